"""Consumer.run(timeout=, idle_timeout=, max_messages=) against a real nsqd: every end, the
summary it returns, and nothing left in flight on nsqd afterwards."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.fault_proxy import FaultProxy
from support.nsq import (
    bounded,
    connected_addresses,
    free_closed_port,
    prepare_channel,
    settled_channel,
    wait_for,
)

from nsq_sync import Consumer, Message, RequeueMessage, RunSummary
from nsq_sync.errors import ConfigError
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

pytestmark = pytest.mark.integration

CHANNEL = "ch"


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


def make(nsqd: NsqdProcess, topic: str, handler: Any, **options: Any) -> Consumer:
    return Consumer(topic, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.tcp_address], **options)


class Handled:
    def __init__(self, fail_below: int = 0) -> None:
        self.fail_below = fail_below  # raise on attempts below this
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.calls = 0

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls += 1
        if message.attempts < self.fail_below:
            raise RuntimeError(f"attempt {message.attempts} fails")
        with self.lock:
            self.bodies.append(message.body)


def test_idle_timeout_ends_a_drain_with_everything_finished(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 40)
    handler = Handled()
    consumer = make(nsqd, nsq_topic, handler, max_in_flight=10, concurrency=4)
    summary = consumer.run(idle_timeout=0.5)
    assert isinstance(summary, RunSummary)
    assert summary.reason == "idle"
    assert (summary.handled, summary.finished, summary.requeued) == (40, 40, 0)
    assert (summary.failed, summary.gave_up) == (0, 0)
    assert summary.ok
    assert summary.elapsed >= 0.5
    assert sorted(handler.bodies) == sorted(f"m{i}".encode() for i in range(40))
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)
    assert consumer.stats().finished == 40


def test_max_messages_starts_no_more_handler_calls_and_nsqd_delivers_no_more(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 60)
    handler = Handled()
    consumer = make(nsqd, nsq_topic, handler, max_in_flight=25, concurrency=3)
    summary = consumer.run(max_messages=10, timeout=30.0)
    assert summary.reason == "max_messages"
    assert handler.calls == 10
    assert (summary.handled, summary.finished, summary.failed) == (10, 10, 0)
    assert summary.ok
    # the credit shrank with the places left: nsqd delivered the 10 and nothing more, so no
    # message got an attempt counted without a handler call
    assert consumer.stats().received == 10
    assert summary.requeued == 0
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["in_flight_count"] == 0
    assert stats["deferred_count"] == 0
    assert stats["depth"] == 50
    assert stats["requeue_count"] == 0


def test_cron_runs_with_max_messages_never_give_up_a_message_they_did_not_handle(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """A cron job runs ``run(max_messages=10)`` six times over 60 messages, max_in_flight 25,
    max_attempts 2. nsqd counts an attempt at every delivery: when each run received 25 and
    handed 15 back, the third delivery of a message found it past max_attempts, and it was
    given up without its handler ever seeing it."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 60)
    handler = Handled()
    gave_up: list[bytes] = []
    for _ in range(6):
        consumer = make(
            nsqd, nsq_topic, handler, max_in_flight=25, concurrency=3, max_attempts=2,
            giving_up=lambda message: gave_up.append(message.body),
        )  # fmt: skip
        summary = consumer.run(max_messages=10, timeout=30.0)
        assert (summary.reason, summary.handled, summary.finished) == ("max_messages", 10, 10)
        assert summary.gave_up == 0 and summary.requeued == 0
    assert gave_up == []
    assert sorted(handler.bodies) == sorted(f"m{i}".encode() for i in range(60))
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)


