"""Fork safety: per-process state reset once, and nothing the library owns used across a fork.

A fork is noticed by whichever comes first: ``os.register_at_fork``; uWSGI's post-fork hook
(uWSGI forks from C, where Python's hooks do not run); or :func:`current`, which reads a
canary byte of a page advised ``MADV_WIPEONFORK`` (zeroed in every child, however it forked;
a memory load, not a system call) or, where that is not available, compares ``os.getpid()``.
All of them run the same reset, once per process. Nothing happens at import: objects call
:func:`install` when constructed.

Rules that keep a connection from ever being shared between processes:

- Every object that owns a socket or a task is :func:`track`-ed (weakly). In the child, before
  ``os.fork()`` returns, its abandon function runs: it takes no lock (a parent's thread may hold
  it), closes only the child's copies of descriptors (``close(2)``, never ``shutdown(2)``),
  kills copied greenlets, and marks a started Consumer stopped. A copied task can then only
  fail on a closed socket.
- The child's threads that notice the fork at once wait for the first to reset (under a lock
  made for the child's pid); the reset makes a new ``_lock``, so no lock a parent's thread
  held is used again, and publishes the canary and the pid last.
- :class:`PerProcess` replaces a value only when it was built in an older generation, under
  ``_lock`` with a double check, and :func:`track` notices a fork before it records: nothing
  opened in the child is ever abandoned or dropped.
"""

from __future__ import annotations

import importlib
import mmap
import os
import platform
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

#: forks since this interpreter started, as seen by this process (read it through current())
generation = 0
_installed = False
# The pid the state above belongs to: set by install(), then by every reset. Until install(),
# nothing was built that a fork could concern.
_pid = -1
# A byte that is 1 in the process that set it and 0 in every child forked since (see the
# module docstring); None where MADV_WIPEONFORK is not available (the pid is compared instead).
_canary: mmap.mmap | None = None
# Guards the rebuild of PerProcess values; replaced in every child (a parent's thread may have
# held it at the fork). Resets are serialised by the per-pid locks of _noticing.
_lock = threading.Lock()
# pid -> the lock under which that process's threads notice a fork by the pid (see _notice).
_noticing: dict[int, Any] = {}
# tracked object -> its abandon function (made on first use; weak keys)
# Made here, not on first use: two threads tracking their first objects at once would each make
# one, and the entries of the one that lost would never be abandoned in a child.
_tracked: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()
# Module-level state of other modules to replace in a forked child (replace_in_child).
_replacers: list[Callable[[], None]] = []

T = TypeVar("T")


def current() -> int:
    """The fork generation of this process, after noticing a fork no hook reported. Cheap (a byte
    read, or ``getpid()``); thread-safe; its reset runs once per process."""
    canary = _canary
    if canary is not None:
        if canary[0]:
            return generation
    elif os.getpid() == _pid:
        return generation
    _notice()
    return generation


def _new_canary() -> mmap.mmap | None:
    advice = getattr(mmap, "MADV_WIPEONFORK", None)
    if advice is None and sys.platform == "linux" and platform.machine() in _GENERIC_MADV:
        advice = 18  # asm-generic/mman-common.h (builds of Python without the name)
    if advice is None or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        page.madvise(advice)  # EINVAL before Linux 4.14
        page[0] = 1
    except (AttributeError, OSError, ValueError):
        return None
    return page


_GENERIC_MADV = frozenset(
    {"x86_64", "aarch64", "arm64", "i386", "i686", "armv7l", "ppc64le", "s390x", "riscv64"}
)


def _notice() -> None:
    pid = os.getpid()
    if _pid == -1:  # not installed: nothing was built that the fork concerns
        return
    # dict.setdefault is atomic: every thread of this process gets the same lock, made here
    lock = _noticing.setdefault(pid, threading.Lock())
    with lock:
        if _pid != pid:
            _reset(pid, lock)


def _reset(pid: int, notice_lock: Any) -> None:
    """The child's reset: new locks, one more generation, every tracked object abandoned; the
    canary and the pid last, so a thread that finds either current finds the rest done."""
    global generation, _lock, _noticing, _canary, _pid
    _lock = threading.Lock()
    for replace in _replacers:
        replace()
    _noticing = {pid: notice_lock}
    generation += 1
    for obj, abandon in list(_tracked.items()):
        try:
            abandon(obj)
        except Exception:  # pragma: no cover - best effort; never break the user's fork
            pass
    canary = _new_canary()  # built before it is published: a page with its byte set
    _pid = pid
    _canary = canary


def _after_fork_in_child() -> None:
    # os.register_at_fork: the child's only thread, before os.fork() returns
    pid = os.getpid()
    if _pid != pid:
        _reset(pid, threading.Lock())


def _after_uwsgi_fork() -> None:
    # uWSGI's post-fork hook, in each worker (mule, spooler) it forks from C
    current()


