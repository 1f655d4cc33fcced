"""nsq_sync under a REAL uWSGI (``pip install uwsgi``) with the defaults most Django and Flask
deployments keep: ``--master --processes 2``, the app loaded once in the master, the workers
forked from C, where Python's fork hooks do not run (no ``--lazy-apps``, no
``--py-call-osafterfork``). Each app publishes at import, in the master, so the master holds a
live connection when it forks; then requests spread over both workers publish.

Checked against a real nsqd: every request succeeds, nsqd holds every body exactly once (and
the master's), and while uWSGI runs nsqd lists one producer connection per process (the
master's and one per worker: before issue 24 the workers shared the master's).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.nsq import in_ci, read_bodies, wait_for
from support.web import (
    EXAMPLE,
    FLASK_EXAMPLE,
    Uwsgi,
    channel_stats,
    migrated_shop,
    topic_publishers,
    uwsgi_binary,
)

from nsq_sync import Consumer
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.testing.process import NsqdProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APPS = Path(__file__).resolve().parents[1] / "support" / "uwsgi_apps"
REQUESTS = 200
CLIENTS = 8
THREADS = [pytest.param((), id="processes"), pytest.param(("--threads", "8"), id="threads-8")]


@pytest.fixture(autouse=True)
def _uwsgi_installed() -> None:
    if uwsgi_binary() is None:
        if in_ci():
            pytest.fail("CI run of the uWSGI tests without uwsgi (tox.ini installs it)")
        pytest.skip("uwsgi is not installed (pip install uwsgi)")


def _serve(
    module: str, paths: list[Path], env: dict[str, str], tmp_path: Path, options: Any
) -> Uwsgi:
    env = {k: v for k, v in env.items() if k != "NSQ_SYNC_TEST_RUNTIME"}
    server = Uwsgi(module, [APPS, *paths], env, tmp_path / "uwsgi.log", tuple(options))
    server.wait_ready()
    return server


def _publish_and_check(
    nsqd: NsqdProcess,
    topic: str,
    server: Uwsgi,
    path: str,
    params: Any,
    master_bodies: int = 1,
) -> list[dict[str, Any]]:
    """200 requests from 8 clients; every one answered 200 by one of both workers; nsqd lists
    the master's connection and one per worker while uWSGI runs; uWSGI stops cleanly."""
    try:
        answers = server.spread(path, params, REQUESTS, clients=CLIENTS)
        per_worker = Counter(a["pid"] for a in answers)
        assert set(per_worker) == server.worker_pids, f"not both workers answered: {per_worker}"
        publishers = topic_publishers(nsqd.http_address, topic)
        expected = sorted([*per_worker.values(), master_bodies])
        assert sorted(publishers.values()) == expected, (publishers, per_worker)
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    return answers


def _held(nsqd: NsqdProcess, topic: str) -> Counter[bytes]:
    return read_bodies(nsqd.tcp_address, nsqd.http_address, topic, timeout=60.0)


@pytest.mark.parametrize("options", THREADS)
def test_flask_extension_under_uwsgi(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str, options: Any
) -> None:
    env = dict(os.environ, NSQD_TCP_ADDRESSES=nsqd.tcp_address, EVENTS_TOPIC=nsq_topic)
    server = _serve("flask_warm:app", [FLASK_EXAMPLE], env, tmp_path, options)
    answers = _publish_and_check(
        nsqd, nsq_topic, server, "/publish", lambda i: {"body": f"event {i}"}
    )
    held = _held(nsqd, nsq_topic)
    assert [b for b in held if b.startswith(b"master ")] != [], "the master's publish is lost"
    events = {b: n for b, n in held.items() if not b.startswith(b"master ")}
    assert events == {b"event %d" % i: 1 for i in range(len(answers))}


@pytest.mark.parametrize("options", THREADS)
def test_django_integration_under_uwsgi(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str, options: Any
) -> None:
    _, env = migrated_shop(tmp_path, NSQD_TCP_ADDRESSES=nsqd.tcp_address, ORDERS_TOPIC=nsq_topic)
    server = _serve("django_warm:application", [EXAMPLE], env, tmp_path, options)
    answers = _publish_and_check(
        nsqd, nsq_topic, server, "/orders", lambda i: {"item": f"item {i}"}
    )
    held = _held(nsqd, nsq_topic)
    assert sum(1 for b in held if b.startswith(b"master ")) == 1, "the master's publish"
    orders = Counter(b for b in held if not b.startswith(b"master "))
    assert len(orders) == len(answers) and max(orders.values()) == 1  # each order once


