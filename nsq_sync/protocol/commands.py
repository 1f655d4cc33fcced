"""Pure encoders for every command of the NSQ V2 protocol: arguments in, bytes out. Inputs are
validated before any bytes are produced; durations are float seconds, and become integer
milliseconds only here."""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Union

from nsq_sync.errors import ConfigError, InvalidBody, LocalProtocolError
from nsq_sync.protocol.constants import MAGIC_V2, MESSAGE_ID_SIZE
from nsq_sync.protocol.names import validate_channel, validate_topic

Body = Union[bytes, bytearray, memoryview, str]

_U32 = struct.Struct(">I")
_MAX_RDY = 2**31 - 1
_MAX_MS = 2**31 - 1  # the largest millisecond count written (an int32, 24.8 days)

NOP = b"NOP\n"
CLS = b"CLS\n"


def to_body(body: object, *, index: int | None = None) -> bytes:
    """``body`` as non-empty bytes (str encoded as UTF-8); else InvalidBody."""
    if isinstance(body, bytes):
        data = body
    elif isinstance(body, (bytearray, memoryview)):
        data = bytes(body)
    elif isinstance(body, str):
        data = body.encode("utf-8")
    else:
        where = "" if index is None else f" (message {index})"
        raise InvalidBody(f"message body{where} must be bytes or str, got {type(body).__name__}")
    if not data:
        where = "" if index is None else f" (message {index})"
        raise InvalidBody(f"message body{where} is empty; nsqd rejects empty messages")
    return data


def to_bodies(bodies: Iterable[Body]) -> list[bytes]:
    """A batch of bodies as a list of non-empty bytes. Raises InvalidBody for a single body instead
    of a sequence, no bodies, or a bad one (named by its index)."""
    if isinstance(bodies, (bytes, bytearray, memoryview, str)):
        raise InvalidBody("MPUB takes a sequence of bodies, not a single body")
    datas = bodies if type(bodies) is list else list(bodies)
    if not datas:
        raise InvalidBody("MPUB needs at least one message")
    # The common case checked at C speed: all bytes, none empty.
    if set(map(type, datas)) == {bytes} and min(map(len, datas)):
        return datas  # type: ignore[return-value]
    return [to_body(b, index=i) for i, b in enumerate(datas)]


