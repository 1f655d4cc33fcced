"""A thread-safe Producer: PUB/MPUB/DPUB with synchronous acks and failover across nsqds.

The producer's design (pool.py and slot.py carry it out):

- No task of its own: a publish writes its command and reads its own answer on the caller's
  thread; threads pipeline on one connection, answers matched in FIFO order
  (:mod:`nsq_sync.wire.requests`). A caller's timeout abandons only its own wait.
- Failover: stick to the first nsqd that works; move on when connecting fails or nsqd answers
  with a retriable error (E_PUB_FAILED...), never on a rejection of the request (E_BAD_TOPIC).
- Reconnecting: one attempt at a time per nsqd, backing off exponentially with jitter. While
  every address backs off, a publish fails at once; only the first failure of a working address
  is retried, once, after its short first backoff.
- Duplicates: a command that may have reached nsqd is never resent behind the caller's back
  (PublishOutcomeUnknown) unless ``retry_unknown``; one that certainly did not goes elsewhere.
- Fork safety: all that must not cross a fork lives in the per-process Pool
  (:class:`nsq_sync.process.PerProcess`), which a forked child builds at its first publish.
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
        nsqd_tcp_addresses: one ``host:port`` or a list, in order of preference (one string may
            hold several, separated by commas); empty: ``config.nsqd_tcp_addresses``.
        config: a :class:`~nsq_sync.config.Config`; keyword ``overrides`` are applied on top.
        runtime: ``"auto"``, ``"threads"`` or ``"gevent"``.
        retry_unknown: resend a command whose outcome is unknown (the connection broke after it
            was written) on the next connection, within the publish's timeout: nsqd may then hold
            it twice. False (the default): raise :class:`~nsq_sync.errors.PublishOutcomeUnknown`.

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
        """This process's slots (for tests)."""
        return self._pool.get().slots

    # ------------------------------------------------------------------ public API

    def publish(self, topic: str, body: Body, *, timeout: Duration | None = None) -> None:
        """PUB one message and wait for nsqd's OK. Thread-safe.

        ``timeout`` (default ``publish_timeout``) bounds connecting, the handshake and the wait
        for the answer; a write under way is bounded by ``write_timeout`` (cutting it short would
        tear the connection other threads share).

        Raises:
            InvalidName, InvalidBody: bad topic or body (empty, over ``max_msg_size``); nothing
                is sent.
            ServerError: nsqd rejected it (E_BAD_TOPIC, E_BAD_MESSAGE, E_UNAUTHORIZED...).
            PublishOutcomeUnknown: it was sent but no answer came (connection lost, producer
                closed, timeout): nsqd may or may not hold it. Resent only under ``retry_unknown``.
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
        """DPUB: nsqd delivers the message after ``delay`` (seconds, a :class:`datetime.timedelta`
        or ``"250ms"``). Thread-safe.

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
        connections; a publish still waiting for its answer then raises
        :class:`~nsq_sync.errors.PublishOutcomeUnknown`. Idempotent, thread-safe.

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
        """Publish through ``observer`` (metrics on); apart, so public methods hold no closure."""
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
