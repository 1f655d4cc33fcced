"""One nsqd of a Producer's pool: its connection and its reconnect backoff. The slot's lock is
held while connecting: threads that arrive meanwhile wait for that attempt and use its
connection, or see its failure as the slot's backoff."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from nsq_sync.backoff import reconnect_delay
from nsq_sync.config import Config
from nsq_sync.errors import (
    AuthError,
    ConnectTimeout,
    NSQConnectionError,
    ProtocolError,
    ServerError,
    Stopped,
    TLSError,
)
from nsq_sync.runtime import Runtime
from nsq_sync.wire.connection import NsqdConnection

# the producer's logger: what a slot logs is the producer's doing
log = logging.getLogger("nsq_sync.producer")


class SlotBackingOff(Exception):
    """The slot is backing off (another thread's attempt just failed): try another address."""


class Slot:
    """One nsqd of a producer's pool: its connection (``conn``, or None) and its backoff
    (``failures`` since the last success, no new connection before ``retry_at``, monotonic)."""

    __slots__ = (
        "address",
        "conn",
        "lock",
        "failures",
        "retry_at",
        "last_error",
        "_config",
        "_runtime",
        "_rng",
    )

    def __init__(self, address: str, config: Config, runtime: Runtime, rng: random.Random) -> None:
        self.address = address
        self.conn: NsqdConnection | None = None
        self.lock = runtime.lock()  # held while connecting
        self.failures = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None
        self._config = config
        self._runtime = runtime
        self._rng = rng

    def connection(self, deadline: float, closed: Callable[[], bool]) -> NsqdConnection:
        """The open connection, or a new one (one attempt at a time, by ``deadline``; none once
        ``closed()``). Thread-safe. Raises SlotBackingOff, Stopped, ConnectTimeout (another
        thread's attempt did not end in time), or what connecting raised (counted once)."""
        conn = self.conn
        if conn is not None and not conn.closed:
            return conn
        if not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ConnectTimeout(
                "timed out waiting for another thread's connection attempt", self.address
            )
        try:
            conn = self.conn
            if conn is not None and not conn.closed:
                return conn
            if closed():
                raise Stopped("producer is closed")
            if self.retry_at > time.monotonic():
                raise SlotBackingOff()
            conn = NsqdConnection(
                self.address, self._config, runtime=self._runtime, heartbeats=False
            )
            try:
                conn.connect(max(0.001, deadline - time.monotonic()))
            except (NSQConnectionError, ProtocolError, ServerError) as exc:
                # counted here, once per attempt (not once per waiting thread)
                delay = None
                if isinstance(exc, (ProtocolError, TLSError, AuthError)):
                    delay = self._config.reconnect_backoff_max
                self.back_off(exc, delay)
                raise
            self.conn = conn
            if closed():  # close() ran meanwhile: it may have missed this connection
                self.conn = None
                conn.close()
                raise Stopped("producer is closed")
            self.failures = 0
            self.retry_at = 0.0
            log.debug("producer connected to %s", self.address)
            return conn
        finally:
            self.lock.release()

    def mark_failed(
        self, conn: NsqdConnection | None, error: BaseException, delay: float | None = None
    ) -> None:
        """After ``error`` on ``conn`` (None: already counted by :meth:`connection`): drop the
        connection and back off."""
        if conn is None or self.conn is not conn:
            # Connecting failed (counted where it failed), or another thread using the same
            # connection already handled its failure (and maybe connected again): counting it
            # twice would inflate the backoff, and closing the slot's new connection would
            # fail the requests waiting on it.
            return
        self.conn = None
        if not conn.closed:
            # An error frame: start afresh. A connection that is already closed is left alone:
            # its reader may still be delivering answers nsqd sent before it closed (OKs other
            # threads are waiting for).
            conn.close()
        self.back_off(error, delay)

    def back_off(self, error: BaseException, delay: float | None) -> None:
        """Count a failure; no attempt for ``delay`` seconds (None: exponential, with jitter)."""
        self.last_error = error
        self.failures += 1
        if delay is None:
            # the first retry comes quickly (50 ms): a publish is waiting
            delay = reconnect_delay(
                self.failures, 0.05, self._config.reconnect_backoff_max, self._rng
            )
        self.retry_at = time.monotonic() + delay
        log.warning("nsqd %s failed (%s); retrying it in %.2f s", self.address, error, delay)
