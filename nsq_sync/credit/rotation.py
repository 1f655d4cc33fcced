"""Where scarce credit goes: RDY follows the nsqds that have messages.

When ``max_in_flight`` is below the number of connections only some of them hold RDY (1 each),
and while a backoff probe tests the water only one does. nsqd sends at once when it has a
message and RDY (with RDY 1 the message fills it, and nsqd flushes its output buffer at once),
so a holder whose nsqd sends nothing is as good as proof that the nsqd is empty, and its credit
should move on at once, to a connection whose nsqd may have messages. Peers rotate blindly
every few seconds instead (go-nsq, pynsq), which left a consumer idle for 5-12 s while another
nsqd held a backlog.

* A holder is *free* (may give its credit away) once its nsqd has sent nothing for
  ``unproductive_after`` since its grant, its last message or the answer that emptied it (the
  consumer makes that longer than nsqd's ``output_buffer_timeout``); or, outside backoff, once
  it has held credit for ``redistribute_interval``, busy or not (fairness: an nsqd with a
  steady backlog does not keep the credit from the others).
* A waiting connection is *due* at once when it never held credit, or had delivered since its
  grant when its credit was taken (``productive``: it may still have messages; once it holds
  credit and sends nothing it is not). One whose nsqd was found empty is due once it may have
  filled up: at once when, since, some connection got a message after none for a while (the
  first since its grant, or the first after ``unproductive_after`` without: ``woke_at``, a
  producer may be publishing again), otherwise ``probe_interval`` (``low_rdy_idle_timeout``)
  after it lost its credit.
* A free holder's credit goes to the due connection due the earliest (then: the one that lost
  credit the longest ago; then at random). With none due, a holder keeps its credit.

So an idle consumer (no nsqd has messages) moves credit only when a waiting connection comes
due: one RDY 0 and one RDY 1 per waiting connection per ``probe_interval`` (each nsqd is
tried again that often), and no timer wakes it in between.

The bound (``tests/unit/test_rdy_rotation.py`` checks it against a model of nsqds): a *hop*
(credit granted to an nsqd with nothing, which then gives it away) takes ``unproductive_after``
plus a round trip, plus a handler's time when the holder had just delivered its last message.
While the messages are on nsqds that never held credit or were delivering when it was taken,
every hop visits a connection ahead of them in the order, and ``max_in_flight`` credits hop in
parallel: the longest time with nothing consumed is ``ceil((n - max_in_flight) /
max_in_flight)`` hops (one for 1 of 2 or 2 of 3 nsqds). Messages that arrive on an nsqd found
empty wait until it comes due: at once when another nsqd wakes up too (a producer publishing to
several), at most ``probe_interval`` more otherwise.

Everything here runs under the RDY manager's caller's lock, on the manager's state.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from nsq_sync.credit.state import Action, ConnRDY, CreditState

__all__ = ["active", "best", "deadline", "due_at", "idle_since", "rotate"]

_NEVER = math.inf


def active(m: CreditState) -> bool:
    """Whether credit rotates now: it is scarce (outside backoff), or a backoff probe is out
    (or due) with more than one connection to put it on."""
    if m.backoff_level:
        return m.testing and m.backoff_until is None and len(m.conns) > 1
    return m.scarce


def due_at(m: CreditState, conn: ConnRDY) -> float:
    """When a waiting connection should get the next free credit (0: at once)."""
    if conn.released_at == 0.0 or conn.productive:
        return 0.0
    if m.woke_at > conn.released_at:  # publishing resumed since it was found empty
        return m.woke_at
    return conn.released_at + m.probe_interval


def idle_since(conn: ConnRDY) -> float:
    """Since when a connection's nsqd has sent nothing: its grant, its last message or the
    answer that emptied it."""
    return max(conn.granted_at, conn.last_msg_at, conn.answered_at)


def _free_at(m: CreditState, conn: ConnRDY, fair: bool) -> float:
    """When a holder may give its credit away: its nsqd sent nothing for unproductive_after
    (nothing in flight), or (``fair``) it held the credit for a whole interval."""
    at = conn.granted_at + m.redistribute_interval if fair else _NEVER
    if conn.in_flight == 0:
        at = min(at, idle_since(conn) + m.unproductive_after)
    return at


def best(m: CreditState, keys: list[Hashable]) -> list[Hashable]:
    """``keys`` (connections without credit) in the order credit goes to them: due the
    earliest, then credit lost the longest ago, then at random."""
    keys = list(keys)
    m.rng.shuffle(keys)
    conns = m.conns
    keys.sort(key=lambda k: (due_at(m, conns[k]), conns[k].released_at))
    return keys


def deadline(m: CreditState) -> float | None:
    """When :func:`rotate` next moves credit (some holder free and some connection due), or
    None."""
    if not active(m):
        return None
    fair = not m.backoff_level
    free = due = _NEVER
    for conn in m.conns.values():
        if conn.rdy > 0:
            free = min(free, _free_at(m, conn, fair))
        else:
            due = min(due, due_at(m, conn))
    at = max(free, due)
    return None if at == _NEVER else at


def rotate(m: CreditState, now: float) -> list[Action]:
    """Move the credit of every free holder to a due connection (RDY 0 before each RDY 1)."""
    if not active(m):
        return []
    fair = not m.backoff_level
    free = sorted(
        (at, index, key)
        for index, (key, conn) in enumerate(m.conns.items())
        if conn.rdy > 0 and (at := _free_at(m, conn, fair)) <= now
    )
    waiting = [k for k, c in m.conns.items() if c.rdy == 0 and due_at(m, c) <= now]
    actions: list[Action] = []
    for (_, _, holder), key in zip(free, best(m, waiting)):
        actions.append(m.set_rdy(holder, 0))
        actions.append(m.set_rdy(key, 1))
    return actions
