"""Consumer lifecycle against a real nsqd: stop() from a handler, concurrent stop() calls, a
handler raising SystemExit, a hung lookupd, FINs nsqd rejects, and answers racing the worker.

Regression tests for issue 11 (items 6-10 and the suspected answer race). Bounded like
test_consumer.py: deadline polls, no fixed sleeps, a watchdog per test; runs under threads and
under gevent (``python tests/run_gevent.py``).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.fake_nsqd import FakeNsqd
from support.fault_proxy import FaultProxy
from support.nsq import bounded, connected_addresses, raise_like_a_time_limit, settled_channel
from support.nsq import wait_for as _wait_for

from nsq_sync import Consumer, Message, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
CHANNEL = "ch"

wait_for = functools.partial(_wait_for, timeout=TIMEOUT, interval=0.01)


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


def prepare(nsqd: NsqdProcess, topic: str, n: int = 0) -> NsqdHTTPClient:
    client = NsqdHTTPClient(nsqd.http_url)
    client.create_topic(topic)
    client.create_channel(topic, CHANNEL)
    if n:
        client.mpub(topic, [b"m%d" % i for i in range(n)])
    return client


def channel(client: NsqdHTTPClient, topic: str) -> dict[str, Any]:
    stats = client.channel_stats(topic, CHANNEL)
    assert stats is not None
    return stats


def consumer_tasks(topic: str) -> list[str]:
    """Names of this topic's consumer threads still alive (threads runtime only: greenlets are
    not threads)."""
    return [
        t.name for t in threading.enumerate() if t.name.startswith("nsq_sync-") and topic in t.name
    ]


def gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("socket"))


# --------------------------------------------------------------------------- stop from a handler


def test_stop_from_a_handler_finishes_its_message_and_run_returns(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Issue 11 item 7: a handler calls stop(). No exception; the message is FINed when the
    handler returns; run() (main thread) returns; no task, thread or connection is left."""
    client = prepare(nsqd, nsq_topic, 1)
    outcome: dict[str, Any] = {}
    consumer: Consumer

    def handler(message: Message) -> None:
        try:
            outcome["stop"] = consumer.stop(timeout=10.0)
        except BaseException as exc:  # the old code raised RuntimeError here
            outcome["error"] = exc
            raise

    consumer = consumers(nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address)
    started = time.monotonic()
    consumer.run()  # returns once fully stopped
    elapsed = time.monotonic() - started
    assert "error" not in outcome, outcome
    assert outcome["stop"] is False  # documented: the handler cannot wait for itself
    # nsqd reads the last FIN (then the close) a moment after run() returned
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert stats["message_count"] == 1
    assert consumer.stats().finished == 1
    assert connected_addresses(consumer) == []
    wait_for(
        lambda: channel(client, nsq_topic)["client_count"] == 0, "nsqd to see the client leave"
    )
    if not gevent_patched():
        wait_for(lambda: not consumer_tasks(nsq_topic), "every consumer thread to end", timeout=5.0)
    assert consumer.stop(timeout=1.0) is True
    assert elapsed < 10.0, f"run() took {elapsed:.1f} s"  # the old code waited out the timeout


