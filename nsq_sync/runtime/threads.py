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

    def queue(self, maxsize: int = 0) -> queue.Queue[Any]:
        return queue.Queue(maxsize)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def create_connection(self, address: tuple[str, int], timeout: float) -> socket.socket:
        return socket.create_connection(address, timeout=timeout)

    def is_current(self, task: Any) -> bool:
        return task is threading.current_thread()
