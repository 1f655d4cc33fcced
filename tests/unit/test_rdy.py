"""The RDY manager as pure policy: a fake clock, a seeded RNG, no sockets, no threads.

Every returned action list is applied one action at a time to a model of "what nsqd was told"
(:class:`Wire`), and the invariants are checked after *each* action, not only after the batch:
the consumer writes RDY commands in the order the manager returns them, so an increase that comes
before the matching decrease would briefly hand out more credit than ``max_in_flight``.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from support.fakes import FakeClock
from support.properties import examples

from nsq_sync.backoff import ExponentialBackoff, FullJitterBackoff
from nsq_sync.credit.manager import STARVED_RATIO, RDYManager


class Wire:
    """What every nsqd was last told, built only from the actions the manager returned.

    ``apply`` sends the actions one by one and checks after each one that the credit handed out
    never exceeds ``max_in_flight``, never exceeds a connection's ``max_rdy_count`` and is never
    negative; after the batch the wire must agree with the manager's own view.
    """

    def __init__(self, manager: RDYManager) -> None:
        self.m = manager
        self.rdy: dict[Hashable, int] = {}
        self.max_rdy: dict[Hashable, int] = {}
        self.ever_served: set[Hashable] = set()
        self.batches = 0

    # -- events, each followed by apply()

    def add(self, key: Hashable, max_rdy: int = 2500) -> list[tuple[Any, int]]:
        self.rdy[key] = 0  # SUB leaves a new connection at RDY 0
        self.max_rdy[key] = max_rdy
        return self.apply(self.m.add(key, max_rdy))

    def remove(self, key: Hashable) -> list[tuple[Any, int]]:
        # The connection is gone: nsqd forgets its RDY with it.
        self.rdy.pop(key, None)
        self.max_rdy.pop(key, None)
        return self.apply(self.m.remove(key))

    def message(self, key: Hashable) -> list[tuple[Any, int]]:
        return self.apply(self.m.on_message(key))

    def finish(self, key: Hashable) -> list[tuple[Any, int]]:
        before = self.m.max_in_flight  # an answer may lower it (a budget): decreases first
        return self.apply(self.m.on_finish(key), limit=max(before, self.m.max_in_flight))

    def requeue(self, key: Hashable, backoff: bool = True) -> list[tuple[Any, int]]:
        before = self.m.max_in_flight
        actions = self.m.on_requeue(key, backoff=backoff)
        return self.apply(actions, limit=max(before, self.m.max_in_flight))

    def set_budget(self, n: int) -> list[tuple[Any, int]]:
        before = self.m.max_in_flight
        return self.apply(self.m.set_budget(n), limit=max(before, n))

    def tick(self) -> list[tuple[Any, int]]:
        return self.apply(self.m.tick())

    def set_max_in_flight(self, n: int) -> list[tuple[Any, int]]:
        # Lowering the limit is only safe because the decreases come first: check against the
        # larger of the two limits until the batch is applied, then against the new one.
        before = self.m.max_in_flight
        return self.apply(self.m.set_max_in_flight(n), limit=max(before, n))

    # -- the checker

    def apply(
        self, actions: list[tuple[Any, int]], limit: int | None = None
    ) -> list[tuple[Any, int]]:
        self.batches += 1
        limit = self.m.max_in_flight if limit is None else limit
        for key, count in actions:
            assert key in self.rdy, f"RDY {count} for unknown connection {key!r}"
            assert count >= 0, f"negative RDY {count} for {key!r}"
            assert count <= self.max_rdy[key], (
                f"RDY {count} for {key!r} is above its max_rdy_count {self.max_rdy[key]}"
            )
            self.rdy[key] = count
            if count > 0:
                self.ever_served.add(key)
            total = sum(self.rdy.values())
            assert total <= limit, (
                f"after ({key!r}, {count}) of {actions}: sum(RDY)={total} > max_in_flight={limit}"
            )
        total = sum(self.rdy.values())
        assert total <= self.m.max_in_flight, f"sum(RDY)={total} > {self.m.max_in_flight}"
        assert self.rdy == {k: c.rdy for k, c in self.m.conns.items()}, "wire and manager differ"
        assert self.m.total_rdy == total
        return actions

    @property
    def total(self) -> int:
        return sum(self.rdy.values())

    def holders(self) -> set[Hashable]:
        return {k for k, v in self.rdy.items() if v > 0}


def make(
    max_in_flight: int,
    *,
    backoff: ExponentialBackoff | None = None,
    seed: int = 1,
    low_rdy_idle_timeout: float = 10.0,
    redistribute_interval: float = 5.0,
) -> tuple[RDYManager, Wire, FakeClock]:
    clock = FakeClock()
    manager = RDYManager(
        max_in_flight,
        backoff=backoff,
        low_rdy_idle_timeout=low_rdy_idle_timeout,
        redistribute_interval=redistribute_interval,
        clock=clock,
        rng=random.Random(seed),
    )
    return manager, Wire(manager), clock


def fill(wire: Wire, keys: list[str]) -> None:
    """Connect ``keys`` and deliver one message on each (so each reaches its even share)."""
    for key in keys:
        wire.add(key)
    for key in keys:
        wire.message(key)
        wire.finish(key)


# --------------------------------------------------------------------------- bootstrap and split


def test_new_connection_bootstraps_with_rdy_1() -> None:
    m, wire, _ = make(100)
    assert wire.add("a") == [("a", 1)]
    assert wire.add("b") == [("b", 1)]
    assert wire.rdy == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    ("max_in_flight", "n", "shares"),
    [
        (10, 1, [10]),
        (10, 2, [5, 5]),
        (10, 3, [4, 3, 3]),  # the remainder goes to the first connections
        (11, 3, [4, 4, 3]),
        (12, 3, [4, 4, 4]),
        (3, 3, [1, 1, 1]),
        (7, 4, [2, 2, 2, 1]),
        (200, 8, [25] * 8),
    ],
)
def test_first_message_raises_a_connection_to_its_even_share(
    max_in_flight: int, n: int, shares: list[int]
) -> None:
    m, wire, _ = make(max_in_flight)
    keys = [f"c{i}" for i in range(n)]
    for key in keys:
        wire.add(key)
    for key, share in zip(keys, shares):
        assert m.share(key) == share
        actions = wire.message(key)
        assert actions == ([(key, share)] if share > 1 else [(key, 1)])
    assert [wire.rdy[k] for k in keys] == shares
    assert wire.total == sum(shares) <= max_in_flight


@pytest.mark.parametrize(
    ("max_in_flight", "max_rdy", "expected"),
    [(100, 10, 10), (100, 2500, 100), (5000, 2500, 2500), (10, 1, 1)],
)
def test_share_never_exceeds_max_rdy_count(max_in_flight: int, max_rdy: int, expected: int) -> None:
    m, wire, _ = make(max_in_flight)
    wire.add("a", max_rdy=max_rdy)
    wire.message("a")
    assert wire.rdy["a"] == expected


def test_max_rdy_count_is_per_connection() -> None:
    m, wire, _ = make(100)
    wire.add("small", max_rdy=5)
    wire.add("big", max_rdy=2500)
    wire.message("small")
    wire.message("big")
    assert wire.rdy == {"small": 5, "big": 50}


@pytest.mark.parametrize(
    ("rdy", "update_at_remaining"), [(100, 25), (8, 2), (4, 1), (3, 0), (1, 0)]
)
def test_rdy_is_renewed_when_remaining_falls_to_a_quarter(
    rdy: int, update_at_remaining: int
) -> None:
    m, wire, _ = make(rdy)
    wire.add("a")
    assert wire.message("a") == ([("a", rdy)] if rdy > 1 else [("a", 1)])
    remaining = rdy
    while True:
        actions = wire.message("a")
        remaining -= 1
        if actions:
            break
        assert remaining > update_at_remaining
    assert remaining == update_at_remaining
    assert actions == [("a", rdy)]


# --------------------------------------------------------------------------- joining and leaving


def test_joining_lowers_existing_connections_before_bootstrapping_the_new_one() -> None:
    m, wire, _ = make(10)
    fill(wire, ["a", "b"])
    assert wire.rdy == {"a": 5, "b": 5}
    actions = wire.add("c")  # shares become 4, 3, 3
    assert actions == [("a", 4), ("b", 3), ("c", 1)]
    wire.message("c")
    assert wire.rdy == {"a": 4, "b": 3, "c": 3}


def test_leaving_returns_credit_that_the_others_take_on_their_next_message() -> None:
    m, wire, _ = make(9)
    fill(wire, ["a", "b", "c"])
    assert wire.rdy == {"a": 3, "b": 3, "c": 3}
    wire.remove("b")
    assert wire.total == 6
    wire.message("a")
    wire.message("c")
    assert wire.rdy == {"a": 5, "c": 4}


def test_joining_and_leaving_sequence_keeps_the_invariant_after_every_action() -> None:
    m, wire, clock = make(7, seed=3)
    script = [
        ("add", "a"),
        ("msg", "a"),
        ("add", "b"),
        ("msg", "b"),
        ("msg", "a"),
        ("add", "c"),
        ("add", "d"),
        ("msg", "c"),
        ("msg", "d"),
        ("remove", "a"),
        ("msg", "b"),
        ("add", "e"),
        ("add", "f"),
        ("add", "g"),
        ("add", "h"),  # 8 connections > max_in_flight 7: scarce
        ("tick", ""),
        ("remove", "c"),
        ("msg", "b"),
        ("remove", "d"),  # 6 connections again: everyone gets credit back
        ("msg", "e"),
        ("remove", "e"),
        ("add", "a"),
    ]
    for op, key in script:
        if op == "add":
            wire.add(key)
        elif op == "remove":
            wire.remove(key)
        elif op == "msg":
            wire.message(key)
            wire.finish(key)
        else:
            clock.advance(m.redistribute_interval)
            wire.tick()
    assert not m.scarce
    assert all(v > 0 for v in wire.rdy.values()), wire.rdy


def test_leaving_the_scarce_regime_gives_every_connection_credit_again() -> None:
    # 3 connections, max_in_flight 2: one waits at RDY 0. When another leaves there is enough
    # credit for everyone, and the waiting one must not stay at 0 (nothing else would wake it:
    # no messages can arrive at RDY 0 and redistribution only runs while credit is scarce).
    for seed in range(20):
        m, wire, _ = make(2, seed=seed)
        for key in "abc":
            wire.add(key)
        waiting = [k for k, v in wire.rdy.items() if v == 0]
        assert len(waiting) == 1
        holder = next(k for k in "abc" if k not in waiting)
        wire.remove(holder)
        assert not m.scarce
        assert all(v >= 1 for v in wire.rdy.values()), (seed, wire.rdy)
        assert m.next_deadline() is None


# --------------------------------------------------------------------------- scarce credit


def test_scarce_credit_goes_to_at_most_max_in_flight_connections() -> None:
    m, wire, _ = make(2)
    for key in "abcde":
        wire.add(key)
    assert m.scarce
    assert wire.total == 2
    assert len(wire.holders()) == 2
    assert all(v <= 1 for v in wire.rdy.values())


def test_a_holder_whose_nsqd_sends_nothing_gives_its_credit_to_one_never_tried() -> None:
    """Scarce credit: a holder that received nothing for unproductive_after since its grant
    gives its credit at once to a connection that never held any; a busy holder keeps it."""
    for busy in (True, False):
        m, wire, clock = make(1, seed=7, low_rdy_idle_timeout=10.0, redistribute_interval=5.0)
        wire.add("a")
        wire.add("b")
        assert wire.holders() == {"a"}
        found_empty_at = clock.now + m.unproductive_after
        assert m.next_deadline() == found_empty_at
        if busy:  # its nsqd sent one at once: in flight, being handled
            wire.message("a")
        clock.jump_to(found_empty_at)
        wire.tick()
        assert wire.holders() == ({"a"} if busy else {"b"})


def test_an_answer_that_empties_the_holder_starts_its_idle_time() -> None:
    """A holder is found empty unproductive_after after the answer that emptied it (its nsqd
    sends the next message as soon as the FIN frees the slot), not after its last message."""
    m, wire, clock = make(1, seed=3, low_rdy_idle_timeout=10.0, redistribute_interval=5.0)
    wire.add("a")
    wire.add("b")
    wire.message("a")
    clock.advance(2.0)  # a slow handler: nothing moves while it runs
    assert m.next_deadline() == m.conns["a"].granted_at + 5.0  # only fairness
    wire.finish("a")
    assert m.next_deadline() == clock.now + m.unproductive_after
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("a", 0), ("b", 1)]


def test_an_nsqd_found_empty_is_due_at_once_when_another_one_wakes_up() -> None:
    """An idle consumer: b holds the credit, a was found empty. A producer publishes to both:
    b's message (its first in a while) makes a due at once, so a's messages wait one
    unproductive_after after b's answer, not low_rdy_idle_timeout."""
    m, wire, clock = make(1, seed=4, low_rdy_idle_timeout=10.0, redistribute_interval=5.0)
    wire.add("a")
    wire.add("b")
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("a", 0), ("b", 1)]  # a found empty
    clock.advance(3.0)  # idle: the credit stays on b (a is due again 10 s after)
    assert m.next_deadline() == m.conns["a"].released_at + 10.0
    wire.message("b")  # publishing resumed
    assert m.woken
    wire.finish("b")
    assert m.next_deadline() == clock.now + m.unproductive_after
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("b", 0), ("a", 1)]


