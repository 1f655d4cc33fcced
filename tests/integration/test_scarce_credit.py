"""Scarce credit follows the data on real nsqds (issue 25): max_in_flight below the number of
nsqds, a 10 ms handler, and the longest time with nothing consumed while some nsqd holds
messages stays under a second (it was 5-12 s: credit sat on an nsqd that had nothing until a
blind redistribution every few seconds).

The gap is measured from the moment every message is on its nsqd (published before the
consumer starts, or once the consumer's credit sits where the case wants it) over the
handler's start times, to the last message. Bounded like test_consumer.py: deadline polls, no
fixed sleeps, a watchdog per test; runs under threads and under gevent
(``python tests/run_gevent.py``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.nsq import bounded, connected_addresses, settled_channel
from support.nsq import wait_for as _wait_for

from nsq_sync import Consumer, LookupdClient, Message, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
CHANNEL = "ch"
BACKLOG = 150  # on nsqd A: 1.5 s of 10 ms handlers, longer than a hop, shorter than a rotation
#: the issue says "under ~1 s"; a hop is unproductive_after (0.5 s) plus a round trip
LONGEST_GAP = 1.0

wait_for = functools.partial(_wait_for, timeout=TIMEOUT, interval=0.01)


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


class Timed:
    """A 10 ms handler that records when each message's handling began, and where from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[float] = []
        self.origins: Counter[str] = Counter()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.starts.append(time.monotonic())
            self.origins[message.nsqd_address] += 1
        time.sleep(0.01)

    @property
    def handled(self) -> int:
        with self.lock:
            return len(self.starts)

    def longest_gap(self, since: float) -> float:
        """The longest time without a message starting, from ``since`` to the last one."""
        with self.lock:
            times = [since, *sorted(t for t in self.starts if t >= since)]
        return max(b - a for a, b in zip(times, times[1:]))


def prepare(nsqd: NsqdProcess, topic: str) -> NsqdHTTPClient:
    client = NsqdHTTPClient(nsqd.http_url)
    client.create_topic(topic)
    client.create_channel(topic, CHANNEL)
    return client


def publish(client: NsqdHTTPClient, topic: str, n: int) -> None:
    if n:
        client.mpub(topic, [b"m%d" % i for i in range(n)])


def holders(consumer: Consumer) -> list[str]:
    return [c.address for c in consumer.stats().connections if c.rdy > 0]


def consume_all(consumer: Consumer, handler: Timed, total: int, since: float) -> float:
    consumer.start()
    wait_for(lambda: handler.handled >= total, f"all {total} messages handled")
    return handler.longest_gap(since)


@pytest.mark.parametrize("holder_has", [1, BACKLOG], ids=["credit-on-B-first", "credit-on-A-first"])
def test_one_credit_over_two_nsqds_follows_the_messages(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
    holder_has: int,
) -> None:
    """max_in_flight 1 over two nsqds given directly; the nsqd holding the credit gets 1
    message (B) or the backlog (A), the other one the rest. Before: B kept the credit for 10 s
    after its message while A held 300; or A's backlog was consumed and B's message then waited
    for the next redistribution (~12 s)."""
    nsqds = [nsqd_factory(), nsqd_factory()]
    clients = {n.tcp_address: prepare(n, nsq_topic) for n in nsqds}
    handler = Timed()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=list(clients),
        max_in_flight=1,
    )
    consumer.start()
    wait_for(lambda: len(connected_addresses(consumer)) == 2, "both nsqds connected")
    # An idle consumer tries each nsqd once (unproductive_after each), then the credit stays
    # put until a probe is due (low_rdy_idle_timeout, 10 s): long enough for the case.
    rdy = consumer._connections.rdy  # (private: which nsqd was found empty when)
    wait_for(
        lambda: (
            len(holders(consumer)) == 1
            and all(rdy.conns[a].released_at > 0 for a in clients if a not in holders(consumer))
        ),
        "the credit to have visited both nsqds",
    )
    (holder,) = holders(consumer)
    (other,) = set(clients) - {holder}
    total = BACKLOG + 1
    since = time.monotonic()
    publish(clients[other], nsq_topic, total - holder_has)
    publish(clients[holder], nsq_topic, holder_has)
    wait_for(lambda: handler.handled >= total, f"all {total} messages handled")
    assert handler.origins == {holder: holder_has, other: total - holder_has}
    gap = handler.longest_gap(since)
    assert gap < LONGEST_GAP, f"nothing consumed for {gap:.2f} s while an nsqd held messages"


