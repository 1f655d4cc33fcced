"""Small helpers for integration tests: bounded polling, nsqd stats, a message-collecting handler."""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from nsq_sync.errors import ServerError
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.protocol import commands
from nsq_sync.protocol.events import MessageFrame, RawMessage
from nsq_sync.wire.connection import NsqdConnection

__all__ = [
    "Abort",
    "Collector",
    "raise_like_a_time_limit",
    "settled_channel",
    "prepare_channel",
    "free_closed_port",
    "message_count",
    "producer_clients",
    "read_bodies",
    "topic_depth",
    "wait_for",
    "waitpid",
]

T = TypeVar("T")


class Abort(BaseException):
    """A BaseException that is neither SystemExit, KeyboardInterrupt nor GreenletExit."""


def raise_like_a_time_limit() -> None:
    """Raise what a handler's own time limit raises: under gevent a gevent.Timeout escaping
    ``with gevent.Timeout(...)`` (a BaseException), under threads :class:`Abort`."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        import gevent

        with gevent.Timeout(0.001):
            gevent.sleep(1.0)
    raise Abort()


DEFAULT_TIMEOUT = 15.0


def in_ci() -> bool:
    """True in a CI run (``CI`` set to 1/true/yes): an integration test whose tool is missing
    fails there instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def wait_for(
    condition: Callable[[], T], what: str, timeout: float = DEFAULT_TIMEOUT, interval: float = 0.02
) -> T:
    """Poll ``condition`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def connected_addresses(consumer: Any) -> list[str]:
    """The nsqd addresses a Consumer is connected to now, sorted (from its stats)."""
    return sorted(c.address for c in consumer.stats().connections)


def waitpid(pid: int, timeout: float) -> int:
    """Wait for a forked child to exit (its exit code); kill it and fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"forked child {pid} did not exit within {timeout} s")
        time.sleep(0.02)


def bounded(seconds: float) -> Iterator[None]:
    """Generator for an autouse fixture: dump every stack and exit if a test runs longer than
    ``seconds`` (a hung test must not hang CI)."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def free_closed_port() -> int:
    """A loopback port that nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _topic(http_address: str, topic: str) -> dict[str, Any] | None:
    with NsqdHTTPClient(http_address) as client:
        return client.topic_stats(topic)


def prepare_channel(nsqd: Any, topic: str, channel: str, n: int = 0) -> NsqdHTTPClient:
    """Create ``topic`` and ``channel`` on ``nsqd`` (an NsqdProcess), so nothing depends on who
    subscribes first, then publish ``n`` messages ``m0``, ``m1``...; returns an HTTP client."""
    client = NsqdHTTPClient(nsqd.http_url)
    client.create_topic(topic)
    client.create_channel(topic, channel)
    if n:
        client.mpub(topic, [f"m{i}".encode() for i in range(n)])
    return client


def settled_channel(client: NsqdHTTPClient, topic: str, channel: str) -> dict[str, Any]:
    """The channel's entry in nsqd's /stats (depth, in_flight_count, deferred_count...) once no
    client is connected to it: a consumer that closed has written its last FIN/REQ, but nsqd
    reads them (and then the close) a moment later, and drops the client only after that."""

    def settled() -> dict[str, Any] | None:
        stats = client.channel_stats(topic, channel)
        assert stats is not None, f"nsqd has no channel {topic}/{channel}"
        return None if stats["clients"] else stats

    return wait_for(settled, f"every client of {topic}/{channel} to leave")


def message_count(http_address: str, topic: str) -> int:
    """The topic's ``message_count`` in nsqd's /stats (0 when the topic does not exist)."""
    stats = _topic(http_address, topic)
    return 0 if stats is None else int(stats["message_count"])


def topic_depth(http_address: str, topic: str) -> int:
    """The topic's ``depth`` in nsqd's /stats (0 when the topic does not exist)."""
    stats = _topic(http_address, topic)
    return 0 if stats is None else int(stats["depth"])


def producer_clients(http_address: str) -> list[dict[str, Any]]:
    """nsqd's /stats ``producers``: every live client connection that has published."""
    with NsqdHTTPClient(http_address) as client:
        return list(client.stats(include_clients=True).get("producers") or [])


def read_bodies(
    tcp_address: str, http_address: str, topic: str, timeout: float = DEFAULT_TIMEOUT
) -> Counter[bytes]:
    """Every body nsqd holds for ``topic`` (with how many times it holds it), read back over a
    plain subscription on a fresh channel. Read this once, after publishing ended, while the
    topic has no channel yet: nsqd keeps every message in the topic (its depth, which survives
    a restart) and hands them all to the first channel."""
    expected = topic_depth(http_address, topic)
    collector = Collector()
    conn = NsqdConnection(tcp_address, handler=collector)
    conn.connect()
    try:
        conn.subscribe(topic, "read_bodies")
        conn.start_reader()
        conn.send(commands.rdy(2500))
        finished = 0

        def all_read() -> bool:
            # FIN as they come: nsqd sends at most RDY (2500) unfinished messages
            nonlocal finished
            with collector._lock:
                frames = collector.messages[finished:]
            for frame in frames:
                conn.send(commands.fin(frame.id))
            finished += len(frames)
            return finished >= expected

        wait_for(all_read, f"the {expected} messages of {topic}", timeout)
        frames = collector.wait_messages(expected, timeout)
    finally:
        conn.close()
        conn.join(5.0)
    return Counter(frame.body for frame in frames)


class Collector:
    """A ConnectionHandler that keeps every message, error and the close notification."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[MessageFrame] = []
        self.errors: list[ServerError] = []
        self.responses: list[bytes] = []
        self.closed: list[BaseException | None] = []

    def on_messages(self, conn: NsqdConnection, messages: list[RawMessage]) -> None:
        # (the reader hands over plain (id, timestamp, attempts, body) tuples)
        frames = [MessageFrame(*m) for m in messages]
        with self._lock:
            self.messages.extend(frames)

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None:
        with self._lock:
            self.errors.append(error)

    def on_response(self, conn: NsqdConnection, data: bytes) -> None:
        with self._lock:
            self.responses.append(data)

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None:
        with self._lock:
            self.closed.append(error)

    def wait_messages(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[MessageFrame]:
        def enough() -> bool:
            with self._lock:
                if self.errors:
                    raise AssertionError(f"error from nsqd while reading: {self.errors}")
                return len(self.messages) >= n

        wait_for(enough, f"{n} messages (got {len(self.messages)})", timeout)
        with self._lock:
            return list(self.messages)
