"""BatchConsumer: batches on top of a Consumer's parts. The consumer's one worker screens and
marks async what it takes, and hands it to ``_Batcher.collect_many``; one batch task closes
batches and runs ``handle_batch``. ``max_in_flight >= batch_size``: credit can fill a batch.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Any

from nsq_sync.config import Config, positive_int
from nsq_sync.consumer.consumer import Consumer, check_argument_order
from nsq_sync.consumer.parts import ConsumerParts, PartsUser
from nsq_sync.consumer.running import RunSummary, run_to_end
from nsq_sync.consumer.stats import ConsumerStats
from nsq_sync.consumer.workers import GiveUpHandler, ends_task
from nsq_sync.durations import positive_seconds, to_seconds
from nsq_sync.errors import ConfigError
from nsq_sync.message import Message
from nsq_sync.metrics.observer import ConsumerObserver
from nsq_sync.runtime import Runtime

__all__ = ["BatchConsumer", "BatchHandler"]

BatchHandler = Callable[[list[Message]], Any]

_RESPONDED = operator.attrgetter("has_responded")

#: longest gap between two looks at the consumer's credit while a batch is open, in seconds
POLL = 0.01


class BatchConsumer:
    """Consumes ``topic``/``channel`` and calls ``handle_batch(list_of_messages)``, one batch at
    a time. Every public method may be called from any thread.

    A batch closes at ``batch_size`` messages, ``batch_timeout`` seconds (float or timedelta)
    after its first message, or as soon as no more credit can fill it. ``handle_batch`` returning
    finishes every message it did not answer itself; raising requeues them (delay policy, one
    failure for backoff), or gives up those on their last attempt (all of them after
    :class:`~nsq_sync.errors.DeadLetter`). The other arguments (``giving_up``, ``config``, the
    addresses, ``runtime``, ``dead_letter_topic``, any Config option) are as for
    :class:`~nsq_sync.consumer.Consumer`; ``max_in_flight`` defaults to ``batch_size`` (or the
    config's value when larger).

    Raises:
        ConfigError: a bad batch_size or batch_timeout, ``max_in_flight`` below ``batch_size``,
            ``concurrency`` (batches are handled one at a time), or anything Consumer rejects.
        InvalidName: a bad topic or channel name.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handle_batch: BatchHandler | None = None,  # required: None only to name a forgotten channel
        batch_size: int = 100,
        batch_timeout: Any = 1.0,
        *,
        giving_up: GiveUpHandler | None = None,
        config: Config | None = None,
        **options: Any,
    ) -> None:
        handle_batch = check_argument_order(
            "BatchConsumer", "handle_batch", topic, channel, handle_batch
        )
        if not callable(handle_batch):
            raise ConfigError(f"handle_batch must be callable, got {handle_batch!r}")
        size = positive_int("batch_size", batch_size)
        timeout = positive_seconds("batch_timeout", batch_timeout)
        if size is None or timeout is None:
            raise ConfigError("batch_size and batch_timeout may not be None")
        if "concurrency" in options:
            raise ConfigError("BatchConsumer handles one batch at a time: no concurrency option")
        if "max_in_flight" in options:
            max_in_flight = options.pop("max_in_flight")
            if isinstance(max_in_flight, int) and max_in_flight < size:
                raise ConfigError(
                    f"max_in_flight ({max_in_flight}) must be at least batch_size "
                    f"({size}): a batch would wait for credit it cannot get"
                )
        else:
            max_in_flight = max(size, config.max_in_flight if config else 1)
        self.handle_batch = handle_batch
        self.batch_size = size
        self.batch_timeout = timeout
        self._batcher = _Batcher(handle_batch, size, timeout, self.stop)
        self._consumer = Consumer(
            topic,
            channel,
            self._batcher,
            concurrency=1,
            giving_up=giving_up,
            config=config,
            max_in_flight=max_in_flight,
            **options,
        )
        self.topic = self._consumer.topic
        self.channel = self._consumer.channel
        self.config = self._consumer.config
        self.log = self._consumer.log

    @property
    def runtime(self) -> Runtime:
        """As :attr:`Consumer.runtime <nsq_sync.consumer.Consumer.runtime>`."""
        return self._consumer.runtime

    def start(self) -> None:
        """Start the batch task and the consumer; returns at once.

        Raises:
            Stopped: the consumer was stopped (consumers are not restartable), or it was started
                in another process before a fork.
        """
        self._consumer.start()  # decides the runtime (the parts are attached again if it changed)
        self._batcher.start(f"{self.topic}/{self.channel}")

    def run(
        self, timeout: Any = None, idle_timeout: Any = None, max_messages: int | None = None
    ) -> RunSummary:
        """As :meth:`Consumer.run <nsq_sync.consumer.Consumer.run>`; ``max_messages`` counts
        messages put in batches, and ``handled`` in the summary too.

        Raises:
            ConfigError, Stopped: as Consumer.run.
            SystemExit, KeyboardInterrupt: ``handle_batch`` raised it; its batch was requeued
                and the consumer stopped gracefully first.
        """
        return run_to_end(
            self,
            self._batcher.parts.control,
            timeout=timeout,
            idle_timeout=idle_timeout,
            max_messages=max_messages,
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully: no more messages arrive (RDY 0), the open batch closes and is handled,
        then as :meth:`Consumer.stop <nsq_sync.consumer.Consumer.stop>`; True when everything in
        flight was answered in time. Called from ``handle_batch``, it returns False at once.

        Raises:
            ConfigError: ``timeout`` is not a duration >= 0.
        """
        timeout = to_seconds(timeout, "timeout")
        batcher = self._batcher
        if batcher.on_own_task():
            batcher.stop_elsewhere(timeout)
            return False
        deadline = time.monotonic() + timeout
        batcher.stopping()  # the batch task leaves once nothing is in flight
        clean = self._consumer.stop(timeout)
        batcher.close(deadline)
        return clean

    def __enter__(self) -> BatchConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> ConsumerStats:
        """As :meth:`Consumer.stats <nsq_sync.consumer.Consumer.stats>`; ``failed`` counts every
        message of a batch whose handler raised."""
        return self._consumer.stats()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """As :meth:`Consumer.wait_connected <nsq_sync.consumer.Consumer.wait_connected>`."""
        return self._consumer.wait_connected(timeout)


class _Batcher(PartsUser):
    """A BatchConsumer's handler (it collects) and its batch task (it runs ``handle_batch``)."""

    def __init__(
        self,
        handle_batch: BatchHandler,
        batch_size: int,
        batch_timeout: float,
        stop: Callable[..., object],
    ) -> None:
        self.handle_batch = handle_batch
        #: handle_batch, timed and traced while metrics are on (nsq_sync.metrics)
        self.batch_handler: BatchHandler = handle_batch
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.stop_consumer = stop
        self._parts: ConsumerParts | None = None
        self._open: list[Message] = []  # collected, not yet handed to handle_batch
        # when _open[k * batch_size] arrived, for each k: when each batch still to be taken began
        self._arrived: list[float] = []
        self._busy = 0  # messages in the batch handle_batch is running on
        self._closing = False  # the consumer stopped: leave once the open batch is handled
        self._stopping = False  # stop() began
        self._stop_spawned = False
        self._task: Any = None

    # ------------------------------------------------------------------ PartsUser

    def __call__(self, message: Message) -> None:
        # not called while the pool's collect is set (attach sets it): kept correct anyway
        message.is_async = True
        self.collect_many([message])

    def attach(self, parts: ConsumerParts) -> None:
        """Batch on the consumer's (new) parts."""
        self._parts = parts
        self._lock = parts.runtime.lock()
        self._wake = parts.runtime.event()
        parts.pool.collect = self.collect_many  # the worker hands over lists, not messages

    def observe(self, observer: ConsumerObserver | None) -> None:
        handler = self.handle_batch
        self.batch_handler = handler if observer is None else observer.wrap_handler(handler, True)

    @property
    def parts(self) -> ConsumerParts:
        parts = self._parts
        assert parts is not None
        return parts

    # ------------------------------------------------------------------ lifecycle

    def start(self, name: str) -> None:
        """Start the batch task (once)."""
        if self._task is not None:
            return
        self._name = name
        runtime = self.parts.runtime
        # the task waits until it is known as the batch task and as one of the pool's tasks:
        # messages may already be arriving, and a handle_batch that calls stop() must be
        # recognised as running on it (else stop() would try to join its own task)
        known = runtime.event()
        self._task = runtime.spawn(self._batches_once_known, known, name=f"nsq_sync-batches-{name}")
        # one of the pool's tasks: the consumer's stop joins it (after the last message in
        # flight was answered) before it closes the connections, so the batch task's last
        # FINs and REQs are written, not cut off
        self.parts.pool.add_task(self._task)
        known.set()

    def on_own_task(self) -> bool:
        """True on the batch task (a handle_batch is calling)."""
        return self._task is not None and self.parts.runtime.is_current(self._task)

    def stop_elsewhere(self, timeout: float) -> None:
        """The BatchConsumer's ``stop(timeout)`` on a task of its own (once)."""
        with self._lock:
            spawn = not self._stop_spawned
            self._stop_spawned = True
        if spawn:
            self.parts.runtime.spawn(
                self.stop_consumer, timeout, name=f"nsq_sync-stop-{self._name}"
            )

    def stopping(self) -> None:
        """stop() began: the batch task leaves once nothing is in flight."""
        self._stopping = True
        self._wake.set()

    def close(self, deadline: float) -> None:
        """Handle the open batch, then end the task (until ``deadline``)."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.join(max(0.1, deadline - time.monotonic()))

    # ------------------------------------------------------------------ batching

    def collect_many(self, messages: list[Message]) -> None:
        """Add ``messages`` (screened, marked async) to the open batch, in order."""
        size = self.batch_size
        opened = self._open
        arrived = self._arrived
        with self._lock:
            before = len(opened)
            after = before + len(messages)
            # Batches are taken from the front, batch_size at a time (or all that is open), so
            # only every batch_size-th message can begin one: only its arrival time is kept.
            begins = -(-before // size) * size  # the first such position from ``before`` on
            starts = (after - 1 - begins) // size + 1 if begins < after else 0
            times = [time.monotonic()] * starts if starts else []
            opened.extend(messages)  # the two lists change together, nothing between them
            arrived.extend(times)
            # the batch task looks again after each batch it handles: wake it when the open
            # batch begins or fills
            wake = before == 0 or before < size <= after
        if wake:
            self._wake.set()

    def _cannot_grow(self, in_batches: int) -> bool:
        """No credit left, and every message in flight is in the batches."""
        credit_left, in_flight, _ = self.parts.connections.credit()
        return credit_left == 0 and in_flight <= in_batches

    def _batches_once_known(self, known: Any) -> None:
        known.wait()
        self._batches()

    def _batches(self) -> None:
        while True:
            batch: list[Message] = []
            wait: float | None = None
            with self._lock:
                count = len(self._open)
                in_batches = count + self._busy
                if count == 0:
                    if self._closing:
                        return
                else:
                    wait = self._arrived[0] + self.batch_timeout - time.monotonic()
                    if count >= self.batch_size or wait <= 0 or self._closing:
                        batch = self._take()
            if count == 0 and self._stopping:
                # leave once nothing can reach collect_many any more: the consumer is stopping (it
                # requeues whatever arrives now) and nothing it received is still in flight
                connections = self.parts.connections
                if connections.stopping and connections.in_flight() == 0:
                    return
                wait = POLL
            if not batch and count and self._cannot_grow(in_batches):
                with self._lock:
                    batch = self._take()
            if batch:
                try:
                    self._handle(batch)
                except Exception:  # never let the batch task die silently
                    self.parts.log.exception("handling a batch of %d message(s) failed", len(batch))
                continue
            self._wake.wait(None if wait is None else min(POLL, wait))
            self._wake.clear()

    def _take(self) -> list[Message]:
        """The oldest ``batch_size`` open messages (caller holds ``_lock``)."""
        batch = self._open[: self.batch_size]
        del self._open[: self.batch_size]
        del self._arrived[:1]  # the next batch (if any) begins at the next batch_size-th
        self._busy = len(batch)
        return batch

    def _handle(self, batch: list[Message]) -> None:
        pool = self.parts.pool
        if any(map(_RESPONDED, batch)) or any(map(pool.is_stale, batch)):
            live = self._live(batch)
        else:  # the common case, checked at C speed
            live = batch
        try:
            if live:
                self._run_handler(live)
        finally:
            with self._lock:
                self._busy = 0

    def _live(self, batch: list[Message]) -> list[Message]:
        """``batch`` without the messages answered already or whose connection closed."""
        pool = self.parts.pool
        live = []
        for message in batch:
            if message.has_responded:  # requeued when handing it to the batch failed
                continue
            if pool.is_stale(message):
                # nsqd redelivers it; it took a place of a run (admitted into the batch)
                self.parts.connections.skipped(message, admitted=True)
            else:
                live.append(message)
        return live

    def _run_handler(self, batch: list[Message]) -> None:
        try:
            self.batch_handler(batch)
        except BaseException as exc:
            if ends_task(exc):
                self._ended(batch, exc)
                return
            # anything else (an Exception, a gevent.Timeout, ...) fails this batch only
            try:
                self._failed(batch, exc)
            except BaseException as exc2:  # give_up lets out only what ends the task
                self._ended(batch, exc2)
            return
        # claimed here (the first answer wins), then finished with one write per connection
        to_finish = Message.claim_all(batch)
        if to_finish:
            self.parts.responder.finish_many(to_finish)

    def _failed(self, batch: list[Message], error: BaseException) -> None:
        """Requeue or give up what the failed batch left unanswered."""
        parts = self.parts
        unanswered = [m for m in batch if not m.has_responded]
        retried = [m for m in unanswered if not parts.pool.gives_up(m, error)]
        self.parts.log.exception(
            "batch handler failed on %d message(s); requeueing %d%s",
            len(batch),
            len(retried),
            parts.pool.when_retried(retried),
        )
        parts.connections.count("failed", len(batch))
        for message in unanswered:
            parts.pool.requeue_or_give_up(message, error)

    def _ended(self, batch: list[Message], exc: BaseException) -> None:
        """SystemExit/KeyboardInterrupt (stop gracefully) or GreenletExit (re-raised) from
        ``handle_batch``: nothing may stay in flight."""
        fatal = isinstance(exc, (SystemExit, KeyboardInterrupt))
        if fatal:
            self.parts.control.pause()  # first, or nsqd hands the batch straight back
        for message in batch:
            if not message.has_responded:
                message.requeue(0.0, backoff=False)
        if not fatal:
            raise exc
        # as sys.exit() in a view ends a web worker: stop gracefully, run() re-raises it
        self.parts.log.error("batch handler raised %r; stopping the consumer", exc)
        self.parts.control.set_fatal(exc)
        self.stop_consumer()
