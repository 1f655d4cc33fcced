"""The consumer: :class:`Consumer`, :class:`BatchConsumer`, ``run()`` to an end, their parts."""

from nsq_sync.consumer.batch import BatchConsumer, BatchHandler
from nsq_sync.consumer.consumer import Consumer
from nsq_sync.consumer.running import RunSummary
from nsq_sync.consumer.stats import ConnectionStats, ConsumerStats

__all__ = [
    "BatchConsumer",
    "BatchHandler",
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "RunSummary",
]
