"""A consumer's parts as one value, for what is built on top of a Consumer (BatchConsumer).

A handler that subclasses :class:`PartsUser` is given the consumer's :class:`ConsumerParts`
whenever the consumer builds them, so it composes them (finishes through the responder, gives
up through the pool, reads the credit) instead of copying the consumer's code. Internal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.responder import ConsumerResponder
from nsq_sync.consumer.workers import WorkerPool
from nsq_sync.message import Message
from nsq_sync.metrics.observer import ConsumerObserver
from nsq_sync.runtime import Runtime

__all__ = ["ConsumerParts", "PartsUser"]


@dataclass(frozen=True)
class ConsumerParts:
    """A consumer's machinery, for what is built on top of it (BatchConsumer): internal."""

    runtime: Runtime
    connections: ConnectionSet
    responder: ConsumerResponder
    pool: WorkerPool


class PartsUser:
    """Base class of a handler that works with the consumer's parts (BatchConsumer's collector;
    internal). The consumer calls :meth:`attach` whenever it builds them: at construction, and
    again at ``start()`` when ``runtime="auto"`` decided on another runtime."""

    __slots__ = ()

    def __call__(self, message: Message) -> Any:
        raise NotImplementedError

    def attach(self, parts: ConsumerParts) -> None:
        raise NotImplementedError

    def observe(self, observer: ConsumerObserver | None) -> None:
        """Metrics were turned on (or off): time and trace the user's handler through
        ``observer.wrap_handler``. Default: nothing."""
