"""Prometheus' multiprocess mode under a REAL gunicorn --preload -w 2: metrics enabled and the
Producer made in the master; the scraped totals equal the sum of what both workers (and the
master) published, as nsqd counted it."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from support.nsq import message_count
from support.web import Gunicorn

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS = 40


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_multiprocess_totals_are_the_sum_of_both_workers(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    support = Path(__file__).resolve().parents[1] / "support"
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = dict(
        os.environ,
        NSQD_TCP_ADDRESSES=nsqd.tcp_address,
        TOPIC=nsq_topic,
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
    )
    server = Gunicorn("metrics_preload_app:app", support, env, tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        answers = server.spread("/publish", lambda i: {"body": f"m{i}"}, REQUESTS)
        per_worker = Counter(a["pid"] for a in answers)
        assert set(per_worker) == server.worker_pids, f"not both workers answered: {per_worker}"
        # each worker wrote its own values (a file per pid), the master its one publish
        files = {p.name for p in multiproc.iterdir() if p.name.startswith("counter_")}
        assert {f"counter_{pid}.db" for pid in server.worker_pids} <= files
        text = requests.get(server.url + "/metrics", timeout=30).text
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    published = len(answers) + 1  # and the master's
    assert message_count(nsqd.http_address, nsq_topic) == published
    samples = _samples(text)
    assert (
        samples[("nsq_sync_published_messages_total", (("outcome", "ok"), ("topic", nsq_topic)))]
        == published
    )
    assert (
        samples.get(
            ("nsq_sync_published_messages_total", (("outcome", "error"), ("topic", nsq_topic))), 0
        )
        == 0
    )
    assert (
        samples[("nsq_sync_publish_duration_seconds_count", (("topic", nsq_topic),))] == published
    )
