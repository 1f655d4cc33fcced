"""The streaming source: one Consumer on the driver; a batch's messages are FINed on commit.

Spark serves ``read`` and ``commit`` of one reader object sequentially, on the main thread of one
long-lived driver-side Python process; other copies are unpickled elsewhere (executors only call
``readBetweenOffsets``, on a replay). So the Consumer starts lazily on the first ``read`` and is
never pickled. It cannot live on executors: a message can only be FINed over the connection
that delivered it, and Spark commits on the driver, after a task's connection is gone.

The handler keeps every message (``enable_async``) in a buffer; ``read`` takes up to
``max_messages_per_batch`` of them as rows under the offset ``{"seq": start + 1}``, pending;
``commit(end)`` FINs every pending batch up to ``end``. Spark commits batch N only while it
builds N+1, so with messages pending and none arriving for ``commit_flush_after`` seconds,
``read`` returns an empty batch. A TOUCH task keeps held messages from timing out at nsqd.

When the query stops or the process exits, everything held is requeued at once. A replayed
batch is empty: its messages were never FINed, so nsqd redelivers them. At least once: a batch
whose output was written but whose commit never arrived is delivered again.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from nsq_sync.consumer import Consumer
from nsq_sync.errors import NSQError
from nsq_sync.message import Message
from nsq_sync.spark._options import SourceOptions
from nsq_sync.spark._partition import messages_to_arrow, requeue_now

try:  # pyspark >= 4.1 (availableNow for Python sources)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow
except ImportError:  # pragma: no cover - pyspark 4.0

    class _AvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger(__name__)

__all__ = ["NsqStreamReader"]

#: how long ``read`` waits for a first message when nothing is pending (keeps Spark's
#: no-data polling from spinning)
_IDLE_WAIT = 0.1
#: a batch stops filling once no message arrived for this long
_LINGER = 0.05
#: how long the availableNow drain waits for the first connection
_CONNECT_WAIT = 30.0


class NsqStreamReader(SimpleDataSourceStreamReader, _AvailableNow):  # type: ignore[misc]
    """Reads NSQ into micro-batches; see the module docs. Picklable (the live state is not)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._consumer: Consumer | None = None
        self._buffer: deque[Message] = deque()
        self._pending: dict[int, list[Message]] = {}
        self._closing = False
        self._signalled = False
        self._critical = 0  # main thread only: > 0 while SIGTERM must not unwind it
        self._exit_deferred = False
        self._available_now = False
        self._toucher: threading.Thread | None = None
        self._stop_touching = threading.Event()

    def __getstate__(self) -> dict[str, Any]:
        # Only what describes the source: no consumer, lock or thread leaves this process.
        return {"options": self.options, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self.schema = state["schema"]
        self._reset()

    # ------------------------------------------------------------------ Spark's calls

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Any], dict[str, int]]:
        """Up to ``max_messages_per_batch`` buffered messages as rows, and the next offset."""
        self._ensure_started()
        seq = int(start["seq"])
        messages = self._take(seq + 1)
        if messages:
            return iter([self._to_arrow(messages)]), {"seq": seq + 1}
        with self._lock:
            pending = bool(self._pending)
        if pending:
            # The zero-row tick: an empty batch, so that Spark commits the pending one.
            return iter([]), {"seq": seq + 1}
        return iter([]), {"seq": seq}

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        # A batch replayed after a restart: its messages were never FINed; nsqd redelivers them
        # (at once when the old process requeued them, else after msg_timeout).
        return iter([])

    def commit(self, end: dict[str, Any]) -> None:
        """FIN every pending batch up to ``end`` (unknown or older offsets are ignored)."""
        last = int(end["seq"])
        n = 0
        # Once popped, a batch is this thread's to FIN: a SIGTERM must not unwind it half-way.
        with self._uninterrupted():
            with self._lock:
                done = [seq for seq in self._pending if seq <= last]
                batches = [self._pending.pop(seq) for seq in sorted(done)]
            for batch in batches:
                for message in batch:
                    message.finish()
                n += len(batch)
        if n:
            log.debug("nsq source: committed offset %d, finished %d message(s)", last, n)

    # ------------------------------------------------------------------ consumer side

    def _ensure_started(self) -> None:
        if self._consumer is not None:
            return
        opts = self.options
        self._consumer = Consumer(
            opts.topic,
            opts.channel,
            self._on_message,
            nsqd_tcp_addresses=list(opts.nsqd_tcp_addresses),
            lookupd_http_addresses=list(opts.lookupd_http_addresses),
            config=opts.config,
            runtime="threads",  # Spark's runner loop blocks on a plain socket
        )
        self._consumer.start()
        interval = (opts.config.msg_timeout or 60.0) / 3
        self._toucher = threading.Thread(
            target=self._touch_loop, args=(interval,), name="nsq_sync-spark-touch", daemon=True
        )
        self._toucher.start()
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            # Spark stops the reader's process with SIGTERM and never calls stop() on a simple
            # reader: requeue what we hold, then let the process exit.
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_message(self, message: Message) -> None:
        message.enable_async()
        with self._lock:
            if self._closing:
                message.requeue(0.0, backoff=False)
                return
            self._buffer.append(message)
            self._arrived.notify_all()

    def _take(self, seq: int) -> list[Message]:
        """Wait for up to a batch of messages; what it returns is pending under ``seq``."""
        opts = self.options
        limit = opts.max_messages_per_batch
        with self._lock:
            if not self._buffer:
                if self._available_now and not self._pending:
                    self._wait_for_drain_start()
                    wait = opts.drain_idle_timeout
                elif self._pending:
                    wait = opts.commit_flush_after
                else:
                    wait = _IDLE_WAIT
                self._arrived.wait_for(lambda: bool(self._buffer), wait)
            # Let a batch fill while messages keep coming (nsqd sends them in bursts).
            size = -1
            while len(self._buffer) < limit and len(self._buffer) != size:
                size = len(self._buffer)
                self._arrived.wait(_LINGER)
            # Taken and pending in one step: close() finds every message in one place or the
            # other, and a SIGTERM cannot land in between.
            with self._uninterrupted():
                n = min(limit, len(self._buffer))
                messages = [self._buffer.popleft() for _ in range(n)]
                if messages:
                    self._pending[seq] = messages
            return messages

    def _wait_for_drain_start(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._lock.release()
        try:
            if not consumer.wait_connected(_CONNECT_WAIT):
                raise NSQError(
                    f"nsq source: no connection to nsqd for {self.options.topic}/"
                    f"{self.options.channel} within {_CONNECT_WAIT:g} s "
                    f"(nsqd_tcp_addresses={list(self.options.nsqd_tcp_addresses)}, "
                    f"lookupd_http_addresses={list(self.options.lookupd_http_addresses)})"
                )
        finally:
            self._lock.acquire()

    def _to_arrow(self, messages: list[Message]) -> Any:
        return messages_to_arrow(messages, self.options, self.schema.fieldNames())

    def _held(self) -> list[Message]:
        with self._lock:
            held = list(self._buffer)
            for batch in self._pending.values():
                held.extend(batch)
            return held

    def _touch_loop(self, interval: float) -> None:
        while not self._stop_touching.wait(interval):
            held = self._held()
            for message in held:
                message.touch()
            if held:
                log.debug("nsq source: touched %d held message(s)", len(held))

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Requeue every message held (REQ 0: nsqd hands them out again at once) and stop the
        consumer. Idempotent; thread-safe."""
        with self._lock:
            if self._closing or self._consumer is None:
                self._closing = True
                return
            self._closing = True
            held = list(self._buffer)
            for batch in self._pending.values():
                held.extend(batch)
            self._buffer.clear()
            self._pending.clear()
            consumer = self._consumer
        self._stop_touching.set()
        requeue_now(held)
        log.info("nsq source: stopping; requeued %d held message(s)", len(held))
        consumer.stop(timeout=10.0)

    @contextlib.contextmanager
    def _uninterrupted(self) -> Iterator[None]:
        """On the main thread: a SIGTERM arriving inside exits only at its end."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
            if not self._critical and self._exit_deferred:
                raise SystemExit(0)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Spark sends SIGTERM twice: only the first one acts.
        if self._signalled:
            return
        self._signalled = True
        # The signal may have interrupted this very thread inside a lock that close() needs (the
        # source's own, or a connection's while commit() writes FINs): close on a thread of its
        # own, which the interpreter waits for before it exits (not a daemon). This thread
        # unwinds at once, releasing whatever it held, unless it is between taking messages and
        # recording them, or FINing a committed batch: then it unwinds when that is done.
        threading.Thread(target=self._close_on_signal, name="nsq_sync-spark-sigterm").start()
        if self._critical:
            self._exit_deferred = True
            return
        raise SystemExit(0)

    def _close_on_signal(self) -> None:
        start = time.monotonic()
        self.close()
        log.info("nsq source: SIGTERM handled in %.2f s", time.monotonic() - start)
