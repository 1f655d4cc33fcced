"""WorkerPool semantics without sockets: a recording Responder stands in for the consumer.

Each test starts a real pool (threads, or greenlets under ``tests/run_gevent.py``), submits
messages and stops it: ``stop`` queues one stop marker per worker behind the messages, so when it
returns every submitted message has been processed.

Every test runs twice: with FINs one by one (``message.finish()``), and batched as the consumer
runs the pool (``finish_many`` plus a real Flusher as the backstop).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.nsq import wait_for

from nsq_sync.consumer.flusher import Flusher
from nsq_sync.consumer.workers import FIN_BATCH, WorkerPool
from nsq_sync.errors import DeadLetter, RequeueMessage
from nsq_sync.message import Message
from nsq_sync.runtime import resolve_runtime

TIMEOUT = 10.0


class RecordingResponder:
    """A real in-memory Responder: records every call the messages make, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def finish(self, message: Message) -> None:
        with self._lock:
            self.calls.append(("finish", message.id))

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        with self._lock:
            self.calls.append(("requeue", message.id, delay, backoff))

    def touch(self, message: Message) -> None:
        with self._lock:
            self.calls.append(("touch", message.id))


class DeadLetterHookStub:
    """Stands in for the dead-letter publisher: records ("dead_letter", id) and what
    ``publish(message, error)`` answers (True: acknowledged)."""

    def __init__(self, harness: Harness, publish: Any) -> None:
        self.harness = harness
        self.publish = publish
        self.errors: list[BaseException | None] = []
        self.closed = False

    def __call__(self, message: Message, error: BaseException | None) -> bool:
        self.harness.events.append(("dead_letter", message.id))
        self.errors.append(error)
        return bool(self.publish(message, error))

    def close(self, timeout: float) -> None:
        self.closed = True


class Harness:
    batched = False  # set for each test by the fin_mode fixture

    def __init__(
        self,
        handler: Callable[[Message], Any],
        *,
        max_attempts: int = 0,
        giving_up: Callable[[Message], Any] | None = None,
        concurrency: int = 1,
        stale: bool = False,
        dead_letter: Callable[[Message, BaseException | None], bool] | None = None,
    ) -> None:
        self.responder = RecordingResponder()
        self.events: list[tuple[str, bytes]] = []  # handler / giving_up / skip / gave_up, in order
        self.handler = handler
        self.giving_up_fn = giving_up
        runtime = resolve_runtime("auto")
        self.batches: list[list[bytes]] = []  # what each finish_many call got
        self.flusher = Flusher(runtime, logging.getLogger("test_dispatch"))
        self.pool = WorkerPool(
            runtime,
            self._handler,
            concurrency=concurrency,
            max_attempts=max_attempts,
            giving_up=self._giving_up if giving_up is not None else None,
            log=logging.getLogger("test_dispatch"),
            is_stale=lambda message: stale,
            on_skip=lambda message: self.events.append(("skip", message.id)),
            on_gave_up=lambda message: self.events.append(("gave_up", message.id)),
            finish_many=self._finish_many if self.batched else None,
            backstop=self.flusher if self.batched else None,
            dead_letter=None if dead_letter is None else DeadLetterHookStub(self, dead_letter),
        )
        self._n = 0

    def _finish_many(self, messages: list[Message]) -> None:
        # as the consumer: the messages are already marked answered
        assert all(m.has_responded for m in messages)
        self.batches.append([m.id for m in messages])
        for message in messages:
            self.responder.finish(message)

    def _handler(self, message: Message) -> Any:
        self.events.append(("handler", message.id))
        return self.handler(message)

    def _giving_up(self, message: Message) -> Any:
        self.events.append(("giving_up", message.id))
        assert self.giving_up_fn is not None
        return self.giving_up_fn(message)

    def message(self, attempts: int = 1, body: bytes = b"body") -> Message:
        self._n += 1
        msg_id = b"%016d" % self._n
        return Message(msg_id, body, 0, attempts, self.responder, "127.0.0.1:4150", None)

    def start(self) -> None:
        self.pool.start("test")
        if self.batched:
            self.flusher.start("test", self.pool)

    def stop(self) -> None:
        assert self.pool.stop(TIMEOUT), "workers did not finish in time"
        if self.batched:
            self.flusher.stop(TIMEOUT)

    def run(self, *messages: Message) -> list[tuple[Any, ...]]:
        self.start()
        for message in messages:
            self.pool.submit(message)
        self.stop()
        return self.responder.calls


