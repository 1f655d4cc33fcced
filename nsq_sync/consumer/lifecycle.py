"""A consumer's lifecycle and run control (:class:`Lifecycle`): the process it started in, the
stop request that wakes ``run()``, a handler's fatal error. It outlives the parts, which
``runtime="auto"`` may rebuild at ``start()`` (:meth:`Lifecycle.attach`). Thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nsq_sync import process
from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.discovery import Discovery
from nsq_sync.consumer.workers import WorkerPool
from nsq_sync.errors import Stopped
from nsq_sync.message import Message
from nsq_sync.runtime import Runtime

__all__ = ["Lifecycle"]


class Lifecycle:
    """See the module (and RunControl); :meth:`attach` must be called before any other method."""

    # the consumer's current parts (attach)
    _connections: ConnectionSet
    _pool: WorkerPool
    _discovery: Discovery

    def __init__(self) -> None:
        self._started_in: process.Stamp | None = None
        self._fatal: BaseException | None = None
        self._stop_requested: Any = None  # an event of the parts' runtime (attach)
        self._admit: Callable[[Message], bool] | None = None

    def attach(
        self,
        runtime: Runtime,
        connections: ConnectionSet,
        pool: WorkerPool,
        discovery: Discovery,
    ) -> None:
        """Work with these parts from now on: the stop request and run()'s gate move onto them."""
        requested = self._stop_requested is not None and self._stop_requested.is_set()
        self._stop_requested = runtime.event()
        if requested:  # a signal run() caught before start() rebuilt the parts
            self._stop_requested.set()
        self._connections, self._pool, self._discovery = connections, pool, discovery
        pool.admit = self._admit

    # ------------------------------------------------------------------ the consumer's

    def started(self) -> None:
        """The consumer started in this process."""
        self._started_in = process.Stamp()

    def check_process(self) -> None:
        """Raise Stopped in a forked child of the process that started the consumer. Takes no lock
        (one may be held since the fork)."""
        started_in = self._started_in
        if started_in is None or started_in.is_current():
            return
        raise Stopped(
            f"this Consumer was started in process {started_in.pid} before it forked; its "
            f"threads and connections stay in that process and cannot be shared with this one "
            f"(pid {os.getpid()}). Create and start a new Consumer in each process after the "
            "fork (for example in gunicorn's post_fork hook, a uwsgidecorators.postfork "
            "function under uWSGI, or a multiprocessing pool initializer)"
        )

    def set_fatal(self, error: BaseException) -> None:
        """A handler raised ``error`` (SystemExit, KeyboardInterrupt); the first one is kept."""
        with self._connections.lock:
            if self._fatal is None:
                self._fatal = error

    # ------------------------------------------------------------------ RunControl

    def set_admit(self, admit: Callable[[Message], bool] | None) -> None:
        self._admit = admit
        self._pool.admit = admit

    def set_budget(self, deliveries: int) -> None:
        """Let nsqd deliver at most ``deliveries`` more messages (those queued count)."""
        self._connections.set_budget(max(0, deliveries - self._pool.queued()))

    def pause(self) -> None:
        self._connections.set_max_in_flight(0)

    def credit(self) -> tuple[int, int, int]:
        return self._connections.credit()

    def nothing_to_consume(self) -> bool:
        """True when there is no nsqd to consume from: no direct address, none connected, and
        lookupd answered that none carries the topic."""
        return not self._connections.addresses() and self._discovery.knows_no_nsqd()

    def connected(self) -> bool:
        return bool(self._connections.addresses())

    def unreached(self) -> list[str]:
        return self._discovery.unreached()

    def end_run(self) -> None:
        self._stop_requested.set()

    def wait_stopping(self, timeout: float | None) -> bool:
        return bool(self._stop_requested.wait(timeout))

    def fatal_error(self) -> BaseException | None:
        return self._fatal
