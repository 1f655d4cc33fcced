"""The RDY manager: all of a consumer's in-flight credit, as pure policy.

Called under the consumer's lock; the caller sends the returned ``(key, count)`` RDY updates
*in order*: decreases before increases, so the sum of RDY never exceeds ``max_in_flight``.
Rules (the "Building Client Libraries" guide; go-nsq where it is silent): a new connection gets
RDY 1, its first message its even share (at most ``max_rdy_count``), and an update when its
remaining RDY falls to 25 %; scarce credit (``max_in_flight`` < connections) follows the nsqds
that have messages (rotation.py); backoff is global (a failure: RDY 0 everywhere, wait, then
RDY 1 on one connection to test the water; a success lowers the level; one result counts per
backoff window); a run's budget fits every event's RDY updates (budget.py).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

from nsq_sync.backoff import ExponentialBackoff
from nsq_sync.credit import rotation
from nsq_sync.credit.budget import Budget, NoBudget
from nsq_sync.credit.state import Action, ConnRDY, Snapshot

#: go-nsq's threshold for is_starved(): a connection is starved when this share of its RDY is
#: in flight.
STARVED_RATIO = 0.85


_Event = TypeVar("_Event", bound=Callable[..., "list[Action]"])


def _fitted(event: _Event) -> _Event:
    """An event whose RDY updates are fitted to the run's budget."""

    @functools.wraps(event)
    def fitted_event(self: RDYManager, *args: Any, **kwargs: Any) -> list[Action]:
        return self.budget.fit(functools.partial(event, self, *args, **kwargs))

    return cast(_Event, fitted_event)