@pytest.fixture(autouse=True, params=["one-by-one", "batched"])
def fin_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(Harness, "batched", request.param == "batched")
    return str(request.param)


def ok(message: Message) -> None:
    return None


def boom(message: Message) -> None:
    raise ValueError("handler failed")


def test_return_finishes() -> None:
    h = Harness(ok)
    m = h.message()
    assert h.run(m) == [("finish", m.id)]
    assert m.has_responded


def test_return_value_is_ignored() -> None:
    h = Harness(lambda message: False)
    m = h.message()
    assert h.run(m) == [("finish", m.id)]


def test_raise_requeues_with_the_default_delay_and_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(boom)
    m = h.message(attempts=2)
    with caplog.at_level(logging.ERROR, logger="test_dispatch"):
        assert h.run(m) == [("requeue", m.id, None, True)]
    assert any("ValueError" in (r.exc_text or "") for r in caplog.records), "traceback not logged"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RequeueMessage(delay=3, backoff=False), (3, False)),
        (RequeueMessage(delay=0.5), (0.5, True)),
        (RequeueMessage(), (None, True)),
        (RequeueMessage(backoff=False), (None, False)),
    ],
)
def test_requeue_message_uses_the_handlers_delay_and_backoff(
    exc: RequeueMessage, expected: tuple[Any, bool]
) -> None:
    def handler(message: Message) -> None:
        raise exc

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == [("requeue", m.id, *expected)]


def test_requeue_message_on_the_last_attempt_is_still_a_requeue() -> None:
    # An explicit requeue is the application's choice; only failures count towards give-up.
    def handler(message: Message) -> None:
        raise RequeueMessage(delay=1, backoff=False)

    h = Harness(handler, max_attempts=3, giving_up=ok)
    m = h.message(attempts=3)
    assert h.run(m) == [("requeue", m.id, 1, False)]
    assert ("giving_up", m.id) not in h.events


@pytest.mark.parametrize("attempts", [1, 2])
def test_failure_before_max_attempts_requeues(attempts: int) -> None:
    h = Harness(boom, max_attempts=3, giving_up=ok)
    m = h.message(attempts=attempts)
    assert h.run(m) == [("requeue", m.id, None, True)]
    assert [e for e, _ in h.events] == ["handler"]


def test_failure_on_the_last_attempt_gives_up_then_finishes() -> None:
    order: list[str] = []

    def giving_up(message: Message) -> None:
        order.append(f"giving_up:{len(h.responder.calls)}")  # nothing answered yet

    h = Harness(boom, max_attempts=3, giving_up=giving_up)
    m = h.message(attempts=3)
    assert h.run(m) == [("finish", m.id)]
    assert order == ["giving_up:0"]
    assert [e for e, _ in h.events] == ["handler", "giving_up", "gave_up"]


@pytest.mark.parametrize("attempts", [4, 10, 65535])
def test_delivered_past_max_attempts_gives_up_without_running_the_handler(attempts: int) -> None:
    h = Harness(ok, max_attempts=3, giving_up=ok)
    m = h.message(attempts=attempts)
    assert h.run(m) == [("finish", m.id)]
    assert [e for e, _ in h.events] == ["giving_up", "gave_up"]


def test_default_give_up_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(boom, max_attempts=1)
    m = h.message(attempts=1, body=b"12345")
    with caplog.at_level(logging.WARNING, logger="test_dispatch"):
        assert h.run(m) == [("finish", m.id)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.id.decode() in w and "5 bytes" in w for w in warnings), warnings
    assert ("gave_up", m.id) in h.events


