"""The Consumer discovering nsqds through a real nsqlookupd.

Bounded like test_consumer.py: deadline polls, no fixed sleeps, a watchdog per test; runs under
threads and under gevent (``python tests/run_gevent.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from support.nsq import bounded, connected_addresses
from support.nsq import wait_for as _wait_for

from nsq_sync import Consumer, LookupdClient, Message, NsqdHTTPClient, Producer
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

pytestmark = pytest.mark.integration

T = TypeVar("T")

TIMEOUT = 20.0
WATCHDOG = 120.0
CHANNEL = "ch"
FAST_DISCOVERY = {"lookupd_poll_interval": 0.5, "lookupd_poll_jitter": 0.2}


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    """Bound every test (see support.nsq.bounded)."""
    yield from bounded(WATCHDOG)


# support.nsq.wait_for with this module's longer default timeout and finer polling
wait_for = functools.partial(_wait_for, timeout=TIMEOUT, interval=0.01)


class Recorder:
    """Records (body, nsqd address) of every handled message; thread-safe."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.seen: list[tuple[bytes, str]] = []

    def __call__(self, message: Message) -> None:
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.seen.append((message.body, message.nsqd_address))

    @property
    def handled(self) -> int:
        with self.lock:
            return len(self.seen)

    def by_address(self) -> Counter[str]:
        with self.lock:
            return Counter(address for _, address in self.seen)


def publish(nsqd: NsqdProcess, topic: str, n: int, prefix: str) -> NsqdHTTPClient:
    client = NsqdHTTPClient(nsqd.http_url)
    client.create_topic(topic)
    client.create_channel(topic, CHANNEL)
    client.mpub(topic, [f"{prefix}{i}".encode() for i in range(n)])
    return client


def wait_listed(lookupd: NsqlookupdProcess, topic: str, nsqds: list[NsqdProcess]) -> None:
    """Wait until nsqlookupd lists every one of ``nsqds`` as a producer of ``topic``."""
    wanted = {n.tcp_address for n in nsqds}
    with LookupdClient(lookupd.http_url) as client:
        wait_for(
            lambda: wanted <= {p.tcp_address for p in client.lookup(topic)},
            f"lookupd to list {sorted(wanted)} for {topic}",
        )


def channel(client: NsqdHTTPClient, topic: str) -> dict[str, Any]:
    stats = client.channel_stats(topic, CHANNEL)
    assert stats is not None
    return stats


def drained(client: NsqdHTTPClient, topic: str) -> bool:
    stats = channel(client, topic)
    return stats["depth"] == 0 and stats["in_flight_count"] == 0


# --------------------------------------------------------------------------- discovery


def test_discovers_two_nsqds_and_one_that_joins_later(
    nsq_cluster: Any,
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
) -> None:
    cluster = nsq_cluster(2)
    first, second = cluster.nsqds
    clients = [publish(first, nsq_topic, 20, "a"), publish(second, nsq_topic, 20, "b")]
    wait_listed(cluster.lookupd, nsq_topic, [first, second])

    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=10,
        **FAST_DISCOVERY,
    )
    consumer.start()
    wait_for(lambda: handler.handled == 40, "40 messages from the first two nsqds")
    assert handler.by_address() == {first.tcp_address: 20, second.tcp_address: 20}
    assert connected_addresses(consumer) == sorted([first.tcp_address, second.tcp_address])

    # a third nsqd joins mid-run: the next lookupd poll finds it
    third = nsqd_factory(lookupd=cluster.lookupd)
    clients.append(publish(third, nsq_topic, 15, "c"))
    wait_listed(cluster.lookupd, nsq_topic, [third])
    wait_for(
        lambda: third.tcp_address in connected_addresses(consumer), "a connection to the new nsqd"
    )
    wait_for(lambda: handler.handled == 55, "the new nsqd's messages")
    assert handler.by_address()[third.tcp_address] == 15
    for client in clients:
        wait_for(lambda client=client: drained(client, nsq_topic), "every channel empty")
    assert len({body for body, _ in handler.seen}) == 55


