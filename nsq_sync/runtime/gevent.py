"""The gevent runtime: greenlets and gevent's primitives. The only module importing gevent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
import gevent.lock
import gevent.queue
import gevent.socket
import gevent.threading

from nsq_sync import _fork


def _kill(greenlet: Any) -> None:
    """In a forked child (the fork hook): end a copied greenlet. ``kill(block=False)`` only
    schedules the GreenletExit on the hub (no lock, no switch now)."""
    if not greenlet.dead:
        greenlet.kill(block=False)


class GeventRuntime:
    """Greenlets instead of threads; works with or without monkey patching."""

    name = "gevent"

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> Any:
        greenlet = gevent.spawn(fn, *args)
        greenlet.name = name
        # fork() copies every greenlet into the child: ours are killed there (nsq_sync._fork)
        _fork.track(greenlet, _kill)
        return _Greenlet(greenlet)

    def event(self) -> Any:
        return gevent.event.Event()

    def lock(self) -> Any:
        return gevent.lock.Semaphore()

    def rlock(self) -> Any:
        return gevent.lock.RLock()

    def queue(self, maxsize: int = 0) -> Any:
        return gevent.queue.Queue(maxsize or None)

    def signal(self) -> Any:
        return gevent.event.Event()

    def sleep(self, seconds: float) -> None:
        gevent.sleep(seconds)

    def create_connection(self, address: tuple[str, int], timeout: float) -> Any:
        return gevent.socket.create_connection(address, timeout=timeout)

    def is_current(self, task: Any) -> bool:
        return isinstance(task, _Greenlet) and task.greenlet is gevent.getcurrent()


class _Greenlet:
    __slots__ = ("greenlet",)

    def __init__(self, greenlet: Any) -> None:
        self.greenlet = greenlet

    def join(self, timeout: float | None = None) -> None:
        self.greenlet.join(timeout)

    def is_alive(self) -> bool:
        return not self.greenlet.dead

    @property
    def name(self) -> str:
        return str(self.greenlet.name)
