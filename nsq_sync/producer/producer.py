"""A thread-safe Producer: PUB/MPUB/DPUB with synchronous acks and failover across nsqds.

This docstring is the producer's design; the modules that carry it out refer to it.

No task of its own: each publish writes its command and waits for *its own* answer on the
caller's thread. nsqd answers in order, so answers are matched to requests in FIFO order per
connection, and many threads pipeline through one connection (:mod:`nsq_sync.wire.requests`: the
first waiter reads for all, then hands the reading role on). A caller whose ``timeout`` runs
out abandons only its own wait: the connection stays up for the others, and the late answer is
matched to the abandoned request and dropped. The connections IDENTIFY with heartbeats off
(nothing reads while idle; TCP keepalive is on).

Failover (:mod:`nsq_sync.producer.pool`): the producer sticks to one nsqd (the first that works, in
the order given) and moves to the next one when connecting fails (refused, reset, timed out)
or nsqd answers with a *retriable* error (E_PUB_FAILED while it shuts down...). It never fails
over on a rejection of the request itself (E_BAD_TOPIC, E_BAD_MESSAGE...), which would fail
the same way everywhere. A publish first tries the preferred nsqd's open connection without
the failover loop's set-up (the hot path, in :meth:`Producer._publish`); every failed attempt
goes through :meth:`nsq_sync.producer.pool.Pool.attempt_failed`.

Reconnecting (:mod:`nsq_sync.producer.slot`): one attempt at a time per nsqd, however many threads
publish; the threads that arrive while it connects wait for that attempt (within their own
timeout) instead of starting their own. A failed attempt counts once and backs the address off
(exponentially, with jitter, up to ``reconnect_backoff_max``). While every address is backing
off, a publish fails at once with a :class:`~nsq_sync.errors.PublishError` naming the
addresses and the last cause; only the publish that sees a working address fail for the first
time waits for its short first backoff (25-50 ms) and tries once more within its timeout.

Duplicates: a command that may have reached nsqd (it was written, then the connection broke, the
producer was closed or the caller's timeout ran out before the answer) is never sent again
behind the caller's back: the publish raises :class:`~nsq_sync.errors.PublishOutcomeUnknown`
(a PublishError). With ``retry_unknown=True`` the producer resends it on the next connection
instead, within the same timeout: at-least-once, so nsqd may hold the message twice. Commands
that certainly did not reach nsqd (connecting failed, nsqd answered with a retriable error) are
always sent elsewhere.

Fork safety: everything that must not cross a fork (the connections, their locks, the count of
publishes in progress) lives in the per-process :class:`~nsq_sync.producer.pool.Pool`, held by
:class:`nsq_sync.process.PerProcess`. In a forked child (gunicorn, uwsgi, celery,
multiprocessing, Spark workers) the fork hook has already closed the child's copies of the
parent's descriptors (never shutting the parent's sockets down), and the first publish builds
the child's pool: exactly once per process, however many threads of the child publish at once,
and never touching a connection opened in the child (:mod:`nsq_sync.process` says why this holds
by construction). A publish of the parent copied into the child (gevent copies every greenlet)
fails there with a PublishError or PublishOutcomeUnknown and goes on in the parent.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from nsq_sync import process as _fork
from nsq_sync.addresses import parse_address
from nsq_sync.config import Config, address_list
from nsq_sync.durations import Duration, to_seconds
from nsq_sync.errors import ConfigError, InvalidBody, Stopped
from nsq_sync.metrics import observer as _observe
from nsq_sync.producer.pool import Attempts, Pool, not_ok
from nsq_sync.producer.slot import Slot
from nsq_sync.protocol import commands
from nsq_sync.protocol.commands import Body
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.names import validate_topic
from nsq_sync.runtime import AutoRuntime, Runtime, resolve_runtime

log = logging.getLogger(__name__)

__all__ = ["Producer"]


class Producer:
    """Publishes to nsqd over TCP. Thread-safe; fork-safe; a context manager.

    Args:
        nsqd_tcp_addresses: one ``host:port`` or a list, in order of preference (one string
            may hold several, separated by commas); empty: ``config.nsqd_tcp_addresses``.
        config: a :class:`~nsq_sync.config.Config`; keyword ``overrides`` are applied on top.
        runtime: ``"auto"``, ``"threads"`` or ``"gevent"``.
        retry_unknown: resend a command whose outcome is unknown (the connection broke after it
            was written) on the next connection, within the publish's timeout. nsqd may then
            hold it twice. False (the default): raise
            :class:`~nsq_sync.errors.PublishOutcomeUnknown` and let the caller decide.

    Raises:
        ConfigError: no address, a malformed address, or an invalid option.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        config: Config | None = None,
        *,
        runtime: Any = "auto",
        retry_unknown: bool = False,
        **overrides: Any,
    ) -> None:
        self.config = (config or Config()).replace(**overrides)
        addresses = list(address_list("nsqd_tcp_addresses", nsqd_tcp_addresses))
        addresses = addresses or list(self.config.nsqd_tcp_addresses)
        if not addresses:
            raise ConfigError("Producer needs at least one nsqd TCP address")
        for address in addresses:
            parse_address(address)
        if not isinstance(retry_unknown, bool):
            raise ConfigError(f"retry_unknown must be True or False, got {retry_unknown!r}")
        # "auto" is decided at the first publish in each process, not here: a producer made in
        # a gunicorn master (--preload) runs on gevent in workers that gevent patched later.
        # Nothing runtime-made exists before (the pool is built lazily).
        self.runtime: Runtime = resolve_runtime(runtime, lazy=True)
        self.addresses = addresses
        self.retry_unknown = retry_unknown
        self._closed = False
        self._rng = random.Random()
        self._pool: _fork.PerProcess[Pool] = _fork.PerProcess(
            lambda: Pool(self.addresses, self.config, self.runtime, self._rng, self, self._pool),
            lazy=True,
        )

    @property
    def _slots(self) -> list[Slot]:
        """This process's slots (tests look at the connections through them)."""
        return self._pool.get().slots

    # ------------------------------------------------------------------ public API

    def publish(self, topic: str, body: Body, *, timeout: Duration | None = None) -> None:
        """PUB one message and wait for nsqd's OK. Thread-safe.

        ``timeout`` (default ``publish_timeout``) bounds what the call waits for: connecting,
        the handshake, and nsqd's answer. (A write in progress is bounded by ``write_timeout``:
        cutting it short would tear the connection the other threads share.)

        Raises:
            InvalidName, InvalidBody: bad topic or body (empty, over ``max_msg_size``); nothing
                is sent.
            ServerError: nsqd rejected it (E_BAD_TOPIC, E_BAD_MESSAGE, E_UNAUTHORIZED...).
            PublishOutcomeUnknown: it was sent but no answer came (connection lost, producer
                closed, timeout): nsqd may or may not hold it. Never resent unless
                ``retry_unknown``.
            PublishError: no nsqd accepted it (``reason`` holds the last error); at once while
                every address is backing off after a failure.
            Stopped: the producer is closed (nothing was sent).
        """
        observer = _observe.publisher  # metrics (nsq_sync.metrics); None while off
        if observer is not None:
            self._observed(observer, "PUB", topic, [body], timeout)
            return
        # _pub's lines, inline: with metrics off a publish costs no extra Python frame
        data = commands.pub(topic, body)
        size = len(data) - len(topic) - 9  # "PUB " + topic + "\n" + 4-byte size, then the body
        limit = self.config.max_msg_size
        if limit is not None and size > limit:
            self._check_size(size, None)  # raises
        self._publish(data, timeout)

    def _pub(self, topic: str, body: Body, timeout: Duration | None) -> str:
        data = commands.pub(topic, body)
        size = len(data) - len(topic) - 9  # "PUB " + topic + "\n" + 4-byte size, then the body
        limit = self.config.max_msg_size
        if limit is not None and size > limit:
            self._check_size(size, None)  # raises
        return self._publish(data, timeout)

    def multi_publish(
        self, topic: str, bodies: Iterable[Body], *, timeout: Duration | None = None
    ) -> None:
        """MPUB a batch atomically (all or none) and wait for OK. Thread-safe.

        Raises:
            InvalidName, InvalidBody: bad topic, no bodies, an empty or oversized body, or a batch
                over ``max_body_size``; nothing is sent.
            ServerError, PublishError, PublishOutcomeUnknown, Stopped: as :meth:`publish`.
        """
        topic = validate_topic(topic)  # the topic's error first, as for publish
        datas = commands.to_bodies(bodies)
        observer = _observe.publisher  # metrics (nsq_sync.metrics); None while off
        if observer is not None:
            self._observed(observer, "MPUB", topic, datas, timeout)
            return
        self._mpub(topic, datas, timeout)

    def _mpub(self, topic: str, datas: list[bytes], timeout: Duration | None) -> str:
        limit = self.config.max_msg_size
        if limit is not None and max(map(len, datas)) > limit:
            for i, d in enumerate(datas):
                self._check_size(len(d), i)  # raises for the first too large
        data = commands.mpub_checked(topic, datas)
        limit = self.config.max_body_size
        # nsqd holds the MPUB's body to --max-body-size: what follows "MPUB <topic>\n" and the
        # body's 4-byte size (the message count, then each message's size and bytes)
        size = len(data) - len(topic) - 10
        if limit is not None and size > limit:
            raise InvalidBody(f"MPUB batch of {size} bytes exceeds max_body_size {limit}")
        return self._publish(data, timeout)

    def deferred_publish(
        self, topic: str, body: Body, delay: Duration, *, timeout: Duration | None = None
    ) -> None:
        """DPUB: nsqd delivers the message after ``delay`` seconds (or a
        :class:`datetime.timedelta`, or ``"250ms"``). Thread-safe.

        Raises:
            ConfigError: ``delay`` not a duration, negative, not finite, or over ``max_defer``;
                nothing is sent.
            InvalidName, InvalidBody, ServerError, PublishError, PublishOutcomeUnknown, Stopped:
                as :meth:`publish`.
        """
        delay = to_seconds(delay, "delay", maximum=self.config.max_defer, maximum_name="max_defer")
        observer = _observe.publisher  # metrics (nsq_sync.metrics); None while off
        if observer is not None:
            self._observed(observer, "DPUB", topic, [body], timeout, delay)
            return
        self._dpub(topic, body, delay, timeout)

    def _dpub(self, topic: str, body: Body, delay: float, timeout: Duration | None) -> str:
        data = commands.dpub(topic, body, delay)
        self._check_size(len(commands.to_body(body)), None)
        return self._publish(data, timeout)

    def close(self, timeout: Duration = 10.0) -> None:
        """Refuse new publishes, wait up to ``timeout`` s for those in progress, then close the
        connections. No connection is opened after this; a publish still waiting for its answer
        then raises :class:`~nsq_sync.errors.PublishOutcomeUnknown` ("producer closed").
        Idempotent, thread-safe.

        Raises:
            ConfigError: ``timeout`` is not a duration >= 0 (nothing is closed).
        """
        seconds = to_seconds(timeout, "timeout")
        self._closed = True
        pool = self._pool.get()
        # Publishes in progress: poll briefly (only at close; a per-publish Event would cost
        # every publish a Condition round trip).
        deadline = time.monotonic() + seconds
        while pool.active and time.monotonic() < deadline:
            self.runtime.sleep(0.005)
        for slot in pool.slots:
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

    def _is_closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ internals

    def _observed(
        self,
        observer: _observe.PublishObserver,
        op: str,
        topic: str,
        bodies: list[Any],
        timeout: Duration | None,
        delay: float = 0.0,
    ) -> None:
        """Publish through ``observer`` (metrics on). Apart from the public methods so that
        they hold no closure: its cells would cost every publish, metrics on or off."""
        topic = validate_topic(topic)  # bad input raises before anything is recorded
        if op == "MPUB":
            observer.publish(op, topic, bodies, lambda b: self._mpub(topic, list(b), timeout))
            return
        datas = [commands.to_body(bodies[0])]
        if op == "PUB":
            observer.publish(op, topic, datas, lambda b: self._pub(topic, b[0], timeout))
        else:
            observer.publish(op, topic, datas, lambda b: self._dpub(topic, b[0], delay, timeout))

    def _check_size(self, size: int, index: int | None) -> None:
        limit = self.config.max_msg_size
        if limit is not None and size > limit:
            where = "" if index is None else f" (message {index})"
            raise InvalidBody(f"message body{where} of {size} bytes exceeds max_msg_size {limit}")

    def _publish(self, data: bytes, timeout: Duration | None) -> str:
        """Send ``data`` (a whole command) with failover; the address of the nsqd that took it."""
        # The deadline starts here: the first publish in a process also builds the pool
        # (deciding the runtime, importing it), which must count against the timeout too.
        start = time.monotonic()
        if timeout is None:
            seconds = self.config.publish_timeout
        else:
            seconds = to_seconds(timeout, "timeout", positive=True)
        if self._closed:
            raise Stopped("producer is closed")
        pool = self._pool.get()
        if pool.watch_patch and "gevent.monkey" in sys.modules:
            self._watch_late_patch(pool)
        active = pool.active
        active.append(None)
        try:
            # close() sets closed, then waits while publishes are registered here: checked
            # again once registered, one of the two sees the other (a publish that registers
            # after close() looked must not send).
            if self._closed:
                raise Stopped("producer is closed")
            # The common case first, without the failover loop's set-up: the preferred nsqd's
            # connection is up. A failure is handled as any attempt's (Pool.attempt_failed), and
            # the loop goes on from there.
            attempts = None
            slot = pool.slots[pool.current]
            conn = slot.conn
            if conn is not None and not conn.closed:
                try:
                    answer = conn.request(data, seconds)
                    if answer == OK:
                        return slot.address
                    raise not_ok(answer)
                except Exception as exc:
                    attempts = Attempts(seconds, start + seconds)
                    pool.attempt_failed(slot, conn, True, exc, attempts)
            return pool.publish_with_failover(data, attempts or Attempts(seconds, start + seconds))
        finally:
            active.pop()

    def _watch_late_patch(self, pool: Pool) -> None:
        runtime = self.runtime
        if isinstance(runtime, AutoRuntime) and runtime.patched_late():  # warned (once)
            pool.watch_patch = False
