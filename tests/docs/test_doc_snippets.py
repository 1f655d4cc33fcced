"""Every Python example in README.md and docs/*.md runs against a real nsqd, and does what the
page says it does.

A fenced Python block in those files is preceded by one of two HTML comments (invisible on
GitHub and in the built site):

- ``<!-- snippet: NAME -->``: the block is run, in a fresh interpreter, against a fresh
  nsqlookupd and nsqd(s) (the ``nsq_cluster`` fixture), with the documented example addresses
  (``127.0.0.1:4150``, ``http://127.0.0.1:4161``...) replaced by the test servers' real ones.
  ``SNIPPETS[NAME]`` says what to prepare (messages to consume), when a long-running snippet
  has shown what it promises (then it gets SIGTERM, as a deployment would send), and what to
  check afterwards (the exit status, what it printed, what nsqd holds).
- ``<!-- no-run: WHY -->``: the block is shown, not run (a settings fragment, a gunicorn config
  file, a Spark job); WHY says so to the reader of the source.

A Python block with neither fails ``test_every_python_block_is_run_or_marked``, as does a
snippet name with no entry here, or an entry no page uses, so nothing is skipped silently.
Run by ``tox -e docs`` (which sets NSQ_SYNC_TEST_DOCS=1; see conftest.py in this folder).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.nsq import settled_channel, wait_for

from nsq_sync import LookupdClient, NsqdHTTPClient, Producer
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
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    setup: Callable[[Cluster], None] | None = None  # before it starts (publish what it consumes)
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
    run = Run(cluster)
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


def publish(cluster: Cluster, topic: str, bodies: list[bytes]) -> None:
    """Publish to the first nsqd and wait until nsqlookupd lists the topic there (nsqd registers
    a new topic with lookupd asynchronously), so a consumer started next finds it."""
    with Producer(cluster.nsqds[0].tcp_address) as producer:
        producer.multi_publish(topic, bodies)
    lookupd = LookupdClient(cluster.lookupd.http_url)
    wait_for(lambda: lookupd.lookup(topic), f"nsqlookupd to list {topic}")


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
    assert lines_with("got ", run) == ["order 1", "order 2", "order 3"], run.describe()
    drained(run, "orders", "billing")


def check_consumer_full(run: Run) -> None:
    exited_ok(run)
    assert lines_with("handled ", run) == ["order 1 attempt 1", "order 2 attempt 1"], run.describe()
    assert "ConsumerStats(" in run.stdout, run.describe()
    stats = drained(run, "orders", "billing")
    assert stats["deferred_count"] == 1, stats  # RequeueMessage(delay=60.0): nsqd holds it back


def check_producer_full(run: Run) -> None:
    exited_ok(run)
    assert "publishing through threads" in run.stdout, run.describe()
    topic = run.nsqd.topic_stats("orders")
    assert topic is not None and topic["message_count"] == 5, (topic, run.describe())
    second = NsqdHTTPClient(run.cluster.nsqds[1].http_url)
    assert second.depth("orders") is None  # the first nsqd answered: no failover happened


def check_producer_errors(run: Run) -> None:
    exited_ok(run)
    assert "not published" not in run.stdout, run.describe()
    assert run.nsqd.depth("orders") == 1, run.describe()


def check_http_clients(run: Run) -> None:
    exited_ok(run)
    assert "depth 1" in run.stdout.splitlines(), run.describe()
    assert f"nsqds ['{run.cluster.nsqds[0].tcp_address}']" in run.stdout, run.describe()


def check_config_sources(run: Run) -> None:
    exited_ok(run)
    assert run.stdout.split() == ["2.0", "200"], run.describe()  # NSQ_SYNC_MAX_IN_FLIGHT=200


def check_gevent(run: Run) -> None:
    exited_ok(run)
    assert "published on gevent" in run.stdout, run.describe()
    assert run.nsqd.depth("orders") == 100, run.describe()


def check_one_message(run: Run) -> None:
    exited_ok(run)
    assert run.nsqd.depth("orders") == 1, run.describe()


def check_cron_run(run: Run) -> None:
    exited_ok(run)  # ended by itself: idle_timeout, summary.ok
    assert lines_with("exported ", run) == ["order 1", "order 2", "order 3"], run.describe()
    assert "idle 3 handled" in run.stdout, run.describe()
    drained(run, "orders", "export")


def inserted(run: Run) -> int:
    return sum(int(n) for n in re.findall(r"^inserting (\d+) rows$", run.stdout, re.M))


def check_batch_consumer(run: Run) -> None:
    exited_ok(run)
    assert inserted(run) == 3, run.describe()
    drained(run, "orders", "db")


def check_pytest_plugin(run: Run) -> None:
    assert run.returncode == 0, run.describe()
    assert re.search(r"^1 passed", run.stdout, re.M), run.describe()


ORDERS = [b"order 1", b"order 2", b"order 3"]

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
        publish("orders", b"rolled back", on_commit=True)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
get_producer().close()
"""

SNIPPETS: dict[str, Spec] = {
    "quickstart-producer": Spec(check=check_quickstart_producer),
    "metrics-prometheus": Spec(check=check_metrics_prometheus),
    "quickstart-consumer": Spec(
        check=check_quickstart_consumer,
        setup=lambda cluster: publish(cluster, "orders", ORDERS),
        stop_when=lambda run: len(lines_with("got ", run)) == 3,
    ),
    "consumer-full": Spec(
        check=check_consumer_full,
        setup=lambda cluster: publish(cluster, "orders", [b"order 1", b"later", b"order 2"]),
        placeholder=textwrap.dedent(
            """\
            import time
            while consumer.stats().finished + consumer.stats().requeued < 3:
                time.sleep(0.05)
            """
        ),
    ),
    "producer-full": Spec(check=check_producer_full, nodes=2),
    "producer-errors": Spec(check=check_producer_errors),
    "http-clients": Spec(check=check_http_clients),
    "config-sources": Spec(check=check_config_sources, env={"NSQ_SYNC_MAX_IN_FLIGHT": "200"}),
    "gevent": Spec(check=check_gevent),
    "django-publish": Spec(
        check=check_one_message, prologue=DJANGO_SETTINGS, epilogue=DJANGO_ROLLBACK
    ),
    "flask-publish": Spec(
        check=check_one_message,
        epilogue="""
        response = app.test_client().post("/orders")
        assert response.status_code == 202, response
        """,
    ),
    "cron-run": Spec(
        check=check_cron_run, setup=lambda cluster: publish(cluster, "orders", ORDERS)
    ),
    "batch-consumer": Spec(
        check=check_batch_consumer,
        setup=lambda cluster: publish(
            cluster, "orders", [json.dumps({"id": i}).encode() for i in (1, 2, 3)]
        ),
        stop_when=lambda run: inserted(run) >= 3,
    ),
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


@pytest.mark.integration
@pytest.mark.parametrize(
    "block",
    [b for b in python_blocks() if b.mark == "snippet" and b.name in SNIPPETS],
    ids=lambda b: f"{b.name}@{b.where}",
)
def test_snippet(block: Block, nsq_cluster: Any, tmp_path: Path) -> None:
    spec = SNIPPETS[block.name]
    cluster = nsq_cluster(spec.nodes)
    if spec.setup is not None:
        spec.setup(cluster)
    run = run_snippet(block, spec, cluster, tmp_path)
    spec.check(run)


def test_the_configuration_reference_covers_every_option() -> None:
    """docs/configuration.md's table comes from Config's field metadata: every option has a
    row with a description, and a range or choices where Config checks one."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from config_options import config_rows
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
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
