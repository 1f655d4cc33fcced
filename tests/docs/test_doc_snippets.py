"""Every example in README.md and docs/*.md runs against real servers, and does what the page
says it does: the Python examples, and every shell command a reader is told to type.

Every code block is fenced, with its language (an indented block could be neither run nor
marked, so one fails ``test_every_block_is_run_or_marked``). What runs:

- ``console`` blocks: ``$ COMMAND`` lines and the output shown under each, typed one after the
  other in the page's terminal (console.py says how output and exit status are compared;
  shell.py how each command runs);
- blocks preceded by an HTML comment (invisible on GitHub and in the built site)
  ``<!-- snippet: NAME -->``: a Python block is run in a fresh interpreter, and
  ``SNIPPETS[NAME]`` says when a long-running snippet has shown what it promises (then it gets
  SIGTERM, as a deployment would send), and what to check afterwards (the exit status, what
  it printed, what nsqd holds); a ``shell`` block (commands without prompts: servers started
  in one terminal, requests and consumers in another) is run by ``SHELLS[NAME]``, which types
  its lines in the order and the terminals the page says and checks what the page promises;
- ``<!-- file: PATH -->``: the block is a file the commands after it use (docs/uwsgi.md's
  ``myapp/wsgi.py``), written at PATH in the page's terminal folder.

``<!-- no-run: WHY -->`` marks a Python or shell block that is shown, not run: a settings
fragment, a gunicorn config file, a Spark job, ``pip install`` (it would install into your
environment), ``scripts/test`` (the whole CI, of which this is a part), a crontab entry or a
usage synopsis; WHY says so to the reader of the source. A Python or ``shell`` block with
neither mark fails, as does a snippet name with no entry here, or an entry no page uses, so
nothing is skipped silently.

The documented example addresses (``127.0.0.1:4150``, ``http://127.0.0.1:4161``...,
``127.0.0.1:8000`` for the example web servers) are replaced by the test servers' real ones,
on 127.0.0.1 and free ports. Each page is followed **in the order a reader meets it**, against
one fresh nsqlookupd and nsqd(s) of its own (the ``nsq_cluster`` fixture), or the ones its own
commands start (the quick start's ``nsqlookupd`` and ``nsqd`` lines). Nothing is published behind
the reader's back: a consumer example gets the messages the page said to publish before it.
Run by ``tox -e docs`` (which sets NSQ_SYNC_TEST_DOCS=1; see conftest.py in this folder).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import console
import pytest
import requests
from shell import Background, Done, Server, Servers, Shell, commands, http_ok
from support.nsq import in_ci, settled_channel, wait_for
from support.web import uwsgi_binary

from nsq_sync import LookupdClient, NsqdHTTPClient
from nsq_sync.testing import Cluster

ROOT = Path(__file__).resolve().parents[2]
PYTHON_LANGS = {"python", "py", "python3", "pycon", "ipython"}
CONSOLE_LANGS = {"console", "shell-session"}  # $ lines and their output: always run
SHELL_LANGS = {"shell", "sh", "bash", "zsh"}  # commands without prompts: a snippet, or no-run
DEADLINE = 60.0  # seconds a snippet may run (a slow, shared CI machine), then it is killed
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_MARK = re.compile(r"^\s*<!--\s*(snippet|no-run|file):\s*(.*?)\s*-->\s*$")
_EXAMPLE_ADDRESS = re.compile(r"(?:http://)?127\.0\.0\.1:\d+")


# --------------------------------------------------------------------------- reading the pages


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence (or of an indented block's first line)
    lang: str  # the fence's info string, lower-cased ("" for none, "{toctree}" for directives)
    code: str
    mark: str | None  # "snippet", "no-run", "file" or None
    name: str  # the snippet name, the no-run reason or the file's path
    indented: bool = False  # an indented code block, not a fenced one

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md, then the pages in the order of docs/index.md's tables of contents (any page
    not in them after those), then ARCHITECTURE.md: the order a reader meets them."""
    docs = ROOT / "docs"
    listed: list[Path] = []
    in_toctree = False
    for line in (docs / "index.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```{toctree}"):
            in_toctree = True
        elif line.startswith("```"):
            in_toctree = False
        elif in_toctree and line.strip() and not line.startswith(":"):
            listed.append(docs / f"{line.strip()}.md")
    rest = [p for p in sorted(docs.glob("*.md")) if p not in listed]
    files = [ROOT / "README.md", *[p for p in listed if p.exists()], *rest]
    if (ROOT / "ARCHITECTURE.md").exists():
        files.append(ROOT / "ARCHITECTURE.md")
    return files


def _mark_before(lines: list[str], i: int) -> re.Match[str] | None:
    before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    return _MARK.match(before)


