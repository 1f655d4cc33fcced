"""nsq_sync: a synchronous NSQ client for threads and gevent."""

from __future__ import annotations

import logging

from nsq_sync._version import __version__
from nsq_sync.errors import NSQError

__all__ = ["NSQError", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())
