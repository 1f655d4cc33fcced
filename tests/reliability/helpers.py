"""Shared pieces of the reliability suite: message accounting, nsqd stats, leak probes.

Everything here works under plain threads and under gevent's monkey patching (the primitives come
from ``threading``/``time``, which gevent patches in ``tests/run_gevent.py``).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from support.nsq import wait_for

from nsq_sync import Message, NsqdHTTPClient

__all__ = [
    "CHANNEL",
    "SCALE",
    "Tally",
    "channel_stats",
    "gevent_patched",
    "live_tasks",
    "make_bodies",
    "open_fds",
    "publish_http",
    "record_figures",
    "scaled",
    "channel_if_drained",
    "soak_seconds",
    "wait_for",
]

CHANNEL = "ch"

#: Multiplies every message count in the suite (``NSQ_SYNC_RELIABILITY_SCALE=0.1`` for a quick
#: run, ``=4`` for a long one). 1 is what CI runs.
SCALE = float(os.environ.get("NSQ_SYNC_RELIABILITY_SCALE", "1") or "1")


def soak_seconds() -> float:
    """How long the soak runs: ``NSQ_SYNC_SOAK_SECONDS`` (60 by default)."""
    return float(os.environ.get("NSQ_SYNC_SOAK_SECONDS", "60") or "60")


def scaled(n: int, minimum: int = 100) -> int:
    return max(minimum, int(n * SCALE))


def record_figures(record_property: Any, **figures: Any) -> None:
    """Record a test's figures for the summary (floats rounded to milliseconds)."""
    for name, value in figures.items():
        if isinstance(value, float):
            value = round(value, 3)
        record_property(name, value)


def make_bodies(n: int, prefix: str = "m") -> list[bytes]:
    """Unique bodies ``b"<prefix>-<i>"``: every published message is identifiable."""
    return [b"%s-%d" % (prefix.encode(), i) for i in range(n)]


def gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("socket"))


class Tally:
    """A handler that counts every body it handles and notes which connection delivered it.

    ``recovery_after(t, old)`` answers "how long after ``t`` was the first message handled that
    arrived on a connection not in ``old``" (a connection made after the fault).
    """

    def __init__(self, action: Any = None) -> None:
        self.action = action
        self.lock = threading.Lock()
        self.counts: Counter[bytes] = Counter()
        self.handled = 0
        self._conn_first: dict[int, float] = {}  # id(connection) -> first handled at
        self._conns: list[Any] = []  # keeps the connection objects alive (ids stay unique)

    def __call__(self, message: Message) -> None:
        if self.action is not None:
            self.action(message)
        conn = message.connection
        now = time.monotonic()
        with self.lock:
            self.counts[message.body] += 1
            self.handled += 1
            if id(conn) not in self._conn_first:
                self._conn_first[id(conn)] = now
                self._conns.append(conn)

    @property
    def unique(self) -> int:
        with self.lock:
            return len(self.counts)

    def bodies(self) -> set[bytes]:
        with self.lock:
            return set(self.counts)

    def covers(self, published: Iterable[bytes]) -> bool:
        with self.lock:
            return all(body in self.counts for body in published)

    def lost(self, published: Iterable[bytes]) -> list[bytes]:
        with self.lock:
            return [body for body in published if body not in self.counts]

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.counts.values())

    def recovery_after(self, t_fault: float, old_conns: Iterable[Any]) -> float | None:
        old = {id(c) for c in old_conns}
        with self.lock:
            firsts = [t for cid, t in self._conn_first.items() if cid not in old and t >= t_fault]
        return min(firsts) - t_fault if firsts else None


def http(address: str, timeout: float = 5.0) -> NsqdHTTPClient:
    return NsqdHTTPClient(address, timeout=timeout)


def publish_http(http_url: str, topic: str, bodies: Sequence[bytes], batch: int = 5000) -> None:
    """Create topic and channel, then MPUB ``bodies`` over nsqd's HTTP API in batches.

    Each request may take long on a busy machine (an nsqd started with ``--sync-every=1``
    fsyncs every message of a batch before it answers): 60 s per request, not 5."""
    with http(http_url, timeout=60.0) as client:
        client.create_topic(topic)
        client.create_channel(topic, CHANNEL)
        for i in range(0, len(bodies), batch):
            client.mpub(topic, bodies[i : i + batch])


def channel_stats(http_url: str, topic: str) -> dict[str, Any]:
    with http(http_url) as client:
        stats = client.channel_stats(topic, CHANNEL)
    assert stats is not None, f"nsqd {http_url} has no channel {topic}/{CHANNEL}"
    return stats


def channel_if_drained(
    http_url: str, topic: str, clients: int | None = None
) -> dict[str, Any] | None:
    """The channel's stats if nothing is queued, in flight or deferred now, else None (a condition
    for wait_for; support.nsq.settled_channel is the one that waits for counts to settle)."""
    stats = channel_stats(http_url, topic)
    if stats["depth"] or stats["in_flight_count"] or stats["deferred_count"]:
        return None
    if clients is not None and stats["client_count"] != clients:
        return None
    return stats


def open_fds() -> int:
    """File descriptors this process holds (Linux)."""
    return len(os.listdir("/proc/self/fd"))


def live_tasks() -> int:
    """Live threads, plus live greenlets when gevent is in use (the gevent runtime spawns raw
    greenlets, which ``threading.active_count()`` does not see)."""
    count = threading.active_count()
    if "gevent" in sys.modules:
        from greenlet import greenlet

        gc.collect()
        # type(), not isinstance(): isinstance reads obj.__class__, which a lazy proxy (Django's
        # staticfiles_storage, alive once the contrib tests ran) answers by setting itself up
        count += sum(
            1
            for obj in gc.get_objects()
            if issubclass(type(obj), greenlet)
            and bool(obj)
            and not obj.dead
            and obj.parent is not None
        )
    return count


def settle_leaks(before_tasks: int, before_fds: int, timeout: float = 10.0) -> tuple[int, int]:
    """Wait (bounded) until tasks and fds are back to their baseline; return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        tasks, fds = live_tasks(), open_fds()
        if (tasks <= before_tasks and fds <= before_fds) or time.monotonic() > deadline:
            return tasks, fds
        time.sleep(0.05)
