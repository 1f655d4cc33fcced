"""Incremental frame decoder: bytes in, events out (the h11 shape).

    decoder = FrameDecoder()
    decoder.receive_data(chunk)          # b"" means the peer closed the connection
    for event in decoder.events():       # stops at NEED_DATA; raises on garbage
        ...

Frames are ``[4-byte size][4-byte frame type][data]`` where size counts the type and the data.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from nsq_sync.errors import FrameTooLarge, RemoteProtocolError
from nsq_sync.protocol.constants import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MESSAGE_HEADER_SIZE,
)
from nsq_sync.protocol.events import ErrorFrame, Event, Heartbeat, MessageFrame, Response

_SIZE = struct.Struct(">l")
_FRAME_HEAD = struct.Struct(">ll")
_MSG_HEAD = struct.Struct(">qH16s")


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: returned by :meth:`FrameDecoder.next_event` when more bytes are needed
NEED_DATA: Final = _Sentinel("NEED_DATA")
#: returned by :meth:`FrameDecoder.next_event` once the peer closed cleanly between frames
EOF: Final = _Sentinel("EOF")

_HEARTBEAT_EVENT = Heartbeat()
_HTTP = b"HTTP"


def parse_message(data: bytes) -> MessageFrame:
    """Parse the payload of a message frame.

    Raises:
        RemoteProtocolError: when the payload is shorter than the 26-byte message header.
    """
    if len(data) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(data)} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header"
        )
    timestamp, attempts, msg_id = _MSG_HEAD.unpack_from(data)
    return MessageFrame(msg_id, timestamp, attempts, bytes(data[MESSAGE_HEADER_SIZE:]))


class FrameDecoder:
    """Turns a byte stream from nsqd into events. Not thread-safe: one reader owns it.

    Args:
        max_frame_size: largest frame accepted (type and data included); a bigger announced size
            raises :class:`~nsq_sync.errors.FrameTooLarge` before any of it is buffered.
    """

    __slots__ = ("_buf", "_pos", "_eof", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self.max_frame_size = max_frame_size

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the connection; ``b""`` signals end of stream.

        Raises:
            RemoteProtocolError: when data arrives after end of stream was signalled.
        """
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RemoteProtocolError("data received after end of stream")
        if self._pos and self._pos == len(self._buf):
            # Everything consumed: start over instead of growing (the common case).
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet turned into events."""
        return len(self._buf) - self._pos

    def take_trailing_data(self) -> bytes:
        """Remove and return the bytes not yet decoded.

        Used when the connection upgrades to TLS or compression right after the IDENTIFY
        response: bytes read past that frame belong to the new layer, not to this decoder.
        """
        data = bytes(self._buf[self._pos :])
        self._buf.clear()
        self._pos = 0
        return data

    def next_event(self) -> Event | _Sentinel:
        """Return the next complete event, :data:`NEED_DATA` or :data:`EOF`.

        Raises:
            FrameTooLarge: a frame announces more than ``max_frame_size`` bytes.
            RemoteProtocolError: garbage (bad size or frame type, an HTTP reply) or a
                stream that ended in the middle of a frame.
        """
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 8:
            return self._need_data(available)
        if buf[pos : pos + 4] == _HTTP:
            # Checked before the size limit: b"HTTP" reads as 1213486160, which a raised
            # max_frame_size (up to 2**31 - 1) would accept and then wait for forever.
            raise RemoteProtocolError(
                "received an HTTP response: this looks like nsqd's HTTP port, not its TCP port"
            )
        size, frame_type = _FRAME_HEAD.unpack_from(buf, pos)
        if size > self.max_frame_size or size < 4:
            if size < 4:
                raise RemoteProtocolError(f"invalid frame size {size}")
            raise FrameTooLarge(f"frame size {size} exceeds max_frame_size {self.max_frame_size}")
        end = pos + 4 + size
        if len(buf) < end:
            return self._need_data(available)
        data = bytes(buf[pos + 8 : end])
        self._pos = end
        if frame_type == FRAME_TYPE_MESSAGE:
            self._check_type_advanced()
            return parse_message(data)
        if frame_type == FRAME_TYPE_RESPONSE:
            self._check_type_advanced()
            if data == HEARTBEAT:
                return _HEARTBEAT_EVENT
            return Response(data)
        if frame_type == FRAME_TYPE_ERROR:
            self._check_type_advanced()
            return ErrorFrame(data)
        self._pos = pos
        raise RemoteProtocolError(f"unknown frame type {frame_type}")

    def _check_type_advanced(self) -> None:
        # Compact lazily: drop consumed bytes once they dominate the buffer.
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0

    def _need_data(self, available: int) -> _Sentinel:
        if self._eof:
            if available:
                raise RemoteProtocolError(
                    f"connection closed in the middle of a frame ({available} bytes left)"
                )
            return EOF
        return NEED_DATA

    def events(self) -> Iterator[Event]:
        """Yield every complete event; stop at NEED_DATA or EOF (see :meth:`next_event`)."""
        while True:
            event = self.next_event()
            if isinstance(event, _Sentinel):
                return
            yield event
