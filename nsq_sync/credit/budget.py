"""The budget of a ``Consumer.run(max_messages=)``: RDY that lets nsqd deliver no more messages
than the run will handle (every delivery counts an attempt, even one handed back unhandled).

The budget is the answers (FIN or REQ) still wanted. Against it stand the *caps*: per
connection, an upper bound on what its nsqd may hold in flight (deliveries to come included),
plus the unanswered messages of closed connections. The rule: the caps never exceed the budget.
Raising RDY raises a cap at once; lowering it does not (messages may be on their way): the cap
comes down by one per answer, or *settles* once nothing arrived for ``settle`` seconds (the one
assumption; docs/cron.md has the limits). Over the budget, credit is cut where that is exact
first; with no room left, a connection with no credit open gets RDY 0 (a message nsqd times out
must not free a slot). Idle credit is taken back and rotates until an nsqd with messages has it.

The manager holds a :class:`NoBudget` until a run sets one. The budget changes credit only
through the manager's moves (CreditState). Not thread-safe: the manager's caller's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from nsq_sync.credit.rotation import idle_since
from nsq_sync.credit.state import Action, ConnRDY, CreditState, Snapshot

__all__ = ["Budget", "NoBudget"]

Event = Callable[..., "list[Action]"]


class NoBudget:
    """No budget (no ``run(max_messages=)``): every event's RDY updates go out as they are."""

    def __init__(self, manager: CreditState) -> None:
        self._m = manager
        # The hot events (messages arrived; an answer) are the manager's own, unchanged: bound
        # here rather than wrapped, so that a consumer without a budget pays no extra call.
        self.refill: Callable[[Hashable, ConnRDY], list[Action]] = manager.refill
        self.answered: Callable[[Hashable, bool | None], list[Action]] = manager.answer

    def for_run(self) -> Budget:
        return Budget(self._m)

    def fit(self, event: Event, *args: Any) -> list[Action]:
        return event(*args)

    def joined(self, key: Hashable) -> None:
        """Nothing to track."""

    def left(self, key: Hashable, conn: ConnRDY) -> None:
        """Nothing to track."""

    def skipped(self, key: Hashable, admitted: bool) -> None:
        """Nothing to count."""

    def quiet_answers_fit(self, key: Hashable, n: int) -> bool:
        return True

    def settling(self) -> int:
        return 0

    def maintain(self, now: float) -> None:
        """No timers."""

    def deadline(self) -> float | None:
        return None


@dataclass
class _Held:
    """What the budget knows about one connection."""

    cap: int = 0  # the most its nsqd may hold in flight (deliveries to come included)
    lowered_at: float = 0.0  # when its RDY was last lowered
    reclaimed_at: float = 0.0  # when its idle credit was last taken back