def read_blocks(path: Path) -> list[Block]:
    """The code blocks of a Markdown page: fenced ones, and indented ones (four spaces after a
    blank line, outside a fence and an HTML comment; none of these pages indents list items
    that deep)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    in_comment = False
    while i < len(lines):
        if in_comment or lines[i].lstrip().startswith("<!--"):
            in_comment = "-->" not in lines[i]
            i += 1
            continue
        after_blank = i == 0 or not lines[i - 1].strip()
        fenced = _FENCE.match(lines[i])
        if after_blank and lines[i].startswith("    ") and lines[i].strip() and not fenced:
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            mark = _mark_before(lines, i)
            blocks.append(
                Block(
                    path=path,
                    line=i + 1,
                    lang="",
                    code="\n".join(line[4:] for line in lines[i:end]) + "\n",
                    mark=mark.group(1) if mark else None,
                    name=mark.group(2) if mark else "",
                    indented=True,
                )
            )
            i = end
            continue
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and set(lines[end].strip()) == {fence[0]}
        ):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        mark = _mark_before(lines, i)
        blocks.append(
            Block(
                path=path,
                line=i + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                mark=mark.group(1) if mark else None,
                name=mark.group(2) if mark else "",
            )
        )
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in read_blocks(path)]


def python_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in PYTHON_LANGS]


# --------------------------------------------------------------------------- running a snippet


@dataclass
class Run:
    """A snippet's run: its servers, exit status and output."""

    cluster: Cluster
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    before: dict[str, int] = field(default_factory=dict)  # topic depths on nsqd 0 beforehand

    @property
    def nsqd(self) -> NsqdHTTPClient:
        return NsqdHTTPClient(self.cluster.nsqds[0].http_url)

    def describe(self) -> str:
        return (
            f"exit status {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


@dataclass(frozen=True)
class Spec:
    """How to run one named snippet and what it promises."""

    check: Callable[[Run], None]
    nodes: int = 1
    stop_when: Callable[[Run], bool] | None = None  # a long-running snippet: SIGTERM once true
    placeholder: str = ""  # replaces a line that is only "..." (the program's own work)
    prologue: str = ""  # code run first in the same interpreter (a framework's set-up)
    epilogue: str = ""  # code run after it (drive a framework's test client)
    env: dict[str, str] = field(default_factory=dict)
    pytest: bool = False  # the snippet is a test module: run it with pytest


def substitute(code: str, cluster: Cluster) -> str:
    lookupd, nsqds = cluster.lookupd, cluster.nsqds
    real = {
        "http://127.0.0.1:4161": lookupd.http_url,
        "127.0.0.1:4161": lookupd.http_address,
        "127.0.0.1:4160": lookupd.tcp_address,
        "http://127.0.0.1:4151": nsqds[0].http_url,
        "127.0.0.1:4151": nsqds[0].http_address,
        "127.0.0.1:4150": nsqds[0].tcp_address,
    }
    if len(nsqds) > 1:
        real.update(
            {
                "http://127.0.0.1:4251": nsqds[1].http_url,
                "127.0.0.1:4251": nsqds[1].http_address,
                "127.0.0.1:4250": nsqds[1].tcp_address,
            }
        )

    def replace(m: re.Match[str]) -> str:
        if m.group(0) not in real:
            raise AssertionError(
                f"{m.group(0)} is not a documented example address with a test server "
                f"(known: {sorted(real)}; a second nsqd needs Spec(nodes=2))"
            )
        return real[m.group(0)]

    return _EXAMPLE_ADDRESS.sub(replace, code)


def run_snippet(block: Block, spec: Spec, cluster: Cluster, tmp_path: Path) -> Run:
    code = block.code
    if spec.placeholder:
        assert re.search(r"^\.\.\.$", code, re.M), f"{block.where}: no '...' line to replace"
        code = re.sub(r"^\.\.\.$", spec.placeholder.rstrip("\n"), code, count=1, flags=re.M)
    source = substitute(
        textwrap.dedent(spec.prologue) + code + textwrap.dedent(spec.epilogue), cluster
    )
    script = tmp_path / ("test_snippet.py" if spec.pytest else "snippet.py")
    script.write_text(source, encoding="utf-8")
    command = (
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
        if spec.pytest
        else [sys.executable, script.name]
    )
    # The snippet sees none of the suite's NSQ_SYNC_* settings (Config.from_env would read them).
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQ_SYNC_")}
    env.update(PYTHONUNBUFFERED="1", **spec.env)
    run = Run(cluster, before=topic_depths(cluster))
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
    try:
        if spec.stop_when is not None:

            def promised() -> bool:
                run.stdout = out.read_text(encoding="utf-8", errors="replace")
                return proc.poll() is not None or spec.stop_when(run)  # type: ignore[misc]

            wait_for(promised, f"{block.where} ({block.name}) to show what it promises", DEADLINE)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DEADLINE)
    except (subprocess.TimeoutExpired, AssertionError) as exc:
        proc.kill()
        proc.wait()
        run.returncode = proc.returncode
        run.stdout, run.stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        raise AssertionError(f"{block.where} ({block.name}): {exc}\n{run.describe()}") from None
    run.returncode = proc.returncode
    run.stdout = out.read_text(encoding="utf-8", errors="replace")
    run.stderr = err.read_text(encoding="utf-8", errors="replace")
    return run


# --------------------------------------------------------------------------- what each promises


