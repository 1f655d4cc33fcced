"""The budget of a ``Consumer.run(max_messages=)``: RDY that lets nsqd deliver no more messages
than the run will handle.

Why: nsqd counts an attempt at every delivery. Messages delivered beyond ``max_messages`` are
handed back unhandled, and a message handed back by a few cron runs in a row reached
``max_attempts`` and was given up without its handler ever seeing it.

The budget is the number of answers (FIN or REQ) still wanted: the run's places left plus the
messages in flight. Every answer spends one; a message dropped unanswered (its connection
closed before its handler ran) counts in flight no more, and spends one only if it had taken a
place of the run (a BatchConsumer's open batch). Against the
budget stands what the nsqds may still hold in flight, future deliveries included: each
connection's ``cap``, an upper bound on its nsqd's in-flight count, plus the messages of closed
connections still to be answered. nsqd sends on a connection while its in-flight count is below
the RDY it was last told, so:

* raising RDY raises the cap to the new RDY at once;
* lowering RDY does **not** lower the cap: nsqd may already have sent messages on the old RDY,
  still on their way. The cap comes down as the connection's messages are answered: an answer
  whose RDY update (sent before it, on the same connection) leaves RDY at most cap - 1 lowers
  the cap by one, so the slot it frees is never refilled. A cap left above RDY and in flight is
  *settled* (brought down to them) once nothing arrived on the connection for ``settle``
  seconds since the lowering (the consumer uses 1 s plus nsqd's ``output_buffer_timeout``).
  This is the one assumption: a message nsqd sent before it saw the lower RDY arrives within
  ``settle``. A slower network or a reader stalled for longer can let one through;
* credit is cut where that is exact first: what the current event raised (nsqd has not seen
  it), then the answered connection; only when the caps are over the budget anyway (messages
  that arrived beyond RDY) is the open credit of the others cut. With no room left, a
  connection with no credit open gets RDY 0, so that a message nsqd times out (and requeues
  by itself) does not free a slot it would fill at once (a worker's batch of FINs that would
  leave no room goes one by one, so this is decided for it too);
* room in the budget goes to connections below their share by the usual rules: credit taken
  back from an idle nsqd goes elsewhere first (the longest ago first), otherwise to those that
  delivered last. Credit an idle connection holds (no message for ``unproductive_after`` while
  *another* connection is below its share, in flight included: its nsqd may have nothing) is
  taken back and, once settled, handed on: it rotates until an nsqd with messages has it
  (about ``settle`` plus ``unproductive_after`` per empty nsqd). Credit settling counts as
  open (``credit_left``), so ``idle_timeout`` still ends a run whose nsqds are all empty.

So, within that assumption, the caps never exceed the budget and nsqd delivers no more than
the run wants (``tests/unit/test_rdy_budget.py`` checks it against a model of nsqd with
messages on their way and reconnects). What the budget cannot see: nsqd timing out a message
whose handler runs longer than ``msg_timeout`` (without ``touch()``) while the run still has
room, which frees a slot nsqd may fill; and messages already queued for the workers when
``run()`` starts on a started consumer, beyond its places. Everything here runs under the RDY
manager's caller's lock, on the manager's state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:  # pragma: no cover
    from nsq_sync.rdy import Action, ConnRDY, RDYManager

__all__ = [
    "deadline", "fit", "fitted", "held", "maintain", "quiet_answers_fit", "snapshot", "spend",
    "start",
]  # fmt: skip

_Event = TypeVar("_Event", bound=Callable[..., "list[Action]"])

#: per connection, (RDY, cap, granted_at, released_at, productive) before an event
Snapshot = dict[Hashable, tuple[int, int, float, float, bool]]


def snapshot(m: RDYManager) -> Snapshot:
    """Every connection's (RDY as nsqd was last told, cap, grant and release times, whether it
    was productive), taken before an event."""
    return {
        key: (conn.rdy, conn.cap, conn.granted_at, conn.released_at, conn.productive)
        for key, conn in m.conns.items()
    }


def fitted(event: _Event) -> _Event:
    """Decorates an RDY manager event that may hand out credit: in a budgeted run its RDY
    updates are fitted to the budget (the hot events, messages and answers, fit inline)."""

    @functools.wraps(event)
    def fitted_event(m: RDYManager, *args: Any, **kwargs: Any) -> list[Action]:
        if m.budget is None:
            return event(m, *args, **kwargs)
        before = snapshot(m)
        event(m, *args, **kwargs)
        return fit(m, before)

    return cast(_Event, fitted_event)


def start(m: RDYManager, deliveries: int) -> list[Action]:
    """Begin a budget of ``deliveries`` more messages (see ``RDYManager.set_budget``)."""
    before = snapshot(m)
    for conn in m.conns.values():
        conn.cap = max(conn.rdy, conn.in_flight)
    in_flight = sum(conn.in_flight for conn in m.conns.values())
    m.budget = deliveries + in_flight + m.unanswered_elsewhere
    return fit(m, before)


def spend(m: RDYManager, key: Hashable) -> None:
    """One answer of the budget (the caller fits the credit: its RDY goes out first)."""
    m.budget = max(0, (m.budget or 0) - 1)
    if key in m.conns:
        m._done(key)
    elif m.unanswered_elsewhere:  # a message of a closed connection
        m.unanswered_elsewhere -= 1


def held(m: RDYManager) -> int:
    """What the nsqds may still hold in flight (deliveries to come included), at most: the
    caps, plus the messages of closed connections still to be answered."""
    return m.unanswered_elsewhere + sum(conn.cap for conn in m.conns.values())


def quiet_answers_fit(m: RDYManager, key: Hashable, n: int) -> bool:
    """True when ``n`` answers on ``key`` need no RDY update to stay within the budget; then
    they are counted (budget and cap). False: nothing counted, answer them one by one."""
    conn = m.conns.get(key)
    budget = m.budget
    if conn is None or budget is None or conn.in_flight < n:
        return False
    cap = max(conn.cap - n, conn.rdy, conn.in_flight - n)
    if held(m) - conn.cap + cap >= budget - n:
        return False  # no room left after them: fit() decides (RDY 0 where nothing is open)
    m.budget = budget - n
    conn.cap = cap
    return True


def fit(m: RDYManager, before: Snapshot, answered: Hashable = None) -> list[Action]:
    """After an event (``answered``: the connection whose message was answered, if any): set
    the caps, hand out room in the budget, cut credit while over it, and return the event's RDY
    updates as net changes from ``before``, decreases first (a raise that is cut never reaches
    nsqd, even for a moment)."""
    conns = m.conns
    budget = m.budget or 0
    # each cap before this event's raises (an answer takes one off its connection's)
    base: dict[Hashable, int] = {}
    for key, conn in conns.items():
        cap = before[key][1] - 1 if key == answered and key in before else conn.cap
        base[key] = cap
        conn.cap = max(cap, conn.rdy, conn.in_flight)
    if m.max_in_flight and held(m) < budget:
        _hand_out(m)
    if held(m) > budget:
        _cut(m, before, base, answered, budget)
    if held(m) >= budget:
        # no room: a connection with no credit open gets RDY 0, so that a message nsqd times
        # out (and requeues itself) does not free a slot it would fill
        for key, conn in conns.items():
            if 0 < conn.rdy <= conn.in_flight:
                m._set(key, 0)
    now = m.clock()
    decreases: list[Action] = []
    increases: list[Action] = []
    for key, conn in conns.items():
        was = before[key][0] if key in before else 0
        if conn.rdy < was:
            decreases.append((key, conn.rdy))
            conn.lowered_at = now
        elif conn.rdy > was:
            increases.append((key, conn.rdy))
        elif key in before:  # a raise cut back (or none): no grant or release reached nsqd
            _, _, conn.granted_at, conn.released_at, conn.productive = before[key]
        else:
            conn.granted_at = conn.released_at = 0.0
    return decreases + increases


def _hand_out(m: RDYManager) -> None:
    """Room in the budget goes back by the usual rules (nothing else would wake a connection
    cut to RDY 0), to the connections that delivered last first; raises set caps."""
    if m.in_backoff:
        m._probe_if_none()
    else:
        _raise_within_room(m)
    for conn in m.conns.values():
        conn.cap = max(conn.cap, conn.rdy)


def _raise_within_room(m: RDYManager) -> None:
    budget = m.budget or 0
    # credit taken back from an idle nsqd goes elsewhere first (the longest ago first: a
    # rotation); otherwise to those that delivered last
    order = sorted(m.conns.items(), key=lambda kc: (kc[1].reclaimed_at, -kc[1].last_msg_at))
    scarce = m.scarce
    for key, conn in order:
        room = budget - held(m)
        if room <= 0:
            break
        if _settling(conn):
            continue  # credit taken back and not settled yet: it still counts where it was
        if scarce:  # RDY 1 each, as long as max_in_flight lasts
            if conn.rdy == 0 and m.total_rdy < m.max_in_flight:
                m._set(key, 1)
        elif conn.rdy < m.share(key):
            m._raise_to_share(key)
            if conn.rdy > conn.cap + room:  # more than the room: keep what fits
                m._set(key, conn.cap + room)
        conn.cap = max(conn.cap, conn.rdy)  # the next one's room counts this raise


def _cut(
    m: RDYManager,
    before: Snapshot,
    base: dict[Hashable, int],
    answered: Hashable,
    budget: int,
) -> None:
    """Cut credit while the caps are over the budget: exact cuts first (see the module).
    ``base``: each cap before the event's raises, the lowest a cut can bring it to."""
    conns = m.conns

    def cap_floor(key: Hashable) -> int:
        return max(base.get(key, 0), conns[key].in_flight)

    # 1. raises of this event, back down to where they were; 2. the answered connection
    exact = [(key, before[key][0] if key in before else 0) for key in conns]
    exact = [(key, low) for key, low in exact if conns[key].rdy > low]
    if answered in conns:
        exact.append((answered, conns[answered].in_flight))
    for key, low in exact:
        conn = conns[key]
        over = held(m) - budget
        if over <= 0:
            return
        floor = max(low, conn.in_flight)
        if conn.rdy > floor:
            # what this cut takes off the cap: down to the cap's own floor, never below RDY
            new_rdy = max(floor, conn.rdy - over)
            m._set(key, new_rdy)
            conn.cap = max(cap_floor(key), new_rdy)
    if held(m) > budget:
        # 3. over anyway: no nsqd may send more; the caps come down as answers arrive
        for key, conn in conns.items():
            if conn.rdy > conn.in_flight:
                m._set(key, conn.in_flight)