def test_concurrent_stop_calls_each_wait_for_the_stop(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Issue 11 item 9: while a handler runs, a second stop() with a short timeout returns False
    (not stopped yet) instead of True at once; once the handler returns, every stop() returns
    True, and only when the consumer has stopped."""
    client = prepare(nsqd, nsq_topic, 1)
    entered = threading.Event()
    release = threading.Event()

    def handler(message: Message) -> None:
        entered.set()
        release.wait(TIMEOUT)

    consumer = consumers(nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address)
    consumer.start()
    assert entered.wait(TIMEOUT)
    results: list[bool] = []
    first = threading.Thread(target=lambda: results.append(consumer.stop(timeout=15.0)))
    first.start()
    wait_for(lambda: channel(client, nsq_topic)["clients"][0]["ready_count"] == 0, "RDY 0 at nsqd")
    assert consumer.stop(timeout=0.3) is False  # the old code returned True here
    assert first.is_alive()
    release.set()
    first.join(TIMEOUT)
    assert results == [True]
    assert consumer.stop(timeout=1.0) is True
    assert connected_addresses(consumer) == []
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["requeue_count"] == 0


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_handler_raising_system_exit_requeues_stops_and_run_reraises(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer], exc_type: type
) -> None:
    """Issue 11 item 8: SystemExit/KeyboardInterrupt from a handler requeues that message, stops
    the consumer gracefully, and run() re-raises it in the thread that called run()."""
    client = prepare(nsqd, nsq_topic, 5)
    calls: list[bytes] = []

    def handler(message: Message) -> None:
        calls.append(message.body)
        raise exc_type(3)

    consumer = consumers(
        nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=5
    )
    raised: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:
            raised.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(TIMEOUT)
    assert not runner.is_alive(), "run() did not return (the old code never did)"
    assert len(raised) == 1 and type(raised[0]) is exc_type, raised
    assert len(calls) == 1  # the messages queued behind it were requeued, not handled
    wait_for(lambda: channel(client, nsq_topic)["client_count"] == 0, "the consumer disconnected")
    stats = channel(client, nsq_topic)
    assert stats["in_flight_count"] == 0 and stats["timeout_count"] == 0
    assert stats["depth"] == 5  # everything back in the queue: nothing lost, nothing finished
    assert consumer.stats().finished == 0
    if not gevent_patched():
        wait_for(lambda: not consumer_tasks(nsq_topic), "every consumer thread to end", timeout=5.0)


def test_a_handler_raising_another_base_exception_fails_that_message_only(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """A handler raising a BaseException other than SystemExit, KeyboardInterrupt or
    GreenletExit (typically a gevent.Timeout) fails that message as an exception would: it is
    requeued, and the only worker goes on. Before, the worker ended: with concurrency 1 the
    consumer stayed connected and consumed nothing more, its messages in flight at nsqd."""
    client = prepare(nsqd, nsq_topic, 5)
    handled: list[bytes] = []

    def handler(message: Message) -> None:
        if message.attempts == 1:
            raise_like_a_time_limit()
        handled.append(message.body)

    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=5,
        concurrency=1,
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
    )
    consumer.start()
    wait_for(lambda: len(handled) == 5, "every message handled on its second attempt")
    assert consumer.stop(TIMEOUT)
    assert consumer.stats().failed == 5
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert stats["requeue_count"] == 5 and stats["timeout_count"] == 0


def test_a_giving_up_handler_raising_any_base_exception_requeues_the_message(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """max_attempts 1 and a handler that always fails: each message goes to the giving_up
    handler, which raises (a gevent.Timeout, or another BaseException) the first time it sees
    a message. The message is requeued, not left in flight until nsqd's timeout (before, it
    stayed in flight and stop() waited out its whole timeout), and given up on redelivery."""
    client = prepare(nsqd, nsq_topic, 3)
    seen: set[bytes] = set()
    given_up: list[bytes] = []

    def handler(message: Message) -> None:
        raise ValueError("always")

    def giving_up(message: Message) -> None:
        if message.body not in seen:
            seen.add(message.body)
            raise_like_a_time_limit()
        given_up.append(message.body)

    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=3,
        concurrency=1,
        max_attempts=1,
        giving_up=giving_up,
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
    )
    consumer.start()
    wait_for(lambda: len(given_up) == 3, "every message given up on its second delivery")
    assert sorted(given_up) == sorted(seen)
    started = time.monotonic()
    assert consumer.stop(TIMEOUT)
    assert time.monotonic() - started < 5.0
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["timeout_count"] == 0


def test_an_nsqd_dialled_while_connected_keeps_one_connection_and_its_credit(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Discovery dials only what is neither connected nor connecting; should a second dial of a
    connected nsqd ever happen, the new connection is closed and the first keeps its RDY (it
    used to replace the first in the set, orphaned it, and counted its credit twice: with
    max_in_flight 1 the new connection never got RDY 1). Forced by dialling directly."""
    client = prepare(nsqd, nsq_topic)
    handled: list[bytes] = []
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        lambda m: handled.append(m.body),
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=1,
    )
    consumer.start()
    wait_for(lambda: channel(client, nsq_topic)["client_count"] == 1, "the consumer connected")
    consumer._connections._connect(nsqd.tcp_address)  # returns once nsqd has the new one subscribed
    wait_for(lambda: channel(client, nsq_topic)["client_count"] == 1, "the new connection closed")
    client.pub(nsq_topic, b"after")
    wait_for(lambda: handled == [b"after"], "the message handled on the first connection")
    assert consumer.stop(TIMEOUT)
    wait_for(lambda: channel(client, nsq_topic)["client_count"] == 0, "every connection closed")


# --------------------------------------------------------------------------- hung lookupd