def test_an_nsqd_found_empty_is_tried_again_after_low_rdy_idle_timeout() -> None:
    """An idle consumer: the credit moves only when a waiting connection comes due, one RDY 0
    and one RDY 1 per waiting connection per low_rdy_idle_timeout (the slow probe)."""
    m, wire, clock = make(1, seed=5, low_rdy_idle_timeout=10.0, redistribute_interval=5.0)
    for key in "abc":
        wire.add(key)
    start = clock.now
    commands = 0
    while clock.now - start < 100.0:
        clock.jump_to(m.next_deadline())
        commands += len(wire.tick())
        assert wire.total == 1
    # after the first round (two hops of unproductive_after), 2 connections waiting, each due
    # every 10 s: 2 moves of 2 RDY each per 10 s
    assert commands <= 4 + 2 * 2 * 10, commands
    assert wire.ever_served == {"a", "b", "c"}


def test_redistribution_rotates_credit_so_every_connection_is_served() -> None:
    m, wire, clock = make(1, seed=11, redistribute_interval=5.0)
    keys = [f"n{i}" for i in range(6)]
    for key in keys:
        wire.add(key)
    for _ in range(200):
        deadline = m.next_deadline()
        assert deadline is not None
        clock.jump_to(deadline)
        wire.tick()
        for holder in wire.holders():  # holders are busy: rotation must still happen
            wire.message(holder)
            wire.finish(holder)
        assert wire.total == 1
    assert wire.ever_served == set(keys)


