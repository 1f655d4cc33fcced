"""BatchConsumer against a real nsqd: batches form full (not batches of one), close at
batch_timeout or when no credit can fill them, and are finished or requeued as units."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.nsq import bounded, prepare_channel, raise_like_a_time_limit, settled_channel

from nsq_sync import BatchConsumer, Message
from nsq_sync.errors import ConfigError
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

CHANNEL = "ch"


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


class Batches:
    """Records every batch; ``action(batch, call_index)`` may raise or answer messages."""

    def __init__(self, action: Any = None) -> None:
        self.action = action
        self.lock = threading.Lock()
        self.batches: list[list[bytes]] = []

    def __call__(self, batch: list[Message]) -> None:
        with self.lock:
            index = len(self.batches)
            self.batches.append([m.body for m in batch])
        if self.action is not None:
            self.action(batch, index)

    @property
    def sizes(self) -> list[int]:
        with self.lock:
            return [len(b) for b in self.batches]


def make(nsqd: NsqdProcess, topic: str, handler: Any, **options: Any) -> BatchConsumer:
    return BatchConsumer(topic, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.tcp_address], **options)


def test_batches_form_full_and_the_last_closes_at_batch_timeout(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 45)
    handler = Batches()
    consumer = make(nsqd, nsq_topic, handler, batch_size=10, batch_timeout=1.0)
    assert consumer.stats().max_in_flight == 10  # defaults to batch_size
    summary = consumer.run(idle_timeout=2.0, timeout=60.0)
    assert handler.sizes == [10, 10, 10, 10, 5]
    assert summary.reason == "idle"
    assert (summary.handled, summary.finished, summary.requeued, summary.failed) == (45, 45, 0, 0)
    assert summary.ok
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_more_credit_than_a_batch_fills_the_next_batch_while_one_runs(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    prepare_channel(nsqd, nsq_topic, CHANNEL, 60)
    handler = Batches()
    consumer = make(nsqd, nsq_topic, handler, batch_size=20, batch_timeout=5.0, max_in_flight=40)
    summary = consumer.run(max_messages=60, timeout=60.0)
    assert handler.sizes == [20, 20, 20]
    assert summary.reason == "max_messages"
    assert summary.finished == 60


def test_a_failed_batch_is_requeued_as_a_unit_and_backoff_closes_the_open_batch(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """The first batch fails: all of it is requeued (with no delay here) and backoff sends
    RDY 0. After backoff, the probe's RDY 1 lets one message in: that batch cannot grow, so
    it closes at once (batch_timeout is far away) rather than waiting for credit."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 10)

    def fail_first(batch: list[Message], index: int) -> None:
        if index == 0:
            raise RuntimeError("the database is down")

    handler = Batches(fail_first)
    consumer = make(
        nsqd,
        nsq_topic,
        handler,
        batch_size=10,
        batch_timeout=30.0,
        default_requeue_delay=0.0,
        backoff_multiplier=0.2,
    )
    summary = consumer.run(idle_timeout=1.0, timeout=60.0)
    sizes = handler.sizes
    assert sizes[0] == 10
    assert sizes[1] == 1  # the backoff probe's single message, handled at once
    assert summary.elapsed < 30.0  # no batch waited for batch_timeout
    assert sum(sizes[1:]) == 10
    assert (summary.failed, summary.requeued, summary.finished) == (10, 10, 10)
    assert not summary.ok
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 10
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_messages_the_handler_answered_itself_are_left_alone(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 5)
    seen: list[tuple[bytes, int]] = []

    def answer_one(batch: list[Message], index: int) -> None:
        seen.extend((m.body, m.attempts) for m in batch)
        for message in batch:
            if message.body == b"m2" and message.attempts == 1:
                message.requeue(0.0, backoff=False)

    handler = Batches(answer_one)
    consumer = make(nsqd, nsq_topic, handler, batch_size=5, batch_timeout=1.0)
    summary = consumer.run(idle_timeout=1.0, timeout=60.0)
    assert handler.sizes[0] == 5
    assert (summary.finished, summary.requeued, summary.failed) == (5, 1, 0)
    assert (b"m2", 2) in seen
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["requeue_count"], stats["in_flight_count"], stats["depth"]) == (1, 0, 0)


