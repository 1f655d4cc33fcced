"""Consumer lifecycle faults against real nsqd/nsqlookupd: nsqlookupd restarted mid-consumption,
and stop() called from inside a handler under load (issue 11, items 5 and 7).

Every published message has a unique body and every handled one is counted ("0 lost" is checked
body by body; duplicates are at-least-once redeliveries). Figures go to ``record_property`` (see
conftest.py for the summary). Waits poll against deadlines; nothing sleeps a fixed time except the
publisher's pacing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.nsq import connected_addresses, settled_channel

from nsq_sync import Consumer, LookupdClient, Message, NsqdHTTPClient

from .helpers import (
    CHANNEL,
    Tally,
    channel_if_drained,
    http,
    make_bodies,
    publish_http,
    record_figures,
    scaled,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Consumers = Callable[..., Consumer]


class Paced:
    """Publishes ``bodies`` to ``http_urls`` in turn, ``batch`` at a time every ``interval``
    seconds, on a thread (bounded by the number of bodies)."""

    def __init__(
        self, http_urls: list[str], topic: str, bodies: list[bytes], batch: int, interval: float
    ) -> None:
        self.urls = http_urls
        self.topic = topic
        self.bodies = bodies
        self.batch = batch
        self.interval = interval
        self.sent = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        clients = [NsqdHTTPClient(url, timeout=5.0) for url in self.urls]
        try:
            for i, start in enumerate(range(0, len(self.bodies), self.batch)):
                chunk = self.bodies[start : start + self.batch]
                clients[i % len(clients)].mpub(self.topic, chunk)
                self.sent += len(chunk)
                time.sleep(self.interval)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            for client in clients:
                client.close()


def test_lookupd_restarted_mid_consumption_keeps_every_connection(
    nsq_cluster: Any, nsq_topic: str, consumers: Consumers, record_property: Any
) -> None:
    """nsqlookupd is restarted twice (same ports) while two nsqds it lists are consumed. A
    restarted lookupd answers 404 until each nsqd re-registers on its next ping (up to 15 s):
    the consumer keeps its connections throughout (lookupd only adds nsqds), so consumption
    never pauses. Figures: messages, lost, duplicates, connections closed, the longest gap
    between two handled messages from the first restart until everything was handled.

    nsqd flags: none; nsqlookupd flags: none.
    """
    cluster = nsq_cluster(2)
    urls = [n.http_url for n in cluster.nsqds]
    for url in urls:
        publish_http(url, nsq_topic, make_bodies(1, f"warmup-{url[-5:]}"))
    with LookupdClient(cluster.lookupd.http_url) as lookupd:
        wait_for(lambda: len(lookupd.lookup(nsq_topic)) == 2, "lookupd to list both nsqds")
    published = [b for url in urls for b in make_bodies(1, f"warmup-{url[-5:]}")]

    handled_at: list[float] = []
    tally = Tally(lambda m: handled_at.append(time.monotonic()))
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        tally,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=20,
        lookupd_poll_interval=0.5,
        lookupd_poll_jitter=0.1,
        lookupd_http_timeout=1.0,
    )
    consumer.start()
    wait_for(lambda: tally.covers(published), "the warm-up messages")
    expected = sorted(n.tcp_address for n in cluster.nsqds)
    assert connected_addresses(consumer) == expected
    before = {id(c) for c in consumer._connections.conns.values()}

    bodies = make_bodies(scaled(6000), "paced")
    publisher = Paced(urls, nsq_topic, bodies, batch=20, interval=0.02)
    publisher.thread.start()
    wait_for(lambda: publisher.sent >= len(bodies) // 4, "a quarter published")
    t_first = time.monotonic()
    restarts = 0
    for _ in range(2):
        polls = consumer._discovery.polls
        cluster.lookupd.restart()
        restarts += 1
        wait_for(lambda: consumer._discovery.polls >= polls + 3, "three polls after the restart")  # noqa: B023
        assert connected_addresses(consumer) == expected
    publisher.thread.join(120.0)
    assert publisher.error is None, publisher.error
    published += bodies
    wait_for(lambda: tally.covers(published), f"all {len(published)} messages", 60.0)
    for url in urls:
        wait_for(lambda url=url: channel_if_drained(url, nsq_topic), "channels empty")
    # from the first restart until the last message was handled (after publishing ended the
    # backlog drains, so a stall shows as one long gap wherever it fell)
    window = [t_first, *sorted(t for t in handled_at if t >= t_first)]
    gap = max(b - a for a, b in zip(window, window[1:]))
    closed = len(before - {id(c) for c in consumer._connections.conns.values()})
    lost = tally.lost(published)
    record_figures(
        record_property,
        messages=len(published),
        handled=tally.handled,
        faults=restarts,
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=gap,
        connections_closed=closed,
    )
    assert lost == []
    assert closed == 0
    # publishing paces 20 messages per ~20 ms: a gap of seconds would be the old stall
    assert gap < 5.0, gap


def test_stop_from_a_handler_under_load_loses_nothing(
    nsqd: Any, nsq_topic: str, consumers: Consumers, record_property: Any
) -> None:
    """A handler calls stop() in the middle of a backlog (max_in_flight 50, 4 workers): run()
    (main thread) returns, every message the first consumer got is FINed or requeued (nothing
    stays in flight at nsqd until msg_timeout), and a second consumer drains the rest. Figures:
    messages, lost, duplicates, and the time from the handler's stop() to run() returning.
    """
    n = scaled(5000)
    bodies = make_bodies(n, "s")
    publish_http(nsqd.http_url, nsq_topic, bodies)
    stop_after = n // 3
    marks: dict[str, float] = {}
    lock = threading.Lock()
    count = [0]
    consumer: Consumer

    def handler(message: Message) -> None:
        with lock:
            count[0] += 1
            trigger = count[0] == stop_after
        if trigger:
            marks["stop"] = time.monotonic()
            marks["stop_returned"] = float(consumer.stop(timeout=10.0))

    tally = Tally(handler)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        tally,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=50,
        concurrency=4,
    )
    consumer.run()
    stopped_s = time.monotonic() - marks["stop"]
    first = tally.handled
    # nsqd reads the last FINs/REQs (then the close) a moment after run() returned
    with http(nsqd.http_url) as client:
        stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["in_flight_count"] == 0 and stats["client_count"] == 0, stats
    assert stats["timeout_count"] == 0, stats

    second = consumers(
        nsq_topic, CHANNEL, tally, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=50
    )
    second.start()
    wait_for(lambda: tally.covers(bodies), f"all {n} messages", 60.0)
    wait_for(lambda: channel_if_drained(nsqd.http_url, nsq_topic), "channel empty")
    assert second.stop(timeout=10.0) is True
    lost = tally.lost(bodies)
    record_figures(
        record_property,
        messages=n,
        handled=tally.handled,
        handled_before_stop=first,
        faults=1,
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=stopped_s,
    )
    assert lost == []
    assert tally.duplicates() == 0  # every answer reached nsqd before the connection closed
