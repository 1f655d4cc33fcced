"""Where scarce credit goes: RDY follows the nsqds that have messages.

With ``max_in_flight`` < connections (or a backoff probe) only some connections hold RDY. nsqd
sends at once when it has a message and RDY, so a holder whose nsqd sent nothing for
``unproductive_after`` is empty, and its credit goes to the connection *due* the earliest (at
once: never tried, or delivering when it lost credit; found empty: once another nsqd wakes up,
or after ``probe_interval``). Outside backoff, credit also moves after ``redistribute_interval``
(fairness). A stall lasts at most ``ceil((n - max_in_flight) / max_in_flight)`` hops.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from nsq_sync.credit.state import Action, ConnRDY, CreditState

__all__ = ["active", "best", "deadline", "due_at", "idle_since", "rotate"]

_NEVER = math.inf


def active(m: CreditState) -> bool:
    """Whether credit rotates: scarce credit (outside backoff), or a probe on 2+ connections."""
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
    """Since when a connection's nsqd has sent nothing: its grant, last message or last answer."""
    return max(conn.granted_at, conn.last_msg_at, conn.answered_at)


def _free_at(m: CreditState, conn: ConnRDY, fair: bool) -> float:
    """When a holder may give its credit away."""
    at = conn.granted_at + m.redistribute_interval if fair else _NEVER
    if conn.in_flight == 0:
        at = min(at, idle_since(conn) + m.unproductive_after)
    return at


def best(m: CreditState, keys: list[Hashable]) -> list[Hashable]:
    """``keys`` in the order credit goes to them: due earliest, lost credit longest ago, random."""
    keys = list(keys)
    m.rng.shuffle(keys)
    conns = m.conns
    keys.sort(key=lambda k: (due_at(m, conns[k]), conns[k].released_at))
    return keys


def deadline(m: CreditState) -> float | None:
    """When :func:`rotate` next moves credit, or None."""
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
