"""A consumer's parts as one value, for what is built on a Consumer (BatchConsumer, dead_letter):
a :class:`PartsUser` handler composes them instead of reaching into the consumer. Internal.
"""

from __future__ import annotations

import logging
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
    #: the consumer's logger (per subscription)
    log: logging.Logger | logging.LoggerAdapter[Any]
    connections: ConnectionSet
    responder: ConsumerResponder
    pool: WorkerPool
    #: the consumer's lifecycle: what run_to_end needs, the fatal error, the stop request
    control: Lifecycle


class PartsUser:
    """A handler that works with the consumer's parts: :meth:`attach` is called whenever the
    consumer builds them (again at ``start()`` when ``runtime="auto"`` picked another runtime)."""

    __slots__ = ()

    def __call__(self, message: Message) -> Any:
        raise NotImplementedError

    def attach(self, parts: ConsumerParts) -> None:
        raise NotImplementedError

    def observe(self, observer: ConsumerObserver | None) -> None:
        """Metrics were turned on (or off): wrap the user's handler with ``observer.wrap_handler``.
        Default: nothing."""