def topic_depths(cluster: Cluster) -> dict[str, int]:
    """Each topic's depth on the first nsqd."""
    with NsqdHTTPClient(cluster.nsqds[0].http_url) as nsqd:
        return {t["topic_name"]: int(t["depth"]) for t in nsqd.stats()["topics"]}


def lookupd_caught_up(cluster: Cluster) -> None:
    """Wait until nsqlookupd lists every topic the nsqds have (nsqd registers a new topic
    asynchronously), so that a consumer started next through nsqlookupd finds it, as it would
    for a reader typing the next example a few seconds later."""
    lookupd = LookupdClient(cluster.lookupd.http_url)
    topics: set[str] = set()
    for node in cluster.nsqds:
        with NsqdHTTPClient(node.http_url) as nsqd:
            topics.update(t["topic_name"] for t in nsqd.stats()["topics"])
    wait_for(lambda: topics <= set(lookupd.topics()), f"nsqlookupd to list {sorted(topics)}")


def lines_with(prefix: str, run: Run) -> list[str]:
    return sorted(
        line[len(prefix) :] for line in run.stdout.splitlines() if line.startswith(prefix)
    )


def exited_ok(run: Run) -> None:
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.stderr, run.describe()


def drained(run: Run, topic: str, channel: str) -> dict[str, Any]:
    """After a consumer stopped: the channel holds nothing, nothing is in flight."""
    stats = settled_channel(run.nsqd, topic, channel)
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0), (stats, run.describe())
    return stats


def check_quickstart_producer(run: Run) -> None:
    exited_ok(run)
    assert run.nsqd.depth("orders") == 3, run.describe()  # 1 PUB + an MPUB of 2


def check_metrics_prometheus(run: Run) -> None:
    exited_ok(run)
    assert lines_with("published ", run) == ["1.0"], run.describe()
    assert run.nsqd.depth("orders") == 1, run.describe()


def check_quickstart_consumer(run: Run) -> None:
    exited_ok(run)  # SIGTERM: run() stopped gracefully and returned
    # the three the producer example published before: the topic's first channel gets them
    assert lines_with("got ", run) == ["order 1", "order 2", "order 3"], run.describe()
    drained(run, "orders", "billing")


def check_consumer_full(run: Run) -> None:
    exited_ok(run)
    assert lines_with("handled ", run) == ["invoice 1 attempt 1", "invoice 2 attempt 1"], (
        run.describe()
    )
    assert "ConsumerStats(" in run.stdout, run.describe()
    stats = drained(run, "invoices", "billing")
    assert stats["deferred_count"] == 1, stats  # RequeueMessage(delay=60.0): nsqd holds it back


def check_producer_full(run: Run) -> None:
    exited_ok(run)
    assert "publishing through threads" in run.stdout, run.describe()
    topic = run.nsqd.topic_stats("shipments")
    assert topic is not None and topic["message_count"] == 5, (topic, run.describe())
    second = NsqdHTTPClient(run.cluster.nsqds[1].http_url)
    assert second.depth("shipments") is None  # the first nsqd answered: no failover happened


def check_producer_errors(run: Run) -> None:
    exited_ok(run)
    assert "not published" not in run.stdout, run.describe()
    assert run.nsqd.depth("shipments") == run.before.get("shipments", 0) + 1, run.describe()


def check_http_clients(run: Run) -> None:
    exited_ok(run)
    depth = run.before.get("shipments", 0) + 1  # with what the page's examples published before
    assert f"depth {depth}" in run.stdout.splitlines(), run.describe()
    nsqds = re.search(r"^nsqds (\[.*\])$", run.stdout, re.M)
    assert nsqds is not None, run.describe()
    assert sorted(ast.literal_eval(nsqds.group(1))) == sorted(run.cluster.nsqd_tcp_addresses)


def check_config_sources(run: Run) -> None:
    exited_ok(run)
    assert run.stdout.split() == ["2.0", "200"], run.describe()  # NSQ_SYNC_MAX_IN_FLIGHT=200


def check_gevent(run: Run) -> None:
    exited_ok(run)
    assert "published on gevent" in run.stdout, run.describe()
    assert run.nsqd.depth("signups") == 100, run.describe()


def one_message_on(topic: str) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        exited_ok(run)
        assert run.nsqd.depth(topic) == 1, run.describe()

    return check


def check_cron_run(run: Run) -> None:
    exited_ok(run)  # ended by itself: idle_timeout, summary.ok
    assert lines_with("exported ", run) == ["report 1", "report 2", "report 3"], run.describe()
    assert "idle 3 handled" in run.stdout, run.describe()
    drained(run, "reports", "export")


def inserted(run: Run) -> int:
    return sum(int(n) for n in re.findall(r"^inserting (\d+) rows$", run.stdout, re.M))


def check_batch_consumer(run: Run) -> None:
    exited_ok(run)
    assert inserted(run) == 3, run.describe()
    drained(run, "rows", "db")


