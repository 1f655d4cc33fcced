"""Reading a dead-letter topic's durable channel: :func:`list_messages` and :func:`replay`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nsq_sync.config import Config, positive_int
from nsq_sync.consumer import Consumer
from nsq_sync.consumer.dead_letters import CHANNEL
from nsq_sync.consumer.envelope import DeadLetterRecord, parse
from nsq_sync.consumer.parts import ConsumerParts, PartsUser
from nsq_sync.consumer.running import run_to_end
from nsq_sync.durations import positive_seconds
from nsq_sync.errors import (
    ConfigError,
    InvalidBody,
    InvalidEnvelope,
    InvalidName,
    RequeueMessage,
    ServerError,
)
from nsq_sync.message import Message
from nsq_sync.producer import Producer
from nsq_sync.protocol.names import validate_topic

__all__ = ["Listed", "Listing", "ReplaySummary", "list_messages", "replay"]

log = logging.getLogger(__name__)

#: the most messages one call holds in flight (nsqd's default --max-rdy-count)
MAX_HELD = 2500
#: delay of a dead-letter message whose republish failed for a reason that may pass
RETRY_DELAY = 0.5


@dataclass(frozen=True)
class Listed:
    """One message of a dead-letter topic, as :func:`list_messages` saw it.

    Attributes:
        record: its envelope, parsed; None when the body is not an envelope.
        message_id: the dead-letter message's own nsqd id.
        nsqd_address: the nsqd that holds it.
        body: the dead-letter message's body (the envelope itself).
    """

    record: DeadLetterRecord | None
    message_id: str
    nsqd_address: str
    body: bytes


@dataclass(frozen=True)
class Listing:
    """What :func:`list_messages` returns; ``complete`` is False when ``limit`` ended it early."""

    messages: list[Listed]
    complete: bool


@dataclass(frozen=True)
class ReplaySummary:
    """What :func:`replay` did.

    Attributes:
        replayed: messages republished and finished in the dead-letter topic.
        skipped: messages left in place: their error does not contain ``where``.
        invalid: messages left in place: their body is not an envelope.
        failed: republish attempts that failed (the message stays until one succeeds).
        reason: ``"idle"`` (everything seen), ``"max_messages"``, ``"signal"``, ``"timeout"``,
            ``"stopped"``, ``"unreachable"`` (no nsqd connected when ``idle_timeout`` came) or
            ``"held"`` (``max_in_flight`` messages left in place at once).
        elapsed: seconds it took.
    """

    replayed: int
    skipped: int
    invalid: int
    failed: int
    reason: str
    elapsed: float

    @property
    def ok(self) -> bool:
        """True when no republish failed, nothing was left unread and an nsqd was reached."""
        return self.failed == 0 and self.reason not in ("held", "unreachable")


class _Reading:
    """A ``dead-letter`` channel consumer that holds what it does not finish until it ends."""

    def __init__(
        self,
        topic: str,
        handler: Any,
        servers: dict[str, Any],
        max_in_flight: int,
        config: Config | None,
        overrides: dict[str, Any],
    ) -> None:
        self._lock = threading.Lock()
        self._held: list[Message] = []
        self._closing = False
        self.max_in_flight = max_in_flight
        self.reason: str | None = None  # set when this (not run()) ended the reading
        self._handler = _Handler(handler)
        self.consumer = Consumer(
            validate_topic(topic),
            CHANNEL,
            self._handler,
            config=config,
            runtime=overrides.pop("runtime", "auto"),
            max_in_flight=max_in_flight,
            **servers,
            **{**overrides, "max_attempts": 0},  # reading never pushes towards a give-up
        )

    def hold(self, message: Message) -> None:
        """Keep ``message`` in flight until the end; end once ``max_in_flight`` are held."""
        message.enable_async()
        full = False
        with self._lock:
            closing = self._closing
            if not closing:
                self._held.append(message)
                full = len(self._held) >= self.max_in_flight
        if closing:
            message.requeue(0.0, backoff=False)
        elif full:
            self.end("held")

    def end(self, reason: str) -> None:
        """End the reading (from a handler): RDY 0, and run() returns."""
        if self.reason is None:
            self.reason = reason
        self.consumer.set_max_in_flight(0)
        self._handler.parts.control.end_run()

    def stop(self) -> None:
        """run()'s stop: no more credit, the held messages requeued, then a graceful stop."""
        self.consumer.set_max_in_flight(0)
        with self._lock:
            self._closing = True
            held, self._held = self._held, []
        for message in held:
            message.requeue(0.0, backoff=False)
        self.consumer.stop()

    def run(self, idle_timeout: float, timeout: float | None) -> str:
        summary = run_to_end(
            self.consumer,
            self._handler.parts.control,
            idle_timeout=idle_timeout,
            timeout=timeout,
            stop=self.stop,
        )
        return self.reason or summary.reason


class _Handler(PartsUser):
    """The reading consumer's handler, with the consumer's parts (to end the reading)."""

    __slots__ = ("handler", "_parts")

    def __init__(self, handler: Callable[[Message], object]) -> None:
        self.handler = handler
        self._parts: ConsumerParts | None = None

    def __call__(self, message: Message) -> None:
        self.handler(message)

    def attach(self, parts: ConsumerParts) -> None:
        self._parts = parts

    @property
    def parts(self) -> ConsumerParts:
        parts = self._parts
        assert parts is not None  # attached in Consumer.__init__
        return parts


def _servers(
    nsqd_tcp_addresses: str | Sequence[str], lookupd_http_addresses: str | Sequence[str]
) -> dict[str, Any]:
    return {
        "nsqd_tcp_addresses": nsqd_tcp_addresses,
        "lookupd_http_addresses": lookupd_http_addresses,
    }


