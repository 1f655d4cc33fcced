"""Fakes for the unit tests of the consumer's parts: a clock that moves only when told, and a
runtime whose events, locks and tasks do nothing by themselves (no threads, no sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FakeClock", "FakeEvent", "FakeLock", "FakeRuntime"]


class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds

    def jump_to(self, when: float | None) -> None:
        """Move to ``when`` (a deadline), never backwards: a deadline may already be past."""
        assert when is not None
        self.now = max(self.now, when)


class FakeEvent:
    """An event that never blocks: ``wait`` returns the flag at once (and records its
    timeout)."""

    def __init__(self) -> None:
        self.flag = False
        self.waits: list[float | None] = []

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.flag


class FakeLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class FakeRuntime:
    """Spawned functions are kept until :meth:`run_spawned` (a task "in flight"); the events it
    made are in :attr:`events`."""

    name = "fake"

    def __init__(self) -> None:
        self.spawned: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
        self.events: list[FakeEvent] = []

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> Any:
        self.spawned.append((name, fn, args))
        return None

    def event(self) -> FakeEvent:
        event = FakeEvent()
        self.events.append(event)
        return event

    def lock(self) -> FakeLock:
        return FakeLock()

    def run_spawned(self, name_prefix: str = "") -> list[str]:
        """Run the spawned functions whose task name starts with ``name_prefix``; their names."""
        ran = [s for s in self.spawned if s[0].startswith(name_prefix)]
        self.spawned = [s for s in self.spawned if not s[0].startswith(name_prefix)]
        for _, fn, args in ran:
            fn(*args)
        return [name for name, _, _ in ran]
