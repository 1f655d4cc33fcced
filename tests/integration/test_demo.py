"""The quick-start demo (``scripts/demo``: ``python -m nsq_sync.testing.demo
examples/quickstart.py``) as a new user runs it, against real nsqd and nsqlookupd processes: a
short summary when it works, the servers' logs when it does not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.nsq import bounded

from nsq_sync.testing.pytest_plugin import NsqBinaries

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(180.0)


def run_demo(nsq_bin: NsqBinaries, script: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NSQ_BIN=os.path.dirname(nsq_bin.nsqd))
    env.pop("NSQ_SYNC_TEST_RUNTIME", None)
    return subprocess.run(
        [sys.executable, "-m", "nsq_sync.testing.demo", str(script)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=env,
        check=False,
    )


# A few seconds on a loaded machine; tox -e package runs the same demo from the built wheel too.
@pytest.mark.slow
def test_quickstart_prints_a_short_summary_and_no_server_logs(nsq_bin: NsqBinaries) -> None:
    proc = run_demo(nsq_bin, ROOT / "examples" / "quickstart.py")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert re.fullmatch(
        r"published 10,001 messages to quickstart_\w+ on nsqd 127\.0\.0\.1:\d+ in [\d.]+ s "
        r"\(1 PUB, 1 MPUB of 10,000\)",
        lines[0],
    ), lines[0]
    assert re.fullmatch(
        r"consumed 10,001/10,001 via nsqlookupd 127\.0\.0\.1:\d+ in [\d.]+ s \([\d,]+ msg/s\); "
        r"finished 10,001, requeued 0; stopped cleanly",
        lines[1],
    ), lines[1]
    # The runner adds one line: the total time. No server output on success.
    assert re.fullmatch(
        r"\[demo\] OK in [\d.]+ s \(nsqlookupd and nsqd started and stopped\)\n", proc.stderr
    ), proc.stderr


def test_a_failing_script_shows_the_servers_logs(nsq_bin: NsqBinaries, tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('something went wrong', file=sys.stderr)\nsys.exit(3)\n")

    proc = run_demo(nsq_bin, script)

    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "something went wrong" in proc.stderr
    assert f"[demo] FAILED: {script} exited with status 3" in proc.stderr
    # Both servers' addresses and the ends of their logs (nsqd v1.3.0 logs its listeners).
    assert re.search(r"\[demo\] nsqlookupd tcp=127\.0\.0\.1:\d+ http=127\.0\.0\.1:\d+", proc.stderr)
    assert re.search(r"\[demo\] nsqd tcp=127\.0\.0\.1:\d+ http=127\.0\.0\.1:\d+", proc.stderr)
    assert re.search(r"nsqlookupd.*TCP: listening on", proc.stderr), proc.stderr
    assert re.search(r"nsqd.*TCP: listening on", proc.stderr), proc.stderr
    assert "[demo] OK" not in proc.stderr