def test_a_topic_created_after_the_consumer_started_is_found_within_seconds(
    nsqd: NsqdProcess,
    nsqlookupd: NsqlookupdProcess,
    nsq_topic: str,
    consumers: Callable[..., Consumer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 39: with the default 60 s poll interval, a consumer started before anything was
    published to its topic got the first message only at the next poll, a minute later. While
    lookupd lists no nsqd, it is now polled from 1 s on (doubling): the message arrives within
    seconds, and the wait was logged at INFO."""
    caplog.set_level(logging.INFO, logger="nsq_sync")
    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=[nsqlookupd.http_address],
        lookupd_poll_interval=60.0,
    )
    consumer.start()

    def waiting() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.INFO and "waiting for it to appear" in r.getMessage()
        ]

    wait_for(waiting, "the INFO line: waiting for the topic")
    assert nsq_topic in waiting()[0] and nsqlookupd.http_address in waiting()[0]
    with Producer(nsqd.tcp_address) as producer:
        producer.publish(nsq_topic, b"first")
    wait_for(lambda: handler.handled == 1, "the first message", timeout=10.0)
    assert handler.seen == [(b"first", nsqd.tcp_address)]
    assert len(waiting()) == 1  # once per wait, not once per poll


def test_max_in_flight_2_over_three_nsqds_never_exceeds_2_ready(
    nsq_cluster: Any, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """max_in_flight < connections: credit rotates between the nsqds (so all are consumed) and
    the RDY the nsqds report never adds up to more than 2.

    A sweep reads the three /stats one after the other, so it is not a snapshot: a RDY that
    moves from nsqd A to nsqd B between the reads of A and B would be counted twice although
    the consumer wrote RDY 0 to A before RDY 1 to B. Each nsqd's value is therefore the smaller
    of two consecutive sweeps; a move is then counted at most once, while any over-grant that
    lasts longer than a sweep (~20 ms) is still seen.
    """
    cluster = nsq_cluster(3)
    per_nsqd = 40
    clients = [publish(n, nsq_topic, per_nsqd, f"n{i}-") for i, n in enumerate(cluster.nsqds)]
    wait_listed(cluster.lookupd, nsq_topic, list(cluster.nsqds))

    handler = Recorder(delay=0.01)  # ~2 s of work: many sweeps, many rotations
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=2,
        rdy_redistribute_interval=0.2,
        low_rdy_idle_timeout=0.5,
        **FAST_DISCOVERY,
    )

    sweeps: list[list[int]] = []
    client_totals: list[int] = []
    stop_sampling = threading.Event()

    def ready(client: NsqdHTTPClient) -> int:
        return sum(c["ready_count"] for c in channel(client, nsq_topic)["clients"])

    def sample() -> None:
        samplers = [NsqdHTTPClient(n.http_url) for n in cluster.nsqds]
        while not stop_sampling.is_set():
            sweeps.append([ready(c) for c in samplers])
            client_totals.append(consumer.stats().total_rdy)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        consumer.start()
        wait_for(lambda: handler.handled == 3 * per_nsqd, "every message from all three nsqds")
        # enough sweeps to say something even where consuming went fast (PyPy once finished
        # after 29): the ones after the last message still check the sum
        wait_for(lambda: len(sweeps) >= 30, "30 sweeps of the three nsqds' RDY")
    finally:
        stop_sampling.set()
        sampler.join(TIMEOUT)

    assert handler.by_address() == {n.tcp_address: per_nsqd for n in cluster.nsqds}
    assert len(sweeps) >= 30, "too few samples to say anything"
    assert any(sum(s) > 0 for s in sweeps), "the sampler never saw any RDY"
    assert max(client_totals) <= 2
    for before, after in zip(sweeps, sweeps[1:]):
        settled = [min(a, b) for a, b in zip(before, after)]
        assert sum(settled) <= 2, (before, after)
    for client in clients:
        wait_for(lambda client=client: drained(client, nsq_topic), "every channel empty")


def test_nsqd_dropped_by_lookupd_keeps_its_live_connection_and_is_not_redialled(
    nsq_cluster: Any,
    nsq_topic: str,
    consumers: Callable[..., Consumer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """lookupd only adds nsqds (as go-nsq): an nsqd that lookupd stops listing (tombstoned)
    keeps its live connection and is consumed; once that connection closes (nsqd stopped), the
    consumer does not dial it again, since no lookupd lists it. (Restarted, it would register
    afresh and lookupd would list it again.)"""
    cluster = nsq_cluster(2)
    kept, dropped = cluster.nsqds
    kept_client = publish(kept, nsq_topic, 10, "k")
    dropped_client = publish(dropped, nsq_topic, 10, "d")
    wait_listed(cluster.lookupd, nsq_topic, [kept, dropped])

    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=4,
        **FAST_DISCOVERY,
    )
    consumer.start()
    wait_for(lambda: handler.handled == 20, "the first 20 messages")

    with LookupdClient(cluster.lookupd.http_url) as lookupd:
        lookupd.tombstone_topic_producer(nsq_topic, dropped.http_address)
        wait_for(
            lambda: dropped.tcp_address not in {p.tcp_address for p in lookupd.lookup(nsq_topic)},
            "lookupd to stop listing the tombstoned nsqd",
        )
    polls = consumer._discovery.polls
    wait_for(lambda: consumer._discovery.polls >= polls + 2, "two lookupd polls")
    assert connected_addresses(consumer) == sorted([kept.tcp_address, dropped.tcp_address])
    dropped_client.mpub(nsq_topic, [b"d-after-%d" % i for i in range(5)])
    wait_for(lambda: handler.handled == 25, "the tombstoned nsqd's new messages")

    dropped.stop()
    wait_for(
        lambda: connected_addresses(consumer) == [kept.tcp_address],
        "the stopped nsqd's connection gone",
    )
    polls = consumer._discovery.polls
    wait_for(lambda: consumer._discovery.polls >= polls + 2, "two more lookupd polls")
    redials = [
        r
        for r in caplog.records
        if "cannot connect to nsqd " + dropped.tcp_address in r.getMessage()
    ]
    assert redials == [], "an nsqd no lookupd lists was dialled again"
    assert connected_addresses(consumer) == [kept.tcp_address]
    kept_client.mpub(nsq_topic, [b"k-after-%d" % i for i in range(10)])
    wait_for(lambda: handler.handled == 35, "the kept nsqd's new messages")
    wait_for(lambda: drained(kept_client, nsq_topic), "the kept channel empty")
    # all of max_in_flight is back on the one nsqd left
    wait_for(
        lambda: [c["ready_count"] for c in channel(kept_client, nsq_topic)["clients"]] == [4],
        "RDY 4 on the remaining nsqd",
    )


def test_lookupd_restart_keeps_every_nsqd_connection(
    nsq_cluster: Any, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Issue 11 item 5: after nsqlookupd restarts it answers 404 TOPIC_NOT_FOUND until nsqd
    re-registers (on nsqd's next ping, up to 15 s later). That is no reason to close a live
    connection: consumption goes on at once (the old code closed every connection and stopped
    consuming until nsqd re-registered)."""
    cluster = nsq_cluster(1)
    [nsqd] = cluster.nsqds
    client = publish(nsqd, nsq_topic, 10, "before")
    wait_listed(cluster.lookupd, nsq_topic, [nsqd])
    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=4,
        **FAST_DISCOVERY,
    )
    consumer.start()
    wait_for(lambda: handler.handled == 10, "the first 10 messages")

    cluster.lookupd.restart()
    with LookupdClient(cluster.lookupd.http_url) as lookupd:
        # nsqd re-registers on its next ping (0-15 s from now): deleting the topic holds the
        # 404 a restarted lookupd answers for the rest of the test, whenever that ping comes
        lookupd.delete_topic(nsq_topic)
        polls = consumer._discovery.polls
        wait_for(lambda: consumer._discovery.polls >= polls + 2, "two polls answering 404")
        assert lookupd.lookup(nsq_topic) == []
    client.mpub(nsq_topic, [b"after%d" % i for i in range(10)])
    wait_for(lambda: handler.handled == 20, "messages published after the restart", timeout=5.0)
    assert connected_addresses(consumer) == [nsqd.tcp_address]
    assert channel(client, nsq_topic)["client_count"] == 1