def maintain(m: RDYManager, now: float) -> None:
    """Timers of a budgeted run (called from ``tick``): take idle credit back while another
    connection is below its share, and settle caps (see the module)."""
    idle_after, settle = m.unproductive_after, m.settle
    wanting = _wanting(m)
    for key, conn in m.conns.items():
        if wanting - {key} and conn.rdy > conn.in_flight and now - _since(conn) >= idle_after:
            m._set(key, conn.in_flight)
            conn.lowered_at = conn.reclaimed_at = now
        if _settling(conn) and now - max(conn.lowered_at, conn.last_msg_at) >= settle:
            conn.cap = max(conn.rdy, conn.in_flight)


def deadline(m: RDYManager) -> float | None:
    """When :func:`maintain` next has work to do, or None."""
    idle_after, settle = m.unproductive_after, m.settle
    wanting = _wanting(m)
    times = []
    for key, conn in m.conns.items():
        if wanting - {key} and conn.rdy > conn.in_flight:
            times.append(_since(conn) + idle_after)
        if _settling(conn):
            times.append(max(conn.lowered_at, conn.last_msg_at) + settle)
    return min(times) if times else None


def _settling(conn: ConnRDY) -> bool:
    """Its RDY was lowered below what its nsqd may hold, and that has not settled yet."""
    return conn.cap > max(conn.rdy, conn.in_flight)


def _wanting(m: RDYManager) -> set[Hashable]:
    """Connections below their share (and not settling) that idle credit could go to. While
    there are, idle credit on another connection rotates among the nsqds, so that one with
    messages gets it."""
    return {
        key
        for key, conn in m.conns.items()
        # a connection full of messages in flight (RDY 0 at the tail) is not waiting for credit
        if max(conn.rdy, conn.in_flight) < m.share(key) and not _settling(conn)
    }


def _since(conn: ConnRDY) -> float:
    """Since when a connection holding credit has been idle: its grant, last message or (when
    credit is scarce) the answer that emptied it."""
    return max(conn.last_msg_at, conn.granted_at, conn.answered_at)
