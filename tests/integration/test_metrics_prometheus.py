"""Prometheus metrics as an operator sees them: a consumer and a producer in another process
serve ``/metrics``; what a scrape says matches what nsqd's ``/stats`` says (received, finished,
requeued, in flight), and keeps counting across an nsqd restart."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support.nsq import wait_for

from nsq_sync.http import NsqdHTTPClient

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.integration

SUPPORT = Path(__file__).resolve().parents[1] / "support"


class App:
    """tests/support/metrics_app.py, running."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.log_path = log
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "metrics_app.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )
        try:
            self.port = json.loads(self._readline())["port"]
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            self.close()
            raise

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"metrics_app exited:\n{self.log_path.read_text()}")
        return line

    def command(self, text: str) -> int:
        """Send a command; the number its answer carries (publishes that raised), or 0."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        answer = self._readline().split()
        assert answer[0] == "ok", answer
        return int(answer[1]) if len(answer) > 1 else 0

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, by (name, sorted labels)."""
        text = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.command("quit")
                    self.proc.wait(30)
                except (AssertionError, OSError, subprocess.TimeoutExpired):
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self._log.close()


@pytest.fixture
def app_factory(tmp_path: Path) -> Iterator[Any]:
    apps: list[App] = []

    def make(env: dict[str, str]) -> App:
        app = App(env, tmp_path / f"app{len(apps)}.log")
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def _nsqd_view(nsqd: Any, topic: str, channel: str) -> dict[str, int]:
    """What nsqd's /stats says of the channel: delivered, finished and requeued (summed over
    its clients), in flight, RDY, and messages put into the channel."""
    try:
        ch = NsqdHTTPClient(nsqd.http_url).channel_stats(topic, channel)
    except Exception:  # (restarting)
        ch = None
    if ch is None:
        return {}
    clients = ch["clients"]
    return {
        "clients": len(clients),
        "messages": ch["message_count"],
        "received": sum(c["message_count"] for c in clients),
        "finished": sum(c["finish_count"] for c in clients),
        "requeued": sum(c["requeue_count"] for c in clients),
        "in_flight": ch["in_flight_count"],
        "rdy": sum(c["ready_count"] for c in clients),
    }


def test_scraped_values_match_nsqd_stats_across_a_restart(
    nsqd_factory: Any, nsq_topic: str, app_factory: Any
) -> None:
    import os

    nsqd = nsqd_factory()
    channel = "metrics"
    env = dict(os.environ, NSQD_TCP_ADDRESS=nsqd.tcp_address, TOPIC=nsq_topic, CHANNEL=channel)
    app = app_factory(env)
    sub = (("channel", channel), ("nsqd", nsqd.tcp_address), ("topic", nsq_topic))

    def value(name: str, labels: tuple[tuple[str, str], ...] = sub) -> float:
        return app.scrape().get((name, labels), 0.0)

    wait_for(lambda: value("nsq_sync_connections") == 1, "the consumer's connection")
    app.command("publish ok 5")
    app.command("mpub fail 2")  # each fails once: requeued, and the consumer backs off
    per_sub = (("channel", channel), ("topic", nsq_topic))
    wait_for(lambda: value("nsq_sync_backoff_level", per_sub) > 0, "backoff scraped")
    wait_for(lambda: value("nsq_sync_messages_finished_total") == 7, "7 finished")
    wait_for(lambda: value("nsq_sync_backoff_level", per_sub) == 0, "out of backoff")
    app.command("publish hold 2")

    def view() -> dict[str, int]:
        return _nsqd_view(nsqd, nsq_topic, channel)

    wait_for(lambda: view().get("finished") == 7 and view()["in_flight"] == 2, "7 FIN, 2 held")
    before = view()
    assert (before["messages"], before["requeued"], before["received"]) == (9, 2, 11)
    # nsqd counts a message when it writes it: wait until it arrived here too
    wait_for(lambda: value("nsq_sync_in_flight") == 2, "2 in flight scraped")
    scraped = app.scrape()
    assert scraped[("nsq_sync_messages_received_total", sub)] == before["received"]
    assert scraped[("nsq_sync_messages_finished_total", sub)] == before["finished"]
    assert scraped[("nsq_sync_messages_requeued_total", sub)] == before["requeued"]
    assert scraped[("nsq_sync_in_flight", sub)] == before["in_flight"]
    assert scraped[("nsq_sync_rdy", sub)] == before["rdy"] == 10
    assert scraped[("nsq_sync_messages_failed_total", per_sub)] == 2
    assert scraped[("nsq_sync_messages_gave_up_total", per_sub)] == 0
    assert scraped[("nsq_sync_handler_duration_seconds_count", per_sub)] == 9  # 2 held: running
    ok = (("outcome", "ok"), ("topic", nsq_topic))
    assert scraped[("nsq_sync_published_messages_total", ok)] == 9
    assert scraped[("nsq_sync_publish_duration_seconds_count", (("topic", nsq_topic),))] == 8

    # the held messages are finished; then nsqd restarts (its counters start again from 0)
    app.command("release")
    wait_for(lambda: view()["finished"] == 9 and view()["in_flight"] == 0, "released")
    wait_for(lambda: value("nsq_sync_in_flight") == 0, "in flight 0 scraped")
    before = view()
    nsqd.restart()
    wait_for(lambda: view().get("clients") == 1, "the consumer reconnected")
    wait_for(lambda: value("nsq_sync_connections") == 1, "connections 1 again")
    # the producer's connection closed with the restart: its next publish raises (counted as
    # an error), the app tries again
    errors = app.command("publish ok 3")
    wait_for(lambda: view()["finished"] == 3, "3 more finished at nsqd")
    wait_for(lambda: value("nsq_sync_messages_finished_total") == 12, "finished scraped")
    after = view()
    scraped = app.scrape()
    for name, key in [
        ("nsq_sync_messages_received_total", "received"),
        ("nsq_sync_messages_finished_total", "finished"),
        ("nsq_sync_messages_requeued_total", "requeued"),
    ]:
        assert scraped[(name, sub)] == before[key] + after[key], name
    assert scraped[("nsq_sync_in_flight", sub)] == after["in_flight"] == 0
    assert scraped[("nsq_sync_rdy", sub)] == after["rdy"]
    assert scraped[("nsq_sync_published_messages_total", ok)] == 12
    error = (("outcome", "error"), ("topic", nsq_topic))
    assert errors >= 1
    assert scraped[("nsq_sync_published_messages_total", error)] == errors
