"""The producer: :class:`Producer` (producer.py), its per-process pool of nsqds and the failover
of a publish across them (pool.py), and one nsqd's connection and reconnect backoff (slot.py)."""

from nsq_sync.producer.producer import Producer

__all__ = ["Producer"]
