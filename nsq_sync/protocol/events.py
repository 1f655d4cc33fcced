"""Frozen event objects produced by :class:`~nsq_sync.protocol.decoder.FrameDecoder`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

from nsq_sync.errors import ServerError, error_from_frame


@dataclass(frozen=True)
class Response:
    """A response frame (``OK``, ``CLOSE_WAIT``, IDENTIFY's JSON, ...); heartbeats excluded."""

    data: bytes


@dataclass(frozen=True)
class Heartbeat:
    """nsqd's ``_heartbeat_``; the client must answer with NOP."""


@dataclass(frozen=True)
class ErrorFrame:
    """An error frame ``E_CODE text``."""

    data: bytes

    @property
    def code(self) -> str:
        return self.data.split(b" ", 1)[0].decode("utf-8", "replace")

    def to_exception(self) -> ServerError:
        """The :class:`~nsq_sync.errors.ServerError` subclass for this code."""
        return error_from_frame(self.data)


class MessageFrame(NamedTuple):
    """A message frame: ``timestamp`` (ns since epoch), ``attempts``, 16-byte ``id``, ``body``.
    A NamedTuple: one is built per message received, and it is cheaper than a dataclass."""

    id: bytes
    timestamp: int
    attempts: int
    body: bytes


#: A message's fields as :meth:`FrameDecoder.next_messages` hands them out, ``(id, timestamp,
#: attempts, body)``: a plain tuple, as a :class:`MessageFrame` is, without building one (one less
#: object per message on a consumer's hot path)
RawMessage = tuple[bytes, int, int, bytes]

Event = Union[Response, Heartbeat, ErrorFrame, MessageFrame]
