"""The Message handed to handlers. The first finish or requeue *claims* it, under
:data:`claim_lock`: one lock for all messages, held for two attribute accesses and never across
I/O (it never blocks a greenlet); replaced in a forked child (a parent's thread may hold it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from nsq_sync import process
from nsq_sync.durations import to_seconds

if TYPE_CHECKING:  # pragma: no cover
    from nsq_sync.protocol.events import RawMessage
    from nsq_sync.wire.connection import NsqdConnection

__all__ = ["Message", "Responder", "claim_lock"]

log = logging.getLogger(__name__)

#: guards every message's claim (see the module docstring); replaced in a forked child
claim_lock = threading.Lock()


def _new_claim_lock() -> None:
    global claim_lock
    claim_lock = threading.Lock()


process.replace_in_child(_new_claim_lock)


class Responder(Protocol):
    """What a message answers through (the consumer's responder). Thread-safe."""

    def finish(self, message: Message) -> None: ...

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None: ...

    def touch(self, message: Message) -> None: ...


class Message:
    """One message delivered by nsqd. ``finish``, ``requeue`` and ``touch`` are thread-safe:
    the first of finish/requeue wins, later calls are ignored (with a debug log).

    Attributes:
        id: 16-byte message id.
        body: the payload.
        timestamp: when nsqd received it, nanoseconds since the epoch.
        attempts: delivery attempts, this one included (1 on first delivery).
        nsqd_address: TCP address of the nsqd that delivered it (its FIN must go back there).
        has_responded: True once finish() or requeue() was called (read-only).
        is_async: True once :meth:`enable_async` was called (read-only).

    ``responder``, ``connection``, ``claim()`` and ``claim_all()`` are the consumer's internal
    interface (what answers it, the connection it came on, the right to answer): not for
    handlers.
    """

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "nsqd_address",
        "has_responded",
        "is_async",
        "responder",
        "connection",
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
        connection: NsqdConnection | None = None,
    ) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.nsqd_address = nsqd_address
        self.has_responded = False
        self.is_async = False
        self.responder = responder
        self.connection = connection

    @classmethod
    def from_frames(
        cls,
        frames: Iterable[RawMessage],
        responder: Responder | None,
        nsqd_address: str,
        connection: NsqdConnection | None,
    ) -> list[Message]:
        """``Message(...)`` per frame of one read, minus the ``__init__`` calls (keep in step).

        :meta private:"""
        new = cls.__new__
        messages: list[Message] = []
        append = messages.append
        for msg_id, timestamp, attempts, body in frames:
            message = new(cls)
            message.id = msg_id
            message.body = body
            message.timestamp = timestamp
            message.attempts = attempts
            message.nsqd_address = nsqd_address
            message.has_responded = False
            message.is_async = False
            message.responder = responder
            message.connection = connection
            append(message)
        return messages

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"size={len(self.body)}>"
        )

    def enable_async(self) -> None:
        """The handler will answer later (from any thread): returning from it then neither finishes
        nor requeues the message. Call touch() if that takes longer than nsqd's msg_timeout."""
        self.is_async = True

    def claim(self, what: str | None) -> bool:
        """Take the right to answer; True for the first caller (``what``: logged for later ones).

        :meta private:"""
        lock = claim_lock
        lock.acquire()
        if self.has_responded:
            lock.release()
            if what is not None:
                log.debug("%s ignored: message %r already answered", what, self.id)
            return False
        self.has_responded = True
        lock.release()
        return True

    @staticmethod
    def claim_all(messages: list[Message]) -> list[Message]:
        """Claim every message nobody answered yet, under one lock acquisition; return those.

        :meta private:"""
        with claim_lock:
            claimed = [message for message in messages if not message.has_responded]
            for message in claimed:
                message.has_responded = True
        return claimed

    def finish(self) -> None:
        """FIN: processed successfully; nsqd forgets it."""
        if self.claim("finish") and self.responder is not None:
            self.responder.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: nsqd redelivers it after ``delay`` seconds (None: ``default_requeue_delay *
        attempts``, capped at ``max_requeue_delay``); ``backoff``: a failure for backoff.

        Raises:
            ConfigError: ``delay`` is not a duration >= 0 (seconds or a timedelta).
        """
        if delay is not None:
            delay = to_seconds(delay, "requeue delay")
        if self.claim("requeue") and self.responder is not None:
            self.responder.requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (it stays in flight longer)."""
        if not self.has_responded and self.responder is not None:
            self.responder.touch(self)
