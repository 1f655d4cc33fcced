"""Threads and gevent behind one small interface.

Every blocking primitive nsq_sync uses (tasks, events, locks, queues, sockets, sleep) comes from
a :class:`Runtime`. ``"auto"`` picks gevent when gevent has monkey-patched ``socket``, and plain
threads otherwise -- never at import (users may patch after importing nsq_sync). A Producer
decides in each process at its first publish there (:class:`AutoRuntime`): one made in a gunicorn
master with ``--preload`` runs on gevent in ``-k gevent`` workers, which patch after the fork; if
gevent patches a process after a producer started there on threads, it warns. A Consumer decides
at ``start()``: its parts are built with what "auto" picks when it is made, and built again on
gevent at ``start()`` if gevent patched the process since (``consumer.runtime`` reports, before
``start()``, what "auto" would pick now).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from nsq_sync import process

__all__ = [
    "AutoRuntime",
    "Runtime",
    "Task",
    "patched_after",
    "resolve_runtime",
    "warn_if_patched_late",
]


class Task(Protocol):
    """A running thread or greenlet."""

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class Runtime(Protocol):
    """Factory of concurrency primitives; implementations are stateless and shareable."""

    @property
    def name(self) -> str:
        """``"threads"`` or ``"gevent"``."""
        ...

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> Task: ...

    def event(self) -> Any: ...

    def signal(self) -> Any:
        """A one-shot event (set once, waited by one task); may be cheaper than event()."""
        ...

    def lock(self) -> Any: ...

    def rlock(self) -> Any: ...

    def queue(self, maxsize: int = 0) -> Any: ...

    def sleep(self, seconds: float) -> None: ...

    def create_connection(self, address: tuple[str, int], timeout: float) -> Any: ...

    def is_current(self, task: Task) -> bool: ...


def _gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return False
    return bool(monkey.is_module_patched("socket"))


def _detected() -> str:
    return "gevent" if _gevent_patched() else "threads"


def patched_after(runtime: Runtime) -> bool:
    """True when ``runtime`` is threads but gevent has patched the process since it was chosen."""
    return runtime.name == "threads" and _gevent_patched()


def warn_if_patched_late(runtime: Runtime, what: str) -> None:
    """Warn (RuntimeWarning) when ``runtime`` is threads but gevent has patched the process
    since: the client then blocks the gevent hub instead of yielding to other greenlets."""
    if patched_after(runtime):
        warnings.warn(
            f"{what} runs on the threads runtime, but gevent monkey-patched this process after "
            "the runtime was chosen: its blocking calls will stall other greenlets. Patch "
            f"before creating the {what}, or pass runtime='gevent'.",
            RuntimeWarning,
            stacklevel=2,
        )


class _Choice:
    """What "auto" decided in one process, and whether it warned about a late patch there."""

    __slots__ = ("runtime", "made_in", "warned")

    def __init__(self) -> None:
        self.runtime = resolve_runtime(_detected())
        self.made_in = process.Stamp()
        self.warned = False


class AutoRuntime:
    """``runtime="auto"`` decided lazily: at the first use in each process (the first lock,
    task or socket asked of it there), again after a fork. Reading :attr:`name` decides nothing.

    Only for clients that create their primitives at first use and afresh after a fork (the
    Producer). Connections get the concrete runtime (:meth:`resolve`), so their hot paths pay no
    indirection.
    """

    def __init__(self) -> None:
        self._choice: _Choice | None = None  # made at its first use in each process

    def _current(self) -> _Choice | None:
        choice = self._choice
        return choice if choice is not None and choice.made_in.is_current() else None

    @property
    def name(self) -> str:
        """``"threads"`` or ``"gevent"``: the decision in this process, or (before it is made)
        what it would be now."""
        choice = self._current()
        return _detected() if choice is None else choice.runtime.name

    def resolve(self) -> Runtime:
        """The concrete runtime of this process, deciding it now if not yet decided here.
        Warns once per process if gevent patched the process after threads were chosen.
        Thread-safe (threads deciding at once decide alike)."""
        choice = self._current()
        if choice is None:
            choice = self._choice = _Choice()
        elif not choice.warned:
            self.patched_late()
        return choice.runtime

    def patched_late(self) -> bool:
        """True (with a RuntimeWarning, once per process) when threads were chosen here and
        gevent has patched the process since."""
        choice = self._current()
        if choice is None or not patched_after(choice.runtime):
            return False
        if not choice.warned:
            choice.warned = True
            warn_if_patched_late(choice.runtime, "nsq_sync client")
        return True

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> Task:
        return self.resolve().spawn(fn, *args, name=name)

    def event(self) -> Any:
        return self.resolve().event()

    def signal(self) -> Any:
        return self.resolve().signal()

    def lock(self) -> Any:
        return self.resolve().lock()

    def rlock(self) -> Any:
        return self.resolve().rlock()

    def queue(self, maxsize: int = 0) -> Any:
        return self.resolve().queue(maxsize)

    def sleep(self, seconds: float) -> None:
        self.resolve().sleep(seconds)

    def create_connection(self, address: tuple[str, int], timeout: float) -> Any:
        return self.resolve().create_connection(address, timeout)

    def is_current(self, task: Task) -> bool:
        return self.resolve().is_current(task)

    def __repr__(self) -> str:
        return f"<AutoRuntime {self.name}>"


def resolve_runtime(runtime: str | Runtime | None = "auto", *, lazy: bool = False) -> Runtime:
    """Return the runtime to use.

    Args:
        runtime: ``"auto"`` (gevent if gevent patched ``socket``, else threads), ``"threads"``,
            ``"gevent"``, or a Runtime instance (an :class:`AutoRuntime` resolves to the
            concrete runtime of this process unless ``lazy``).
        lazy: return an :class:`AutoRuntime` for ``"auto"`` (decided at first use per process).

    Raises:
        ConfigError: an unknown name, or ``"gevent"`` without gevent installed.
    """
    from nsq_sync.errors import ConfigError

    if runtime is None or runtime == "auto":
        if lazy:
            return AutoRuntime()
        runtime = _detected()
    if isinstance(runtime, AutoRuntime) and not lazy:
        return runtime.resolve()
    if runtime == "threads":
        from nsq_sync.runtime.threads import ThreadsRuntime

        return ThreadsRuntime()
    if runtime == "gevent":
        try:
            from nsq_sync.runtime.gevent import GeventRuntime
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError(
                "runtime='gevent' needs gevent: pip install 'nsq_sync[gevent]'"
            ) from exc
        return GeventRuntime()
    if isinstance(runtime, str):
        raise ConfigError(f"runtime must be 'auto', 'threads' or 'gevent', got {runtime!r}")
    return runtime