def test_hung_lookupd_delays_neither_direct_nsqds_nor_stop(
    nsqd: NsqdProcess, nsqlookupd: Any, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Issue 11 item 6: with a lookupd that accepts and never answers (lookupd_http_timeout
    20 s), the direct nsqd's message is handled and stop() returns long before the query could
    time out (the old code waited the full query before dialling, and stop() waited for it)."""
    prepare(nsqd, nsq_topic, 1)
    handled = threading.Event()
    with FaultProxy(nsqlookupd.http_address) as proxy:
        proxy.stall()
        consumer = consumers(
            nsq_topic,
            CHANNEL,
            lambda m: handled.set(),
            nsqd_tcp_addresses=nsqd.tcp_address,
            lookupd_http_addresses=f"http://{proxy.address}",
            lookupd_http_timeout=20.0,
        )
        started = time.monotonic()
        consumer.start()
        assert handled.wait(TIMEOUT)
        first_message_s = time.monotonic() - started
        wait_for(lambda: proxy.accepted >= 1, "the lookupd query to hang")
        started = time.monotonic()
        assert consumer.stop(timeout=15.0) is True
        stop_s = time.monotonic() - started
    # bounds far from the 20 s query and the 15 s stop budget the old code used up
    assert first_message_s < 10.0, first_message_s
    assert stop_s < 5.0, stop_s


# --------------------------------------------------------------------------- counters


def test_fin_rejected_by_nsqd_is_not_counted_as_finished(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Issue 11 item 10: a handler outlives msg_timeout; nsqd times the message out and answers
    its FIN with E_FIN_FAILED. stats().finished counts only the redelivery's FIN."""
    client = prepare(nsqd, nsq_topic, 1)
    timed_out = threading.Event()
    attempts: list[int] = []

    def handler(message: Message) -> None:
        attempts.append(message.attempts)
        if message.attempts == 1:
            assert timed_out.wait(TIMEOUT)

    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        msg_timeout=1.0,
        max_in_flight=2,
        concurrency=2,
        default_requeue_delay=0,
    )
    consumer.start()
    wait_for(
        lambda: channel(client, nsq_topic)["timeout_count"] == 1, "nsqd to time the message out"
    )
    timed_out.set()
    wait_for(lambda: attempts == [1, 2] or attempts == [2, 1], "the redelivery handled")
    wait_for(lambda: channel(client, nsq_topic)["in_flight_count"] == 0, "nothing in flight")

    def settled() -> bool:
        # the rejected FIN's E_FIN_FAILED has been read once finished + rejections settle
        return consumer.stats().finished == 1

    wait_for(settled, "finished == 1 (the rejected FIN uncounted)", timeout=5.0)
    assert consumer.stop(timeout=5.0) is True
    assert consumer.stats().finished == 1


# --------------------------------------------------------------------------- answer race


def test_application_thread_answer_racing_the_worker_answers_once(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Suspected in issue 11: a handler hands its message to an application thread that
    requeues it while the handler returns (the worker then FINs it). Exactly one answer may go
    out per message: a double answer shows as E_FIN_FAILED/E_REQ_FAILED and as
    finished + requeued > received."""
    n = 2000
    client = prepare(nsqd, nsq_topic, n)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: widen the race window
    try:
        threads: list[threading.Thread] = []

        def handler(message: Message) -> None:
            if message.attempts == 1:
                t = threading.Thread(target=message.requeue, args=(0, False))
                threads.append(t)
                t.start()

        consumer = consumers(
            nsq_topic,
            CHANNEL,
            handler,
            nsqd_tcp_addresses=nsqd.tcp_address,
            max_in_flight=50,
            concurrency=4,
        )
        consumer.start()
        wait_for(lambda: channel(client, nsq_topic)["message_count"] == n, "published")
        wait_for(
            lambda: (
                channel(client, nsq_topic)["depth"] == 0
                and channel(client, nsq_topic)["in_flight_count"] == 0
                and channel(client, nsq_topic)["deferred_count"] == 0
            ),
            "every message answered",
            timeout=60.0,
        )
        for t in threads:
            t.join(TIMEOUT)
    finally:
        sys.setswitchinterval(old_interval)
    stats = consumer.stats()
    assert consumer.stop(timeout=5.0) is True
    assert stats.finished + stats.requeued == stats.received, stats


# --------------------------------------------------------------------------- reconnect backoff


def test_nsqd_that_closes_right_after_sub_is_redialled_with_growing_backoff(
    consumers: Callable[..., Consumer],
) -> None:
    """Suspected in issue 11, confirmed: an nsqd that accepts, answers SUB with OK and closes
    (a byte-level behaviour, so the scripted fake nsqd) was redialled ~10 times a second for
    ever, because a successful SUB reset the failure count. The count now resets only once a
    connection proved useful (a message, or a heartbeat interval alive), so the backoff grows:
    the failure count climbs with every short-lived connection."""
    with FakeNsqd(lambda index: b"", mode="consumer") as fake:
        consumer = consumers("t", "c", lambda m: None, nsqd_tcp_addresses=fake.address)
        consumer.start()
        # the old code never got past 1: every SUB reset the count
        wait_for(
            lambda: consumer._discovery.failures.get(fake.address, 0) >= 4,
            "the failure count to climb with each short-lived connection",
        )
        assert fake.subscribed >= 4
        assert consumer.stop(timeout=5.0) is True