def check_dead_letter(run: Run) -> None:
    exited_ok(run)
    assert lines_with("billed order ", run) == ["1", "3"], run.describe()
    assert "dead-lettered: 1 (stats: 1 )" in run.stdout, run.describe()
    assert (
        "dead: orders billing 1 nsq_sync.errors.DeadLetter: not an order number b'oops'"
        in run.stdout
    ), run.describe()
    # listing put it back: it is still in orders.dead, for the page's shell session to list
    # and replay, and nothing of orders is left
    kept = settled_channel(run.nsqd, "orders.dead", "dead-letter")
    assert (kept["depth"], kept["in_flight_count"]) == (1, 0), run.describe()
    drained(run, "orders", "billing")


def check_pytest_plugin(run: Run) -> None:
    assert run.returncode == 0, run.describe()
    assert re.search(r"^1 passed", run.stdout, re.M), run.describe()


DJANGO_SETTINGS = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["nsq_sync.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    NSQ={"nsqd_tcp_addresses": ["127.0.0.1:4150"]},
)
django.setup()
"""

DJANGO_ROLLBACK = """
from django.db import transaction as _transaction

try:
    with _transaction.atomic():
        publish("shop_orders", b"rolled back", on_commit=True)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
get_producer().close()
"""


def check_logging(run: Run) -> None:
    exited_ok(run)
    assert "INFO nsq_sync: nsq_sync logs are shown" in run.stderr, run.describe()


SNIPPETS: dict[str, Spec] = {
    "quickstart-producer": Spec(check=check_quickstart_producer),
    "metrics-prometheus": Spec(check=check_metrics_prometheus),
    "quickstart-consumer": Spec(
        check=check_quickstart_consumer, stop_when=lambda run: len(lines_with("got ", run)) == 3
    ),
    "consumer-full": Spec(
        check=check_consumer_full,
        placeholder=textwrap.dedent(
            """\
            import time
            while consumer.stats().finished + consumer.stats().requeued < 3:
                time.sleep(0.05)
            """
        ),
    ),
    "logging": Spec(check=check_logging),
    "producer-full": Spec(check=check_producer_full, nodes=2),
    "producer-errors": Spec(check=check_producer_errors),
    "http-clients": Spec(check=check_http_clients),
    "config-sources": Spec(check=check_config_sources, env={"NSQ_SYNC_MAX_IN_FLIGHT": "200"}),
    "gevent": Spec(check=check_gevent),
    "django-publish": Spec(
        check=one_message_on("shop_orders"), prologue=DJANGO_SETTINGS, epilogue=DJANGO_ROLLBACK
    ),
    "flask-publish": Spec(
        check=one_message_on("signups"),
        epilogue="""
        response = app.test_client().post("/signups")
        assert response.status_code == 202, response
        """,
    ),
    "cron-run": Spec(check=check_cron_run),
    "batch-consumer": Spec(check=check_batch_consumer, stop_when=lambda run: inserted(run) >= 3),
    "dead-letter": Spec(check=check_dead_letter),
    "pytest-plugin": Spec(check=check_pytest_plugin, pytest=True),
}


# --------------------------------------------------------------------------- the shell recipes


class Reader:
    """A reader going through one page: the servers the page's examples talk to (a fresh
    cluster, made when first needed, or the ones the page's own commands started), and the
    page's terminal."""

    def __init__(self, nsq_cluster: Any, nodes: int, tmp_path: Path) -> None:
        self._start_cluster = lambda: nsq_cluster(nodes)
        self._cluster: Any = None
        self.tmp = tmp_path
        folder = tmp_path / "terminal"
        folder.mkdir()
        # the example apps' own setting for their nsqd (docs/django.md, docs/flask.md: "With an
        # nsqd on 127.0.0.1:4150 (NSQD_TCP_ADDRESSES to change it)")
        self.shell = Shell(
            folder,
            self.substitute,
            lambda: {"NSQD_TCP_ADDRESSES": self.cluster.nsqds[0].tcp_address},
        )
        self.at_end: list[Callable[[], None]] = []  # checks once the page is read (stop servers)

    @property
    def cluster(self) -> Any:
        if self._cluster is None:
            self._cluster = self._start_cluster()
        return self._cluster

    def use(self, servers: Servers) -> None:
        """From now on the page's examples talk to ``servers`` (started by its commands)."""
        self._cluster = servers

    def substitute(self, text: str) -> str:
        return substitute(text, self.cluster)


@dataclass
class ShellRun:
    """A ``shell`` snippet being typed: its lines, each run or started when the recipe says,
    and every one of them at least once."""

    block: Block
    reader: Reader
    used: set[str] = field(default_factory=set)

    @property
    def lines(self) -> list[str]:
        return [line for line in self.block.code.splitlines() if commands(line)]

    @property
    def cwd(self) -> Path:
        return self.reader.shell.cwd

    def line(self, select: str | Callable[[str], bool]) -> str:
        """The one line that contains ``select`` (or for which it is true)."""
        found = [
            line
            for line in self.lines
            if (select in line if isinstance(select, str) else select(line))
        ]
        assert len(found) == 1, f"{self.block.where}: {select!r} picks {found}"
        self.used.add(found[0])
        return found[0]

    def run(self, select: str | Callable[[str], bool]) -> list[Done]:
        """Type the line and wait for its commands to end: each must succeed."""
        done = self.reader.shell.run(self.line(select))
        for each in done:
            assert each.returncode == 0, f"{self.block.where}: {each.describe()}"
        return done

    def start(self, select: str | Callable[[str], bool]) -> Background:
        """Type the line in a terminal of its own: it runs until stopped."""
        return self.reader.shell.start(self.line(select))

    def stop(self, background: Background) -> None:
        """Ctrl-C, as the page says (SIGTERM, as a deployment sends): a graceful stop, 0."""
        status = self.reader.shell.stop(background)
        assert status == 0, f"{self.block.where}: exit status {status}\n{background.describe()}"

    def every_line_typed(self) -> None:
        left = [line for line in self.lines if line not in self.used]
        assert not left, f"{self.block.where}: lines the test did not run: {left}"


