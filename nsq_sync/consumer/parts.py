"""A consumer's parts as one value, for what is built on top of a Consumer (BatchConsumer,
dead_letter's reading).

A handler that subclasses :class:`PartsUser` is given the consumer's :class:`ConsumerParts`
whenever the consumer builds them, so it composes them (finishes through the responder, gives
up through the pool, reads the credit, runs the consumer to an end through its control)
instead of copying the consumer's code or reaching into it. Internal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.lifecycle import Lifecycle
from nsq_sync.consumer.responder import ConsumerResponder
from nsq_sync.consumer.workers import WorkerPool
from nsq_sync.message import Message
from nsq_sync.metrics.observer import ConsumerObserver
from nsq_sync.runtime import Runtime

__all__ = ["ConsumerParts", "PartsUser"]


@dataclass(frozen=True)
class ConsumerParts:
    """A consumer's machinery, for what is built on top of it: internal."""

    runtime: Runtime
    connections: ConnectionSet
    responder: ConsumerResponder
    pool: WorkerPool
    #: the consumer's lifecycle: what run_to_end needs, the fatal error, the stop request
    control: Lifecycle


class PartsUser:
    """Base class of a handler that works with the consumer's parts. The consumer calls
    :meth:`attach` whenever it builds them: at construction, and again at ``start()`` when
    ``runtime="auto"`` decided on another runtime."""

    __slots__ = ()

    def __call__(self, message: Message) -> Any:
        raise NotImplementedError

    def attach(self, parts: ConsumerParts) -> None:
        raise NotImplementedError

    def observe(self, observer: ConsumerObserver | None) -> None:
        """Metrics were turned on (or off): time and trace the user's handler through
        ``observer.wrap_handler``. Default: nothing."""
