"""What :meth:`Consumer.stats() <nsq_sync.consumer.Consumer.stats>` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ConnectionStats", "ConsumerStats"]


@dataclass(frozen=True)
class ConnectionStats:
    address: str
    rdy: int
    in_flight: int
    messages_received: int


@dataclass(frozen=True)
class ConsumerStats:
    """A snapshot of a consumer's state (see :meth:`Consumer.stats`)."""

    connections: list[ConnectionStats] = field(default_factory=list)
    max_in_flight: int = 0
    total_rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0  # every REQ sent: after failures, by message.requeue(), at stop
    failed: int = 0  # handler calls that raised (RequeueMessage aside)
    gave_up: int = 0
    skipped: int = 0
    #: given up and published to the dead-letter topic (also counted in gave_up)
    dead_lettered: int = 0
    backoff_level: int = 0
    in_backoff: bool = False
    is_starved: bool = False
