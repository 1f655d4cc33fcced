"""The consumer's side of a dead-letter topic (docs/consumer.md has the whole behaviour).
Thread-safe: workers call it concurrently.

* The envelope goes **to the nsqd that delivered the message**: its FIN goes there too, so a
  publish succeeds only where the FIN can follow (else an outage means duplicate envelopes).
* The durable channel ``dead-letter`` is made before the first publish on each nsqd, so
  ``nsq-sync dead-letter list/replay`` see every envelope.
* A message is finished only once its envelope was acknowledged; a failed publish (or an
  envelope too big even without its error message: the body is never cut) requeues it with
  backoff and logs an ERROR.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from nsq_sync.config import Config
from nsq_sync.consumer.envelope import ErrorInfo, encode, error_of
from nsq_sync.errors import ConfigError, InvalidBody, ServerBadMessage
from nsq_sync.message import Message
from nsq_sync.producer import Producer
from nsq_sync.protocol.names import validate_topic
from nsq_sync.runtime import Runtime
from nsq_sync.wire.connection import NsqdConnection

__all__ = ["CHANNEL", "DeadLetterer", "check_topic"]

log = logging.getLogger(__name__)

#: the durable channel of every dead-letter topic (made with the topic; list and replay read it)
CHANNEL = "dead-letter"
#: last errors kept for messages whose dead-lettering failed (their next give-up has no
#: exception of its own: it happens on delivery, before any handler call)
REMEMBERED_ERRORS = 10_000
#: shortest requeue delay after a failed dead-letter publish, in seconds
RETRY_MIN = 1.0
_TOO_BIG = re.compile(r"too big (\d+) > (\d+)")


def check_topic(dead_letter_topic: str | None, topic: str) -> str | None:
    """The validated dead-letter topic (None: none). Raises InvalidName for a bad name, and
    ConfigError for the consumer's own topic (every failure would loop back into it)."""
    if dead_letter_topic is None:
        return None
    name = validate_topic(dead_letter_topic)
    if name == topic:
        raise ConfigError(f"dead_letter_topic must not be the consumed topic {topic!r}")
    return name


