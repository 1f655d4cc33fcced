"""What the RDY manager knows, as its policies (rotation, a run's budget) see it. They change
credit only through :class:`CreditState`'s moves: the manager owns every RDY count."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Action", "ConnRDY", "CreditState", "Snapshot"]

#: an RDY update to send: (connection key, count)
Action = tuple[Hashable, int]
#: per connection, before an event: (RDY as nsqd was last told, granted_at, released_at,
#: productive)
Snapshot = dict[Hashable, tuple[int, float, float, bool]]


@dataclass
class ConnRDY:
    """What the manager knows about one connection."""

    max_rdy: int
    rdy: int = 0  # last RDY value sent
    remaining: int = 0  # messages nsqd may still send before the next RDY
    in_flight: int = 0
    last_msg_at: float = 0.0
    granted_at: float = 0.0  # when rdy last went from 0 to > 0
    released_at: float = 0.0  # when rdy last went from > 0 to 0 (0: never held credit)
    productive: bool = False  # it had delivered since its grant when its credit was taken
    answered_at: float = 0.0  # when credit was scarce: when its last message was answered


class CreditState(Protocol):
    """The RDY manager as its policies see it; not thread-safe (RDYManager documents it)."""

    conns: dict[Hashable, ConnRDY]
    max_in_flight: int
    clock: Callable[[], float]
    rng: random.Random
    #: max_in_flight cannot give every connection RDY 1
    scarce: bool
    backoff_level: int
    #: the backoff timer runs until then (None: not running)
    backoff_until: float | None
    #: the timer expired and one connection probes with RDY 1
    testing: bool
    redistribute_interval: float
    #: how soon a holder whose nsqd sent nothing is found empty
    unproductive_after: float
    #: how soon an nsqd found empty is tried again
    probe_interval: float
    #: when credit is scarce: when some connection last got a message after none for a while
    woke_at: float
    #: a budgeted run: how long after an RDY was lowered what nsqd sent before has arrived
    settle: float

    @property
    def total_rdy(self) -> int: ...

    @property
    def in_backoff(self) -> bool: ...

    def share(self, key: Hashable) -> int:
        """The even split of max_in_flight for ``key``."""
        ...

    def set_rdy(self, key: Hashable, count: int) -> Action:
        """Record that ``key`` is to be told RDY ``count``; return the update."""
        ...

    def raise_to_share(self, key: Hashable) -> list[Action]:
        """Raise ``key``'s RDY to its share, as far as max_in_flight allows."""
        ...

    def out_of_flight(self, key: Hashable) -> None:
        """A message of ``key`` is no longer in flight."""

    def probe_if_none(self) -> list[Action]:
        """While testing the water, send the probe if no connection holds it."""
        ...

    def refill(self, key: Hashable, conn: ConnRDY) -> list[Action]:
        """Messages arrived on ``key``: its RDY back up when due (unfitted)."""
        ...

    def answer(self, key: Hashable, success: bool | None) -> list[Action]:
        """A message of ``key`` was answered (unfitted)."""
        ...

    def snapshot(self) -> Snapshot:
        """Every connection's RDY and grant bookkeeping, before an event."""
        ...

    def net_updates(self, before: Snapshot) -> tuple[list[Action], list[Action]]:
        """An event's RDY updates as net changes from ``before``: (decreases, increases)."""
        ...
