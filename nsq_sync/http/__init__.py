"""The HTTP clients: :class:`NsqdHTTPClient` (nsqd.py) and :class:`LookupdClient` (lookupd.py),
on one fork-safe base (base.py)."""

from nsq_sync.http.lookupd import LookupdClient, ProducerInfo
from nsq_sync.http.nsqd import NsqdHTTPClient

__all__ = ["LookupdClient", "NsqdHTTPClient", "ProducerInfo"]
