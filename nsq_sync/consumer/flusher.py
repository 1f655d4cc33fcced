"""The flusher task: writes what workers left buffered, in batches.

Two kinds of work reach it:

* FIN/REQ/TOUCH commands answered outside the batch path (``message.finish()`` called by the
  handler or from another thread) only join their connection's write buffer
  (:meth:`~nsq_sync.wire.connection.NsqdConnection.buffer`); :meth:`Flusher.schedule` wakes
  the flusher, which writes every buffered connection in one system call each. While it writes,
  others keep appending, so under load each call carries many commands.
* FINs the workers hold back for a batch (:attr:`~nsq_sync.consumer.workers.WorkerPool.held`):
  workers write them when a batch is full or when they run out of messages; :meth:`Flusher.watch`
  makes the flusher write them after ``hold`` seconds if no worker did (a long handler must not
  hold back the FINs of the messages before it).

An idle consumer's flusher sleeps on its event: no polling.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from nsq_sync.consumer.workers import FIN_HOLD
from nsq_sync.errors import NSQConnectionError


class HeldAnswers(Protocol):
    """What the flusher needs of the worker pool."""

    @property
    def held(self) -> Any: ...

    def flush_held(self) -> None: ...


class Flusher:
    """One per consumer. ``schedule`` and ``watch`` are thread-safe.

    Args:
        runtime: threads or gevent.
        log: logger.
        hold: longest time held FINs wait for a worker before the flusher writes them, seconds.
    """

    def __init__(
        self,
        runtime: Any,
        log: logging.Logger | logging.LoggerAdapter[Any],
        hold: float = FIN_HOLD,
    ) -> None:
        self.runtime = runtime
        self.log = log
        self.hold = hold
        self._lock = runtime.lock()
        self._buffered: list[Any] = []  # connections whose write buffer waits for a flush
        self._wakeup = runtime.event()
        self._stopped = False
        self._task: Any = None
        self._held: HeldAnswers | None = None
        #: True while the flusher checks held FINs every ``hold`` seconds. Protocol: a worker
        # appends to ``held`` and then reads this flag; the flusher clears it and then reads
        # ``held``. Either the worker sees False (and wakes the flusher) or the flusher sees
        # the new message (and keeps watching): a held FIN is never forgotten.
        self.watching = False

    def start(self, name: str, held: HeldAnswers | None = None) -> None:
        self._held = held
        self._task = self.runtime.spawn(self._run, name=f"nsq_sync-flusher-{name}")

    def schedule(self, conn: Any) -> None:
        """Make sure ``conn``'s buffered commands are written soon."""
        with self._lock:
            self._buffered.append(conn)
            first = len(self._buffered) == 1
        if first:
            self._wakeup.set()

    def watch(self) -> None:
        """A worker holds FINs: write them within ``hold`` seconds unless a worker does."""
        if not self.watching:
            self.watching = True
            self._wakeup.set()

    def stop(self, timeout: float = 1.0) -> None:
        """Write what is left, then end the task."""
        self._stopped = True
        self._wakeup.set()
        if self._task is not None:
            self._task.join(timeout)
        if self._held is not None:
            self._held.flush_held()
        self._flush_all()

    def _run(self) -> None:
        while not self._stopped:
            self.step()

    def step(self) -> None:
        """One round of the task: sleep until woken (or ``hold`` seconds while watching held
        FINs), then write every buffered connection, and the held FINs when watching."""
        watching = self.watching
        self._wakeup.wait(self.hold if watching else None)
        self._wakeup.clear()
        self._flush_all()
        if watching and self._held is not None:
            self.watching = False
            if self._held.held:
                self.watching = True  # written now; look again after the next hold
            self._held.flush_held()

    def _flush_all(self) -> None:
        with self._lock:
            buffered, self._buffered = self._buffered, []
        for conn in dict.fromkeys(buffered):  # each connection once, in order
            try:
                conn.flush()
            except NSQConnectionError as exc:
                self.log.warning("could not write to nsqd %s: %s", conn.address, exc)
            except Exception:
                self.log.exception("flush to nsqd %s failed", conn.address)