class RDYManager:
    """In-flight credit for one consumer. Not thread-safe: callers serialise access.

    Args:
        low_rdy_idle_timeout: how soon an nsqd found empty is tried again (scarce credit).
        redistribute_interval: the longest a connection holds scarce credit another waits for.
        settle: a budgeted run: seconds within which a message sent before an RDY was lowered
            arrives (default max(1, unproductive_after)).
        buffering: nsqd's ``output_buffer_timeout``: a holder is found empty only after longer.
    """

    def __init__(
        self,
        max_in_flight: int,
        *,
        backoff: ExponentialBackoff | None = None,
        low_rdy_idle_timeout: float = 10.0,
        redistribute_interval: float = 5.0,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        settle: float | None = None,
        buffering: float = 0.0,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.backoff = backoff
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.redistribute_interval = redistribute_interval
        self.clock = clock
        self.rng = rng or random.Random()
        self.conns: dict[Hashable, ConnRDY] = {}
        self.backoff_level = 0
        self.backoff_until: float | None = None  # timer running until then
        self.testing = False  # timer expired, one connection probes with RDY 1
        #: how soon a holder whose nsqd sent nothing (since its grant, last message or last
        #: answer) is found empty: nsqd with messages sends as soon as it gets RDY
        self.unproductive_after = max(
            0.1, min(low_rdy_idle_timeout, redistribute_interval) / 10, buffering + 0.1
        )
        #: how soon an nsqd found empty is tried again (see rotation.py)
        self.probe_interval = low_rdy_idle_timeout
        #: True when max_in_flight cannot give every connection RDY 1 (kept by
        #: _recompute_shares: read on the hot path)
        self.scarce = False
        #: when scarce: when a connection last got a message after none for a while (the first
        #: since its grant, or after unproductive_after without): others found empty before
        #: may have filled up too (rotation.py)
        self.woke_at = 0.0
        self.woken = False  # woke_at moved: the caller wakes the RDY timer (and clears this)
        #: a budgeted run: how long after an RDY is lowered a message sent on the old value is
        #: assumed to have arrived (see rdy_budget; the consumer adds nsqd's output buffering)
        self.settle = max(1.0, self.unproductive_after) if settle is None else settle
        self._shares: dict[Hashable, int] = {}
        self._total = 0
        #: the run's budget (see :meth:`set_budget`); a NoBudget until one is set
        self.budget: Budget | NoBudget = NoBudget(self)
        #: True once a run set a budget: its deadlines follow messages (read on the hot path)
        self.budgeted = False

    # ------------------------------------------------------------------ queries

    @property
    def total_rdy(self) -> int:
        """Sum of the RDY last sent to every connection (never above max_in_flight)."""
        return self._total

    @property
    def in_backoff(self) -> bool:
        return self.backoff_level > 0

    def share(self, key: Hashable) -> int:
        """The even split of max_in_flight for ``key`` (>= 1), capped by its max_rdy_count."""
        return self._shares.get(key, 0)

    def _recompute_shares(self) -> None:
        # Cached: on_message (the hot path) reads shares for every message.
        n = len(self.conns)
        self._shares = {}
        self.scarce = 0 < self.max_in_flight < n
        if n == 0 or self.max_in_flight == 0:
            return
        base, extra = divmod(self.max_in_flight, n)
        for index, (key, conn) in enumerate(self.conns.items()):
            share = 1 if base == 0 else base + (1 if index < extra else 0)
            self._shares[key] = min(share, conn.max_rdy)

    def in_flight(self, key: Hashable) -> int:
        """Messages in flight on ``key`` (0 for a key not added, or None)."""
        conn = self.conns.get(key)
        return 0 if conn is None else conn.in_flight

    def total_in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    def holdings(self) -> list[tuple[Hashable, ConnRDY]]:
        """Every connection's key and state (read them; only the manager changes them)."""
        return list(self.conns.items())

    def take_woken(self) -> bool:
        """True once after scarce credit found an nsqd waking up (the caller wakes its timer)."""
        woken, self.woken = self.woken, False
        return woken

    def is_starved(self) -> bool:
        """True when some connection has at least 85 % of its RDY in flight."""
        return any(
            c.in_flight > 0 and c.in_flight >= c.rdy * STARVED_RATIO for c in self.conns.values()
        )

    def credit_left(self) -> int:
        """Messages nsqds may still send: RDY above in-flight, plus credit still settling."""
        return sum(max(0, c.rdy - c.in_flight) for c in self.conns.values()) + (
            self.budget.settling()
        )

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has work to do, or None."""
        deadlines = []
        if self.backoff_until is not None:
            deadlines.append(self.backoff_until)
        rotation_at = rotation.deadline(self)
        if rotation_at is not None:
            deadlines.append(rotation_at)
        budget_at = self.budget.deadline()
        if budget_at is not None:
            deadlines.append(budget_at)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------ events

    @_fitted
    def add(self, key: Hashable, max_rdy: int) -> list[Action]:
        """A connection is ready (subscribed): lower others if needed, then RDY 1. Raises
        ValueError if ``key`` was added already (its credit would count twice)."""
        if key in self.conns:
            raise ValueError(f"connection {key!r} is already added")
        self.conns[key] = ConnRDY(max_rdy=max(1, max_rdy))
        self.budget.joined(key)
        self._recompute_shares()
        actions = self._trim_to_shares()
        if self.in_backoff:
            return actions + self.probe_if_none()
        if self.max_in_flight == 0:
            return actions
        if self.total_rdy + 1 <= self.max_in_flight:
            actions.append(self.set_rdy(key, 1))
        return actions

    @_fitted
    def remove(self, key: Hashable) -> list[Action]:
        """A connection closed: its credit returns, first as RDY 1 to connections at 0."""
        conn = self.conns.pop(key, None)
        if conn is not None:
            self._total -= conn.rdy
            self.budget.left(key, conn)
        self._recompute_shares()
        if self.in_backoff:
            return self.probe_if_none()
        if self.max_in_flight == 0:
            return []
        # Scarce: the freed credit goes to a random waiting connection. Not scarce (any more):
        # a connection left at RDY 0 while credit was scarce gets its bootstrap RDY 1 now;
        # nothing else would wake it (no message arrives at RDY 0, and redistribution only runs
        # while credit is scarce).
        return self._fill_random()

    def on_message(self, key: Hashable) -> list[Action]:
        return self.on_messages(key, 1)

    def on_messages(self, key: Hashable, n: int) -> list[Action]:
        """``n`` messages arrived on ``key`` in one read: one RDY check for them all."""
        conn = self.conns.get(key)
        if conn is None:
            return []
        if self.scarce:
            self._note_waking(conn)
        conn.in_flight += n
        conn.last_msg_at = self.clock()
        conn.remaining = max(0, conn.remaining - n)
        return self.budget.refill(key, conn)

    def _note_waking(self, conn: ConnRDY) -> None:
        """Scarce credit: a message on a connection quiet until now sets ``woke_at``."""
        now = self.clock()
        if conn.last_msg_at < conn.granted_at or (
            not conn.in_flight and now - conn.last_msg_at >= self.unproductive_after
        ):
            self.woke_at = now
            self.woken = True

    def refill(self, key: Hashable, conn: ConnRDY) -> list[Action]:
        """Messages arrived: RDY back up to the share when below it, or at a quarter remaining."""
        if self.in_backoff or self.max_in_flight == 0:
            return []
        if conn.rdy < self.share(key) or conn.remaining <= conn.rdy // 4:
            return self.raise_to_share(key)
        return []

    @_fitted
    def on_skip(self, key: Hashable, admitted: bool = False) -> list[Action]:
        """A message of ``key`` (None: closed) was dropped unanswered; ``admitted``: in the run."""
        self.budget.skipped(key, admitted)
        return []

    def on_finish(self, key: Hashable) -> list[Action]:
        """A message of ``key`` was finished (FIN): one success for backoff."""
        return self.budget.answered(key, True)

    def finish_quietly(self, key: Hashable, n: int) -> bool:
        """Count ``n`` FINs of ``key`` and return True when that changes only in-flight counts;
        False (nothing counted): call :meth:`on_finish` for each."""
        if self.backoff_level or self.scarce:  # scarce: an answer may free the credit
            return False
        if not self.budget.quiet_answers_fit(key, n):
            return False  # RDY must shrink first: one by one (each RDY goes out before its FIN)
        conn = self.conns.get(key)
        if conn is not None:
            conn.in_flight = max(0, conn.in_flight - n)
        return True

    def on_requeue(self, key: Hashable, backoff: bool = True) -> list[Action]:
        """A message of ``key`` was requeued; a failure for backoff unless ``backoff`` is False."""
        return self.budget.answered(key, False if backoff else None)

    def answer(self, key: Hashable, success: bool | None) -> list[Action]:
        """A message of ``key`` was answered: out of flight, and a backoff result (None: none)."""
        self.out_of_flight(key)
        return [] if success is None else self._result(success)

    def set_budget(self, deliveries: int) -> list[Action]:
        """Let nsqd deliver at most ``deliveries`` more messages: every FIN or REQ from now on
        spends one answer, and RDY never lets the nsqds hold more than what is left (budget.py)."""
        self.budget = self.budget.for_run()
        self.budgeted = True
        return self.budget.start(deliveries)

    @_fitted
    def set_max_in_flight(self, max_in_flight: int) -> list[Action]:
        """Change the total credit at run time; 0 pauses (RDY 0 everywhere)."""
        self.max_in_flight = max_in_flight
        self._recompute_shares()
        actions = self._trim_to_shares()
        if max_in_flight == 0:
            return actions
        if self.in_backoff:
            return actions + self.probe_if_none()
        if self.scarce:
            return actions + self._fill_random()
        for key in self.conns:
            if self.conns[key].rdy == 0:
                actions += self.raise_to_share(key)
        return actions

    @_fitted
    def tick(self) -> list[Action]:
        """Run timers: backoff expiry and redistribution. Call at :meth:`next_deadline`."""
        now = self.clock()
        self.budget.maintain(now)
        if self.backoff_until is not None and now >= self.backoff_until:
            self.backoff_until = None
            self.testing = True
            return self._probe()
        rotation_at = rotation.deadline(self)
        if rotation_at is not None and now >= rotation_at:
            return rotation.rotate(self, now)
        return []

    # ------------------------------------------------------------------ for the budget
    # (and rotation): what they change credit with, and what an event looks like to them

    def set_rdy(self, key: Hashable, count: int) -> Action:
        """Record that ``key`` is to be told RDY ``count`` (noting a grant or release)."""
        conn = self.conns[key]
        if conn.rdy == 0 and count > 0:
            conn.granted_at = self.clock()
        elif conn.rdy > 0 and count == 0:
            conn.released_at = self.clock()
            conn.productive = self._delivered_since_grant(conn)
        self._total += count - conn.rdy
        conn.rdy = count
        conn.remaining = count
        return (key, count)

    def out_of_flight(self, key: Hashable) -> None:
        """A message of ``key`` is no longer in flight (answered, or dropped unanswered)."""
        conn = self.conns.get(key)
        if conn is not None and conn.in_flight > 0:
            conn.in_flight -= 1
            if self.scarce or self.testing:  # its credit may be free now (rotation.py)
                conn.answered_at = self.clock()

    def raise_to_share(self, key: Hashable) -> list[Action]:
        """Raise ``key``'s RDY to its share, as far as max_in_flight allows."""
        conn = self.conns[key]
        others = self.total_rdy - conn.rdy
        count = min(self.share(key), self.max_in_flight - others)
        if count <= 0:
            return []
        return [self.set_rdy(key, count)]

    def probe_if_none(self) -> list[Action]:
        """While testing the water, send the probe if no connection holds it."""
        if self.testing and self.total_rdy == 0:
            return self._probe()
        return []

    def snapshot(self) -> Snapshot:
        """Every connection's RDY and grant bookkeeping, before an event (:meth:`net_updates`)."""
        return {
            key: (conn.rdy, conn.granted_at, conn.released_at, conn.productive)
            for key, conn in self.conns.items()
        }

    def net_updates(self, before: Snapshot) -> tuple[list[Action], list[Action]]:
        """An event's RDY updates as net changes from ``before``: (decreases, increases)."""
        decreases: list[Action] = []
        increases: list[Action] = []
        for key, conn in self.conns.items():
            was = before[key][0] if key in before else 0
            if conn.rdy < was:
                decreases.append((key, conn.rdy))
            elif conn.rdy > was:
                increases.append((key, conn.rdy))
            elif key in before:  # a raise cut back (or none)
                _, conn.granted_at, conn.released_at, conn.productive = before[key]
            else:
                conn.granted_at = conn.released_at = 0.0
        return decreases, increases

    # ------------------------------------------------------------------ internals

    def _trim_to_shares(self) -> list[Action]:
        """Lower every connection above its share (or to 0 while paused / backing off)."""
        actions = []
        scarce = self.scarce
        for key, conn in self.conns.items():
            if self.max_in_flight == 0 or (self.in_backoff and not self.testing):
                limit = 0
            else:
                limit = self.share(key)
            if conn.rdy > limit:
                actions.append(self.set_rdy(key, limit))
        if scarce and not self.in_backoff:
            # scarce credit: RDY 1 each, never more than max_in_flight of them
            holders = [k for k, c in self.conns.items() if c.rdy > 0]
            self.rng.shuffle(holders)
            while len(holders) > self.max_in_flight:
                actions.append(self.set_rdy(holders.pop(), 0))
        return actions

    def _fill_random(self) -> list[Action]:
        available = self.max_in_flight - self.total_rdy
        idle = [k for k, c in self.conns.items() if c.rdy == 0]
        self.rng.shuffle(idle)
        return [self.set_rdy(k, 1) for k in idle[: max(0, available)]]

    @staticmethod
    def _delivered_since_grant(conn: ConnRDY) -> bool:
        return conn.last_msg_at >= conn.granted_at and conn.last_msg_at > 0

    def _probe(self) -> list[Action]:
        """Backoff timer expired: RDY 1 to the connection most likely to have messages (with none,
        or while paused, ``testing`` stays set and a join or resume sends it)."""
        if not self.conns or self.max_in_flight == 0:
            return []
        order = rotation.best(self, list(self.conns))
        # one that was delivering first: the probe needs a message to test the handler with
        key = next((k for k in order if self.conns[k].productive), order[0])
        return [self.set_rdy(key, 1)]

    def _result(self, success: bool) -> list[Action]:
        if self.backoff is None:
            return []
        if self.backoff_until is not None:
            return []  # one result per backoff window: the timer is still running
        if success:
            if self.backoff_level == 0:
                return []
            self.backoff_level -= 1
            if self.backoff_level == 0:
                self.testing = False
                return self._restore()
            return self._start_backoff()
        self.backoff_level = min(self.backoff_level + 1, self.backoff.max_level())
        return self._start_backoff()

    def _start_backoff(self) -> list[Action]:
        self.testing = False
        duration = self.backoff.compute(self.backoff_level) if self.backoff else 0.0
        self.backoff_until = self.clock() + duration
        return [self.set_rdy(k, 0) for k, c in self.conns.items() if c.rdy > 0]

    def _restore(self) -> list[Action]:
        actions = self._trim_to_shares()
        if self.scarce:
            return actions + self._fill_random()
        for key in self.conns:
            actions += self.raise_to_share(key)
        return actions
