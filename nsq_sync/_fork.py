"""Fork detection without a system call per check, and per-process state that is reset once.

Objects holding sockets (Producer connections, HTTP sessions) must not reuse them in a forked
child. ``generation`` counts the forks in this process's lineage: ``os.register_at_fork`` bumps
it in every child, so comparing it with a copy taken earlier is an integer compare instead of a
``getpid()`` system call on every publish. :func:`install` registers the hook once; the objects
that need it call it when constructed (nothing happens at import). Where ``os.fork`` does not
exist (Windows) there is no hook, and no fork either.

:class:`PerProcess` holds what must not cross a fork (a producer's connections, an HTTP
session). Why its reset runs exactly once per process and never touches what the child opened,
however many threads of the child notice the fork at once:

* The hook runs in the child before ``os.fork()`` returns, while the forking thread is the only
  thread there: it bumps ``generation`` and makes a *new* ``_lock``. The lock a parent's thread
  may have held at the moment of the fork is never used again, so a child cannot deadlock on it.
* :meth:`PerProcess.get` compares the value's generation with ``generation``; on a mismatch it
  takes ``_lock`` and checks again, so of all the threads that noticed the fork, the first builds
  the child's value and the others find it already built (double-checked locking).
* Everything the child opens lives in the value built *in the child* (stamped with the child's
  generation); the reset only ever discards the value stamped with an older generation, which
  was built before the fork. A second reset in the same process cannot happen (the stamps
  match), so nothing opened in the child is ever discarded by one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

#: forks since this interpreter started, as seen by this process
generation = 0
_installed = False
# Serialises resets within one process; replaced in every child (see the module docstring).
_lock = threading.Lock()

T = TypeVar("T")


def _after_fork_in_child() -> None:
    global generation, _lock
    _lock = threading.Lock()
    generation += 1


def install() -> None:
    """Register the fork hook (once). Thread-safe enough: a race registers it twice, and a child
    then sees two bumps instead of one, which still differs from its copy."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        _installed = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def started_elsewhere(stamp: tuple[int, int] | None) -> str | None:
    """For objects that own threads and cannot follow a fork (a started Consumer): given the
    ``stamp()`` taken when they started, the error message to raise in a forked child (None in
    the process that started them)."""
    if stamp is None or stamp[0] == generation:
        return None
    return (
        f"this Consumer was started in process {stamp[1]} before it forked; its threads and "
        f"connections stay in that process and cannot be shared with this one (pid "
        f"{os.getpid()}). Create and start a new Consumer in each process after the fork (for "
        "example in gunicorn's post_fork hook or a multiprocessing pool initializer)"
    )


def stamp() -> tuple[int, int]:
    """(generation, pid) of the current process, for :func:`started_elsewhere`."""
    install()
    return generation, os.getpid()


class PerProcess(Generic[T]):
    """A value built once in each process that uses it: ``factory()`` on first use after a
    fork, and ``discard(old)`` for the value inherited from the parent. Thread-safe.

    Args:
        factory: builds the value for the current process (called under the reset lock; keep it
            free of I/O).
        discard: drops the parent's value in the child (close descriptors only: never shut
            down a socket the parent still uses).
        lazy: build the first value at the first :meth:`get`, not now (a Producer: its runtime
            is decided when it first publishes).
    """

    __slots__ = ("_factory", "_discard", "_value", "_generation")

    def __init__(
        self, factory: Callable[[], T], discard: Callable[[T], None], *, lazy: bool = False
    ) -> None:
        install()
        self._factory = factory
        self._discard = discard
        self._value: T | None = None
        self._generation = -1  # no process: built by the first get() (lazy)
        if not lazy:
            self._value = factory()
            self._generation = generation

    def get(self) -> T:
        """The value of the current process (built here once: at the first use if ``lazy``,
        and after a fork)."""
        if self._generation != generation:
            with _lock:
                if self._generation != generation:
                    old = self._value
                    # value first, then the stamp: a thread that sees the new stamp sees the value
                    self._value = self._factory()
                    self._generation = generation
                    if old is not None:
                        self._discard(old)
        return self._value  # type: ignore[return-value]  # built above

    def peek(self) -> T | None:
        """The value if it belongs to this process, else None (nothing is built or dropped)."""
        # stamp first: the value is stored before its stamp (see get)
        return self._value if self._generation == generation else None