def test_max_attempts_zero_means_unlimited() -> None:
    h = Harness(boom, max_attempts=0, giving_up=ok)
    m = h.message(attempts=60000)
    assert h.run(m) == [("requeue", m.id, None, True)]
    assert [e for e, _ in h.events] == ["handler"]


def test_giving_up_that_raises_requeues_instead_of_losing_the_message() -> None:
    h = Harness(boom, max_attempts=3, giving_up=boom)
    m = h.message(attempts=3)
    calls = h.run(m)
    assert len(calls) == 1 and calls[0][:2] == ("requeue", m.id)
    assert ("gave_up", m.id) not in h.events


def test_giving_up_that_answers_itself_is_not_answered_twice() -> None:
    h = Harness(ok, max_attempts=3, giving_up=lambda message: message.requeue(60, backoff=False))
    m = h.message(attempts=5)
    assert h.run(m) == [("requeue", m.id, 60, False)]


def test_enable_async_sends_nothing_until_the_application_answers() -> None:
    kept: list[Message] = []

    def handler(message: Message) -> None:
        message.enable_async()
        kept.append(message)

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == []
    assert m.is_async and not m.has_responded
    done = threading.Event()

    def later() -> None:
        kept[0].finish()
        done.set()

    threading.Thread(target=later).start()
    assert done.wait(TIMEOUT)
    assert h.responder.calls == [("finish", m.id)]


def test_enable_async_then_raise_still_requeues() -> None:
    def handler(message: Message) -> None:
        message.enable_async()
        raise ValueError("failed before handing the message off")

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == [("requeue", m.id, None, True)]


def test_finish_twice_sends_one_finish() -> None:
    def handler(message: Message) -> None:
        message.finish()
        message.finish()
        message.requeue()

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == [("finish", m.id)]
    m.finish()
    assert h.responder.calls == [("finish", m.id)]


def test_handler_that_answers_then_raises_is_not_answered_again() -> None:
    def handler(message: Message) -> None:
        message.finish()
        raise ValueError("after the FIN")

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == [("finish", m.id)]


def test_touch_goes_through_the_responder_until_answered() -> None:
    def handler(message: Message) -> None:
        message.touch()
        message.touch()

    h = Harness(handler)
    m = h.message()
    assert h.run(m) == [("touch", m.id), ("touch", m.id), ("finish", m.id)]
    m.touch()  # answered: TOUCH would fail on nsqd, so nothing is sent
    assert h.responder.calls[-1] == ("finish", m.id)


def test_requeue_rejects_a_negative_delay() -> None:
    m = Message(b"0" * 16, b"", 0, 1, RecordingResponder())
    with pytest.raises(ValueError, match="delay"):
        m.requeue(-1)
    assert not m.has_responded


def test_stale_message_is_skipped_without_running_or_answering() -> None:
    h = Harness(ok, stale=True)
    m = h.message()
    assert h.run(m) == []
    assert h.events == [("skip", m.id)]


def test_many_messages_on_many_workers_are_each_answered_once() -> None:
    def handler(message: Message) -> None:
        n = int(message.body)
        if n % 3 == 0:
            raise ValueError(n)
        if n % 3 == 1:
            raise RequeueMessage(delay=n, backoff=False)

    h = Harness(handler, concurrency=4)
    messages = [h.message(body=b"%d" % i) for i in range(200)]
    calls = h.run(*messages)
    assert len(calls) == 200
    assert sorted(c[1] for c in calls) == sorted(m.id for m in messages)
    by_id = {c[1]: c for c in calls}
    for i, m in enumerate(messages):
        expected = (
            ("requeue", m.id, None, True)
            if i % 3 == 0
            else ("requeue", m.id, i, False)
            if i % 3 == 1
            else ("finish", m.id)
        )
        assert by_id[m.id] == expected
    assert not h.pool.held  # nothing held back


def test_drain_returns_queued_messages_that_did_not_start() -> None:
    h = Harness(ok)
    messages = [h.message() for _ in range(3)]
    for m in messages:
        h.pool.submit(m)  # workers not started: everything stays queued
    assert h.pool.drain() == messages
    assert h.pool.drain() == []
    assert h.run() == []


