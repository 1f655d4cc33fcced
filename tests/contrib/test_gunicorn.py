"""The examples under a REAL gunicorn with --preload and two workers, sync and gevent: requests
spread over both workers publish, every message arrives once (counted at nsqd), each worker
has its own producer connection, and under -k gevent the client runs on gevent."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.nsq import message_count, wait_for
from support.web import EXAMPLE, FLASK_EXAMPLE, Gunicorn, migrated_shop, topic_publishers

from nsq_sync import Consumer, Message
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.testing.process import NsqdProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER_CLASSES = ["sync", "gevent"]
REQUESTS = 40


def _serve(
    app: str,
    cwd: Path,
    env: dict[str, str],
    tmp_path: Path,
    worker_class: str,
    options: tuple[str, ...] = (),
) -> Any:
    log = tmp_path / f"gunicorn-{worker_class}.log"
    server = Gunicorn(app, cwd, env, log, worker_class, options)
    server.wait_ready()
    return server


def _drain(nsqd: NsqdProcess, topic: str, channel: str, n: int) -> list[bytes]:
    """Consume ``n`` messages from ``channel`` (created before publishing); the bodies."""
    bodies: list[bytes] = []

    def handle(message: Message) -> None:
        bodies.append(message.body)

    consumer = Consumer(
        topic, channel, handle, nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=50
    )
    with consumer:
        wait_for(lambda: len(bodies) >= n, f"{n} messages")
        wait_for(lambda: consumer.stats().finished == len(bodies), "every message finished")
    return bodies


def _check_spread_and_connections(
    nsqd: NsqdProcess, topic: str, server: Gunicorn, pids: list[int], expect_master: int = 0
) -> None:
    per_worker = Counter(pids)
    assert set(per_worker) == server.worker_pids, f"not both workers answered: {per_worker}"
    publishers = topic_publishers(nsqd.http_address, topic)
    # one producer connection per worker (plus the master's own, where it published), each
    # with exactly the PUBs of the requests that worker served
    expected = sorted([*per_worker.values(), *([1] * expect_master)])
    assert sorted(publishers.values()) == expected, (publishers, per_worker)


def _expected_runtime(worker_class: str) -> str:
    return "gevent" if worker_class == "gevent" else "threads"


def _serve_and_publish(
    nsqd: NsqdProcess,
    topic: str,
    server: Gunicorn,
    publish: tuple[str, Callable[[int], dict[str, str]]],
    worker_class: str,
) -> list[dict[str, Any]]:
    """Spread publishing requests over both workers; check the connections and the count at
    nsqd, the runtime each worker reports, and a clean stop. The publishing answers."""
    try:
        answers = server.spread(*publish, REQUESTS)
        runtimes = {a["pid"]: a["runtime"] for a in server.spread("/runtime", lambda i: {}, 20)}
        _check_spread_and_connections(nsqd, topic, server, [a["pid"] for a in answers])
        assert message_count(nsqd.http_address, topic) == len(answers)
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    assert set(runtimes.values()) == {_expected_runtime(worker_class)}, runtimes
    return answers


def _check_channel(nsqd: NsqdProcess, topic: str) -> None:
    """A channel that keeps every message published from now on."""
    with NsqdHTTPClient(nsqd.http_address) as http:
        http.create_topic(topic)
        http.create_channel(topic, "check")


@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_flask_example(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str, worker_class: str
) -> None:
    _check_channel(nsqd, nsq_topic)
    env = dict(os.environ, NSQD_TCP_ADDRESSES=nsqd.tcp_address, EVENTS_TOPIC=nsq_topic)
    server = _serve("app:app", FLASK_EXAMPLE, env, tmp_path, worker_class)
    publish = ("/publish", lambda i: {"body": f"event {i}"})
    answers = _serve_and_publish(nsqd, nsq_topic, server, publish, worker_class)
    received = _drain(nsqd, nsq_topic, "check", len(answers))
    assert sorted(received) == sorted(b"event %d" % i for i in range(len(answers)))  # each once


@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_django_example(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str, worker_class: str
) -> None:
    _check_channel(nsqd, nsq_topic)
    _, env = migrated_shop(tmp_path, NSQD_TCP_ADDRESSES=nsqd.tcp_address, ORDERS_TOPIC=nsq_topic)
    # Django's own thread-locals need the master patched under gevent (see gunicorn_gevent.py)
    options = ("-c", "gunicorn_gevent.py") if worker_class == "gevent" else ()
    server = _serve("shop_site.wsgi", EXAMPLE, env, tmp_path, worker_class, options)
    publish = ("/orders", lambda i: {"item": f"item {i}"})
    answers = _serve_and_publish(nsqd, nsq_topic, server, publish, worker_class)
    received = [json.loads(b)["order_id"] for b in _drain(nsqd, nsq_topic, "check", len(answers))]
    assert sorted(received) == sorted(a["order_id"] for a in answers)  # each exactly once


def test_producer_made_in_the_master_runs_on_gevent_in_gevent_workers(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """A plain Producer made and used at import time in the --preload master (threads there)
    decides again in each -k gevent worker, at its first publish there."""
    support = Path(__file__).resolve().parents[1] / "support"
    env = dict(os.environ, NSQD_TCP_ADDRESSES=nsqd.tcp_address, TOPIC=nsq_topic)
    server = _serve("preload_app:app", support, env, tmp_path, "gevent")
    try:
        answers = server.spread("/publish", lambda i: {"body": f"m{i}"}, REQUESTS)
        _check_spread_and_connections(
            nsqd, nsq_topic, server, [a["pid"] for a in answers], expect_master=1
        )
        assert message_count(nsqd.http_address, nsq_topic) == len(answers) + 1
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    assert {(a["master"], a["runtime"]) for a in answers} == {("threads", "gevent")}