def _nsqd_registered(lookupd: Server, nsqd: Server) -> bool:
    try:
        nodes = LookupdClient(lookupd.http_url).nodes()
    except Exception:  # noqa: BLE001 - not listening yet
        return False
    return any(node.tcp_address == nsqd.tcp_address for node in nodes)


def quickstart_servers(run: ShellRun) -> None:
    """docs/quickstart.md: nsqlookupd, a data folder, nsqd registered with it. They keep running
    for the rest of the page: its producer and consumer examples talk to them; then Ctrl-C
    stops each, and nsqd has kept its metadata in its data folder."""
    servers = Servers(Server.on_free_ports(), (Server.on_free_ports(),))
    run.reader.use(servers)
    lookupd = run.start("nsqlookupd")
    lookupd.wait(lambda: http_ok(f"{servers.lookupd.http_url}/ping"), "nsqlookupd to listen")
    run.run("mkdir")
    nsqd = run.start(lambda line: line.startswith("nsqd "))
    nsqd.wait(lambda: http_ok(f"{servers.nsqds[0].http_url}/ping"), "nsqd to listen")
    nsqd.wait(
        lambda: _nsqd_registered(servers.lookupd, servers.nsqds[0]),
        "nsqd to register with nsqlookupd",
    )
    data = run.cwd / "nsqd-data"

    def stop() -> None:
        run.stop(nsqd)
        run.stop(lookupd)
        assert (data / "nsqd.dat").is_file(), sorted(p.name for p in data.iterdir())

    run.reader.at_end.append(stop)


def gunicorn_ready(server: Background, address: str) -> None:
    """gunicorn listens on ``address`` and booted the workers its ``-w`` asks for."""
    words = server.line.split()
    workers = int(words[words.index("-w") + 1])

    def ready() -> bool:
        text = server.log_text()
        booted = re.findall(r"Booting worker with pid: (\d+)", text)
        return f"Listening at: http://{address}" in text and len(booted) >= workers

    server.wait(ready, f"gunicorn to listen on {address} with {workers} workers")


def _web_get(run: ShellRun, path: str) -> Any:
    with requests.Session() as http:
        http.trust_env = False
        response = http.get(f"http://{run.reader.shell.web_address}{path}", timeout=30)
    assert response.ok, (response.status_code, response.text[:2000])
    return response


def django_example(run: ShellRun) -> None:
    """docs/django.md's example project: migrate; each gunicorn line (threads, then gevent),
    with an order posted and the runtime shown, then one of the consumers in another terminal,
    which ships the order (the first one makes the channel, and still gets the order posted
    before it); Ctrl-C stops each."""
    run.run("cd examples/django_project")
    run.run("manage.py migrate")
    db = run.cwd / "db.sqlite3"

    def shipped() -> list[int]:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as connection:
            rows = connection.execute("SELECT order_id FROM shop_shipment").fetchall()
        return sorted(row[0] for row in rows)

    rounds = [
        ("# threads", "threads", lambda line: line.endswith("--handler shop.handlers.ship")),
        ("# gevent", "gevent", lambda line: "shop.handlers.ship_batch" in line),
    ]
    orders: list[int] = []
    for web_line, runtime, consume_line in rounds:
        web = run.start(web_line)
        gunicorn_ready(web, run.reader.shell.web_address)
        posted, shown = run.run("curl")
        orders.append(json.loads(posted.output)["order_id"])
        assert json.loads(shown.output)["runtime"] == runtime, shown.output
        consumer = run.start(consume_line)
        consumer.wait(lambda: shipped() == orders, f"orders {orders} to ship")
        run.stop(consumer)
        run.stop(web)
    assert len(set(orders)) == 2, orders
    stats = settled_channel(
        NsqdHTTPClient(run.reader.cluster.nsqds[0].http_url), "shop_orders", "shipping"
    )
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0), stats