@pytest.mark.parametrize(("max_in_flight", "n"), [(1, 2), (2, 3), (2, 7), (5, 9), (1, 12)])
def test_every_connection_eventually_gets_credit(max_in_flight: int, n: int) -> None:
    for seed in range(5):
        m, wire, clock = make(max_in_flight, seed=seed)
        keys = [f"n{i}" for i in range(n)]
        for key in keys:
            wire.add(key)
        for _ in range(300):
            deadline = m.next_deadline()
            assert deadline is not None
            clock.jump_to(deadline)
            wire.tick()
            assert wire.total == max_in_flight
        assert wire.ever_served == set(keys), (seed, set(keys) - wire.ever_served)


def test_redistribution_only_runs_while_credit_is_scarce() -> None:
    m, wire, clock = make(4)
    for key in "abc":
        wire.add(key)
    assert not m.scarce
    assert m.next_deadline() is None
    clock.advance(100.0)
    assert wire.tick() == []


def test_max_in_flight_below_connections_after_set_max_in_flight() -> None:
    m, wire, clock = make(6)
    fill(wire, ["a", "b", "c"])
    assert wire.rdy == {"a": 2, "b": 2, "c": 2}
    wire.set_max_in_flight(2)
    assert m.scarce
    assert wire.total == 2
    assert all(v <= 1 for v in wire.rdy.values())
    wire.set_max_in_flight(6)
    assert not m.scarce
    assert all(v >= 1 for v in wire.rdy.values())
    for key in "abc":
        wire.message(key)
    assert wire.rdy == {"a": 2, "b": 2, "c": 2}


