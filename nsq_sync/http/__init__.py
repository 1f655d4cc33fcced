"""The HTTP clients: :class:`NsqdHTTPClient` and :class:`LookupdClient`, on one fork-safe base."""

from nsq_sync.http.lookupd import LookupdClient, ProducerInfo
from nsq_sync.http.nsqd import NsqdHTTPClient

__all__ = ["LookupdClient", "NsqdHTTPClient", "ProducerInfo"]