def test_one_credit_over_two_nsqds_with_the_messages_there_first(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
) -> None:
    """The issue's run as a new user meets it: A holds the backlog and B 1 message before the
    consumer starts; whichever nsqd the credit lands on first."""
    a, b = nsqd_factory(), nsqd_factory()
    publish(prepare(a, nsq_topic), nsq_topic, BACKLOG)
    publish(prepare(b, nsq_topic), nsq_topic, 1)
    handler = Timed()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[a.tcp_address, b.tcp_address],
        max_in_flight=1,
    )
    since = time.monotonic()
    gap = consume_all(consumer, handler, BACKLOG + 1, since)
    assert handler.origins == {a.tcp_address: BACKLOG, b.tcp_address: 1}
    assert gap < LONGEST_GAP, f"nothing consumed for {gap:.2f} s while an nsqd held messages"


def test_two_credits_over_three_nsqds(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
) -> None:
    """max_in_flight 2 over three nsqds: A holds the backlog, B 1 message, C none."""
    a, b, c = nsqd_factory(), nsqd_factory(), nsqd_factory()
    publish(prepare(a, nsq_topic), nsq_topic, BACKLOG)
    publish(prepare(b, nsq_topic), nsq_topic, 1)
    prepare(c, nsq_topic)
    handler = Timed()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[a.tcp_address, b.tcp_address, c.tcp_address],
        max_in_flight=2,
    )
    since = time.monotonic()
    gap = consume_all(consumer, handler, BACKLOG + 1, since)
    assert handler.origins == {a.tcp_address: BACKLOG, b.tcp_address: 1}
    assert gap < LONGEST_GAP, f"nothing consumed for {gap:.2f} s while an nsqd held messages"
    assert consumer.stats().total_rdy <= 2


def test_one_credit_over_two_nsqds_found_through_lookupd(
    nsq_cluster: Any,
    nsq_topic: str,
    consumers: Callable[..., Consumer],
) -> None:
    """The same through nsqlookupd: the nsqds join as discovery finds them."""
    cluster = nsq_cluster(2)
    a, b = cluster.nsqds
    publish(prepare(a, nsq_topic), nsq_topic, BACKLOG)
    publish(prepare(b, nsq_topic), nsq_topic, 1)
    with LookupdClient(cluster.lookupd.http_url) as lookupd:
        wanted = {a.tcp_address, b.tcp_address}
        wait_for(
            lambda: wanted <= {p.tcp_address for p in lookupd.lookup(nsq_topic)},
            "lookupd to list both nsqds",
        )
    handler = Timed()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=1,
        lookupd_poll_interval=0.5,
        lookupd_poll_jitter=0.2,
    )
    since = time.monotonic()
    gap = consume_all(consumer, handler, BACKLOG + 1, since)
    assert handler.origins == {a.tcp_address: BACKLOG, b.tcp_address: 1}
    assert gap < LONGEST_GAP, f"nothing consumed for {gap:.2f} s while an nsqd held messages"


def test_a_budgeted_run_over_two_nsqds_gets_exactly_its_messages_without_a_stall(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
) -> None:
    """run(max_messages=) with 1 credit over 2 nsqds (A 60 messages, B 1): exactly its
    messages, none delivered beyond them (nsqd requeued nothing), and the credit still follows
    the data: the budget has room for the credit on its way back and the next grant, so a hop
    is no longer than without a budget."""
    a, b = nsqd_factory(), nsqd_factory()
    client_a, client_b = prepare(a, nsq_topic), prepare(b, nsq_topic)
    publish(client_a, nsq_topic, 60)
    publish(client_b, nsq_topic, 1)
    handler = Timed()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[a.tcp_address, b.tcp_address],
        max_in_flight=1,
    )
    since = time.monotonic()
    summary = consumer.run(max_messages=40, timeout=TIMEOUT)
    assert (summary.reason, summary.handled, summary.requeued) == ("max_messages", 40, 0)
    assert consumer.stats().received == 40
    left = [settled_channel(c, nsq_topic, CHANNEL) for c in (client_a, client_b)]
    assert sum(s["depth"] for s in left) == 61 - 40
    assert [(s["in_flight_count"], s["requeue_count"]) for s in left] == [(0, 0), (0, 0)]
    gap = handler.longest_gap(since)
    assert gap < LONGEST_GAP, f"nothing consumed for {gap:.2f} s while an nsqd held messages"
