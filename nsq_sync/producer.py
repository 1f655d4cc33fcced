"""A thread-safe Producer: PUB/MPUB/DPUB with synchronous acks and failover across nsqds.

Each publish waits for *its own* answer: responses are matched in FIFO order per connection,
so many threads pipeline through one connection without waiting for each other.

Failover: the producer sticks to one nsqd (the first that works, in the order given) and moves to
the next one when a connection fails (refused, reset, timed out) or nsqd answers with a
*retriable* error (E_PUB_FAILED while it shuts down...). It never fails over on a rejection of
the request itself (E_BAD_TOPIC, E_BAD_MESSAGE...), which would fail the same way everywhere.

Duplicate risk: when a connection dies after a PUB was written but before its OK arrived, the
outcome is unknown; the producer republishes on the next nsqd, so the message may be delivered
twice (at-least-once). Make consumers idempotent, or disable failover with a single address.

Fork safety: the producer remembers the pid that created its connections. In a forked child
(gunicorn, celery, Spark workers) the first publish drops the inherited connections without
touching the parent's sockets and dials new ones.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

from nsq_sync import _fork
from nsq_sync.config import Config
from nsq_sync.connection import NsqdConnection
from nsq_sync.errors import (
    AuthError,
    ConfigError,
    InvalidBody,
    NSQConnectionError,
    ProtocolError,
    PublishError,
    RemoteProtocolError,
    ServerError,
    Stopped,
    TLSError,
)
from nsq_sync.protocol import commands
from nsq_sync.protocol.commands import Body
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.names import validate_topic
from nsq_sync.runtime import Runtime, resolve_runtime
from nsq_sync.transport import parse_address

log = logging.getLogger(__name__)

__all__ = ["Producer"]


class _Slot:
    """One nsqd of the pool: its connection (if any) and its reconnect backoff."""

    __slots__ = ("address", "conn", "lock", "failures", "retry_at", "last_error")

    def __init__(self, address: str, runtime: Runtime) -> None:
        self.address = address
        self.conn: NsqdConnection | None = None
        self.lock = runtime.lock()
        self.failures = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None


class Producer:
    """Publishes to nsqd over TCP. Thread-safe; a context manager.

    Args:
        nsqd_tcp_addresses: one ``host:port`` or a list, in order of preference.
        config: a :class:`~nsq_sync.config.Config`; keyword ``overrides`` are applied on top.
        runtime: ``"auto"``, ``"threads"`` or ``"gevent"``.

    Raises:
        ConfigError: no address, a malformed address, or an invalid option.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        config: Config | None = None,
        *,
        runtime: Any = "auto",
        **overrides: Any,
    ) -> None:
        if isinstance(nsqd_tcp_addresses, str):
            addresses = [nsqd_tcp_addresses]
        elif isinstance(nsqd_tcp_addresses, (bytes, bytearray)) or not isinstance(
            nsqd_tcp_addresses, Iterable
        ):
            raise ConfigError(
                "nsqd_tcp_addresses must be 'host:port' or a list of them, "
                f"got {nsqd_tcp_addresses!r}"
            )
        else:
            addresses = list(nsqd_tcp_addresses)
        if not addresses:
            raise ConfigError("Producer needs at least one nsqd TCP address")
        for address in addresses:
            parse_address(address)
        self.config = (config or Config()).replace(**overrides)
        self.runtime: Runtime = resolve_runtime(runtime)
        self.addresses = addresses
        self._closed = False
        self._rng = random.Random()
        _fork.install()
        self._reset_state()

    def _reset_state(self) -> None:
        self._generation = _fork.generation
        self._slots = [_Slot(a, self.runtime) for a in self.addresses]
        self._current = 0
        self._active: list[None] = []  # a token per publish in progress

    # ------------------------------------------------------------------ public API

    def publish(self, topic: str, body: Body, *, timeout: float | None = None) -> None:
        """PUB one message and wait for nsqd's OK. Thread-safe.

        Raises:
            InvalidName, InvalidBody: bad topic or body (empty, over ``max_msg_size``); nothing
                is sent.
            ServerError: nsqd rejected it (E_BAD_TOPIC, E_BAD_MESSAGE, E_UNAUTHORIZED...).
            PublishError: no nsqd accepted it (``reason`` holds the last error).
            Stopped: the producer is closed.
        """
        data = commands.pub(topic, body)
        # "PUB " + topic + "\n" + 4-byte size precede the body
        self._check_size(len(data) - len(topic) - 9, None)
        self._publish(data, timeout)

    def multi_publish(
        self, topic: str, bodies: Iterable[Body], *, timeout: float | None = None
    ) -> None:
        """MPUB a batch atomically (all or none) and wait for OK. Thread-safe.

        Raises:
            InvalidName, InvalidBody: bad topic, no bodies, an empty or oversized body, or a batch
                over ``max_body_size``; nothing is sent.
            ServerError, PublishError, Stopped: as :meth:`publish`.
        """
        topic = validate_topic(topic)  # the topic's error first, as for publish
        datas = commands.to_bodies(bodies)
        limit = self.config.max_msg_size
        if limit is not None and max(map(len, datas)) > limit:
            for i, d in enumerate(datas):
                self._check_size(len(d), i)  # raises for the first too large
        data = commands.mpub_checked(topic, datas)
        limit = self.config.max_body_size
        if limit is not None and len(data) > limit:
            raise InvalidBody(f"MPUB batch of {len(data)} bytes exceeds max_body_size {limit}")
        self._publish(data, timeout)

    def deferred_publish(
        self, topic: str, body: Body, delay: float, *, timeout: float | None = None
    ) -> None:
        """DPUB: nsqd delivers the message after ``delay`` seconds. Thread-safe.

        Raises:
            ConfigError: ``delay`` negative, not finite, or over ``max_defer``; nothing is sent.
            InvalidName, InvalidBody, ServerError, PublishError, Stopped: as :meth:`publish`.
        """
        if (
            isinstance(delay, bool)
            or not isinstance(delay, (int, float))
            or not (0 <= delay <= self.config.max_defer)
        ):
            raise ConfigError(
                f"deferred publish delay must be between 0 and max_defer "
                f"({self.config.max_defer} s), got {delay!r}"
            )
        data = commands.dpub(topic, float(delay), body)
        self._check_size(len(commands.to_body(body)), None)
        self._publish(data, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new publishes, wait up to ``timeout`` s for those in progress, then close the
        connections. Idempotent, thread-safe."""
        self._closed = True
        if self._generation == _fork.generation:
            # Publishes in progress: poll briefly (only at close; a per-publish Event would cost
            # every publish a Condition round trip).
            deadline = time.monotonic() + timeout
            while self._active and time.monotonic() < deadline:
                self.runtime.sleep(0.005)
            for slot in self._slots:
                # Take the connection first: another thread may be closing the producer too.
                conn, slot.conn = slot.conn, None
                if conn is not None:
                    conn.close()
                    conn.join(1.0)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ internals

    def _check_size(self, size: int, index: int | None) -> None:
        limit = self.config.max_msg_size
        if limit is not None and size > limit:
            where = "" if index is None else f" (message {index})"
            raise InvalidBody(f"message body{where} of {size} bytes exceeds max_msg_size {limit}")

    def _publish(self, data: bytes, timeout: float | None) -> None:
        if self._closed:
            raise Stopped("producer is closed")
        if self._generation != _fork.generation:
            self._after_fork()
        # One token per publish in progress: list append/pop are atomic (no lock, whose
        # contended release costs a futex wake-up per publish when many threads publish).
        self._active.append(None)
        try:
            self._publish_with_failover(
                data, self.config.publish_timeout if timeout is None else timeout
            )
        finally:
            self._active.pop()

    def _publish_with_failover(self, data: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        n = len(self._slots)
        while True:
            start = self._current
            for k in range(n):
                slot = self._slots[(start + k) % n]
                if slot.retry_at and slot.retry_at > time.monotonic():
                    continue
                conn: NsqdConnection | None = None
                try:
                    conn = self._connection(slot)
                    answer = conn.request(data, max(0.001, deadline - time.monotonic()))
                    if answer != OK:
                        # nsqd answers a publish with OK or an error frame: anything else means
                        # the stream is out of step with our requests (the outcome is unknown).
                        raise RemoteProtocolError(
                            f"nsqd answered a publish with {answer[:100]!r} instead of OK"
                        )
                except ServerError as exc:
                    if not exc.retriable:
                        raise
                    last_error = exc
                    self._mark_failed(slot, conn, exc)
                except (ProtocolError, TLSError, AuthError) as exc:
                    # Garbage from the peer (typically nsqd's HTTP port given as its TCP port), a
                    # TLS setup that cannot work (certificate not verified, nsqd requires TLS) or
                    # AUTH required without a secret are configuration errors that a retry would
                    # only repeat: do not hammer that address (fail over, or raise at once).
                    last_error = exc
                    self._mark_failed(slot, conn, exc, delay=self.config.reconnect_backoff_max)
                except NSQConnectionError as exc:
                    last_error = exc
                    self._mark_failed(slot, conn, exc)
                else:
                    self._current = (start + k) % n
                    return
            remaining = deadline - time.monotonic()
            next_try = min(s.retry_at for s in self._slots) - time.monotonic()
            # Raise as soon as no nsqd can be tried again before the deadline: sleeping until
            # the deadline first would only delay the same error.
            if remaining <= 0 or next_try > remaining:
                last_error = last_error or next(
                    (s.last_error for s in self._slots if s.last_error), None
                )
                raise PublishError(
                    f"publish failed on every nsqd ({', '.join(self.addresses)})", last_error
                )
            if next_try > 0:
                self.runtime.sleep(min(next_try, remaining))

    def _connection(self, slot: _Slot) -> NsqdConnection:
        conn = slot.conn
        if conn is not None and not conn.closed:
            return conn
        with slot.lock:
            conn = slot.conn
            if conn is not None and not conn.closed:
                return conn
            conn = NsqdConnection(slot.address, self.config, runtime=self.runtime, heartbeats=False)
            conn.connect()
            slot.conn = conn
            slot.failures = 0
            slot.retry_at = 0.0
            log.debug("producer connected to %s", slot.address)
            return conn

    def _mark_failed(
        self,
        slot: _Slot,
        conn: NsqdConnection | None,
        error: BaseException,
        delay: float | None = None,
    ) -> None:
        """Back off from ``slot`` after ``error`` on ``conn`` (None: connecting failed)."""
        if conn is not None and slot.conn is not conn:
            # Another thread using the same connection already handled its failure (and maybe
            # connected again): counting it twice would inflate the backoff, and closing the
            # slot's new connection would fail the requests waiting on it.
            return
        slot.last_error = error
        slot.failures += 1
        if delay is None:
            # exponential backoff with jitter, capped; the first retry comes quickly
            cap = self.config.reconnect_backoff_max
            delay = min(cap, 0.05 * (2 ** min(slot.failures - 1, 16)))
            delay *= 0.5 + self._rng.random() / 2
        slot.retry_at = time.monotonic() + delay
        slot.conn = None
        if conn is not None and not conn.closed:
            # A timeout (outcome unknown) or an error frame: start afresh. A connection that is
            # already closed is left alone: its reader may still be delivering answers that
            # nsqd sent before it closed (OKs other threads are waiting for).
            conn.close()
        log.warning("nsqd %s failed (%s); retrying it in %.2f s", slot.address, error, delay)

    def _after_fork(self) -> None:
        # The child inherited the parent's sockets (and maybe locks held by threads that no
        # longer exist). Close only our copies of the descriptors, never shut the sockets down.
        for slot in self._slots:
            if slot.conn is not None:
                slot.conn.abandon()
        self._reset_state()