def test_max_messages_on_two_nsqds_receives_exactly_max_messages(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """Credit split over two nsqds, with messages on their way while it shrinks: what an nsqd
    may hold is counted at the highest RDY it may still act on until its messages are answered
    (rdy_budget), so neither gets to send beyond the run's places (before, 2-6 of 12 arrived
    beyond them, from an nsqd whose RDY had been lowered while its messages were on their way)."""
    servers = [nsqd_factory(), nsqd_factory()]
    for server in servers:
        prepare_channel(server, nsq_topic, CHANNEL, 30)
    for _ in range(5):
        handler = Handled()
        consumer = Consumer(
            nsq_topic, CHANNEL, handler, max_in_flight=40, concurrency=3,
            nsqd_tcp_addresses=[s.tcp_address for s in servers],
        )  # fmt: skip
        summary = consumer.run(max_messages=12, timeout=30.0)
        assert (summary.reason, summary.handled, summary.finished) == ("max_messages", 12, 12)
        assert handler.calls == 12
        assert (consumer.stats().received, summary.requeued) == (12, 0)


def test_max_messages_gets_its_messages_from_the_nsqd_that_has_them(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """Two nsqds, messages on one only, max_in_flight 10 for 20 places: the credit the empty
    nsqd holds is taken back once it stays idle and goes to the other one."""
    empty, full = nsqd_factory(), nsqd_factory()
    prepare_channel(empty, nsq_topic, CHANNEL, 0)
    client = prepare_channel(full, nsq_topic, CHANNEL, 50)
    handler = Handled()
    consumer = Consumer(
        nsq_topic, CHANNEL, handler, max_in_flight=10, concurrency=2,
        nsqd_tcp_addresses=[empty.tcp_address, full.tcp_address],
    )  # fmt: skip
    summary = consumer.run(max_messages=20, timeout=30.0)
    assert (summary.reason, summary.handled, summary.requeued) == ("max_messages", 20, 0)
    assert consumer.stats().received == 20
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (30, 0, 0)


def test_timeout_ends_a_run_that_never_goes_idle(nsqd: NsqdProcess, nsq_topic: str) -> None:
    prepare_channel(nsqd, nsq_topic, CHANNEL, 0)
    consumer = make(nsqd, nsq_topic, Handled(), max_in_flight=0)  # paused: never idle
    summary = consumer.run(timeout=datetime.timedelta(seconds=1.0), idle_timeout=0.2)
    assert summary.reason == "timeout"
    assert summary.elapsed >= 1.0
    assert (summary.handled, summary.finished, summary.requeued, summary.failed) == (0, 0, 0, 0)
    assert summary.ok


def test_failing_first_attempts_do_not_end_the_drain_early(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """Backoff (RDY 0) lasts longer than idle_timeout here, and failed messages are requeued
    with no delay (a delayed one would be idle time: nsqd holds it back): a drain that took any
    time without messages for idleness would stop after the first failures."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 5)
    handler = Handled(fail_below=2)  # every first attempt fails
    consumer = make(
        nsqd,
        nsq_topic,
        handler,
        max_in_flight=5,
        default_requeue_delay=0.0,
        backoff_multiplier=0.4,  # 0.8 s at level 1: longer than idle_timeout
        max_backoff_duration=2.0,
    )
    summary = consumer.run(idle_timeout=0.5, timeout=60.0)
    assert summary.reason == "idle"
    assert sorted(handler.bodies) == sorted(f"m{i}".encode() for i in range(5))
    assert summary.finished == 5
    assert summary.failed == 5
    assert summary.requeued == 5
    assert not summary.ok
    assert consumer.stats().failed == 5
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_stop_from_another_thread_ends_the_run_as_stopped(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    prepare_channel(nsqd, nsq_topic, CHANNEL, 0)
    consumer = make(nsqd, nsq_topic, Handled())
    result: list[RunSummary] = []
    runner = threading.Thread(target=lambda: result.append(consumer.run(idle_timeout=60.0)))
    runner.start()
    assert consumer.wait_connected(20.0)
    consumer.stop()
    runner.join(20.0)
    assert result and result[0].reason == "stopped"


def test_requeue_counts_every_req_and_failed_only_exceptions(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """requeued: handler exceptions, RequeueMessage and message.requeue() alike; failed: only
    the exceptions."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 0)

    def handler(message: Message) -> None:
        kind = message.body.split(b":")[0]
        if message.attempts > 1:
            return
        if kind == b"raise":
            raise ValueError("boom")
        if kind == b"requeue-exc":
            raise RequeueMessage(delay=0.0, backoff=False)
        if kind == b"requeue":
            message.requeue(0.0, backoff=False)

    client.mpub(nsq_topic, [b"raise:1", b"requeue-exc:2", b"requeue:3", b"ok:4"])
    consumer = make(nsqd, nsq_topic, handler, max_in_flight=4, default_requeue_delay=0.0)
    summary = consumer.run(idle_timeout=0.5, timeout=30.0)
    assert (summary.failed, summary.requeued, summary.finished) == (1, 3, 4)
    assert summary.handled == 7
    stats = consumer.stats()
    assert (stats.failed, stats.requeued) == (1, 3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"timeout": 0}, "timeout"),
        ({"idle_timeout": -1.0}, "idle_timeout"),
        ({"idle_timeout": "5"}, "idle_timeout"),
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": 2.5}, "max_messages"),
    ],
)
def test_bad_run_arguments_raise_before_anything_starts(
    nsqd: NsqdProcess, nsq_topic: str, kwargs: dict[str, Any], name: str
) -> None:
    consumer = make(nsqd, nsq_topic, Handled())
    with pytest.raises(ConfigError, match=name):
        consumer.run(**kwargs)
    assert connected_addresses(consumer) == []
    consumer.start()
    consumer.stop(5.0)


