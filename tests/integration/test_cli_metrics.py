"""``nsq-sync tail/drain --metrics-port``: Prometheus metrics served while the command runs."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from support.nsq import bounded, wait_for

from nsq_sync import NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = [pytest.mark.integration]

NSQ_SYNC_CMD = [sys.executable, "-m", "nsq_sync"]


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


def _scrape(url: str) -> dict[str, float]:
    text = requests.get(url, timeout=10).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("nsq_sync_")
    }


def test_tail_serves_metrics_while_it_runs(nsqd: NsqdProcess, nsq_topic: str) -> None:
    proc = subprocess.Popen(
        [
            *NSQ_SYNC_CMD, "tail", nsq_topic, "-n", "5", "--nsqd-tcp-address", nsqd.tcp_address,
            "--metrics-port", "0", "--metrics-address", "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        # (tail may warn first: with only a TCP address it cannot see the topic's backlog)
        lines = []
        for _ in range(5):
            lines.append(proc.stderr.readline().decode())
            found = re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", lines[-1])
            if found:
                break
        assert found, lines
        url = found.group(1)
        wait_for(lambda: _scrape(url).get("nsq_sync_connections") == 1, "tail's connection")
        http = NsqdHTTPClient(nsqd.http_url)
        http.mpub(nsq_topic, [b"a", b"b", b"c"])
        wait_for(lambda: _scrape(url).get("nsq_sync_messages_finished_total") == 3, "3 finished")
        scraped = _scrape(url)
        assert scraped["nsq_sync_messages_received_total"] == 3
        assert scraped["nsq_sync_handler_duration_seconds_count"] == 3
        http.mpub(nsq_topic, [b"d", b"e"])
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.split() == [b"a", b"b", b"c", b"d", b"e"]


def test_a_metrics_port_in_use_is_a_usage_error(nsqd: NsqdProcess, nsq_topic: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *NSQ_SYNC_CMD, "drain", nsq_topic, "ch", "--nsqd-tcp-address", nsqd.tcp_address,
                "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )  # fmt: skip
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr.decode()