def flask_example(run: ShellRun) -> None:
    """docs/flask.md's example app: each gunicorn line (threads, then gevent), an event
    published and the runtime shown, then one of the consumers in another terminal, which
    appends the event to archive.log (the first one makes the channel, and still gets the event
    published before it); Ctrl-C stops each."""
    run.run("cd examples/flask_app")
    archive = run.cwd / "archive.log"

    def archived() -> list[bytes]:
        return archive.read_bytes().splitlines() if archive.exists() else []

    rounds = [
        ("# threads", "threads", lambda line: line.endswith("--handler app:archive")),
        ("# gevent", "gevent", lambda line: "app:archive_batch" in line),
    ]
    body = re.findall(r"body=(\w+)", run.line("curl"))
    assert len(body) == 1, run.line("curl")
    for count, (web_line, runtime, consume_line) in enumerate(rounds, 1):
        web = run.start(web_line)
        gunicorn_ready(web, run.reader.shell.web_address)
        published, shown = run.run("curl")
        assert "pid" in json.loads(published.output), published.output
        assert json.loads(shown.output)["runtime"] == runtime, shown.output
        consumer = run.start(consume_line)
        consumer.wait(lambda n=count: len(archived()) >= n, "the event in archive.log")
        run.stop(consumer)
        run.stop(web)
        # the threads round's handler wrote the body; the gevent round's batch handler a line
        # of one body (the batch of what was published)
        assert archived() == [body[0].encode()] * count, archived()


READER_APP = '''\
"""The reader's own app, which docs/uwsgi.md's myapp/wsgi.py imports: a WSGI app whose requests
publish ?body= to uwsgi_orders, through a Producer made at import (in uWSGI's master)."""
from urllib.parse import parse_qs

from nsq_sync import Producer

producer = Producer("127.0.0.1:4150")


def create_app():
    def app(environ, start_response):
        body = parse_qs(environ.get("QUERY_STRING", "")).get("body", ["order"])[0]
        producer.publish("uwsgi_orders", body.encode())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"queued\\n"]

    return app
'''

READER_HANDLERS = """\
import os


def handle(message):
    with open(HANDLED, "a") as handled:
        handled.write(f"{os.getpid()} {message.body.decode()}\\n")
"""


def uwsgi_ready(server: Background) -> set[int]:
    """uWSGI loaded the app and spawned the workers its ``--processes`` asks for; their pids."""
    words = server.line.split()
    workers = int(words[words.index("--processes") + 1])

    def ready() -> set[int] | None:
        text = server.log_text()
        pids = {int(p) for p in re.findall(r"spawned uWSGI worker \d+ \(pid: (\d+)", text)}
        loaded = "WSGI app 0 (mountpoint='') ready" in text
        return pids if loaded and len(pids) >= workers else None

    pids: set[int] = server.wait(ready, f"uWSGI to load the app and spawn {workers} workers")
    return pids


def uwsgi_recipe(run: ShellRun) -> None:
    """docs/uwsgi.md: the page's myapp/wsgi.py (a file block before the command), served by its
    uwsgi line, with the reader's app (a WSGI app publishing at each request) and handler. A
    consumer runs in each worker; a request publishes, a worker's consumer handles it once;
    SIGTERM stops uWSGI (exit 0) and, through uwsgi.atexit, each consumer: nothing is left in
    flight, no connection open."""
    uwsgi_required()
    app = run.cwd / "myapp"
    assert (app / "wsgi.py").is_file(), "the page's myapp/wsgi.py comes before its command"
    handled = run.cwd / "handled.txt"
    (app / "__init__.py").write_text(run.reader.substitute(READER_APP), encoding="utf-8")
    (app / "handlers.py").write_text(
        f"HANDLED = {str(handled)!r}\n{READER_HANDLERS}", encoding="utf-8"
    )
    server = run.start("uwsgi ")
    workers = uwsgi_ready(server)
    nsqd = NsqdHTTPClient(run.reader.cluster.nsqds[0].http_url)

    def lines() -> list[str]:
        return handled.read_text().splitlines() if handled.exists() else []

    def clients() -> list[Any]:
        return list((nsqd.channel_stats("uwsgi_orders", "web") or {}).get("clients") or [])

    _web_get(run, "/?body=order-1")
    server.wait(lambda: lines(), "a worker's consumer to handle the order")
    server.wait(lambda: len(clients()) == len(workers), "a consumer in each worker")
    run.stop(server)
    assert [line.split()[1] for line in lines()] == ["order-1"], lines()
    assert int(lines()[0].split()[0]) in workers, (lines(), workers)
    channel = wait_for(
        lambda: (c := nsqd.channel_stats("uwsgi_orders", "web")) and not c["clients"] and c,
        "the workers' consumers to disconnect",
    )
    assert (channel["depth"], channel["in_flight_count"]) == (0, 0), channel


def uwsgi_required() -> None:
    """Skip without uWSGI on a developer's machine; fail in CI, whose docs env installs it."""
    if uwsgi_binary() is None:
        if in_ci():
            pytest.fail("CI run of the docs tests without uwsgi (tox.ini installs it)")
        pytest.skip("uwsgi is not installed (pip install uwsgi; tox -e docs installs it)")


SHELLS: dict[str, Callable[[ShellRun], None]] = {
    "quickstart-servers": quickstart_servers,
    "django-example": django_example,
    "flask-example": flask_example,
    "uwsgi-recipe": uwsgi_recipe,
}


# --------------------------------------------------------------------------- the tests


