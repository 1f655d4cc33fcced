"""nsq_sync: a synchronous NSQ client for threads and gevent.

Importing it starts nothing: no threads, no monkey patching, no hostname lookups, no logging
configuration (a NullHandler only), and no optional dependency (gevent, snappy, pyspark).
"""

from __future__ import annotations

import logging

from nsq_sync._version import __version__
from nsq_sync.config import Config
from nsq_sync.consumer import BatchConsumer, Consumer, ConsumerStats, RunSummary
from nsq_sync.errors import DeadLetter, NSQError, RequeueMessage
from nsq_sync.http import LookupdClient, NsqdHTTPClient
from nsq_sync.message import Message
from nsq_sync.producer import Producer

__all__ = [
    "BatchConsumer",
    "Config",
    "Consumer",
    "ConsumerStats",
    "DeadLetter",
    "LookupdClient",
    "Message",
    "NSQError",
    "NsqdHTTPClient",
    "Producer",
    "RequeueMessage",
    "RunSummary",
    "__version__",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