def test_a_batch_on_its_last_attempt_goes_to_the_give_up_handler(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 3)
    given_up: list[bytes] = []

    def fail(batch: list[Message], index: int) -> None:
        raise RuntimeError("always")

    consumer = make(
        nsqd,
        nsq_topic,
        Batches(fail),
        batch_size=3,
        batch_timeout=0.5,
        max_attempts=1,
        giving_up=lambda m: given_up.append(m.body),
    )
    summary = consumer.run(idle_timeout=1.0, timeout=60.0)
    assert sorted(given_up) == [b"m0", b"m1", b"m2"]
    assert (summary.failed, summary.gave_up, summary.requeued, summary.finished) == (3, 3, 0, 3)
    assert settled_channel(client, nsq_topic, CHANNEL)["in_flight_count"] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 10, "max_in_flight": 5}, "max_in_flight .5. must be at least batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_timeout": 0}, "batch_timeout"),
        ({"concurrency": 4}, "concurrency"),
    ],
)
def test_bad_options_raise_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        BatchConsumer("t", "c", Batches(), nsqd_tcp_addresses=["127.0.0.1:4150"], **kwargs)
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        BatchConsumer("t", "c", Batches(), batch_size=3, max_in_flight=2, nsqd_tcp_addresses="h:1")


def test_stop_from_the_batch_handler_finishes_that_batch_and_ends_run(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """stop() cannot wait for the batch that calls it: it must not hang until its deadline
    (the connections would close first and nsqd would redeliver the batch)."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 4)
    holder: list[BatchConsumer] = []

    def stop_now(batch: list[Message], index: int) -> None:
        assert holder[0].stop() is False  # started, not finished: this batch is still running

    consumer = make(nsqd, nsq_topic, Batches(stop_now), batch_size=4, batch_timeout=5.0)
    holder.append(consumer)
    summary = consumer.run(timeout=60.0)
    assert summary.reason == "stopped"
    assert (summary.finished, summary.requeued) == (4, 0)
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)


def test_system_exit_in_the_batch_handler_requeues_the_batch_and_run_reraises_it(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 3)

    def leave(batch: list[Message], index: int) -> None:
        raise SystemExit(3)

    consumer = make(nsqd, nsq_topic, Batches(leave), batch_size=3, batch_timeout=5.0)
    with pytest.raises(SystemExit) as raised:
        consumer.run(timeout=60.0)
    assert raised.value.code == 3
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (3, 0, 3)


def test_a_batch_handler_raising_another_base_exception_fails_that_batch_only(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """The first batch's handler raises a BaseException other than SystemExit,
    KeyboardInterrupt or GreenletExit (a gevent.Timeout, typically): that batch is requeued as
    a failed one and the batch task goes on. Before, the batch task ended: the consumer kept
    collecting messages nobody handled, and run() and stop() waited out their timeouts."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 6)

    def interrupt_first(batch: list[Message], index: int) -> None:
        if index == 0:
            raise_like_a_time_limit()

    handler = Batches(interrupt_first)
    consumer = make(
        nsqd,
        nsq_topic,
        handler,
        batch_size=3,
        batch_timeout=0.2,
        default_requeue_delay=0.0,
        backoff_multiplier=0.2,
    )
    summary = consumer.run(idle_timeout=1.0, timeout=60.0)
    assert handler.sizes[0] == 3
    assert (summary.failed, summary.requeued, summary.finished) == (3, 3, 6)
    assert summary.reason == "idle"
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 3
    assert (stats["depth"], stats["in_flight_count"], stats["timeout_count"]) == (0, 0, 0)


def test_a_stop_waits_for_the_batch_tasks_last_fins_before_closing(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """Regression: the consumer's stop saw nothing in flight once a batch's FINs were counted
    and closed the connections while the batch task was still writing them; nsqd then kept
    the batch in flight until its timeout. The write is slowed down here to widen that gap."""
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 4)
    consumer = make(nsqd, nsq_topic, Batches(), batch_size=4, batch_timeout=5.0)
    responder = consumer._batcher.parts.responder
    write = responder._write

    def slow_write(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        write(*args, **kwargs)

    responder._write = slow_write  # type: ignore[method-assign]
    summary = consumer.run(max_messages=4, timeout=60.0)
    assert summary.finished == 4
    stats = settled_channel(client, nsq_topic, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