def test_every_block_is_run_or_marked() -> None:
    blocks = all_blocks()
    assert python_blocks(), "no Python blocks found: is the Markdown parser broken?"
    indented = [b.where for b in blocks if b.indented]
    assert not indented, (
        "indented code blocks: nothing can run or mark them; fence each with its language "
        f"(console: $ lines and their output; shell: commands; text: output, formats): {indented}"
    )
    no_language = [b.where for b in blocks if not b.lang]
    assert not no_language, f"fenced blocks without a language: {no_language}"
    runnable = PYTHON_LANGS | SHELL_LANGS
    unmarked = [b.where for b in blocks if b.lang in runnable and b.mark is None]
    assert not unmarked, (
        "Python and shell blocks that are neither run nor marked (precede each with "
        f"'<!-- snippet: NAME -->' or '<!-- no-run: why -->'): {unmarked}"
    )
    prompts = [
        b.where
        for b in blocks
        if b.lang not in CONSOLE_LANGS
        and any(line.startswith("$ ") for line in b.code.splitlines())
    ]
    assert not prompts, f"$ prompts outside a console block (which runs them): {prompts}"
    console_marked = [b.where for b in blocks if b.lang in CONSOLE_LANGS and b.mark == "snippet"]
    assert not console_marked, f"console blocks always run: no snippet name {console_marked}"
    for kind, specs in (("python", SNIPPETS), ("shell", SHELLS)):
        langs = PYTHON_LANGS if kind == "python" else SHELL_LANGS
        named = [b for b in blocks if b.lang in langs and b.mark == "snippet"]
        unknown = [f"{b.where} ({b.name})" for b in named if b.name not in specs]
        assert not unknown, f"{kind} snippets with no entry in their table: {unknown}"
        unused = set(specs) - {b.name for b in named}
        assert not unused, f"{kind} entries no page uses: {sorted(unused)}"
    no_reason = [b.where for b in blocks if b.mark in ("no-run", "file") and not b.name]
    assert not no_reason, f"no-run blocks must say why, file blocks where: {no_reason}"


def test_the_parser_finds_marks_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- snippet: a -->\n```python\nx = 1\n```\n\n<!-- no-run: a fragment -->\n\n"
        "```py\ny = 2\n```\n\n```python\nz = 3\n```\n\n    ```python\n    w = 4\n    ```\n"
        "```console\n$ ls\n```\n\nText:\n\n    pip install .\n    scripts/demo\n\nMore text\n"
        "<!-- a comment\n\n    indented in a comment -->\n<!-- file: app/x.py -->\n```shell\nls\n```\n"
    )
    found = [(b.line, b.lang, b.code, b.mark, b.name, b.indented) for b in read_blocks(page)]
    assert found == [
        (2, "python", "x = 1\n", "snippet", "a", False),
        (8, "py", "y = 2\n", "no-run", "a fragment", False),
        (12, "python", "z = 3\n", None, "", False),
        (16, "python", "w = 4\n", None, "", False),
        (19, "console", "$ ls\n", None, "", False),
        (25, "", "pip install .\nscripts/demo\n", None, "", True),
        (33, "shell", "ls\n", "file", "app/x.py", False),
    ]


def test_a_shell_line_is_its_commands_without_the_comment() -> None:
    line = "curl 'http://h/o?item=book'; curl http://h/runtime   # two; one 'quoted # not' here"
    assert commands(line) == [["curl", "http://h/o?item=book"], ["curl", "http://h/runtime"]]
    assert commands("# only a comment") == []
    assert commands("nsq-sync pub clicks '{\"id\": 1}'") == [
        ["nsq-sync", "pub", "clicks", '{"id": 1}']
    ]


def test_a_uwsgi_command_without_a_socket_fails_the_recipe(tmp_path: Path) -> None:
    """What docs/uwsgi.md's command once lacked (--http-socket): uWSGI then exits with "The
    -s/--socket option is missing", and the recipe's run fails at once, saying so."""
    uwsgi_required()
    recipe = next(b for b in read_blocks(ROOT / "docs" / "uwsgi.md") if b.name == "uwsgi-recipe")
    line = re.sub(r" --http-socket \S+", "", recipe.code.strip())
    assert line != recipe.code.strip() and line.startswith("uwsgi "), recipe.code
    (tmp_path / "terminal").mkdir()
    shell = Shell(tmp_path / "terminal", lambda text: text)
    try:
        with pytest.raises(AssertionError, match="The -s/--socket option is missing"):
            uwsgi_ready(shell.start(line))
    finally:
        shell.close()


# --------------------------------------------------------------------------- shell sessions


def _follows(command: console.Command) -> bool:
    """``nsq-sync tail`` without ``-n``: it prints until Ctrl-C, while the reader publishes from
    another terminal (the page's next console block)."""
    words = command.line.split()
    refused = any(": error: " in line for line in command.shown)
    return "tail" in words and "-n" not in words and not refused


def _check(command: console.Command, status: int, output: str, where: str, reader: Reader) -> None:
    text = f"{where} $ {command.line}: exit status {status}\n{output}"
    assert status == command.expected_status(), text
    shown = (
        [reader.substitute(line) for line in command.shown]
        if command.is_nsq_sync
        else command.shown
    )
    console.same_output(command, shown, output, text)


