"""The gevent runtime: greenlets and gevent's primitives. The only module importing gevent."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
import gevent.lock
import gevent.queue
import gevent.socket
import gevent.threading

from nsq_sync import process as _fork


def _kill(greenlet: Any) -> None:
    """Fork hook: end a copied greenlet (``kill(block=False)``: no lock, no switch now)."""
    if not greenlet.dead:
        greenlet.kill(block=False)


class GeventRuntime:
    """Greenlets instead of threads; works with or without monkey patching."""

    name = "gevent"

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> Any:
        greenlet = gevent.spawn(fn, *args)
        greenlet.name = name
        # fork() copies every greenlet into the child: ours are killed there (nsq_sync.process)
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
        """Dial ``address`` within ``timeout``, name resolution included (gevent's own
        ``create_connection`` does not count the resolver's time): an IP literal is dialled without
        the resolver; socket.timeout when the time runs out."""
        host, port = address
        family = _ip_family(host)
        if family is not None:
            return _dial(family, (host, port), timeout)
        deadline = time.monotonic() + timeout
        with gevent.Timeout(timeout, socket.timeout(f"timed out resolving {host!r}")):
            infos = gevent.socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        error: OSError = OSError(f"getaddrinfo returned nothing for {host!r}")
        for family, _, _, _, sockaddr in infos:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout(f"timed out connecting to {host!r}")
            try:
                return _dial(family, sockaddr, remaining)
            except OSError as exc:
                error = exc
        raise error

    def is_current(self, task: Any) -> bool:
        return isinstance(task, _Greenlet) and task.greenlet is gevent.getcurrent()


def _ip_family(host: str) -> int | None:
    """AF_INET or AF_INET6 when ``host`` is an IP literal, else None (a name to resolve)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        return family
    return None


def _dial(family: int, sockaddr: Any, timeout: float) -> Any:
    sock = gevent.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


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
