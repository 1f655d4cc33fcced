"""The Message handed to handlers; finish/requeue/touch go through the consumer's responder."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from nsq_sync import process as _fork
from nsq_sync.durations import to_seconds

if TYPE_CHECKING:  # pragma: no cover
    from nsq_sync.protocol.events import RawMessage
    from nsq_sync.wire.connection import NsqdConnection

log = logging.getLogger(__name__)

# The first answer (finish/requeue) of every message is taken under ``_fork.claim_lock``: a
# worker's automatic FIN and an application thread's finish()/requeue() may race; exactly one of
# them wins. Held for two attribute accesses, never across I/O (so one lock for all messages does
# not contend, and under gevent it never blocks a greenlet); replaced in a forked child.


class Responder(Protocol):
    """What a message answers through (a consumer's
    :class:`~nsq_sync.consumer.responder.ConsumerResponder`). Implementations are thread-safe."""

    def finish(self, message: Message) -> None: ...

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None: ...

    def touch(self, message: Message) -> None: ...


class Message:
    """One message delivered by nsqd.

    Attributes:
        id: 16-byte message id.
        body: the payload.
        timestamp: when nsqd received it, nanoseconds since the epoch.
        attempts: delivery attempts, this one included (1 on first delivery).
        nsqd_address: TCP address of the nsqd that delivered it (FIN must go back there).

    ``finish``, ``requeue`` and ``touch`` are thread-safe; the first of finish/requeue wins and
    later calls are ignored (with a debug log), as in go-nsq.
    """

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "nsqd_address",
        "_responder",
        "_responded",
        "_async",
        "_conn",
        "__weakref__",
    )

    def __init__(
        self,
        id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int,
        responder: Responder | None = None,
        nsqd_address: str = "",
        conn: NsqdConnection | None = None,
    ) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.nsqd_address = nsqd_address
        self._responder = responder
        self._responded = False
        self._async = False
        #: the connection it came on (its FIN/REQ/TOUCH go back there); read by the responder
        self._conn = conn

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"size={len(self.body)}>"
        )

    @property
    def has_responded(self) -> bool:
        """True once finish() or requeue() was called."""
        return self._responded

    @property
    def is_async(self) -> bool:
        return self._async

    def enable_async(self) -> None:
        """Tell the consumer the handler will respond later (from any thread): returning from the
        handler then neither finishes nor requeues the message. Call touch() if it takes longer
        than nsqd's msg_timeout."""
        self._async = True

    def _claim(self, what: str | None) -> bool:
        """Take the right to answer: True for the first caller only. ``what`` names the answer
        for the debug log of a later one (None: no log; the worker's automatic FIN, whose
        loser is an application thread that answered first)."""
        with _fork.claim_lock:
            if self._responded:
                claimed = False
            else:
                self._responded = True
                claimed = True
        if not claimed and what is not None:
            log.debug("%s ignored: message %r already answered", what, self.id)
        return claimed

    def finish(self) -> None:
        """FIN: processed successfully; nsqd forgets it."""
        if self._claim("finish") and self._responder is not None:
            self._responder.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: nsqd redelivers it after ``delay`` seconds (None: the consumer's policy,
        ``default_requeue_delay * attempts`` capped at ``max_requeue_delay``). ``backoff``
        counts it as a failure for the consumer's backoff.

        Raises:
            ConfigError: ``delay`` is not a duration >= 0 (seconds or a timedelta).
        """
        if delay is not None:
            delay = to_seconds(delay, "requeue delay")
        if self._claim("requeue") and self._responder is not None:
            self._responder.requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (it stays in flight longer)."""
        if not self._responded and self._responder is not None:
            self._responder.touch(self)


def from_frames(
    frames: Iterable[RawMessage],
    responder: Responder | None,
    nsqd_address: str,
    conn: NsqdConnection | None,
) -> list[Message]:
    """The :class:`Message` of every frame of one read (the reader task's hot path).

    What ``Message(...)`` does, attribute by attribute, without a Python ``__init__`` call per
    message (about a quarter of the cost of building one); keep it in step with ``__init__``.
    """
    new = Message.__new__
    messages: list[Message] = []
    append = messages.append
    for msg_id, timestamp, attempts, body in frames:
        message = new(Message)
        message.id = msg_id
        message.body = body
        message.timestamp = timestamp
        message.attempts = attempts
        message.nsqd_address = nsqd_address
        message._responder = responder
        message._responded = False
        message._async = False
        message._conn = conn
        append(message)
    return messages


def claim_all(messages: list[Message]) -> list[Message]:
    """Claim every message of ``messages`` that nobody answered yet, under one acquisition of
    the claim lock; return those (the others lost to an answer given first, as
    ``Message._claim(None)``). A batch's automatic FIN takes its messages this way."""
    with _fork.claim_lock:
        claimed = [message for message in messages if not message._responded]
        for message in claimed:
            message._responded = True
    return claimed
