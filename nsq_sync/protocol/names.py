"""Topic and channel name rules: ``[.a-zA-Z0-9_-]``, 1-64 characters, optional ``#ephemeral``."""

from __future__ import annotations

import re

from nsq_sync.errors import InvalidName
from nsq_sync.protocol.constants import MAX_NAME_LENGTH

# nsqd (internal/protocol/names.go): ^[.a-zA-Z0-9_-]+(#ephemeral)?$ and 1 <= len <= 64, the
# suffix included. Python's ``$`` also matches before a trailing "\n" (Go's does not), which
# would let "topic\n" through and split the command line on the wire: anchor with ``\Z``.
_NAME_RE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?\Z")


def is_valid_name(name: str) -> bool:
    """Return True when ``name`` is a valid topic or channel name. Never raises."""
    return (
        isinstance(name, str)
        and 1 <= len(name) <= MAX_NAME_LENGTH
        and _NAME_RE.match(name) is not None
    )


def _validate(kind: str, name: object) -> str:
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidName(f"invalid {kind} name {name!r}: not ASCII") from None
    if not isinstance(name, str):
        raise InvalidName(f"invalid {kind} name {name!r}: expected str, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise InvalidName(
            f"invalid {kind} name {name!r}: length {len(name)}, must be 1-{MAX_NAME_LENGTH}"
        )
    if _NAME_RE.match(name) is None:
        raise InvalidName(
            f"invalid {kind} name {name!r}: only [.a-zA-Z0-9_-] allowed, "
            "with an optional '#ephemeral' suffix"
        )
    return name


def validate_topic(topic: object) -> str:
    """``topic`` as str if valid (bytes decoded as ASCII); else InvalidName, naming the rule."""
    return _validate("topic", topic)


def validate_channel(channel: object) -> str:
    """``channel`` as str if valid (bytes decoded as ASCII); else InvalidName naming the rule."""
    return _validate("channel", channel)
