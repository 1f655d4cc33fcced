"""The producer: :class:`Producer`, its per-process pool of nsqds with the failover of a publish
(pool.py), and one nsqd's connection and reconnect backoff (slot.py)."""

from nsq_sync.producer.producer import Producer

__all__ = ["Producer"]