class DeadLetterer:
    """Publishes the envelopes of one consumer's given-up messages (see the module docstring).
    ``source_topic``/``source_channel`` are written in each envelope; ``on_dead_lettered`` is
    called after each acknowledged publish."""

    def __init__(
        self,
        topic: str,
        source_topic: str,
        source_channel: str,
        config: Config,
        runtime: Runtime,
        log: logging.Logger | logging.LoggerAdapter[Any],
        on_dead_lettered: Callable[[Message], None],
    ) -> None:
        self.topic = topic
        self.source_topic = source_topic
        self.source_channel = source_channel
        self.config = config
        self.runtime = runtime
        self.log = log
        self.on_dead_lettered = on_dead_lettered
        self._lock = runtime.lock()
        self._producers: dict[str, Producer] = {}
        self._channels: set[str] = set()  # nsqds where the dead-letter channel was made
        self._limits: dict[str, int] = {}  # nsqd's --max-msg-size, learned from a refusal
        self._errors: OrderedDict[bytes, ErrorInfo] = OrderedDict()
        self._closed = False

    def __call__(self, message: Message, error: BaseException | None) -> bool:
        """Publish ``message``'s envelope: True when nsqd acknowledged it (the caller finishes the
        message); False when it was requeued with backoff instead (logged). Never raises an
        Exception."""
        info = error_of(error) if error is not None else self._recall(message.id)
        address = message.nsqd_address
        try:
            # more than once only to learn nsqd's size limit, or to find it raised
            learned = False  # nsqd refused a too big envelope during this call
            for _ in range(3):
                limit = self._limit(address)
                envelope = encode(
                    message, self.source_topic, self.source_channel, info, time.time(), limit
                )
                if envelope is None:
                    if not learned and self._limits.pop(address, None) is not None:
                        continue  # what nsqd refused before: try it, its limit may be higher now
                    self._too_big(message, info, limit)
                    return False
                try:
                    self._publish(address, envelope)
                except ServerBadMessage as exc:
                    if not self._learn_limit(address, exc):
                        raise
                    learned = True
                    continue
                self.on_dead_lettered(message)
                self.log.warning(
                    "message %s dead-lettered to %s after %d attempt(s)%s",
                    message.id.decode("ascii", "replace"),
                    self.topic,
                    message.attempts,
                    "" if info is None else f" ({info[0]}: {info[1][:200]})",
                )
                return True
            raise InvalidBody("nsqd kept refusing the envelope as too big")
        except Exception as exc:
            self.log.error(
                "dead-lettering message %s to %s on nsqd %s failed (%s: %s); requeueing it",
                message.id.decode("ascii", "replace"),
                self.topic,
                address,
                type(exc).__name__,
                exc,
            )
            self._requeue(message, info)
            return False

    def close(self, timeout: float = 5.0) -> None:
        """Close the producers (publishes in progress get ``timeout`` seconds). Thread-safe."""
        with self._lock:
            self._closed = True
            producers = list(self._producers.values())
            self._producers.clear()
        for producer in producers:
            producer.close(timeout)

    # ------------------------------------------------------------------ internals

    def _producer(self, address: str) -> Producer:
        with self._lock:
            if self._closed:
                raise ConfigError("the consumer's dead-letter producers are closed")
            producer = self._producers.get(address)
            if producer is None:
                producer = Producer([address], self.config, runtime=self.runtime)
                self._producers[address] = producer
            return producer

    def _publish(self, address: str, envelope: bytes) -> None:
        producer = self._producer(address)
        if address not in self._channels:
            self._make_channel(address)
            self._channels.add(address)
        producer.publish(self.topic, envelope)

    def _make_channel(self, address: str) -> None:
        """SUB to the durable dead-letter channel and close: nsqd makes the topic and channel."""
        conn = NsqdConnection(address, self.config, runtime=self.runtime)
        try:
            conn.connect(self.config.publish_timeout)
            conn.subscribe(self.topic, CHANNEL)
        finally:
            conn.close()

    def _limit(self, address: str) -> int | None:
        limits = [x for x in (self.config.max_msg_size, self._limits.get(address)) if x]
        return min(limits) if limits else None

    def _learn_limit(self, address: str, exc: ServerBadMessage) -> bool:
        """nsqd refused a message as too big: remember its limit; True if it is new."""
        match = _TOO_BIG.search(str(exc))
        if match is None:
            return False
        limit = int(match.group(2))
        if self._limits.get(address) == limit:
            return False
        self._limits[address] = limit
        return True

    def _too_big(self, message: Message, info: ErrorInfo | None, limit: int | None) -> None:
        self.log.error(
            "message %s (%d bytes) cannot be dead-lettered to %s: its envelope would exceed the "
            "message size limit of %s bytes (nsqd's --max-msg-size, or max_msg_size) even with "
            "no error text; requeueing it with backoff (raise the limit and it is dead-lettered "
            "at its next delivery)",
            message.id.decode("ascii", "replace"),
            len(message.body),
            self.topic,
            limit,
        )
        self._requeue(message, info)

    def _requeue(self, message: Message, info: ErrorInfo | None) -> None:
        if info is not None:
            with self._lock:
                self._errors[message.id] = info
                self._errors.move_to_end(message.id)
                while len(self._errors) > REMEMBERED_ERRORS:
                    self._errors.popitem(last=False)
        if not message.has_responded:
            # the consumer's delay policy, but never sooner than RETRY_MIN (a failing dead-letter
            # publish must not spin however small default_requeue_delay is), with backoff
            cfg = self.config
            delay = max(RETRY_MIN, cfg.default_requeue_delay * message.attempts)
            message.requeue(min(delay, max(RETRY_MIN, cfg.max_requeue_delay)))

    def _recall(self, message_id: bytes) -> ErrorInfo | None:
        with self._lock:
            return self._errors.pop(message_id, None)
