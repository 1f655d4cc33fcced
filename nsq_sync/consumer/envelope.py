"""The dead-letter envelope, format version 1 (docs/consumer.md documents it for readers).

One line of UTF-8 JSON (no raw newline), the byte ``\\n``, then the original body byte for byte.
The version (key ``nsq_sync_dead_letter``) changes only if an existing key changes meaning;
keys may be added (readers ignore keys they do not know). Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nsq_sync.errors import InvalidEnvelope

if TYPE_CHECKING:  # pragma: no cover
    from nsq_sync.message import Message

__all__ = ["FORMAT_VERSION", "DeadLetterRecord", "encode", "error_of", "parse"]

FORMAT_VERSION = 1
#: longest error message kept, in characters (a traceback is not kept: the log has it)
ERROR_MESSAGE_MAX = 1024
#: longest error type kept, in characters
ERROR_TYPE_MAX = 200
_TRUNCATED = " [truncated]"
_VERSION_KEY = "nsq_sync_dead_letter"

ErrorInfo = tuple[str, str]


@dataclass(frozen=True)
class DeadLetterRecord:
    """A parsed dead-letter envelope.

    Attributes:
        topic, channel: where the message was consumed.
        id: its nsqd message id (str).
        attempts: deliveries, the last included.
        timestamp: when nsqd first received it (nanoseconds since the epoch).
        dead_lettered_at: when it was dead-lettered (seconds since the epoch).
        error_type, error_message: the handler's last exception (None when unknown).
        host, pid: the process that dead-lettered it.
        body: the original body, byte for byte.
        version: the envelope's format version.
    """

    topic: str
    channel: str
    id: str
    attempts: int
    timestamp: int
    dead_lettered_at: float
    error_type: str | None
    error_message: str | None
    host: str
    pid: int
    body: bytes
    version: int = FORMAT_VERSION

    @property
    def error(self) -> str:
        """What ``--where`` searches, as ``"Type: message"`` (empty when no error is known)."""
        if self.error_type is None:
            return ""
        return f"{self.error_type}: {self.error_message or ''}"


def error_of(exc: BaseException) -> ErrorInfo:
    """(type, message) of an exception, each bounded in size."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return name[:ERROR_TYPE_MAX], _cut(str(exc), ERROR_MESSAGE_MAX)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(_TRUNCATED))] + _TRUNCATED


def _header(
    message: Message,
    topic: str,
    channel: str,
    error: ErrorInfo | None,
    now: float,
    truncated: bool,
) -> bytes:
    record: dict[str, Any] = {
        _VERSION_KEY: FORMAT_VERSION,
        "topic": topic,
        "channel": channel,
        "id": message.id.decode("ascii", "replace"),
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "dead_lettered_at": now,
        "error": None if error is None else {"type": error[0], "message": error[1]},
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if truncated:
        record["error_truncated"] = True
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def encode(
    message: Message,
    topic: str,
    channel: str,
    error: ErrorInfo | None,
    now: float,
    limit: int | None = None,
) -> bytes | None:
    """The envelope of ``message``, at most ``limit`` bytes when given (the error message is cut
    to fit, ``error_truncated``); None when even no error message fits: the body is never cut."""
    data = _header(message, topic, channel, error, now, False) + message.body
    if limit is None or len(data) <= limit:
        return data
    if error is not None:
        text = error[1]
        for _ in range(4):  # each round removes at least the overflow (a character >= 1 byte)
            keep = max(0, len(text) - (len(data) - limit) - len(_TRUNCATED))
            text = text[:keep]
            marked = (error[0], text + _TRUNCATED if text else "")
            data = _header(message, topic, channel, marked, now, True) + message.body
            if len(data) <= limit:
                return data
            if not text:
                break
    return None


def parse(body: bytes) -> DeadLetterRecord:
    """Take a dead-letter envelope apart. Thread-safe.

    Raises:
        InvalidEnvelope: ``body`` is not an envelope (no JSON line with the format key), or one
            of a newer format version.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidEnvelope(f"a dead-letter envelope is bytes, got {type(body).__name__}")
    data = bytes(body)
    head, sep, rest = data.partition(b"\n")
    if not sep:
        raise InvalidEnvelope("not a dead-letter envelope: no line break after the header")
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidEnvelope("not a dead-letter envelope: its first line is not JSON") from None
    if not isinstance(header, dict) or _VERSION_KEY not in header:
        raise InvalidEnvelope(f"not a dead-letter envelope: no {_VERSION_KEY!r} key")
    version = header[_VERSION_KEY]
    if version != FORMAT_VERSION:
        raise InvalidEnvelope(
            f"dead-letter envelope format {version!r} is not one this nsq_sync reads "
            f"({FORMAT_VERSION})"
        )
    try:
        error = header["error"]
        return DeadLetterRecord(
            topic=str(header["topic"]),
            channel=str(header["channel"]),
            id=str(header["id"]),
            attempts=int(header["attempts"]),
            timestamp=int(header["timestamp"]),
            dead_lettered_at=float(header["dead_lettered_at"]),
            error_type=None if error is None else str(error["type"]),
            error_message=None if error is None else str(error["message"]),
            host=str(header["host"]),
            pid=int(header["pid"]),
            body=rest,
            version=version,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidEnvelope(f"dead-letter envelope without a valid {exc}") from None
