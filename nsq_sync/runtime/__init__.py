"""Threads and gevent behind one small interface: every blocking primitive nsq_sync uses comes
from a :class:`Runtime`. ``"auto"`` picks gevent when gevent has monkey-patched ``socket``,
else threads, and never decides at import (users may patch after importing nsq_sync): a
Producer decides in each process at its first publish there (:class:`AutoRuntime`), a Consumer
at ``start()``."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from nsq_sync import process
from nsq_sync._version import install_hint

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
    """Warn (RuntimeWarning) when ``runtime`` is threads but gevent has patched the process since:
    the client would block the gevent hub."""
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
    """``runtime="auto"`` decided at the first use in each process (again after a fork); reading
    :attr:`name` decides nothing. Only for clients that make their primitives at first use and
    afresh after a fork (the Producer); connections get the concrete runtime (:meth:`resolve`)."""

    def __init__(self) -> None:
        self._choice: _Choice | None = None  # made at its first use in each process

    def _current(self) -> _Choice | None:
        choice = self._choice
        return choice if choice is not None and choice.made_in.is_current() else None

    @property
    def name(self) -> str:
        """``"threads"`` or ``"gevent"``, as decided in this process, or as it would be now."""
        choice = self._current()
        return _detected() if choice is None else choice.runtime.name

    def resolve(self) -> Runtime:
        """This process's concrete runtime, decided now if need be; warns once per process if
        gevent patched it after threads were chosen. Thread-safe (racing threads decide alike)."""
        choice = self._current()
        if choice is None:
            choice = self._choice = _Choice()
        elif not choice.warned:
            self.patched_late()
        return choice.runtime

    def patched_late(self) -> bool:
        """True (with a RuntimeWarning, once per process) when threads were chosen here and gevent
        patched the process since."""
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
    """The runtime to use.

    Args:
        runtime: ``"auto"`` (gevent if gevent patched ``socket``, else threads), ``"threads"``,
            ``"gevent"``, or a Runtime (an :class:`AutoRuntime` is resolved unless ``lazy``).
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
            raise ConfigError(f"runtime='gevent' needs gevent: {install_hint('gevent')}") from exc
        return GeventRuntime()
    if isinstance(runtime, str):
        raise ConfigError(f"runtime must be 'auto', 'threads' or 'gevent', got {runtime!r}")
    return runtime