# --------------------------------------------------------------------------- pause / resume


def test_pause_and_resume() -> None:
    m, wire, _ = make(10)
    fill(wire, ["a", "b"])
    assert wire.set_max_in_flight(0) == [("a", 0), ("b", 0)]
    assert wire.total == 0
    # late messages (sent before nsqd saw RDY 0) do not bring credit back
    assert wire.message("a") == []
    wire.finish("a")
    assert wire.add("c") == []
    assert wire.total == 0
    assert m.next_deadline() is None
    actions = wire.set_max_in_flight(9)
    assert sorted(actions) == [("a", 3), ("b", 3), ("c", 3)]


# --------------------------------------------------------------------------- backoff


def backoff_manager(
    n: int = 2, max_in_flight: int = 10, *, max_duration: float = 60.0, seed: int = 1
) -> tuple[RDYManager, Wire, FakeClock]:
    m, wire, clock = make(
        max_in_flight,
        backoff=ExponentialBackoff(multiplier=1.0, max_duration=max_duration),
        seed=seed,
    )
    fill(wire, [f"c{i}" for i in range(n)])
    return m, wire, clock


def test_failure_sends_rdy_0_everywhere_and_starts_the_timer() -> None:
    m, wire, clock = backoff_manager(3, 9)
    assert wire.rdy == {"c0": 3, "c1": 3, "c2": 3}
    wire.message("c1")
    actions = wire.requeue("c1")
    assert sorted(actions) == [("c0", 0), ("c1", 0), ("c2", 0)]
    assert m.in_backoff and m.backoff_level == 1
    assert m.next_deadline() == clock.now + 2.0  # multiplier * 2**1
    assert m.is_starved() is False


def probe_holder(wire: Wire) -> Hashable:
    (key,) = wire.holders()
    return key


def expire(m: RDYManager, wire: Wire, clock: FakeClock) -> Hashable:
    """Jump to the backoff deadline, tick, and return the connection that got the probe."""
    deadline = m.next_deadline()
    assert deadline is not None and m.backoff_until == deadline
    clock.jump_to(deadline)
    actions = wire.tick()
    assert len(actions) == 1 and actions[0][1] == 1, actions
    return actions[0][0]


@pytest.mark.parametrize(
    ("failures", "durations"),
    [
        (1, [2.0]),
        (3, [2.0, 4.0, 8.0]),
        (7, [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),  # capped at max_backoff_duration
    ],
)
def test_backoff_duration_doubles_per_level_up_to_the_cap(
    failures: int, durations: list[float]
) -> None:
    m, wire, clock = backoff_manager(3, max_duration=60.0)
    key: Hashable = "c0"
    seen = []
    for _ in range(failures):
        wire.message(key)
        wire.requeue(key)  # the first message, then every probe, fails
        assert wire.total == 0
        deadline = m.next_deadline()
        assert deadline is not None
        seen.append(deadline - clock.now)
        key = expire(m, wire, clock)
    assert seen == durations
    assert m.backoff_level <= m.backoff.max_level()  # type: ignore[union-attr]


def test_backoff_level_stops_at_the_level_that_reaches_the_cap() -> None:
    m, wire, clock = backoff_manager(1, 4, max_duration=10.0)
    for _ in range(10):
        wire.message("c0")
        wire.requeue("c0")
        deadline = m.next_deadline()
        assert deadline is not None and deadline - clock.now <= 10.0
        clock.jump_to(deadline)
        assert wire.tick() == [("c0", 1)]
    assert m.backoff_level == 4  # 2**4 = 16 >= 10


def test_timer_expiry_sends_exactly_one_rdy_1() -> None:
    for seed in range(10):
        m, wire, clock = backoff_manager(4, 20, seed=seed)
        wire.message("c2")
        wire.requeue("c2")
        deadline = m.next_deadline()
        assert deadline is not None
        clock.now = deadline - 0.001
        assert wire.tick() == []
        clock.jump_to(deadline)
        actions = wire.tick()
        assert len(actions) == 1
        assert actions[0][1] == 1
        assert wire.total == 1


def test_results_during_the_timer_are_ignored() -> None:
    m, wire, clock = backoff_manager(2)
    for key in ("c0", "c0", "c1"):
        wire.message(key)
    wire.requeue("c0")
    assert m.backoff_level == 1
    until = m.backoff_until
    assert wire.requeue("c0") == []
    assert wire.finish("c1") == []
    assert m.backoff_level == 1 and m.backoff_until == until
    assert wire.total == 0


def test_success_lowers_the_level_and_level_0_restores_full_rdy() -> None:
    m, wire, clock = backoff_manager(2, 10)
    key: Hashable = "c0"
    for _ in range(3):  # three failures: level 3
        wire.message(key)
        wire.requeue(key)
        key = expire(m, wire, clock)
    assert m.backoff_level == 3
    for level in (2, 1):
        wire.message(key)
        wire.finish(key)
        # still backing off: RDY 0 again and a shorter timer, then another single probe
        assert m.backoff_level == level
        assert wire.total == 0
        assert m.next_deadline() == clock.now + 2.0**level
        key = expire(m, wire, clock)
    wire.message(key)
    actions = wire.finish(key)
    assert m.backoff_level == 0 and not m.in_backoff
    assert sorted(actions) == [("c0", 5), ("c1", 5)]
    assert m.next_deadline() is None


def test_failed_probe_raises_the_level_again() -> None:
    m, wire, clock = backoff_manager(1, 10)
    wire.message("c0")
    wire.requeue("c0")
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("c0", 1)]
    wire.message("c0")
    assert wire.requeue("c0") == [("c0", 0)]
    assert m.backoff_level == 2
    assert m.next_deadline() == clock.now + 4.0


