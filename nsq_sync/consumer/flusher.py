"""The flusher task: writes the FINs and REQs buffered outside a worker's batch
(:meth:`Flusher.schedule`: each connection in one system call), and the FINs workers hold when
no worker wrote them within ``hold`` seconds (:meth:`Flusher.watch`). Idle, it sleeps.
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
    """One per consumer. ``schedule`` and ``watch`` are thread-safe. ``hold``: the longest held
    FINs wait for a worker, in seconds."""

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
        """One round: sleep until woken (or ``hold`` seconds while watching), then write every
        buffered connection, and the held FINs when watching."""
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