class Budget:
    """The budget of a run (see the module): the manager runs its events through :meth:`fit`."""

    def __init__(self, manager: CreditState) -> None:
        self._m = manager
        #: answers (FIN/REQ) still wanted: the deliveries the run takes plus those in flight
        self.answers = 0
        #: messages of closed connections not answered yet (they still count)
        self.unanswered_elsewhere = 0
        self._held: dict[Hashable, _Held] = {}

    def for_run(self) -> Budget:
        """This budget: a run that sets it again keeps its timers and closed connections."""
        return self

    def start(self, deliveries: int) -> list[Action]:
        """Let nsqd deliver at most ``deliveries`` more messages; return the RDY updates."""
        return self.fit(self._begin, deliveries)

    def _begin(self, deliveries: int) -> list[Action]:
        conns = self._m.conns
        for key, conn in conns.items():
            self._held.setdefault(key, _Held()).cap = max(conn.rdy, conn.in_flight)
        in_flight = sum(conn.in_flight for conn in conns.values())
        self.answers = deliveries + in_flight + self.unanswered_elsewhere
        return []

    # ------------------------------------------------------------------ what the manager tells

    def joined(self, key: Hashable) -> None:
        """A connection was added (RDY 0, nothing in flight)."""
        self._held[key] = _Held()

    def left(self, key: Hashable, conn: ConnRDY) -> None:
        """A connection closed: its handlers still run, and their answers will come."""
        del self._held[key]
        self.unanswered_elsewhere += conn.in_flight

    def skipped(self, key: Hashable, admitted: bool) -> None:
        """A message dropped unanswered leaves flight; it spends an answer only if ``admitted``."""
        if admitted:
            self.answers = max(0, self.answers - 1)
        if key in self._m.conns:
            self._m.out_of_flight(key)
        else:
            self._answered_elsewhere()

    def _answered_elsewhere(self) -> None:
        if self.unanswered_elsewhere:  # a message of a closed connection
            self.unanswered_elsewhere -= 1

    # ------------------------------------------------------------------ queries

    def cap(self, key: Hashable) -> int:
        """The most ``key``'s nsqd may hold in flight, deliveries to come included."""
        return self._held[key].cap

    def held(self) -> int:
        """What the nsqds may still hold in flight, at most: the caps and closed connections'."""
        return self.unanswered_elsewhere + sum(h.cap for h in self._held.values())

    def settling(self) -> int:
        """Credit taken back and not settled yet (it may be on its way)."""
        held = self._held
        return sum(
            max(0, held[key].cap - max(conn.rdy, conn.in_flight))
            for key, conn in self._m.conns.items()
        )

    def quiet_answers_fit(self, key: Hashable, n: int) -> bool:
        """If ``n`` answers on ``key`` need no RDY update, count them and return True."""
        conn = self._m.conns.get(key)
        if conn is None or conn.in_flight < n:
            return False
        held = self._held[key]
        cap = max(held.cap - n, conn.rdy, conn.in_flight - n)
        if self.held() - held.cap + cap >= self.answers - n:
            return False  # no room left after them: fit() decides (RDY 0 where nothing is open)
        self.answers -= n
        held.cap = cap
        return True

    # ------------------------------------------------------------------ fitting an event

    def fit(self, event: Event, *args: Any) -> list[Action]:
        """Run the manager's ``event(*args)``, then fit its RDY updates to the budget."""
        before = self._m.snapshot()
        event(*args)
        return self._fit(before)

    def refill(self, key: Hashable, conn: ConnRDY) -> list[Action]:
        """Messages arrived on ``key``: the manager's refill, fitted."""
        m = self._m
        before = m.snapshot()
        m.refill(key, conn)
        return self._fit(before)

    def answered(self, key: Hashable, success: bool | None) -> list[Action]:
        """A message was answered: one answer spent, then fitted."""
        m = self._m
        before = m.snapshot()
        m.answer(key, success)
        self.answers = max(0, self.answers - 1)
        if key not in m.conns:
            self._answered_elsewhere()
        return self._fit(before, answered=key)

    def _fit(self, before: Snapshot, answered: Hashable = None) -> list[Action]:
        """After an event: caps, room, cuts; the net updates from ``before``, decreases first."""
        m = self._m
        conns, held = m.conns, self._held
        answers = self.answers
        # each cap before this event's raises (an answer takes one off its connection's)
        base: dict[Hashable, int] = {}
        for key, conn in conns.items():
            h = held[key]
            cap = h.cap - 1 if key == answered and key in before else h.cap
            base[key] = cap
            h.cap = max(cap, conn.rdy, conn.in_flight)
        if m.max_in_flight and self.held() < answers:
            self._hand_out()
        if self.held() > answers:
            self._cut(before, base, answered)
        if self.held() >= answers:
            # no room: a connection with no credit open gets RDY 0, so that a message nsqd
            # times out (and requeues itself) does not free a slot it would fill
            for key, conn in conns.items():
                if 0 < conn.rdy <= conn.in_flight:
                    m.set_rdy(key, 0)
        now = m.clock()
        decreases, increases = m.net_updates(before)
        for key, _ in decreases:
            held[key].lowered_at = now
        return decreases + increases

    def _hand_out(self) -> None:
        """Room in the budget goes out by the usual rules; raises set caps."""
        m = self._m
        if m.in_backoff:
            m.probe_if_none()
        else:
            self._raise_within_room()
        held = self._held
        for key, conn in m.conns.items():
            h = held[key]
            h.cap = max(h.cap, conn.rdy)

    def _raise_within_room(self) -> None:
        m, held, answers = self._m, self._held, self.answers
        # credit taken back from an idle nsqd goes elsewhere first (the longest ago first: a
        # rotation); otherwise to those that delivered last
        order = sorted(
            m.conns.items(), key=lambda kc: (held[kc[0]].reclaimed_at, -kc[1].last_msg_at)
        )
        scarce = m.scarce
        for key, conn in order:
            room = answers - self.held()
            if room <= 0:
                break
            h = held[key]
            if _settling(h, conn):
                continue  # credit taken back and not settled yet: it still counts where it was
            if scarce:  # RDY 1 each, as long as max_in_flight lasts
                if conn.rdy == 0 and m.total_rdy < m.max_in_flight:
                    m.set_rdy(key, 1)
            elif conn.rdy < m.share(key):
                m.raise_to_share(key)
                if conn.rdy > h.cap + room:  # more than the room: keep what fits
                    m.set_rdy(key, h.cap + room)
            h.cap = max(h.cap, conn.rdy)  # the next one's room counts this raise

    def _cut(self, before: Snapshot, base: dict[Hashable, int], answered: Hashable) -> None:
        """Cut credit while the caps are over the budget, exact cuts first (see the module)."""
        m, held, answers = self._m, self._held, self.answers
        conns = m.conns
        # 1. raises of this event, back down to where they were; 2. the answered connection
        exact = [(key, before[key][0] if key in before else 0) for key in conns]
        exact = [(key, low) for key, low in exact if conns[key].rdy > low]
        if answered in conns:
            exact.append((answered, conns[answered].in_flight))
        for key, low in exact:
            conn = conns[key]
            over = self.held() - answers
            if over <= 0:
                return
            floor = max(low, conn.in_flight)
            if conn.rdy > floor:
                # what this cut takes off the cap: down to the cap's own floor, never below RDY
                new_rdy = max(floor, conn.rdy - over)
                m.set_rdy(key, new_rdy)
                held[key].cap = max(base.get(key, 0), conn.in_flight, new_rdy)
        if self.held() > answers:
            # 3. over anyway: no nsqd may send more; the caps come down as answers arrive
            for key, conn in conns.items():
                if conn.rdy > conn.in_flight:
                    m.set_rdy(key, conn.in_flight)

    # ------------------------------------------------------------------ timers

    def maintain(self, now: float) -> None:
        """Timers: take idle credit back while another connection wants it; settle caps."""
        m, held = self._m, self._held
        idle_after, settle = m.unproductive_after, m.settle
        wanting = self._wanting()
        for key, conn in m.conns.items():
            h = held[key]
            if (
                wanting - {key}
                and conn.rdy > conn.in_flight
                and now - idle_since(conn) >= idle_after
            ):
                m.set_rdy(key, conn.in_flight)
                h.lowered_at = h.reclaimed_at = now
            if _settling(h, conn) and now - max(h.lowered_at, conn.last_msg_at) >= settle:
                h.cap = max(conn.rdy, conn.in_flight)

    def deadline(self) -> float | None:
        """When :meth:`maintain` next has work to do, or None."""
        m, held = self._m, self._held
        idle_after, settle = m.unproductive_after, m.settle
        wanting = self._wanting()
        times = []
        for key, conn in m.conns.items():
            h = held[key]
            if wanting - {key} and conn.rdy > conn.in_flight:
                times.append(idle_since(conn) + idle_after)
            if _settling(h, conn):
                times.append(max(h.lowered_at, conn.last_msg_at) + settle)
        return min(times) if times else None

    def _wanting(self) -> set[Hashable]:
        """Connections below their share (and not settling) that idle credit could go to."""
        m, held = self._m, self._held
        return {
            key
            for key, conn in m.conns.items()
            # a connection full of messages in flight (RDY 0 at the tail) is not waiting for
            # credit
            if max(conn.rdy, conn.in_flight) < m.share(key) and not _settling(held[key], conn)
        }


def _settling(held: _Held, conn: ConnRDY) -> bool:
    """Its RDY was lowered below what its nsqd may hold, not settled yet."""
    return held.cap > max(conn.rdy, conn.in_flight)