def list_messages(
    topic: str,
    *,
    nsqd_tcp_addresses: str | Sequence[str] = (),
    lookupd_http_addresses: str | Sequence[str] = (),
    limit: int = 1000,
    idle_timeout: float = 2.0,
    timeout: float | None = None,
    config: Config | None = None,
    **overrides: Any,
) -> Listing:
    """Read every message of the dead-letter topic ``topic`` (up to ``limit``), put each back as
    it was; other arguments as for :class:`~nsq_sync.consumer.Consumer` (``max_attempts`` 0).
    Blocks until done; thread-safe (each call has its own consumer).

    Args:
        limit: most messages listed (at most 2500: they are all held in flight at once).
        idle_timeout: seconds without a new message (credit open) after which all were seen.

    Raises:
        InvalidName, ConfigError: a bad topic, address, limit or option (nothing read).
    """
    count = positive_int("limit", limit)
    if count is None or count > MAX_HELD:
        raise ConfigError(f"limit must be an int from 1 to {MAX_HELD}, got {limit!r}")
    idle = positive_seconds("idle_timeout", idle_timeout)
    assert idle is not None
    seen: list[Listed] = []

    def handle(message: Message) -> None:
        try:
            record: DeadLetterRecord | None = parse(message.body)
        except InvalidEnvelope:
            record = None
        seen.append(
            Listed(
                record, message.id.decode("ascii", "replace"), message.nsqd_address, message.body
            )
        )
        reading.hold(message)

    reading = _Reading(
        topic,
        handle,
        _servers(nsqd_tcp_addresses, lookupd_http_addresses),
        count,
        config,
        overrides,
    )
    reason = reading.run(idle, positive_seconds("timeout", timeout))
    return Listing(list(seen), complete=reason == "idle")


def replay(
    topic: str,
    to: str | None = None,
    max_messages: int | None = None,
    *,
    where: str | None = None,
    nsqd_tcp_addresses: str | Sequence[str] = (),
    lookupd_http_addresses: str | Sequence[str] = (),
    idle_timeout: float = 2.0,
    timeout: float | None = None,
    max_in_flight: int = 100,
    config: Config | None = None,
    **overrides: Any,
) -> ReplaySummary:
    """Republish each original body in the dead-letter topic ``topic`` to its topic (or ``to``) on
    the nsqd its dead-letter message came from, and finish that message once nsqd acknowledged
    the republish (else as :func:`list_messages`); SIGTERM/SIGINT (main thread) end it gracefully.

    Args:
        max_messages: most messages republished (None: all).
        where: only messages whose :attr:`DeadLetterRecord.error` contains this text.
        max_in_flight: dead-letter messages in flight at once (duplicates after a broken
            connection are at most this many), and the most left in place per call.

    Raises:
        InvalidName, ConfigError: a bad topic, ``to``, address or option (nothing read).
    """
    target = None if to is None else validate_topic(to)
    limit = positive_int("max_messages", max_messages)
    held_max = positive_int("max_in_flight", max_in_flight)
    if held_max is None or held_max > MAX_HELD:
        raise ConfigError(f"max_in_flight must be an int from 1 to {MAX_HELD}")
    idle = positive_seconds("idle_timeout", idle_timeout)
    assert idle is not None
    if where is not None and not isinstance(where, str):
        raise ConfigError(f"where must be text, got {where!r}")
    counts = dict.fromkeys(("replayed", "skipped", "invalid", "failed"), 0)
    producers: dict[str, Producer] = {}

    def handle(message: Message) -> None:
        if reading.reason is not None:  # max_messages reached: the rest stay in place
            reading.hold(message)
            return
        try:
            record = parse(message.body)
        except InvalidEnvelope as exc:
            log.warning("dead-letter message %s left in place: %s", message.id.decode(), exc)
            counts["invalid"] += 1
            reading.hold(message)
            return
        if where is not None and where not in record.error:
            counts["skipped"] += 1
            reading.hold(message)
            return
        destination = target or record.topic
        address = message.nsqd_address
        producer = producers.get(address)
        if producer is None:
            producer = producers[address] = Producer([address], reading.consumer.config)
        try:
            producer.publish(destination, record.body)
        except (InvalidName, InvalidBody) as exc:
            _failed(counts, record, destination, exc)
            reading.hold(message)  # would fail again: left in place
            return
        except ServerError as exc:
            _failed(counts, record, destination, exc)
            if exc.retriable:
                raise RequeueMessage(RETRY_DELAY) from None
            reading.hold(message)
            return
        except Exception as exc:  # nsqd down, timeout, outcome unknown: later, from here
            _failed(counts, record, destination, exc)
            raise RequeueMessage(RETRY_DELAY) from None
        counts["replayed"] += 1
        if limit is not None and counts["replayed"] >= limit:
            reading.end("max_messages")

    reading = _Reading(
        topic,
        handle,
        _servers(nsqd_tcp_addresses, lookupd_http_addresses),
        held_max,
        config,
        overrides,
    )
    began = time.monotonic()
    try:
        reason = reading.run(idle, positive_seconds("timeout", timeout))
    finally:
        for producer in producers.values():
            producer.close()
    summary = ReplaySummary(elapsed=time.monotonic() - began, reason=reason, **counts)
    log.info("replay of %s ended (%s): %s", topic, reason, summary)
    return summary


def _failed(counts: dict[str, int], record: DeadLetterRecord, topic: str, exc: Exception) -> None:
    counts["failed"] += 1
    log.error(
        "republishing message %s to %s failed (%s: %s); it stays in the dead-letter topic",
        record.id,
        topic,
        type(exc).__name__,
        exc,
    )