def install() -> None:
    """Register the fork hooks once (Python's; uWSGI's inside uWSGI). A race registering them twice
    is harmless: each hook checks the pid."""
    global _installed, _pid, _canary
    if _installed:
        return
    if _pid == -1:
        _canary = _new_canary()
        _pid = os.getpid()  # before _installed: see _notice
    _installed = True
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _install_uwsgi_hook()


def _install_uwsgi_hook() -> None:
    # The embedded `uwsgi` module exists only inside a uWSGI process (importing it elsewhere
    # fails); uwsgidecorators chains post-fork functions on it (uwsgi.post_fork_hook).
    if "uwsgi" not in sys.modules:
        return
    try:
        importlib.import_module("uwsgidecorators").postfork(_after_uwsgi_fork)
    except Exception:  # pragma: no cover - an unusual uWSGI build: the pid check remains
        try:
            uwsgi = sys.modules["uwsgi"]
            previous = getattr(uwsgi, "post_fork_hook", None)

            def hook() -> None:
                _after_uwsgi_fork()
                if previous is not None:
                    previous()

            setattr(uwsgi, "post_fork_hook", hook)  # noqa: B010 (an embedded module, untyped)
        except Exception:
            pass


def track(obj: Any, abandon: Callable[[Any], None]) -> None:
    """Call ``abandon(obj)`` in every forked child while ``obj`` lives (held weakly). Thread-safe.
    ``abandon`` runs in the fork hook: it must take no lock, do no I/O on the parent's resources
    (close descriptors only) and be idempotent; a plain function, not a bound method (that would
    keep ``obj`` alive)."""
    install()
    current()  # a fork not noticed yet is reset first: the child's own objects are never abandoned
    _tracked[obj] = abandon


def close_socket(sock: Any) -> None:
    """Close this process's copy of a socket's descriptor, never ``shutdown(2)`` (that would cut
    the parent's connection too), even while a ``makefile()`` file is open. Under gevent a socket
    nobody waits on is closed from the hub's next callback, after gevent re-initialised its loop.
    """
    if sock is None:
        return
    hub = getattr(sock, "hub", None)
    waited = any(
        getattr(getattr(sock, name, None), "callback", None) is not None
        for name in ("_read_event", "_write_event")
    )
    if hub is not None and not waited:
        hub.loop.run_callback(_close_now, sock)
    else:
        _close_now(sock)


def _close_now(sock: Any) -> None:
    try:
        real_close = getattr(sock, "_real_close", None)  # stdlib and gevent sockets
        if real_close is not None:
            sock._closed = True
            real_close()
        else:  # pragma: no cover - other socket types
            sock.close()
    except OSError:
        pass


def replace_in_child(replace: Callable[[], None]) -> None:
    """Call ``replace()`` first thing in every forked child's reset: for a module-level lock a
    parent's thread may have held at the fork. ``replace`` must take no lock and do no I/O.
    Registering installs nothing (safe at import time)."""
    _replacers.append(replace)


class Stamp:
    """Which process made something: :meth:`is_current` is False in a process forked since,
    however it forked. Cheap; thread-safe. ``pid``: the pid of the process that made it."""

    __slots__ = ("generation", "pid")

    def __init__(self) -> None:
        install()
        self.generation = current()
        self.pid = os.getpid()

    def is_current(self) -> bool:
        """True in the process that made this stamp (not in a child forked since)."""
        return self.generation == current()


class PerProcess(Generic[T]):
    """A value built once in each process that uses it: ``factory()`` at the first use after a fork
    (the fork hook already abandoned what the parent's value held). Thread-safe.

    Args:
        factory: builds the value; called under ``_lock``, keep it free of I/O.
        discard: called in the child with the parent's value once replaced, under ``_lock``.
        lazy: build the first value at the first :meth:`get`, not now.
    """

    __slots__ = ("_factory", "_discard", "_value", "_generation")

    def __init__(
        self,
        factory: Callable[[], T],
        discard: Callable[[T], None] | None = None,
        *,
        lazy: bool = False,
    ) -> None:
        install()
        self._factory = factory
        self._discard = discard
        self._value: T | None = None
        self._generation = -1  # no process: built by the first get() (lazy)
        if not lazy:
            self._value = factory()
            self._generation = current()

    def get(self) -> T:
        """This process's value (built here once: at first use if ``lazy``, and after a fork)."""
        if self._generation != current():
            with _lock:
                if self._generation != generation:
                    old = self._value
                    # value first, then the stamp: a thread that sees the new stamp sees the value
                    self._value = self._factory()
                    self._generation = generation
                    if old is not None and self._discard is not None:
                        self._discard(old)
        return self._value  # type: ignore[return-value]  # built above

    def peek(self) -> T | None:
        """The value if it belongs to this process, else None (nothing is built)."""
        # stamp first: the value is stored before its stamp (see get)
        return self._value if self._generation == current() else None