def run_session(block: Block, after: Block | None, reader: Reader) -> bool:
    """Run a console block's commands in order, each checked against what the page shows.
    Returns whether ``after`` (the next block) was run too: the other terminal of a tail."""
    used_after = False
    for command in console.session(block.code):
        if command.is_nsq_sync and _follows(command):
            assert after is not None and after.lang == "console", f"{block.where}: tail, then?"
            _follow(command, block, after, reader)
            used_after = True
        else:
            done = reader.shell.run(command.line)
            assert len(done) == 1, f"{block.where}: one command per $ line: {command.line}"
            _check(command, done[0].returncode, done[0].output, block.where, reader)
        lookupd_caught_up(reader.cluster)  # the next command comes a few seconds later
    return used_after


def _follow(command: console.Command, block: Block, after: Block, reader: Reader) -> None:
    """Start a tail, run the next console block (another terminal) once it has subscribed,
    wait until it has printed what the page shows, then stop it as Ctrl-C would."""
    words = shlex.split(reader.substitute(command.line))
    topic = words[words.index("tail") + 1]
    nsqd = NsqdHTTPClient(reader.cluster.nsqds[0].http_url)
    shown = [line for line in command.shown if not line.startswith("nsq-sync ")]

    def tail_channel() -> str | None:
        entry = nsqd.topic_stats(topic)
        for channel in entry["channels"] if entry else []:
            if channel["channel_name"].endswith("#ephemeral") and channel["clients"]:
                return str(channel["channel_name"])
        return None

    tail = reader.shell.start(command.line)
    name = tail.wait(tail_channel, f"{block.where}: tail to subscribe")
    run_session(after, None, reader)

    def printed() -> bool:
        channel = nsqd.channel_stats(topic, name)
        return bool(
            channel
            and channel["message_count"] >= len(shown)
            and (channel["depth"], channel["in_flight_count"]) == (0, 0)
        )

    tail.wait(printed, f"{block.where}: tail to print {shown}")
    status = reader.shell.stop(tail)  # Ctrl-C (SIGINT) stops it the same way
    _check(command, status, tail.log_text(), block.where, reader)


# --------------------------------------------------------------------------- pages, in order


def _steps(path: Path) -> list[Block]:
    return [
        b
        for b in read_blocks(path)
        if (b.lang in CONSOLE_LANGS and b.mark != "no-run")
        or b.mark == "file"
        or (b.lang in PYTHON_LANGS | SHELL_LANGS and b.mark == "snippet")
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    "page", [p for p in doc_files() if _steps(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_page_in_reading_order(page: Path, nsq_cluster: Any, tmp_path: Path) -> None:
    """The page's snippets, files and shell sessions, in order, against servers of its own."""
    steps = _steps(page)
    nodes = max(
        [SNIPPETS[b.name].nodes for b in steps if b.mark == "snippet" and b.name in SNIPPETS],
        default=1,
    )
    reader = Reader(nsq_cluster, nodes, tmp_path)
    skip_next = False
    try:
        for index, block in enumerate(steps):
            if skip_next:
                skip_next = False
                continue
            if block.lang in CONSOLE_LANGS:
                after = steps[index + 1] if index + 1 < len(steps) else None
                skip_next = run_session(block, after, reader)
            elif block.mark == "file":
                target = reader.shell.cwd / block.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(reader.substitute(block.code), encoding="utf-8")
            elif block.lang in SHELL_LANGS:
                run = ShellRun(block, reader)
                SHELLS[block.name](run)
                run.every_line_typed()
            else:
                spec = SNIPPETS[block.name]
                folder = tmp_path / f"{index}-{block.name}"
                folder.mkdir()
                spec.check(run_snippet(block, spec, reader.cluster, folder))
            lookupd_caught_up(reader.cluster)
        for check in reader.at_end:
            check()
    finally:
        reader.shell.close()


def test_the_configuration_reference_covers_every_option() -> None:
    """docs/configuration.md's table comes from Config's field metadata: every option has a
    row with a description, its default, and a range or choices where Config checks one; and
    the table on the page (read on the repository's web view too) is that one, so every
    default shown is Config's."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from config_reference import config_rows, markdown_table, page_table
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page_table(page) == markdown_table(), (
        "docs/configuration.md's table differs from Config: run python docs/_ext/config_reference.py"
    )
    assert "| `default_requeue_delay` | seconds" in page and "| `90.0` |" in page
    from nsq_sync import Config

    rows = {
        name: (type_, default, range_, doc) for name, type_, default, range_, doc in config_rows()
    }
    assert list(rows) == [f.name for f in dataclasses.fields(Config)]
    assert [name for name, (_, _, _, doc) in rows.items() if not doc] == []
    assert rows["max_in_flight"][2] == [("0 – 2147483647", False)]
    assert rows["backoff_strategy"][2] == [
        ("'exponential'", True),
        (", ", False),
        ("'full_jitter'", True),
    ]
    with pytest.raises(Exception, match="backoff_strategy"):
        Config(backoff_strategy="linear")  # the choices shown are the ones Config enforces