@pytest.mark.parametrize("options", THREADS)
def test_module_level_producer_and_http_client_under_uwsgi(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str, options: Any
) -> None:
    """A bare module-level Producer (TCP) and NsqdHTTPClient, both used in the master: half of
    the requests publish over each."""
    env = dict(
        os.environ,
        NSQD_TCP_ADDRESS=nsqd.tcp_address,
        NSQD_HTTP_ADDRESS=nsqd.http_address,
        NSQ_TOPIC=nsq_topic,
    )
    server = _serve("bare:app", [], env, tmp_path, options)
    try:
        tcp = server.spread(
            "/publish", lambda i: {"body": f"tcp {i}"}, REQUESTS // 2, clients=CLIENTS
        )
        http = server.spread(
            "/http-publish", lambda i: {"body": f"http {i}"}, REQUESTS // 2, clients=CLIENTS
        )
        for answers in (tcp, http):
            assert {a["pid"] for a in answers} == server.worker_pids, answers[:3]
            # nsq_sync's uWSGI post-fork hook noticed the fork before the worker served anything
            assert {a["noticed"] for a in answers} == {1}, answers[:3]
        per_worker = Counter(a["pid"] for a in tcp)
        publishers = topic_publishers(nsqd.http_address, nsq_topic)
        assert sorted(publishers.values()) == sorted([*per_worker.values(), 1]), publishers
    finally:
        status = server.stop()
    assert status == 0, server.log_text()
    held = _held(nsqd, nsq_topic)
    expected = {b"tcp %d" % i for i in range(len(tcp))} | {b"http %d" % i for i in range(len(http))}
    assert {b: n for b, n in held.items() if not b.startswith(b"master ")} == dict.fromkeys(
        expected, 1
    )
    assert sorted(b.split()[1] for b in held if b.startswith(b"master ")) == [b"http", b"tcp"]


def test_a_consumer_per_worker_started_in_postfork(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """The recipe of docs/uwsgi.md: a Consumer started in each worker by a
    ``uwsgidecorators.postfork`` function and stopped by ``uwsgi.atexit``. Both workers consume
    (10 ms a message); SIGTERM to uWSGI (``--die-on-term``) mid-stream: afterwards nothing is in
    flight at nsqd, and every message was either handled once (and finished) or is back in the
    channel, never both."""
    handled = tmp_path / "handled.txt"

    def lines() -> list[bytes]:
        return handled.read_bytes().splitlines() if handled.exists() else []

    with NsqdHTTPClient(nsqd.http_address) as http:
        http.create_topic(nsq_topic)
        http.create_channel(nsq_topic, "workers")
        env = dict(
            os.environ,
            NSQD_TCP_ADDRESS=nsqd.tcp_address,
            NSQ_TOPIC=nsq_topic,
            HANDLED_FILE=str(handled),
            HANDLE_SECONDS="0.01",
        )
        server = _serve("consumer:app", [], env, tmp_path, ())
        try:
            wait_for(
                lambda: len(channel_stats(nsqd.http_address, nsq_topic, "workers")["clients"]) == 2,
                "both workers' consumers connected",
                timeout=30.0,
            )
            bodies = [b"m%d" % i for i in range(2000)]
            for i in range(0, len(bodies), 500):
                http.mpub(nsq_topic, bodies[i : i + 500])

            def both_consuming() -> bool:
                return len({line.split()[0] for line in lines()}) == 2 and len(lines()) >= 100

            wait_for(both_consuming, "both workers handling messages", timeout=60.0)
        finally:
            status = server.stop()
        assert status == 0, server.log_text()
    done = Counter(line.split()[1] for line in lines())
    assert max(done.values()) == 1, [b for b, n in done.items() if n > 1][:5]
    assert {int(line.split()[0]) for line in lines()} == server.worker_pids
    # uwsgi.atexit stopped both consumers: every message answered, their connections closed
    channel = wait_for(
        lambda: (
            (c := channel_stats(nsqd.http_address, nsq_topic, "workers"))["clients"] == [] and c
        ),
        "both consumers' connections closed",
    )
    assert channel["in_flight_count"] == 0, channel
    assert channel["depth"] == len(bodies) - len(done), (channel, len(done))
    assert len(done) < len(bodies), "stopped too late to show anything: all were handled"
    # the rest, back in the channel, are exactly the messages no worker handled
    rest: list[bytes] = []
    drain = Consumer(
        nsq_topic, "workers", lambda m: rest.append(m.body),
        nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=200,
    )  # fmt: skip
    summary = drain.run(timeout=60.0, max_messages=channel["depth"])
    assert summary.reason == "max_messages", summary
    assert Counter(rest) == dict.fromkeys(set(bodies) - set(done), 1)