def test_handler_ending_its_worker_still_requeues_the_message() -> None:
    """SystemExit (threads) or GreenletExit (gevent) from a handler ends that worker, but the
    message is requeued at once instead of staying in flight until nsqd's timeout."""
    if resolve_runtime("auto").name == "gevent":
        from gevent import GreenletExit

        exit_exc: BaseException = GreenletExit()
    else:
        exit_exc = SystemExit(0)

    def handler(message: Message) -> None:
        raise exit_exc

    h = Harness(handler, concurrency=2)
    m = h.message()
    assert h.run(m) == [("requeue", m.id, 0.0, False)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_burst_is_finished_in_batches_in_order(concurrency: int) -> None:
    h = Harness(ok, concurrency=concurrency)
    h.start()
    messages = [h.message() for _ in range(3 * FIN_BATCH)]
    h.pool.submit_many(messages)  # one read's worth, handed over at once
    h.stop()
    assert sorted(c[1] for c in h.responder.calls) == sorted(m.id for m in messages)
    assert all(c[0] == "finish" for c in h.responder.calls)
    if h.batched:
        assert sum(len(b) for b in h.batches) == len(messages)
        assert all(len(b) <= FIN_BATCH for b in h.batches)
        if concurrency == 1:
            # one worker: each write holds its FINs in delivery order, at most FIN_BATCH of them.
            # The boundaries and the order of the writes are timing: a worker descheduled for
            # longer than FIN_HOLD lets the backstop take part of the held FINs, and the two
            # writes may go out in either order (nsqd does not care; PyPy in CI showed it)
            position = {m.id: i for i, m in enumerate(messages)}
            for b in h.batches:
                assert [position[i] for i in b] == sorted(position[i] for i in b)
            assert len(h.batches) >= len(messages) // FIN_BATCH


def test_a_long_handler_does_not_hold_back_the_fins_before_it() -> None:
    """The first message's FIN must go out while the second message's handler still runs (the
    batch holds FINs for at most FIN_HOLD, not until the worker is free again)."""
    seen_first_fin: list[bool] = []

    h = Harness(ok)

    def handler(message: Message) -> None:
        if message.body == b"slow":
            wait_for(lambda: ("finish", first.id) in h.responder.calls, "the first FIN", TIMEOUT)
            seen_first_fin.append(True)

    h.handler = handler
    first = h.message(body=b"fast")
    slow = h.message(body=b"slow")
    h.start()
    h.pool.submit_many([first, slow])
    h.stop()
    assert seen_first_fin == [True]
    assert h.responder.calls == [("finish", first.id), ("finish", slow.id)]


# --------------------------------------------------------------------------- run() hooks


def test_admit_refusing_requeues_at_once_without_a_handler_call_or_give_up() -> None:
    h = Harness(ok, max_attempts=1)
    admitted: list[bytes] = []

    def admit(message: Message) -> bool:
        admitted.append(message.id)
        return len(admitted) <= 1

    h.pool.admit = admit
    first, second, over = h.message(), h.message(), h.message(attempts=5)
    calls = h.run(first, second, over)
    assert sorted(calls) == [  # batched FINs go out after the requeues: compare as a set
        ("finish", first.id),
        ("requeue", second.id, 0.0, False),
        ("requeue", over.id, 0.0, False),  # not given up: the run had ended
    ]
    assert h.events == [("handler", first.id)]


def test_on_failed_counts_handler_exceptions_but_not_requeue_message() -> None:
    failed: list[bytes] = []

    def handler(message: Message) -> None:
        if message.body == b"boom":
            raise ValueError("boom")
        if message.body == b"req":
            raise RequeueMessage(delay=0.0)

    h = Harness(handler)
    h.pool.on_failed = lambda message: failed.append(message.id)
    boom_msg, req_msg, ok_msg = h.message(body=b"boom"), h.message(body=b"req"), h.message()
    h.run(boom_msg, req_msg, ok_msg)
    assert failed == [boom_msg.id]


# ------------------------------------------------------------------------- dead-letter topic


def published(message: Message, error: BaseException | None) -> bool:
    return True


def refused(message: Message, error: BaseException | None) -> bool:
    message.requeue(1.0)  # as the publisher does when nsqd did not acknowledge
    return False


def test_dead_letter_then_giving_up_then_finish() -> None:
    order: list[str] = []

    def giving_up(message: Message) -> None:
        order.append(f"giving_up after {len(h.responder.calls)} answers")

    h = Harness(boom, max_attempts=2, giving_up=giving_up, dead_letter=published)
    m = h.message(attempts=2)
    assert h.run(m) == [("finish", m.id)]
    assert [e for e, _ in h.events] == ["handler", "dead_letter", "giving_up", "gave_up"]
    assert order == ["giving_up after 0 answers"]
    hook = h.pool.dead_letter
    assert isinstance(hook, DeadLetterHookStub)
    [error] = hook.errors
    assert isinstance(error, ValueError)  # the handler's exception goes into the envelope
    assert hook.closed  # the pool's stop closes it


def test_a_dead_letter_publish_not_acknowledged_neither_gives_up_nor_finishes() -> None:
    h = Harness(boom, max_attempts=1, giving_up=ok, dead_letter=refused)
    m = h.message(attempts=1)
    assert h.run(m) == [("requeue", m.id, 1.0, True)]
    assert [e for e, _ in h.events] == ["handler", "dead_letter"]


def test_delivered_past_max_attempts_is_dead_lettered_without_an_error() -> None:
    h = Harness(ok, max_attempts=2, dead_letter=published)
    m = h.message(attempts=3)
    assert h.run(m) == [("finish", m.id)]
    assert [e for e, _ in h.events] == ["dead_letter", "gave_up"]
    hook = h.pool.dead_letter
    assert isinstance(hook, DeadLetterHookStub) and hook.errors == [None]


def poison(message: Message) -> None:
    raise DeadLetter("cannot parse")


@pytest.mark.parametrize("max_attempts", [0, 5])
def test_dead_letter_raised_gives_up_on_the_first_attempt(max_attempts: int) -> None:
    h = Harness(poison, max_attempts=max_attempts, giving_up=ok, dead_letter=published)
    m = h.message(attempts=1)
    assert h.run(m) == [("finish", m.id)]
    assert [e for e, _ in h.events] == ["handler", "dead_letter", "giving_up", "gave_up"]


def test_dead_letter_raised_without_a_topic_goes_to_giving_up() -> None:
    h = Harness(poison, max_attempts=0, giving_up=ok)
    m = h.message(attempts=1)
    assert h.run(m) == [("finish", m.id)]
    assert [e for e, _ in h.events] == ["handler", "giving_up", "gave_up"]


def test_giving_up_that_raises_after_the_dead_letter_publish_still_finishes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(boom, max_attempts=1, giving_up=boom, dead_letter=published)
    m = h.message(attempts=1)
    assert h.run(m) == [("finish", m.id)]  # a requeue would dead-letter it twice
    assert "in the dead-letter topic: finishing it" in caplog.text


def test_a_collecting_worker_hands_over_what_it_admits_in_order_and_answers_the_rest() -> None:
    """BatchConsumer's worker (pool.collect set): the handler never runs; stale, refused and
    over-attempts messages are answered as a handler's worker would; the others reach collect
    in order, marked async, in one list per wake-up except that a give-up waits for what came
    before it to be collected; what give-up raises is handled as in a handler's worker (an
    Exception logged, SystemExit to on_fatal) and loses nothing."""
    fatal: list[BaseException] = []

    def giving_up(message: Message) -> None:
        if message.body == b"exit":
            raise SystemExit(3)
        if message.body == b"fail":
            raise ValueError("give-up handler failed")

    h = Harness(ok, max_attempts=2, giving_up=giving_up)
    collected: list[list[Message]] = []
    h.pool.collect = collected.append
    h.pool.on_fatal = fatal.append
    refused = h.message()
    h.pool.admit = lambda message: message is not refused
    first, second = h.message(), h.message()
    over, over_fail, over_exit = (h.message(attempts=3, body=b) for b in (b"x", b"fail", b"exit"))
    last = h.message()
    h.start()
    h.pool.submit_many([first, refused, over, second, over_fail, over_exit, last])
    h.stop()
    # what was admitted goes to its batch before each give-up (which may wait on a publish)
    assert [[m.id for m in batch] for batch in collected] == [[first.id], [second.id], [last.id]]
    assert all(m.is_async and not m.has_responded for batch in collected for m in batch)
    assert ("handler", first.id) not in h.events
    assert sorted(h.responder.calls) == sorted(
        [
            ("requeue", refused.id, 0.0, False),
            ("finish", over.id),  # given up
            ("requeue", over_fail.id, None, False),  # its give-up handler failed
            ("requeue", over_exit.id, None, False),
        ]
    )
    assert [type(e) for e in fatal] == [SystemExit]


@pytest.mark.parametrize("error", [RuntimeError("collect failed"), SystemExit(4)])
def test_a_collecting_worker_requeues_what_collect_failed_to_take_and_goes_on(
    error: BaseException,
) -> None:
    """collect raising (a bug, or SystemExit under gevent): the messages it was handed are
    requeued at once, not left in flight; an Exception is logged, SystemExit goes to on_fatal;
    the worker goes on collecting."""
    fatal: list[BaseException] = []
    h = Harness(ok)
    collected: list[list[Message]] = []

    def collect(messages: list[Message]) -> None:
        if not collected:
            collected.append([])
            raise error
        collected.append(messages)

    h.pool.collect = collect
    h.pool.on_fatal = fatal.append
    lost, kept = h.message(), h.message()
    h.start()
    h.pool.submit_many([lost])
    wait_for(lambda: len(collected) == 1, "the first hand-over", TIMEOUT)
    h.pool.submit_many([kept])
    h.stop()
    assert [[m.id for m in batch] for batch in collected] == [[], [kept.id]]
    assert h.responder.calls == [("requeue", lost.id, 0.0, False)]
    assert not kept.has_responded
    assert fatal == ([] if isinstance(error, Exception) else [error])


def test_a_collecting_worker_screens_a_plain_run_in_one_hand_over() -> None:
    """The common run (nothing stale, nothing past max_attempts): admission is still asked per
    message, what it refuses is requeued at once, the rest reach collect in order, in one list,
    marked async."""
    h = Harness(ok, max_attempts=5)
    collected: list[list[Message]] = []
    h.pool.collect = collected.append
    run = [h.message(attempts=a) for a in (1, 2, 5, 1)]
    h.pool.admit = lambda message: message is not run[1]
    h.start()
    h.pool.submit_many(run)
    h.stop()
    assert [[m.id for m in batch] for batch in collected] == [[run[0].id, run[2].id, run[3].id]]
    assert all(m.is_async for m in collected[0])
    assert h.responder.calls == [("requeue", run[1].id, 0.0, False)]


def test_a_collecting_worker_requeues_a_run_whose_admission_raised_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An admission that raises (a bug) loses nothing: the run is requeued and logged, and the
    worker collects the next run."""
    h = Harness(ok)
    collected: list[list[Message]] = []
    h.pool.collect = collected.append
    calls: list[Message] = []

    def admit(message: Message) -> bool:
        calls.append(message)
        if len(calls) == 2:
            raise RuntimeError("admission failed")
        return True

    h.pool.admit = admit
    first = [h.message(), h.message()]
    h.start()
    h.pool.submit_many(first)
    wait_for(lambda: len(h.responder.calls) == 2, "the run requeued", TIMEOUT)
    later = h.message()
    h.pool.submit_many([later])
    h.stop()
    assert sorted(h.responder.calls) == sorted(("requeue", m.id, 0.0, False) for m in first)
    assert [[m.id for m in batch] for batch in collected] == [[later.id]]
    assert "a run of 2 message(s), requeued" in caplog.text
