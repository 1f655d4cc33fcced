"""The flusher without sockets or sleeps: a fake runtime whose event records how long the task
asked to sleep (the flusher's only notion of time) and returns at once; connections and the
worker pool's held FINs are in-memory recorders. Each test drives ``Flusher.step()`` (one round
of the task) by hand.
"""

from __future__ import annotations

import logging
from collections import deque

import pytest
from support.fakes import FakeEvent, FakeRuntime

from nsq_sync.consumer.flusher import Flusher
from nsq_sync.errors import ConnectionClosed


class Conn:
    """Records each flush; ``broken`` makes it fail like a lost connection."""

    def __init__(self, address: str, writes: list[str], broken: bool = False) -> None:
        self.address = address
        self.writes = writes
        self.broken = broken

    def flush(self) -> None:
        if self.broken:
            raise ConnectionClosed("gone", self.address)
        self.writes.append(self.address)


class Held:
    """The worker pool's held FINs."""

    def __init__(self) -> None:
        self.held: deque[str] = deque()
        self.flushed: list[list[str]] = []

    def flush_held(self) -> None:
        batch = list(self.held)
        self.held.clear()
        if batch:
            self.flushed.append(batch)


def make(hold: float = 0.002) -> tuple[Flusher, FakeEvent, Held]:
    runtime = FakeRuntime()
    flusher = Flusher(runtime, logging.getLogger("test.flusher"), hold=hold)
    held = Held()
    flusher.start("t/c", held)
    return flusher, runtime.events[0], held


def test_an_idle_flusher_sleeps_until_woken() -> None:
    flusher, wakeup, _ = make()
    flusher.step()
    assert wakeup.waits == [None]  # no timeout: no polling while idle


def test_scheduled_connections_are_written_once_each_in_order() -> None:
    flusher, wakeup, _ = make()
    writes: list[str] = []
    a, b = Conn("a", writes), Conn("b", writes)
    flusher.schedule(a)
    assert wakeup.flag  # the first schedule wakes the task
    wakeup.clear()
    flusher.schedule(b)
    flusher.schedule(a)
    assert not wakeup.flag  # later ones only join the list
    flusher.step()
    assert writes == ["a", "b"]
    flusher.step()
    assert writes == ["a", "b"]  # nothing twice


def test_a_lost_connection_is_logged_and_the_others_are_still_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flusher, _, _ = make()
    writes: list[str] = []
    flusher.schedule(Conn("gone", writes, broken=True))
    flusher.schedule(Conn("b", writes))
    with caplog.at_level(logging.WARNING, logger="test.flusher"):
        flusher.step()
    assert writes == ["b"]
    assert any("could not write to nsqd gone" in r.getMessage() for r in caplog.records)


def test_held_fins_are_written_within_hold_when_no_worker_does() -> None:
    flusher, wakeup, held = make(hold=0.002)
    held.held.append("m1")
    flusher.watch()  # a worker started a handler while m1's FIN was held
    assert wakeup.flag
    flusher.step()
    assert wakeup.waits == [0.002]  # slept at most `hold`
    assert held.flushed == [["m1"]]
    # it found FINs held, so it looks again after the next hold
    held.held.append("m2")
    flusher.step()
    assert wakeup.waits[-1] == 0.002
    assert held.flushed == [["m1"], ["m2"]]
    # nothing held at its next look: it stops watching, and sleeps until woken again
    flusher.step()
    flusher.step()
    assert wakeup.waits[-1] is None


def test_watch_while_watching_does_not_wake_the_task_again() -> None:
    flusher, wakeup, held = make()
    held.held.append("m1")
    flusher.watch()
    wakeup.clear()
    flusher.watch()
    assert not wakeup.flag


def test_stop_writes_what_is_left() -> None:
    flusher, wakeup, held = make()
    writes: list[str] = []
    flusher.schedule(Conn("a", writes))
    held.held.extend(["m1", "m2"])
    flusher.stop()
    assert writes == ["a"]
    assert held.flushed == [["m1", "m2"]]
    assert wakeup.flag  # the task was told to end
