"""Every Python example in README.md and docs/*.md runs against a real nsqd, and does what the
page says it does.

A fenced Python block in those files is preceded by one of two HTML comments (invisible on
GitHub and in the built site):

- ``<!-- snippet: NAME -->``: the block is run, in a fresh interpreter, with the documented
  example addresses (``127.0.0.1:4150``, ``http://127.0.0.1:4161``...) replaced by the test
  servers' real ones. ``SNIPPETS[NAME]`` says when a long-running snippet has shown what it
  promises (then it gets SIGTERM, as a deployment would send), and what to check afterwards
  (the exit status, what it printed, what nsqd holds).
- ``<!-- no-run: WHY -->``: the block is shown, not run (a settings fragment, a gunicorn config
  file, a Spark job); WHY says so to the reader of the source.

A Python block with neither fails ``test_every_python_block_is_run_or_marked``, as does a
snippet name with no entry here, or an entry no page uses, so nothing is skipped silently.

Each page is followed **in the order a reader meets it**, against one fresh nsqlookupd and
nsqd(s) of its own (the ``nsq_cluster`` fixture): its snippets, and its shell sessions (fenced
``console`` blocks: the ``$ nsq-sync ...`` lines are run and their output compared with what the
page shows; see console.py). Nothing is published behind the reader's back: a consumer example
gets the messages the page said to publish before it.
Run by ``tox -e docs`` (which sets NSQ_SYNC_TEST_DOCS=1; see conftest.py in this folder).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import console
import pytest
from support.nsq import settled_channel, wait_for

from nsq_sync import LookupdClient, NsqdHTTPClient
from nsq_sync.testing import Cluster

ROOT = Path(__file__).resolve().parents[2]
PYTHON_LANGS = {"python", "py", "python3", "pycon", "ipython"}
DEADLINE = 60.0  # seconds a snippet may run (a slow, shared CI machine), then it is killed
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`{]*)")
_MARK = re.compile(r"^\s*<!--\s*(snippet|no-run):\s*(.*?)\s*-->\s*$")
_EXAMPLE_ADDRESS = re.compile(r"(?:http://)?127\.0\.0\.1:\d+")


# --------------------------------------------------------------------------- reading the pages


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # "snippet", "no-run" or None
    name: str  # the snippet name, or the no-run reason

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


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
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
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(before)
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


def python_blocks() -> list[Block]:
    return [b for path in doc_files() for b in read_blocks(path) if b.lang in PYTHON_LANGS]


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
    assert "replayed: 1" in run.stdout, run.describe()
    # the poison is back in its topic (waiting for the fixed consumer), gone from orders.dead
    back = settled_channel(run.nsqd, "orders", "billing")
    assert (back["depth"], back["in_flight_count"]) == (1, 0), run.describe()
    drained(run, "orders.dead", "dead-letter")


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


# --------------------------------------------------------------------------- the tests


def test_every_python_block_is_run_or_marked() -> None:
    blocks = python_blocks()
    assert blocks, "no Python blocks found: is the Markdown parser broken?"
    unmarked = [b.where for b in blocks if b.mark is None]
    assert not unmarked, (
        "Python blocks that are neither run nor marked (precede each with "
        f"'<!-- snippet: NAME -->' or '<!-- no-run: why -->'): {unmarked}"
    )
    unknown = [
        f"{b.where} ({b.name})" for b in blocks if b.mark == "snippet" and b.name not in SNIPPETS
    ]
    assert not unknown, f"snippets with no entry in SNIPPETS: {unknown}"
    used = {b.name for b in blocks if b.mark == "snippet"}
    assert not set(SNIPPETS) - used, (
        f"SNIPPETS entries no page uses: {sorted(set(SNIPPETS) - used)}"
    )
    no_reason = [b.where for b in blocks if b.mark == "no-run" and not b.name]
    assert not no_reason, f"no-run blocks must say why: {no_reason}"


def test_the_parser_finds_marks_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- snippet: a -->\n```python\nx = 1\n```\n\n<!-- no-run: a fragment -->\n\n"
        "```py\ny = 2\n```\n\n```python\nz = 3\n```\n\n    ```python\n    w = 4\n    ```\n"
        "```console\n$ ls\n```\n"
    )
    found = [(b.line, b.lang, b.code, b.mark, b.name) for b in read_blocks(page)]
    assert found == [
        (2, "python", "x = 1\n", "snippet", "a"),
        (8, "py", "y = 2\n", "no-run", "a fragment"),
        (12, "python", "z = 3\n", None, ""),
        (16, "python", "w = 4\n", None, ""),
        (19, "console", "$ ls\n", None, ""),
    ]


# --------------------------------------------------------------------------- shell sessions


def _expected(command: console.Command, subst: Callable[[str], str]) -> tuple[list[str], list[str]]:
    """What the page shows under a command: its stdout lines and its stderr lines (those that
    start with the program's name)."""
    shown = [subst(line) for line in command.shown]
    return [x for x in shown if not x.startswith("nsq-sync ")], [
        x for x in shown if x.startswith("nsq-sync ")
    ]


def _same_output(shown: list[str], actual: list[str], where: str) -> None:
    """The lines as shown; a JSON message line by its body (ids and timestamps differ), a table
    row cell by cell (column widths follow the real addresses)."""
    assert len(actual) == len(shown), f"{where}: shown {shown}, got {actual}"
    for expected, line in zip(shown, actual):
        if expected.startswith("{") and '"body"' in expected:
            assert json.loads(line)["body"] == json.loads(expected)["body"], (where, line)
        else:
            assert line.split() == expected.split(), (where, line)


def _check_command(
    command: console.Command, status: int | None, out: bytes, err: bytes, where: str, subst: Any
) -> None:
    shown_out, shown_err = _expected(command, subst)
    text = f"{where} $ {command.line}: exit status {status}\n{out!r}\n{err.decode()}"
    assert status == (2 if any(": error: " in line for line in shown_err) else 0), text
    _same_output(shown_out, out.decode().splitlines(), text)
    assert err.decode().splitlines() == shown_err, text


def _follows(command: console.Command) -> bool:
    """``nsq-sync tail`` without ``-n``: it prints until Ctrl-C, while the reader publishes from
    another terminal (the page's next console block)."""
    words = command.line.split()
    refused = any(": error: " in line for line in command.shown)
    return "tail" in words and "-n" not in words and not refused


def run_session(block: Block, after: Block | None, cluster: Cluster) -> bool:
    """Run a console block's commands in order, each checked against what the page shows.
    Returns whether ``after`` (the next block) was run too: the other terminal of a tail."""

    def subst(text: str) -> str:
        return substitute(text, cluster)

    used_after = False
    for command in console.session(block.code):
        if _follows(command):
            assert after is not None and after.lang == "console", f"{block.where}: tail, then?"
            _follow(command, block, after, cluster, subst)
            used_after = True
        else:
            done = console.run(command, subst)
            _check_command(command, done.returncode, done.stdout, done.stderr, block.where, subst)
    return used_after


def _follow(
    command: console.Command, block: Block, after: Block, cluster: Cluster, subst: Any
) -> None:
    """Start a tail, run the next console block (another terminal) once it has subscribed,
    wait until it has printed what the page shows, then stop it as Ctrl-C would."""
    words = shlex.split(subst(command.line))
    topic = words[words.index("tail") + 1]
    nsqd = NsqdHTTPClient(cluster.nsqds[0].http_url)
    shown_out, _ = _expected(command, subst)

    def tail_channel() -> str | None:
        entry = nsqd.topic_stats(topic)
        for channel in entry["channels"] if entry else []:
            if channel["channel_name"].endswith("#ephemeral") and channel["clients"]:
                return str(channel["channel_name"])
        return None

    proc = console.spawn(command, subst)
    try:
        name = wait_for(tail_channel, f"{block.where}: tail to subscribe")
        run_session(after, None, cluster)

        def printed() -> bool:
            channel = nsqd.channel_stats(topic, name)
            return bool(
                channel
                and channel["message_count"] >= len(shown_out)
                and (channel["depth"], channel["in_flight_count"]) == (0, 0)
            )

        wait_for(printed, f"{block.where}: tail to print {shown_out}")
        proc.send_signal(signal.SIGTERM)  # Ctrl-C (SIGINT) stops it the same way
        out, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _check_command(command, proc.returncode, out, err, block.where, subst)


# --------------------------------------------------------------------------- pages, in order


def _steps(path: Path) -> list[Block]:
    return [
        b
        for b in read_blocks(path)
        if b.lang == "console" or (b.lang in PYTHON_LANGS and b.mark == "snippet")
    ]


@pytest.mark.integration
@pytest.mark.parametrize(
    "page", [p for p in doc_files() if _steps(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_page_in_reading_order(page: Path, nsq_cluster: Any, tmp_path: Path) -> None:
    """The page's snippets and shell sessions, in order, against one cluster of its own."""
    steps = _steps(page)
    nodes = max([SNIPPETS[b.name].nodes for b in steps if b.mark == "snippet"], default=1)
    cluster = nsq_cluster(nodes)
    skip_next = False
    for index, block in enumerate(steps):
        if skip_next:
            skip_next = False
            continue
        if block.lang == "console":
            after = steps[index + 1] if index + 1 < len(steps) else None
            skip_next = run_session(block, after, cluster)
        else:
            spec = SNIPPETS[block.name]
            folder = tmp_path / f"{index}-{block.name}"
            folder.mkdir()
            spec.check(run_snippet(block, spec, cluster, folder))
        lookupd_caught_up(cluster)


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
