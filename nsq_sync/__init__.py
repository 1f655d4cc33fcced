"""nsq_sync: a synchronous NSQ client for threads and gevent.

Importing it starts nothing: no threads, no monkey patching, no hostname lookups, no logging
configuration (a NullHandler only), and no optional dependency (gevent, snappy, pyspark). The
clients are imported on first use (``nsq_sync.Consumer``, ``from nsq_sync import Producer``):
a process that needs only ``nsq_sync.config`` or ``nsq_sync.spark``'s options (Spark's
driver-side Python runners, started for every query) does not pay for them.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from nsq_sync._version import __version__

if TYPE_CHECKING:
    from nsq_sync.config import Config
    from nsq_sync.consumer import BatchConsumer, Consumer, ConsumerStats, RunSummary
    from nsq_sync.errors import DeadLetter, NSQError, RequeueMessage
    from nsq_sync.http import LookupdClient, NsqdHTTPClient
    from nsq_sync.message import Message
    from nsq_sync.producer import Producer

#: public name -> the module that defines it
_PUBLIC = {
    "BatchConsumer": "nsq_sync.consumer",
    "Config": "nsq_sync.config",
    "Consumer": "nsq_sync.consumer",
    "ConsumerStats": "nsq_sync.consumer",
    "DeadLetter": "nsq_sync.errors",
    "LookupdClient": "nsq_sync.http",
    "Message": "nsq_sync.message",
    "NSQError": "nsq_sync.errors",
    "NsqdHTTPClient": "nsq_sync.http",
    "Producer": "nsq_sync.producer",
    "RequeueMessage": "nsq_sync.errors",
    "RunSummary": "nsq_sync.consumer",
}

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


def __getattr__(name: str) -> Any:
    """The public classes, imported on first use (PEP 562); thread-safe (the import lock)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'nsq_sync' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # next time a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


logging.getLogger(__name__).addHandler(logging.NullHandler())
