"""Fork safety: per-process state reset once, and nothing the library owns used across a fork.

``generation`` counts the forks in this process's lineage; :func:`current` returns it after
noticing a fork, and every place that asks "is this still the process that built this?" compares
a stamp with :func:`current` (``PerProcess``, the runtime choice, the transport's dial, a started
Consumer, the HTTP clients). A fork is noticed three ways, whichever comes first; all three run
the same reset (:func:`_reset`), once per process:

* ``os.register_at_fork``: Python's own ``os.fork()`` (gunicorn, multiprocessing, celery) runs
  the hook in the child before ``fork()`` returns;
* uWSGI's post-fork hook (``uwsgidecorators.postfork``), registered when the process runs inside
  uWSGI: uWSGI forks its workers from C, where Python's hooks do not run (unless it was started
  with ``--py-call-osafterfork``);
* the canary: :func:`current` reads one byte of a private page advised ``MADV_WIPEONFORK``
  (Linux >= 4.14), which the kernel hands to every forked child zeroed, however the fork was
  made. It catches any other fork from C (an extension, ``ctypes``) and an application that
  replaced uWSGI's hook. Reading it is a memory load, not a system call: ``os.getpid()`` costs
  about 2 us on virtual machines that trap system calls, the page 0.05 us. Where the advice is
  not available (other systems, old kernels), :func:`current` compares ``os.getpid()`` with the
  pid the state belongs to instead. The publish path and the HTTP clients pay this check; a
  consumed message does not (only objects built after a check handle messages).

:func:`install` registers the hooks once; the objects that need them call it when constructed
(nothing happens at import). Where ``os.fork`` does not exist (Windows) there is no hook, and no
fork either.

**No connection is shared between processes, by construction.** Every object that owns a socket
or a task registers itself with :func:`track` (weakly: tracking never keeps anything alive). The
fork hook runs in the child before ``os.fork()`` returns, before anything else of the child runs,
and calls each tracked object's abandon function, which takes no lock (a lock may be held by a
thread that does not exist in the child) and never touches what the parent owns:

* an nsqd connection closes the *child's copies* of its descriptors (``close(2)``; never
  ``shutdown(2)``, which would cut the parent's connection) and marks itself closed;
* an HTTP connection of our clients does the same for its socket;
* a gevent task (a greenlet) is killed: under gevent, fork copies every greenlet into the child,
  and a copied greenlet that was waiting on a socket would otherwise wake up in the child and
  read the parent's answers. With its socket closed it can only fail (gevent throws into a
  greenlet waiting on a socket that is closed; a later read finds the socket closed), and the
  kill ends it. Threads do not survive a fork at all.
* a started Consumer marks its copy stopped, so nothing it still holds reconnects in the child.

Whatever a copied task does in the child therefore fails on a closed socket instead of sharing
the parent's (a copied publish raises an NSQError to its copied caller), and the parent's
objects are not touched at all.

:class:`PerProcess` holds what must be rebuilt in a child (a producer's connection pool, an
HTTP session). Why its reset runs exactly once per process and never touches what the child
opened, however many threads of the child notice the fork at once:

* The reset makes a *new* ``_lock`` in the child. The lock a parent's thread may have held at
  the moment of the fork is never used again, so a child cannot deadlock on it.
* A fork noticed by the pid is reset under a lock made for that pid (``_noticing``): of all the
  threads of a child that notice it at once, the first resets and the others wait for it, then
  find the pid current. The parent's own notice lock (which one of its threads may have held at
  the fork) is never the child's: the child's pid differs.
* :meth:`PerProcess.get` compares the value's generation with :func:`current`; on a mismatch it
  takes ``_lock`` and checks again, so of all the threads that noticed the fork, the first builds
  the child's value and the others find it already built (double-checked locking).
* :func:`track` notices a fork before it records anything: what the child opens is recorded
  after the reset, so the reset never abandons it.
* Everything the child opens lives in the value built *in the child* (stamped with the child's
  generation); a value is only replaced when its stamp is older, i.e. when it was built before
  the fork, so nothing opened in the child is ever dropped.
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
# Serialises resets within one process; replaced in every child (see the module docstring).
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
    """The fork generation of this process, after noticing a fork that ran no hook (a fork from
    C: uWSGI's workers, an extension). Cheap (a byte read, or one ``getpid()`` where the canary
    page is not available); thread-safe; the reset it may run happens once per process however
    many threads call this at once."""
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
    """The child's reset: new locks, one more generation, every tracked object abandoned, and
    last the canary and the pid: a thread that finds either current (and so does not wait for
    the reset) must find everything else done. (With the canary set first, a thread of the
    child could read the old generation and use the parent's pool while it was being closed.)"""
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
    """Register the fork hooks (once): Python's, and uWSGI's when running inside uWSGI.
    Thread-safe enough: a race registers them twice, which is harmless (a reset runs once per
    process: each hook checks the pid)."""
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
    """Call ``abandon(obj)`` in every forked child while ``obj`` lives (it is held weakly).

    ``abandon`` runs in the fork hook: it must take no lock, do no I/O on the parent's
    resources (close descriptors only) and be idempotent. A plain function, not a bound method
    (that would keep ``obj`` alive). Thread-safe.
    """
    install()
    current()  # a fork not noticed yet is reset first: the child's own objects are never abandoned
    _tracked[obj] = abandon


def close_socket(sock: Any) -> None:
    """Close a socket object's descriptor (this process's copy): no ``shutdown(2)``, which
    would cut the connection for the parent too. Closes even while a file made by
    ``makefile()`` is open (an HTTP response being read); later reads raise OSError.

    gevent: a socket a greenlet waits on is closed here at once (gevent throws into the waiter
    and closes the descriptor from the hub's next callback, after it re-initialised its loop);
    a socket nobody waits on is closed from that callback too, as closing it now would touch
    the event loop before gevent re-initialised it (Transport also refuses to read once its
    closed flag is set, which the hook sets at once)."""
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
    """Call ``replace()`` in every forked child, first thing in the reset: for a module-level
    lock that a parent's thread may have held at the fork (``message.claim_lock``). ``replace``
    must take no lock and do no I/O. Registering installs nothing (safe at import time)."""
    _replacers.append(replace)


class Stamp:
    """Which process made something: :meth:`is_current` is False in a process forked since,
    however the fork was made. The one "is this still my process?" check of nsq_sync (a started
    Consumer, a dial in progress, the runtime "auto" chose, a Spark worker's one-time set-up);
    :class:`PerProcess` builds on the same generation. Cheap; thread-safe.

    Attributes:
        pid: the pid of the process that made it.
    """

    __slots__ = ("generation", "pid")

    def __init__(self) -> None:
        install()
        self.generation = current()
        self.pid = os.getpid()

    def is_current(self) -> bool:
        """True in the process that made this stamp (not in a child forked since)."""
        return self.generation == current()


class PerProcess(Generic[T]):
    """A value built once in each process that uses it: ``factory()`` on first use after a
    fork (what the parent's value held was already abandoned by the fork hook). Thread-safe.

    Args:
        factory: builds the value for the current process (called under the reset lock; keep it
            free of I/O).
        discard: called in the child with the parent's value once it is replaced (its sockets
            are already closed by the fork hook), under the reset lock: keep it short.
        lazy: build the first value at the first :meth:`get`, not now (a Producer: its runtime
            is decided when it first publishes).
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
        """The value of the current process (built here once: at the first use if ``lazy``,
        and after a fork)."""
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
