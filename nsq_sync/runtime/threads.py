"""The plain-threads runtime (the default)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any


class ThreadsRuntime:
    """Daemon threads and the :mod:`threading`/:mod:`queue` primitives."""

    name = "threads"

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
        thread.start()
        return thread

    def event(self) -> threading.Event:
        return threading.Event()

    def lock(self) -> Any:
        return threading.Lock()

    def rlock(self) -> Any:
        return threading.RLock()

    def queue(self, maxsize: int = 0) -> Any:
        # SimpleQueue is implemented in C: several times faster than Queue on the hot path.
        return queue.SimpleQueue() if maxsize == 0 else queue.Queue(maxsize)

    def signal(self) -> Any:
        return _Signal()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def create_connection(self, address: tuple[str, int], timeout: float) -> socket.socket:
        return socket.create_connection(address, timeout=timeout)

    def is_current(self, task: Any) -> bool:
        return task is threading.current_thread()


class _Signal:
    """A one-shot event on a bare lock: cheaper than threading.Event (no Condition)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # already set
            pass

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            acquired = self._lock.acquire()
        else:
            acquired = self._lock.acquire(timeout=max(timeout, 0.0))
        if acquired:
            try:
                self._lock.release()  # stays set for later waits
            except RuntimeError:  # a second set() raced us: it is set either way
                pass
        return acquired