def test_a_topic_no_nsqd_carries_is_idle_but_an_unreachable_lookupd_is_unreachable(
    nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    """With lookupd only, a cron drain of a topic nobody has published yet must still end."""
    consumer = Consumer(
        nsq_topic, CHANNEL, Handled(), lookupd_http_addresses=[nsqlookupd.http_address]
    )
    summary = consumer.run(idle_timeout=0.5, timeout=30.0)
    assert summary.reason == "idle"
    assert summary.handled == 0
    assert summary.ok
    # a lookupd that does not answer says nothing about the topic: the run ends, not ok
    # (issue 39: it waited for ever, up to `timeout`)
    dead = Consumer(
        nsq_topic, CHANNEL, Handled(), lookupd_http_addresses=[f"127.0.0.1:{free_closed_port()}"]
    )
    summary = dead.run(idle_timeout=0.3, timeout=30.0)
    assert summary.reason == "unreachable"
    assert not summary.ok


def test_a_handler_calling_stop_ends_the_run_as_stopped(nsqd: NsqdProcess, nsq_topic: str) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 3)
    holder: list[Consumer] = []

    def handler(message: Message) -> None:
        holder[0].stop()  # returns at once on a worker; the stop completes on its own

    consumer = make(nsqd, nsq_topic, handler)
    holder.append(consumer)
    summary = consumer.run(idle_timeout=30.0, timeout=60.0)
    assert summary.reason == "stopped"
    assert summary.handled == 1
    assert summary.finished == 1
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["in_flight_count"], stats["depth"] + stats["deferred_count"]) == (0, 2)


def test_system_exit_in_a_handler_is_reraised_by_run_after_a_graceful_stop(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 3)

    def handler(message: Message) -> None:
        raise SystemExit(4)

    consumer = make(nsqd, nsq_topic, handler)
    with pytest.raises(SystemExit) as raised:
        consumer.run(idle_timeout=30.0, timeout=60.0)
    assert raised.value.code == 4
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["in_flight_count"], stats["depth"]) == (0, 3)


def test_max_messages_after_a_reconnect_still_gets_its_messages(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """The connection is cut while 9 messages wait for the one worker: they are dropped
    unanswered (nsqd redelivers them on the new connection). They took no place and must not
    hold the run's credit: before, the run stalled at RDY 0 and not even idle_timeout ended it."""
    prepare_channel(nsqd, nsq_topic, CHANNEL, 100)
    started = threading.Event()

    def handler(message: Message) -> None:
        started.set()
        release.wait(10.0)

    release = threading.Event()
    with FaultProxy(nsqd.tcp_address) as proxy:
        consumer = Consumer(
            nsq_topic, CHANNEL, handler, max_in_flight=10, concurrency=1,
            nsqd_tcp_addresses=[proxy.address],
        )  # fmt: skip

        def cut_once_busy() -> None:
            try:
                if started.wait(10.0):
                    wait_for(lambda: consumer.stats().in_flight == 10, "10 in flight", 10.0)
                    proxy.cut()
                    wait_for(lambda: consumer.stats().in_flight < 10, "the cut seen", 10.0)
            finally:
                release.set()  # the worker goes on, and drops the 9 waiting

        cutter = threading.Thread(target=cut_once_busy)
        cutter.start()
        summary = consumer.run(max_messages=10, idle_timeout=5.0, timeout=30.0)
        cutter.join(10.0)
    assert (summary.reason, summary.handled) == ("max_messages", 10)
    assert consumer.stats().skipped == 9