def test_requeue_without_backoff_does_not_count() -> None:
    m, wire, _ = backoff_manager(2)
    wire.message("c0")
    assert wire.requeue("c0", backoff=False) == []
    assert not m.in_backoff
    assert wire.total == 10


def test_backoff_disabled() -> None:
    m, wire, clock = make(10, backoff=None)
    fill(wire, ["a", "b"])
    for _ in range(5):
        wire.message("a")
        assert wire.requeue("a") == []
    assert not m.in_backoff and m.backoff_level == 0
    assert m.next_deadline() is None
    assert wire.rdy == {"a": 5, "b": 5}


def test_full_jitter_backoff_deadline_is_within_bounds() -> None:
    rng = random.Random(5)
    clock = FakeClock()
    m = RDYManager(
        4,
        backoff=FullJitterBackoff(multiplier=0.5, max_duration=3.0, rng=rng),
        clock=clock,
        rng=random.Random(5),
    )
    wire = Wire(m)
    wire.add("a")
    seen = []
    for level in range(1, 8):
        wire.message("a")
        wire.requeue("a")
        assert m.backoff_level == min(level, m.backoff.max_level())  # type: ignore[union-attr]
        deadline = m.next_deadline()
        assert deadline is not None
        wait = deadline - clock.now
        assert 0.0 <= wait <= min(3.0, 0.5 * 2**m.backoff_level)
        seen.append(wait)
        clock.jump_to(deadline)
        assert wire.tick() == [("a", 1)]
    assert len(set(seen)) > 1  # jittered, not constant


def test_backoff_with_no_connection_when_the_timer_expires_probes_the_next_one() -> None:
    m, wire, clock = backoff_manager(1, 10)
    wire.message("c0")
    wire.requeue("c0")
    wire.remove("c0")
    clock.jump_to(m.next_deadline())
    assert wire.tick() == []  # nobody to probe
    assert wire.add("c1") == [("c1", 1)]  # the first connection back tests the water
    wire.message("c1")
    wire.finish("c1")
    assert not m.in_backoff
    assert wire.rdy == {"c1": 10}


def test_probe_moves_away_from_an_idle_connection() -> None:
    """After the timer, the single RDY 1 may land on an nsqd with no messages; it must move on
    (go-nsq redistributes in backoff too) or the consumer would stay in backoff forever."""
    for seed in range(10):
        m, wire, clock = make(
            10, backoff=ExponentialBackoff(1.0, 60.0), seed=seed, low_rdy_idle_timeout=2.0
        )
        fill(wire, ["a", "b", "c"])
        wire.message("a")
        wire.requeue("a")
        clock.jump_to(m.next_deadline())
        wire.tick()
        served = set(wire.holders())
        for _ in range(20):
            deadline = m.next_deadline()
            assert deadline is not None
            clock.jump_to(deadline)
            wire.tick()
            assert wire.total == 1
            served |= wire.holders()
        assert served == {"a", "b", "c"}, seed


def test_the_probe_goes_where_messages_were_and_moves_on_within_unproductive_after() -> None:
    """Backoff over three connections: the probe goes to the one that was delivering when the
    backoff began; when its nsqd sends nothing, the probe moves within unproductive_after to
    one that never held credit, not after low_rdy_idle_timeout."""
    m, wire, clock = make(
        1, backoff=ExponentialBackoff(1.0, 60.0), seed=2, low_rdy_idle_timeout=10.0
    )
    wire.add("a")
    wire.add("b")  # never holds credit until the probe moves
    wire.message("a")
    wire.requeue("a")  # a failure: RDY 0 everywhere, a delivered since its grant
    assert m.in_backoff and wire.total == 0
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("a", 1)]
    assert m.next_deadline() == clock.now + m.unproductive_after
    clock.jump_to(m.next_deadline())
    assert wire.tick() == [("a", 0), ("b", 1)]
    wire.message("b")
    wire.finish("b")  # the probe succeeded
    assert not m.in_backoff


def test_pause_during_backoff_does_not_probe_and_resume_does() -> None:
    m, wire, clock = backoff_manager(2, 10)
    wire.message("c0")
    wire.requeue("c0")
    wire.set_max_in_flight(0)
    clock.jump_to(m.next_deadline())
    assert wire.tick() == []  # paused: the probe waits
    actions = wire.set_max_in_flight(4)
    assert len(actions) == 1 and actions[0][1] == 1
    ((key, _),) = actions
    wire.message(key)
    actions = wire.finish(key)
    assert not m.in_backoff
    assert wire.rdy == {"c0": 2, "c1": 2}