def to_ms(seconds: float, name: str = "delay") -> int:
    """Seconds as the whole milliseconds nsqd takes (DPUB, REQ, HTTP ``defer``). Raises
    ConfigError, naming ``name``, for a non-number, a non-finite or negative value, or over
    2**31-1 ms."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ConfigError(f"{name} must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {seconds!r}")
    ms = int(round(seconds * 1000))
    if ms > _MAX_MS:
        raise ConfigError(f"{name} must be at most {_MAX_MS / 1000} s, got {seconds!r}")
    return ms


def _msg_id(message_id: bytes) -> bytes:
    if (
        not isinstance(message_id, (bytes, bytearray))
        or len(message_id) != MESSAGE_ID_SIZE
        or not bytes(message_id).isalnum()
    ):
        raise LocalProtocolError(
            f"message id must be {MESSAGE_ID_SIZE} alphanumeric bytes, got {message_id!r}"
        )
    return bytes(message_id)


def magic() -> bytes:
    """The 4-byte protocol version that opens every connection."""
    return MAGIC_V2


def identify(data: Mapping[str, Any]) -> bytes:
    """``IDENTIFY`` with a JSON body (keys as the spec names them, durations already in ms)."""
    body = json.dumps(dict(data), separators=(",", ":"), sort_keys=True).encode("utf-8")
    return b"IDENTIFY\n" + _U32.pack(len(body)) + body


def auth(secret: str | bytes) -> bytes:
    """``AUTH`` with the secret as the body. Raises LocalProtocolError for an empty secret, or one
    that is not str or bytes."""
    if isinstance(secret, str):
        data = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        data = bytes(secret)
    else:
        raise LocalProtocolError(f"auth secret must be str or bytes, got {type(secret).__name__}")
    if not data:
        raise LocalProtocolError("auth secret is empty")
    return b"AUTH\n" + _U32.pack(len(data)) + data


def sub(topic: str, channel: str) -> bytes:
    """``SUB <topic> <channel>``. Raises InvalidName."""
    t = validate_topic(topic)
    c = validate_channel(channel)
    return f"SUB {t} {c}\n".encode("ascii")


def pub(topic: str, body: Body) -> bytes:
    """``PUB <topic>`` and one body. Raises InvalidName, InvalidBody."""
    head = _pub_head(topic)  # the topic's error first
    data = body if type(body) is bytes and body else to_body(body)
    return head + _U32.pack(len(data)) + data  # (a quarter cheaper than b"%s%s%s" %)


def _pub_head(topic: object) -> bytes:
    """The ``PUB <topic>`` line; cached per str topic once validated (a regex less per publish)."""
    if type(topic) is str:
        return _pub_head_of(topic)
    return _pub_head_of.__wrapped__(topic)


@functools.lru_cache(maxsize=1024)  # bounded: an application may publish to endless topics
def _pub_head_of(topic: object) -> bytes:
    return b"PUB " + validate_topic(topic).encode("ascii") + b"\n"


def mpub(topic: str, bodies: Iterable[Body]) -> bytes:
    """``MPUB <topic>`` and a batch of bodies, published atomically. Raises InvalidName and, as
    :func:`to_bodies`, InvalidBody."""
    return mpub_checked(validate_topic(topic), to_bodies(bodies))


def mpub_checked(topic: str, datas: list[bytes]) -> bytes:
    """:func:`mpub` of a topic and bodies already validated (the producer checks them once)."""
    pack = _U32.pack
    n = len(datas)
    sizes = list(map(len, datas))
    # [size][body] for each, interleaved by slice assignment (C-level, no per-body concat)
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = map(pack, sizes)
    parts[1::2] = datas
    payload_size = 4 + 4 * n + sum(sizes)
    # one join for the whole command: no copy of the (possibly large) payload per step
    parts[:0] = (b"MPUB ", topic.encode("ascii"), b"\n", pack(payload_size), pack(n))
    return b"".join(parts)


def dpub(topic: str, body: Body, delay: float) -> bytes:
    """``DPUB <topic> <defer_ms>`` and one body; ``delay`` in seconds. Raises InvalidName,
    InvalidBody, ConfigError (a bad delay, as :func:`to_ms`)."""
    t = validate_topic(topic)
    data = to_body(body)
    ms = to_ms(delay)
    return b"DPUB %s %d\n" % (t.encode("ascii"), ms) + _U32.pack(len(data)) + data


def rdy(count: int) -> bytes:
    """``RDY <count>``. Raises LocalProtocolError for a count that is not an int in 0..2**31-1."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_RDY:
        raise LocalProtocolError(f"RDY count must be an int >= 0, got {count!r}")
    return b"RDY %d\n" % count


def fin(message_id: bytes) -> bytes:
    """``FIN <id>``."""
    return b"FIN " + _msg_id(message_id) + b"\n"


def req(message_id: bytes, delay: float) -> bytes:
    """``REQ <id> <timeout_ms>``; ``delay`` in seconds (0 requeues at once). Raises
    LocalProtocolError (a malformed id) or ConfigError (a bad delay, as :func:`to_ms`)."""
    return b"REQ %s %d\n" % (_msg_id(message_id), to_ms(delay, "requeue delay"))


def touch(message_id: bytes) -> bytes:
    """``TOUCH <id>``: reset the message's in-flight timeout."""
    return b"TOUCH " + _msg_id(message_id) + b"\n"


def cls() -> bytes:
    """``CLS``: ask nsqd to stop sending; it answers ``CLOSE_WAIT``."""
    return CLS


def nop() -> bytes:
    """``NOP``: the answer to a heartbeat."""
    return NOP
