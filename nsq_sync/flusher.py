"""The flusher task: writes the FIN/REQ commands that workers buffered, in batches.

A worker that answers a message only appends the command to its connection's write buffer
(:meth:`~nsq_sync.connection.NsqdConnection.send_deferred`); when that buffer was empty it
wakes the flusher. While the flusher writes one batch, workers keep appending, so under load
each system call carries many commands, and with no added delay: an idle consumer's flusher
sleeps on its event and a lone answer is written as soon as the flusher runs.
"""

from __future__ import annotations

import logging
from typing import Any

from nsq_sync.errors import NSQConnectionError


class Flusher:
    """One per consumer. ``schedule`` is thread-safe."""

    def __init__(self, runtime: Any, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.runtime = runtime
        self.log = log
        self._lock = runtime.lock()
        self._dirty: list[Any] = []
        self._wakeup = runtime.event()
        self._stopped = False
        self._task: Any = None

    def start(self, name: str) -> None:
        self._task = self.runtime.spawn(self._run, name=f"nsq_sync-flusher-{name}")

    def schedule(self, conn: Any) -> None:
        """Make sure ``conn``'s buffered commands are written soon."""
        with self._lock:
            self._dirty.append(conn)
            first = len(self._dirty) == 1
        if first:
            self._wakeup.set()

    def stop(self, timeout: float = 1.0) -> None:
        """Write what is left, then end the task."""
        self._stopped = True
        self._wakeup.set()
        if self._task is not None:
            self._task.join(timeout)
        self._flush_all()

    def _run(self) -> None:
        while not self._stopped:
            self._wakeup.wait()
            self._wakeup.clear()
            self._flush_all()

    def _flush_all(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, []
        for conn in dict.fromkeys(dirty):  # each connection once, in order
            try:
                conn.flush()
            except NSQConnectionError as exc:
                self.log.warning("could not write to nsqd %s: %s", conn.address, exc)
            except Exception:
                self.log.exception("flush to nsqd %s failed", conn.address)
