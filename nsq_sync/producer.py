"""A thread-safe Producer: PUB/MPUB/DPUB with synchronous acks and failover across nsqds.

Its design is written once, elsewhere: what a publisher sees (failover in the order given,
timeouts, when a publish may be duplicated, forks) in docs/producer.md; how it works (the
reading role, the per-process pool, the preferred nsqd first) in ARCHITECTURE.md ("The
producer"); one nsqd's reconnect backoff in :mod:`nsq_sync._slots`; fork safety in
:mod:`nsq_sync._fork` and docs/gunicorn.md.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from nsq_sync import _fork, _observe
from nsq_sync._addresses import parse_address
from nsq_sync._slots import Slot, SlotBackingOff
from nsq_sync.config import Config, address_list
from nsq_sync.connection import NotSent, NsqdConnection
from nsq_sync.durations import Duration, to_seconds
from nsq_sync.errors import (
    AuthError,
    ConfigError,
    InvalidBody,
    NSQConnectionError,
    ProtocolError,
    PublishError,
    PublishOutcomeUnknown,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    Stopped,
    TLSError,
)
from nsq_sync.protocol import commands
from nsq_sync.protocol.commands import Body
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.names import validate_topic
from nsq_sync.runtime import AutoRuntime, Runtime, resolve_runtime

log = logging.getLogger(__name__)

__all__ = ["Producer"]


class _Pool:
    """What one process of a producer owns: the slots, the preferred one and a token per
    publish in progress (list append/pop are atomic: no lock on the publish path)."""

    __slots__ = ("slots", "current", "active", "watch_patch")

    def __init__(
        self, addresses: list[str], config: Config, runtime: Runtime, rng: random.Random
    ) -> None:
        self.slots = [Slot(a, config, runtime, rng) for a in addresses]  # decides an AutoRuntime
        self.current = 0
        self.active: list[None] = []
        # "auto" chose threads in this process: warn if gevent patches it later
        self.watch_patch = isinstance(runtime, AutoRuntime) and runtime.name == "threads"


def _not_ok(answer: bytes) -> RemoteProtocolError:
    # nsqd answers a publish with OK or an error frame: anything else means the stream is out
    # of step with our requests (the outcome is unknown)
    return RemoteProtocolError(f"nsqd answered a publish with {answer[:100]!r} instead of OK")


class _Attempts:
    """What the failed attempts of one publish have learned (the failover loop's state)."""

    __slots__ = ("timeout", "deadline", "last_error", "maybe_sent", "first_failure")

    def __init__(self, timeout: float, deadline: float) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self.last_error: BaseException | None = None
        # an earlier attempt wrote it and lost the answer (resent under retry_unknown)
        self.maybe_sent = False
        # an address that worked until this publish failed it (first failure, nothing sent):
        # worth one more try after its short first backoff, within the deadline
        self.first_failure = False


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
        self._pool = _fork.PerProcess(
            lambda: _Pool(self.addresses, self.config, self.runtime, self._rng), lazy=True
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
        # _pub's lines, inline: with metrics off a publish runs in the frames it always had
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
            # connection is up. A failure is handled as any attempt's (_attempt_failed), and
            # the loop goes on from there.
            attempts = None
            slot = pool.slots[pool.current]
            conn = slot.conn
            if conn is not None and not conn.closed:
                deadline = time.monotonic() + seconds
                try:
                    answer = conn.request(data, seconds)
                    if answer == OK:
                        return slot.address
                    raise _not_ok(answer)
                except Exception as exc:
                    attempts = _Attempts(seconds, deadline)
                    self._attempt_failed(slot, conn, True, exc, attempts)
            return self._publish_with_failover(
                pool, data, attempts or _Attempts(seconds, time.monotonic() + seconds)
            )
        finally:
            active.pop()

    def _watch_late_patch(self, pool: _Pool) -> None:
        runtime = self.runtime
        if isinstance(runtime, AutoRuntime) and runtime.patched_late():  # warned (once)
            pool.watch_patch = False

    def _publish_with_failover(self, pool: _Pool, data: bytes, attempts: _Attempts) -> str:
        deadline = attempts.deadline
        retried = False
        slots = pool.slots
        n = len(slots)
        while True:
            start = pool.current
            # each nsqd, and once more for one whose connection was closed under us (NotSent)
            for k in range(2 * n):
                index = (start + k) % n
                slot = slots[index]
                if self._closed or time.monotonic() >= deadline:
                    break
                if self._pool.peek() is not pool:
                    # A publish of the parent copied into a forked child (gevent copies every
                    # greenlet): it goes on in the parent; here it must not connect again.
                    raise (PublishOutcomeUnknown if attempts.maybe_sent else PublishError)(
                        "the process forked during this publish; it continues in the parent "
                        "process only",
                        attempts.last_error,
                    )
                if slot.conn is None and slot.retry_at > time.monotonic():
                    continue  # backing off
                conn: NsqdConnection | None = None
                sent = False
                try:
                    conn = slot.conn
                    if conn is None or conn.closed:
                        conn = slot.connection(deadline, self._is_closed)
                    sent = True
                    answer = conn.request(data, max(0.001, deadline - time.monotonic()))
                    if answer != OK:
                        raise _not_ok(answer)
                except Exception as exc:
                    self._attempt_failed(slot, conn, sent, exc, attempts)
                else:
                    pool.current = index
                    return slot.address
            # Wait (within the deadline) for the first address to come back: under retry_unknown,
            # or once after an address that worked failed for the first time.
            maybe_sent = attempts.maybe_sent
            if self._closed or not ((maybe_sent and self.retry_unknown) or attempts.first_failure):
                break
            if not maybe_sent:
                if retried:
                    break
                retried = True
            wait = min(s.retry_at for s in slots) - time.monotonic()
            if wait >= deadline - time.monotonic():
                break
            if wait > 0:
                self.runtime.sleep(wait)
        last_error = attempts.last_error
        if self._closed:
            if attempts.maybe_sent:
                raise PublishOutcomeUnknown(
                    "producer closed before nsqd answered; the message may or may not have "
                    "been published",
                    last_error,
                )
            raise Stopped("producer closed before the message was sent")
        message = f"publish failed on every nsqd ({', '.join(self.addresses)})"
        if last_error is None:  # nothing tried: every address is backing off after a failure
            last_error = next((s.last_error for s in slots if s.last_error), None)
            wait = max(0.0, min(s.retry_at for s in slots) - time.monotonic())
            message += f"; all backing off after failures, next attempt in {wait:.2f} s"
        if attempts.maybe_sent:
            raise PublishOutcomeUnknown(
                message + "; an earlier attempt may have published it", last_error
            )
        raise PublishError(message, last_error)

    def _attempt_failed(
        self,
        slot: Slot,
        conn: NsqdConnection | None,
        sent: bool,
        error: Exception,
        attempts: _Attempts,
    ) -> None:
        """One attempt on ``slot`` raised ``error``: raise what the caller must see, or learn
        from it (``attempts``) and return, and the failover loop goes on. ``sent``: the
        command may have been written (connecting did not fail)."""
        if isinstance(error, SlotBackingOff):
            return
        if isinstance(error, NotSent):
            # Closed by another thread after we took it: nothing was written. Try this
            # address again (it reconnects, or is backing off).
            if slot.conn is conn:
                slot.conn = None
            return
        if isinstance(error, ReadTimeout):
            if not sent:
                attempts.last_error = error
                slot.mark_failed(None, error)
                return
            # Our own deadline ran out waiting for the answer: only this request gives up; the
            # connection stays up for the others (its answer is matched and dropped).
            raise PublishOutcomeUnknown(
                f"no answer from nsqd {slot.address} within {attempts.timeout:g} s; the message "
                "may or may not have been published",
                error,
            ) from None
        if isinstance(error, ServerError):
            if not error.retriable:
                raise error
            attempts.last_error = error  # nsqd answered: it did not take the message
            slot.mark_failed(conn, error)
            attempts.first_failure = attempts.first_failure or slot.failures == 1
        elif isinstance(error, (ProtocolError, TLSError, AuthError)):
            # Garbage from the peer (typically nsqd's HTTP port given as its TCP port), a TLS
            # setup that cannot work (certificate not verified, nsqd requires TLS) or AUTH
            # required without a secret are configuration errors that a retry would only
            # repeat: do not hammer that address (fail over, or raise at once).
            attempts.last_error = error
            slot.mark_failed(conn, error, delay=self.config.reconnect_backoff_max)
            attempts.maybe_sent = self._unknown_if_sent(sent, slot, error) or attempts.maybe_sent
        elif isinstance(error, NSQConnectionError):
            attempts.last_error = error
            slot.mark_failed(conn if sent else None, error)
            attempts.maybe_sent = self._unknown_if_sent(sent, slot, error) or attempts.maybe_sent
            attempts.first_failure = attempts.first_failure or (not sent and slot.failures == 1)
        else:
            raise error

    def _unknown_if_sent(self, sent: bool, slot: Slot, error: BaseException) -> bool:
        """After a failure on ``slot``: raise PublishOutcomeUnknown if the command was written
        and may not be resent; True if it was written (resent under ``retry_unknown``)."""
        if not sent:
            return False
        if self._closed:
            raise PublishOutcomeUnknown(
                f"producer closed before nsqd {slot.address} answered; the message may or may "
                "not have been published",
                error,
            ) from None
        if not self.retry_unknown:
            raise PublishOutcomeUnknown(
                f"connection to nsqd {slot.address} lost before it answered; the message may "
                "or may not have been published (not resent: retry_unknown is off)",
                error,
            ) from None
        return True
