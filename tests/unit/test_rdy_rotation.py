"""Scarce credit follows the data: a model of several nsqds with backlogs arriving at random
times, driven by the RDY manager as the consumer drives it.

Each nsqd sends a message whenever it has one and its in-flight count is below the last RDY it
read; every command and message takes ``latency`` seconds on the wire (FIFO); the client
handles each message for ``handler`` seconds, then finishes it (its RDY updates go out before
the FIN); a timer calls ``tick()`` at every ``next_deadline()``. Time is a fake clock.

Properties, for max_in_flight below, at or above the number of nsqds:

* ``sum(RDY) <= max_in_flight`` after every single RDY command, as nsqds see them;
* the longest time with nothing consumed while some nsqd holds messages is bounded. One *hop*
  (credit granted to an nsqd with nothing, then moved on) takes at most ``HOP`` =
  ``unproductive_after`` + the handler's time (the holder had just delivered its last message)
  + 4 latencies (the RDY out and a message back, twice: the credit may be taken from a busy
  nsqd). When every backlog is there from the start, credits hop in parallel over the
  connections ahead of the data in the order (never held credit, or were delivering when it
  was taken): at most ``ceil((n - max_in_flight) / max_in_flight)`` hops. A backlog that
  arrives on an nsqd found empty waits until that nsqd comes due again: ``probe_interval``
  (low_rdy_idle_timeout) more, at most;
* an idle consumer sends no more than the slow probe: one RDY 0 and one RDY 1 per waiting
  connection per ``probe_interval``.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from support.properties import examples

from nsq_sync.backoff import ExponentialBackoff
from nsq_sync.credit.manager import RDYManager

IDLE_TIMEOUT = 10.0  # low_rdy_idle_timeout: the slow probe's period
INTERVAL = 5.0  # rdy_redistribute_interval


@dataclass
class Nsqd:
    messages: int = 0
    rdy: int = 0  # the last RDY it read
    in_flight: int = 0


class Cluster:
    """nsqds, the wire and the client, as discrete events on a fake clock."""

    def __init__(
        self,
        n: int,
        max_in_flight: int,
        seed: int,
        latency: float,
        handler: float,
        budget: int | None = None,
        backoff: ExponentialBackoff | None = None,
    ) -> None:
        self.now = 1000.0
        self.m = RDYManager(
            max_in_flight,
            backoff=backoff,
            low_rdy_idle_timeout=IDLE_TIMEOUT,
            redistribute_interval=INTERVAL,
            clock=lambda: self.now,
            rng=random.Random(seed),
            buffering=0.25,
        )
        self.latency = latency
        self.handler = handler
        self.nsqds = {f"n{i}": Nsqd() for i in range(n)}
        self.wire = dict.fromkeys(self.nsqds, 0)  # RDY as sent, in order
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.rdy_commands = 0
        self.consumed = 0
        self.budget = budget
        self.longest_stall = 0.0
        self.stall_since: float | None = None  # while some nsqd holds messages
        self.fail_next = 0  # handler failures to come (backoff)
        if budget is not None:
            self.send(self.m.set_budget(budget))
        for key in self.nsqds:
            self.send(self.m.add(key, 2500))

    # -- the wire

    def later(self, delay: float, kind: str, key: str, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, kind, key, arg))

    def send(self, actions: list[tuple[object, int]]) -> None:
        for key, count in actions:
            key = str(key)
            self.wire[key] = count
            total = sum(self.wire.values())
            assert total <= self.m.max_in_flight, (actions, self.wire)
            self.rdy_commands += 1
            self.later(self.latency, "rdy", key, count)

    def publish(self, key: str, count: int, delay: float) -> None:
        self.later(delay, "publish", key, count)

    # -- nsqd and client

    def nsqd_sends(self, key: str) -> None:
        nsqd = self.nsqds[key]
        while nsqd.messages and nsqd.in_flight < nsqd.rdy:
            nsqd.messages -= 1
            nsqd.in_flight += 1
            self.later(self.latency, "message", key)

    def holding(self) -> bool:
        return any(q.messages for q in self.nsqds.values())

    def handle(self, kind: str, key: str, arg: int) -> None:
        nsqd = self.nsqds[key]
        if kind == "publish":
            nsqd.messages += arg
        elif kind == "rdy":
            nsqd.rdy = arg
        elif kind == "fin":
            nsqd.in_flight -= 1
        elif kind == "message":
            self.consumed += 1
            self.stall_since = self.now
            self.send(self.m.on_message(key))
            self.later(self.handler, "handled", key)
            if self.budget is not None and self.consumed == self.budget:
                self.send(self.m.set_max_in_flight(0))  # the run pauses at its last place
                self.stall_since = None  # and is over: no stall after its last message
        elif kind == "handled":
            if self.fail_next:
                self.fail_next -= 1
                self.send(self.m.on_requeue(key))
                self.later(self.latency, "fin", key)  # REQ frees the slot too
                self.later(self.latency, "publish", key, 1)
            else:
                self.send(self.m.on_finish(key))
                self.later(self.latency, "fin", key)
        self.nsqd_sends(key)

    def run_until(self, end: float) -> None:
        idle_ticks = 0  # ticks in a row that changed nothing at one instant
        while True:
            deadline = self.m.next_deadline()
            at = self.events[0][0] if self.events else math.inf
            if deadline is not None and deadline <= at:
                at = deadline
            if at > end:
                self.observe(end)
                self.now = max(self.now, end)
                return
            self.observe(at)
            self.now = max(self.now, at)
            if deadline is not None and at == deadline:
                actions = self.m.tick()
                self.send(actions)
                moved = actions or self.m.next_deadline() != deadline
                idle_ticks = 0 if moved else idle_ticks + 1
                assert idle_ticks < 3, "the timer would spin"
                continue
            _, _, kind, key, arg = heapq.heappop(self.events)
            was_holding = self.holding()
            self.handle(kind, key, arg)
            if not was_holding and self.holding():
                self.stall_since = self.now

    def observe(self, at: float) -> None:
        """The stall so far, if some nsqd holds messages (state changes only at events)."""
        if self.holding() and self.stall_since is not None:
            self.longest_stall = max(self.longest_stall, at - self.stall_since)


def hop(cluster: Cluster) -> float:
    return cluster.m.unproductive_after + cluster.handler + 4 * cluster.latency


def hops(n: int, max_in_flight: int) -> int:
    return max(0, math.ceil((n - max_in_flight) / max_in_flight))


# 30 examples each in CI (~0.4 s each here), 10 in a developer's run; NSQ_SYNC_RDY_EXAMPLES
# (e.g. 3000) searches deeper when changing the policy
EXAMPLES = examples(ci=300, quick=100, override="NSQ_SYNC_RDY_EXAMPLES") // 10

common = {
    "seed": st.integers(0, 2**16),
    "latency": st.sampled_from([0.0005, 0.005, 0.02]),
    "handler": st.sampled_from([0.0, 0.01, 0.2]),
}


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    data=st.data(),
    n=st.integers(2, 6),
    backlogs=st.lists(st.integers(0, 60), min_size=6, max_size=6),
    **common,
)
def test_backlogs_from_the_start_never_wait_more_than_the_hops_ahead_of_them(
    data: st.DataObject,
    n: int,
    backlogs: list[int],
    seed: int,
    latency: float,
    handler: float,
) -> None:
    """The issue's scenario, generalised: every message is on some nsqd before the consumer
    starts (e.g. 1 over 2 nsqds, A 300 and B 1: one hop, ~0.5 s; it was 5-12 s)."""
    max_in_flight = data.draw(st.integers(1, n), "max_in_flight")
    cluster = Cluster(n, max_in_flight, seed, latency, handler)
    for key, count in zip(cluster.nsqds, backlogs):
        cluster.nsqds[key].messages = count
    cluster.stall_since = cluster.now
    total = sum(backlogs[:n])
    cluster.run_until(cluster.now + total * (handler + 2 * latency) + 120.0)
    assert cluster.consumed == total
    # (not scarce: the gap between messages, a handler's time and a round trip, is one hop)
    bound = max(1, hops(n, max_in_flight)) * hop(cluster)
    assert cluster.longest_stall <= bound + 1e-9, (cluster.longest_stall, bound)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    data=st.data(),
    n=st.integers(2, 6),
    arrivals=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 50), st.floats(0.0, 60.0)),
        min_size=1,
        max_size=8,
    ),
    **common,
)
def test_backlogs_arriving_at_random_times_wait_at_most_a_probe_interval_more(
    data: st.DataObject,
    n: int,
    arrivals: list[tuple[int, int, float]],
    seed: int,
    latency: float,
    handler: float,
) -> None:
    """Backlogs published at random times on random nsqds, an idle consumer in between; then
    a long idle tail, where only the slow probe may send RDY."""
    max_in_flight = data.draw(st.integers(1, n), "max_in_flight")
    cluster = Cluster(n, max_in_flight, seed, latency, handler)
    keys = list(cluster.nsqds)
    for index, count, at in arrivals:
        cluster.publish(keys[index % n], count, at)
    total = sum(count for _, count, _ in arrivals)
    cluster.run_until(cluster.now + 60.0 + total * (handler + 2 * latency) + 60.0)
    assert cluster.consumed == total
    bound = IDLE_TIMEOUT + max(1, hops(n, max_in_flight)) * hop(cluster)
    assert cluster.longest_stall <= bound + 1e-9, (cluster.longest_stall, bound)

    # idle: nothing anywhere; the slow probe at most (one RDY 0 and one RDY 1 per waiting
    # connection per probe_interval, +1 probe each for one already due when the tail starts)
    before, tail = cluster.rdy_commands, 10 * IDLE_TIMEOUT
    cluster.run_until(cluster.now + tail)
    waiting = max(0, n - max_in_flight)
    assert cluster.rdy_commands - before <= 2 * waiting * (tail / IDLE_TIMEOUT + 1)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    n=st.integers(2, 4),
    backlogs=st.lists(st.integers(0, 60), min_size=4, max_size=4),
    budget=st.integers(1, 80),
    **common,
)
def test_a_budgeted_run_gets_its_messages_exactly_without_long_stalls(
    n: int, backlogs: list[int], budget: int, seed: int, latency: float, handler: float
) -> None:
    """run(max_messages=) with 1 credit over n nsqds: never a message beyond the budget, every
    place filled when the nsqds hold enough, and a stall is at most a hop plus the budget's
    settle time per connection ahead (credit taken back waits for messages still on their
    way before it moves, when the budget has no room for both)."""
    cluster = Cluster(n, 1, seed, latency, handler, budget=budget)
    for key, count in zip(cluster.nsqds, backlogs):
        cluster.nsqds[key].messages = count
    cluster.stall_since = cluster.now
    total = sum(backlogs[:n])
    cluster.run_until(cluster.now + total * (handler + 2 * latency) + 120.0)
    assert cluster.consumed == min(budget, total)
    bound = (n - 1) * (hop(cluster) + cluster.m.settle)
    assert cluster.longest_stall <= bound + 1e-9, (cluster.longest_stall, bound)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    data=st.data(),
    n=st.integers(2, 5),
    backlogs=st.lists(st.integers(0, 40), min_size=5, max_size=5),
    failures=st.integers(1, 3),
    **common,
)
def test_a_backoff_probe_finds_the_nsqd_with_messages(
    data: st.DataObject,
    n: int,
    backlogs: list[int],
    failures: int,
    seed: int,
    latency: float,
    handler: float,
) -> None:
    """Handler failures put the consumer in backoff: after each window one RDY 1 tests the
    water, and moves on (by the same rules) when its nsqd has nothing; every message is
    consumed, and sum(RDY) stays within max_in_flight (one while backing off)."""
    max_in_flight = data.draw(st.integers(1, n + 2), "max_in_flight")
    backoff = ExponentialBackoff(multiplier=0.5, max_duration=4.0)
    cluster = Cluster(n, max_in_flight, seed, latency, handler, backoff=backoff)
    for key, count in zip(cluster.nsqds, backlogs):
        cluster.nsqds[key].messages = count
    cluster.fail_next = failures
    total = sum(backlogs[:n])
    cluster.run_until(cluster.now + total * (handler + 2 * latency) + 300.0)
    # Each failure requeues the message it failed (nsqd delivers it again), whichever message
    # that is: one message may fail several times.
    assert cluster.consumed == (total + failures if total else 0)
    assert not cluster.m.in_backoff or total == 0
