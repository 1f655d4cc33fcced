"""Threads and gevent behind one small interface.

Every blocking primitive nsq_sync uses (tasks, events, locks, queues, sockets, sleep) comes from
a :class:`Runtime`. ``resolve_runtime("auto")`` picks gevent when gevent has monkey-patched
``socket`` *at the time the consumer or producer is built* (never at import: users may patch
after importing nsq_sync), and plain threads otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Runtime", "Task", "resolve_runtime"]


class Task(Protocol):
    """A running thread or greenlet."""

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class Runtime(Protocol):
    """Factory of concurrency primitives; implementations are stateless and shareable."""

    name: str

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


def resolve_runtime(runtime: str | Runtime | None = "auto") -> Runtime:
    """Return the runtime to use.

    Args:
        runtime: ``"auto"`` (gevent if gevent patched ``socket``, else threads), ``"threads"``,
            ``"gevent"``, or a Runtime instance.

    Raises:
        ConfigError: an unknown name, or ``"gevent"`` without gevent installed.
    """
    from nsq_sync.errors import ConfigError

    if runtime is None or runtime == "auto":
        runtime = "gevent" if _gevent_patched() else "threads"
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