# --------------------------------------------------------------------------- is_starved


@pytest.mark.parametrize(
    ("rdy", "in_flight", "starved"),
    [
        (10, 0, False),
        (10, 8, False),
        (10, 9, True),  # 9 >= 8.5
        (10, 10, True),
        (1, 1, True),
        (20, 17, True),  # exactly 85 %
        (20, 16, False),
        (100, 84, False),
        (100, 85, True),
    ],
)
def test_is_starved_at_85_percent(rdy: int, in_flight: int, starved: bool) -> None:
    assert STARVED_RATIO == 0.85
    m, wire, _ = make(rdy)
    wire.add("a")
    wire.message("a")
    assert wire.rdy["a"] == rdy
    for _ in range(in_flight - 1):
        wire.message("a")
    if in_flight == 0:
        wire.finish("a")
    assert m.is_starved() is starved


def test_is_starved_needs_only_one_starved_connection() -> None:
    m, wire, _ = make(20)
    fill(wire, ["a", "b"])
    for _ in range(9):
        wire.message("a")
    assert m.is_starved()
    wire.finish("a")
    assert not m.is_starved()


# --------------------------------------------------------------------------- stateful property


KEYS = [f"n{i}" for i in range(6)]


class RDYMachine(RuleBasedStateMachine):
    """Random add/remove/message/finish/requeue/tick/set_max_in_flight with a fake clock."""

    @initialize(
        max_in_flight=st.integers(0, 12),
        use_backoff=st.booleans(),
        jitter=st.booleans(),
        seed=st.integers(0, 2**16),
        idle=st.sampled_from([0.5, 2.0, 10.0]),
        interval=st.sampled_from([0.5, 5.0]),
    )
    def setup(
        self,
        max_in_flight: int,
        use_backoff: bool,
        jitter: bool,
        seed: int,
        idle: float,
        interval: float,
    ) -> None:
        backoff: ExponentialBackoff | None = None
        if use_backoff:
            backoff = (
                FullJitterBackoff(0.5, 8.0, random.Random(seed))
                if jitter
                else ExponentialBackoff(0.5, 8.0)
            )
        self.clock = FakeClock()
        self.m = RDYManager(
            max_in_flight,
            backoff=backoff,
            low_rdy_idle_timeout=idle,
            redistribute_interval=interval,
            clock=self.clock,
            rng=random.Random(seed),
        )
        self.wire = Wire(self.m)

    @rule(key=st.sampled_from(KEYS), max_rdy=st.sampled_from([1, 2, 3, 2500]))
    def add(self, key: str, max_rdy: int) -> None:
        if key in self.wire.rdy:
            self.wire.remove(key)
        self.wire.add(key, max_rdy)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        self.wire.remove(key)

    @rule(key=st.sampled_from(KEYS))
    def message(self, key: str) -> None:
        # Messages also arrive on connections at RDY 0 (sent before nsqd saw the RDY 0).
        if key in self.wire.rdy:
            self.wire.message(key)

    @rule(key=st.sampled_from(KEYS))
    def finish(self, key: str) -> None:
        self.wire.finish(key)

    @rule(key=st.sampled_from(KEYS), backoff=st.booleans())
    def requeue(self, key: str, backoff: bool) -> None:
        self.wire.requeue(key, backoff)

    @rule(seconds=st.sampled_from([0.0, 0.1, 1.0, 3.0, 20.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.wire.tick()

    @rule()
    def tick_at_deadline(self) -> None:
        # a no-op without a deadline (not a precondition: hypothesis would redraw rules until
        # one is enabled, which made this machine ~10x slower)
        deadline = self.m.next_deadline()
        if deadline is None:
            return
        self.clock.jump_to(deadline)
        self.wire.tick()

    @rule(n=st.integers(0, 12))
    def set_max_in_flight(self, n: int) -> None:
        self.wire.set_max_in_flight(n)

    @rule(n=st.integers(0, 30))
    def set_budget(self, n: int) -> None:
        self.wire.set_budget(n)

    @invariant()
    def credit_stays_within_the_budget(self) -> None:
        """A budgeted run: each cap bounds what its nsqd may hold, and the caps fit in the
        budget (unless messages arrived beyond RDY, sent before nsqd saw a lower one: then no
        nsqd may send more)."""
        if not hasattr(self, "wire") or not self.m.budgeted:
            return
        m, wire, budget = self.m, self.wire, self.m.budget
        for key, conn in m.conns.items():
            assert budget.cap(key) >= max(wire.rdy[key], conn.in_flight), (key, conn)
        held = budget.unanswered_elsewhere + sum(budget.cap(k) for k in m.conns)
        assert held <= budget.answers or all(
            wire.rdy[k] <= c.in_flight for k, c in m.conns.items()
        ), (held, budget.answers, wire.rdy)

    @invariant()
    def a_budget_with_room_is_never_stuck(self) -> None:
        """Room in the budget: some nsqd may send, or a timer will change something."""
        if not hasattr(self, "wire") or not self.m.budgeted:
            return
        m, wire, budget = self.m, self.wire, self.m.budget
        held = budget.unanswered_elsewhere + sum(budget.cap(k) for k in m.conns)
        if held < budget.answers and m.max_in_flight and wire.rdy:
            assert wire.total > 0 or m.next_deadline() is not None, (wire.rdy, budget.answers)

    @invariant()
    def credit_is_bounded(self) -> None:
        if not hasattr(self, "wire"):
            return
        m, wire = self.m, self.wire
        assert 0 <= wire.total <= m.max_in_flight
        for key, count in wire.rdy.items():
            assert 0 <= count <= wire.max_rdy[key]
        if m.in_backoff:
            assert wire.total <= 1
            if m.backoff_until is not None:
                assert wire.total == 0

    @invariant()
    def credit_is_not_stranded(self) -> None:
        """Liveness: outside backoff, credit that can be used is in use."""
        if not hasattr(self, "wire"):
            return
        m, wire = self.m, self.wire
        if m.in_backoff or m.max_in_flight == 0 or not wire.rdy:
            return
        if m.budgeted:
            return  # a budgeted run: see a_budget_with_room_is_never_stuck
        if m.scarce:
            assert wire.total == m.max_in_flight
            assert m.next_deadline() is not None
        else:
            assert all(v >= 1 for v in wire.rdy.values()), wire.rdy

    @invariant()
    def backoff_can_always_end(self) -> None:
        """In backoff there is always a way out: a timer, or a probe out (or to come)."""
        if not hasattr(self, "wire"):
            return
        m, wire = self.m, self.wire
        if not m.in_backoff or m.max_in_flight == 0 or not wire.rdy:
            return
        if (
            m.budgeted
            and m.budget.unanswered_elsewhere + sum(m.budget.cap(k) for k in m.conns)
            >= m.budget.answers
        ):
            return  # what nsqd may hold fills the run's places: no probe is needed
        assert m.backoff_until is not None or wire.total == 1


TestRDYMachine = RDYMachine.TestCase
# 30 runs in CI (~0.5 s here), 10 in a developer's run. Set NSQ_SYNC_RDY_EXAMPLES (e.g. 2000)
# for a deeper search when changing rdy.py.
TestRDYMachine.settings = settings(
    max_examples=examples(ci=30, quick=10, override="NSQ_SYNC_RDY_EXAMPLES"),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- batches (the consumer's hot path)


def test_a_batch_of_messages_counts_like_single_messages() -> None:
    m, wire, _ = make(100)
    wire.add("a")
    assert wire.apply(m.on_messages("a", 1)) == [("a", 100)]
    assert wire.apply(m.on_messages("a", 70)) == []  # 30 of 100 left: above a quarter
    assert m.conns["a"].in_flight == 71
    # 5 more leave 25: the batch reaches the 25 % line, and the batch renews RDY once
    assert wire.apply(m.on_messages("a", 5)) == [("a", 100)]
    assert m.conns["a"].in_flight == 76


def test_batch_larger_than_the_remaining_credit_does_not_go_negative() -> None:
    m, wire, _ = make(10)
    wire.add("a")
    wire.message("a")
    assert wire.apply(m.on_messages("a", 50)) == [("a", 10)]
    assert m.conns["a"].remaining == 10
    assert m.conns["a"].in_flight == 51


def test_quiet_finish_outside_backoff_only_counts() -> None:
    m, wire, _ = make(10, backoff=ExponentialBackoff(multiplier=1.0, max_duration=60.0))
    wire.add("a")
    wire.apply(m.on_messages("a", 5))
    before = dict(wire.rdy)
    assert m.finish_quietly("a", 3) is True
    assert m.conns["a"].in_flight == 2
    assert m.finish_quietly("a", 9) is True  # never below zero
    assert m.conns["a"].in_flight == 0
    assert m.finish_quietly(None, 1) is True  # a replaced connection's message: nothing to count
    assert wire.rdy == before and m.backoff_level == 0 and m.next_deadline() is None


def test_quiet_finish_is_refused_in_backoff_where_each_fin_is_a_step() -> None:
    m, wire, clock = backoff_manager(2, 10)
    wire.message("c0")
    wire.requeue("c0")
    key = expire(m, wire, clock)
    wire.message(key)
    in_flight = m.conns[key].in_flight
    assert m.finish_quietly(key, 1) is False
    assert m.conns[key].in_flight == in_flight and m.backoff_level == 1  # nothing counted
    assert wire.finish(key) == [("c0", 5), ("c1", 5)]  # the one-by-one path steps down


def test_a_budget_lowers_the_credit_before_each_answer_goes_out() -> None:
    """run(max_messages=10) with max_in_flight 25: nsqd may never hold credit for more messages
    than the run still handles. Each answer's RDY update is returned by the answer itself (the
    consumer writes it before the FIN), so nsqd cannot refill the slot a FIN frees."""
    m, wire, _ = make(25)
    wire.add("a")
    assert wire.set_budget(10) == [("a", 10)]  # its share, up to what the budget allows
    for _ in range(9):
        assert wire.message("a") == []  # a raise to its share of 25 would be cut again
    # the 10th: nothing left to deliver, so RDY 0 (a message nsqd times out is not replaced)
    assert wire.message("a") == [("a", 0)]
    for left in range(9, -1, -1):
        assert wire.finish("a") == []
        # nsqd sends while in flight < RDY: what it may still deliver fits in what is wanted
        answered, in_flight = 10 - left, m.conns["a"].in_flight
        assert answered + max(in_flight, wire.rdy["a"]) <= 10
    assert m.budget.answers == 0 and wire.total == 0


def test_each_answer_lowers_its_own_connection_first() -> None:
    """Two nsqds with credit open: the answer's RDY update goes to the answered connection
    (written before its FIN), never to the other one, where a message may be on its way."""
    m, wire, _ = make(20)
    wire.add("a")
    wire.add("b")
    wire.set_budget(10)
    assert wire.total == 10
    held = dict(wire.rdy)  # what each may deliver; both deliver half of it
    for key in ("a", "b"):
        for _ in range(held[key] // 2):
            wire.message(key)
    for key in ["a", "b"] * 3:
        if m.conns[key].in_flight:
            actions = wire.finish(key)
            assert all(k == key for k, _ in actions), actions
            assert sum(m.budget.cap(k) for k in m.conns) <= m.budget.answers


def test_quiet_finish_is_refused_where_the_budget_would_lower_the_credit() -> None:
    m, wire, _ = make(4)
    wire.add("a")
    wire.set_budget(10)
    wire.apply(m.on_messages("a", 1))
    wire.apply(m.on_messages("a", 3))
    assert m.finish_quietly("a", 3) is True  # 7 left, not below max_in_flight 4: counts only
    assert (m.budget.answers, m.max_in_flight, m.conns["a"].in_flight) == (7, 4, 1)
    wire.apply(m.on_messages("a", 3))
    assert m.finish_quietly("a", 4) is False  # 3 left would lower the credit: one by one
    assert (m.budget.answers, m.conns["a"].in_flight) == (7, 4)  # nothing counted
    assert [wire.finish("a") for _ in range(4)] == [[], [], [], [("a", 3)]]
    assert (m.budget.answers, m.max_in_flight, m.conns["a"].in_flight) == (3, 4, 0)


def test_a_requeue_spends_the_budget_too() -> None:
    m, wire, _ = make(2)
    wire.add("a")
    wire.set_budget(2)
    assert wire.apply(m.on_messages("a", 2)) == [("a", 0)]  # nothing left to deliver
    assert wire.requeue("a", backoff=False) == []
    # the other one's answer is still to come
    assert (m.budget.answers, m.budget.cap("a")) == (1, 1)


def test_a_skipped_message_of_an_open_batch_keeps_its_place_spent() -> None:
    """BatchConsumer: 5 messages admitted into the open batch (5 of the run's 10 places), then
    their connection closes and the batch drops them. The new connection may be given the 5
    places left, not 10 (a skip of a message that never took a place gives it back)."""
    m, wire, _ = make(20)
    wire.add("a")
    wire.set_budget(10)
    wire.apply(m.on_messages("a", 5))
    wire.remove("a")
    for _ in range(5):
        wire.apply(m.on_skip(None, admitted=True))
    assert wire.add("b") == [("b", 5)]
    assert (m.budget.answers, m.budget.unanswered_elsewhere) == (5, 0)


def test_a_full_connection_does_not_take_idle_credit_from_another() -> None:
    """Budget 10 over two nsqds: b has its 5 in flight (RDY 0, nothing left to deliver), a's
    nsqd is empty. a keeps its credit: b is not waiting for any (no RDY 5/0 blinking)."""
    m, wire, clock = make(10)
    wire.add("a")
    wire.add("b")
    wire.set_budget(10)
    for _ in range(5):
        clock.advance(0.01)
        wire.message("b")
    assert (wire.rdy["a"], wire.rdy["b"]) == (5, 0)
    assert m.next_deadline() is None
    clock.advance(30.0)
    assert wire.tick() == []


def test_quiet_answers_that_leave_no_room_go_one_by_one() -> None:
    """Budget 12, both nsqds at their share of 5 with 5 in flight: two FINs on a leave no room,
    so they take the one-by-one path, where b (no credit open) gets RDY 0: a message b's nsqd
    times out must not free a slot it would fill."""
    m, wire, clock = make(10)
    wire.add("a")
    wire.add("b")
    wire.set_budget(12)
    for key in "ab":
        for _ in range(5):
            clock.advance(0.01)
            wire.message(key)
    assert m.finish_quietly("a", 2) is False
    assert wire.finish("a") == []  # 11 left for 10 held: room for one more
    assert wire.finish("a") == [("b", 0)]  # none: b has nothing open; a still has 2 open
    assert (wire.rdy["a"], m.conns["a"].in_flight, m.budget.answers) == (5, 3, 10)


def test_credit_left_is_rdy_above_in_flight_over_all_connections() -> None:
    clock = [0.0]
    rdy = RDYManager(10, clock=lambda: clock[0])
    rdy.add("a", 2500)
    rdy.add("b", 2500)
    assert rdy.credit_left() == 2  # bootstrap RDY 1 each
    rdy.on_messages("a", 1)  # raises a to its share (5): 4 more may come
    assert rdy.credit_left() == 4 + 1
    rdy.on_messages("b", 1)
    assert rdy.credit_left() == 4 + 4
    rdy.on_finish("a")
    assert rdy.credit_left() == 5 + 4
    rdy.set_max_in_flight(0)  # paused: RDY 0 everywhere, nothing may come
    assert rdy.credit_left() == 0


def test_a_connection_added_twice_is_refused() -> None:
    """Adding a key that is already there would replace its state without taking its RDY out
    of the total (credit counted twice, a later bootstrap RDY refused for good)."""
    manager, _, _ = make(1)
    manager.add("a", 2500)
    with pytest.raises(ValueError, match="already added"):
        manager.add("a", 2500)
    assert manager.total_rdy == 1
