"""Incremental frame decoder, bytes in and events out (the h11 shape)::

    decoder.receive_data(chunk)          # b"" means the peer closed the connection
    for event in decoder.events():       # stops at NEED_DATA; raises on garbage
        ...

A frame is ``[4-byte size][4-byte frame type][data]``, the size counting type and data.
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
from nsq_sync.protocol.events import (
    ErrorFrame,
    Event,
    Heartbeat,
    MessageFrame,
    RawMessage,
    Response,
)

_SIZE = struct.Struct(">l")
_FRAME_HEAD = struct.Struct(">ll")
_MSG_HEAD = struct.Struct(">qH16s")
# a message frame's head in one unpack: size, frame type, timestamp, attempts, id
_MSG_FRAME_HEAD = struct.Struct(">llqH16s")
_MSG_FRAME_HEAD_SIZE = _MSG_FRAME_HEAD.size  # 34
_MIN_MESSAGE_FRAME = 4 + MESSAGE_HEADER_SIZE  # size field of an empty-bodied message
# a partial frame up to this size is carried over by copying it (the buffer stays ``bytes``,
# whose slices need no second copy); a bigger one accumulates in a bytearray instead
_SMALL_CARRY = 65536
# b"HTTP" read as a frame size
_HTTP_SIZE = _SIZE.unpack(b"HTTP")[0]


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
_BAD_PROTOCOL = b"E_BAD_PROTOCOL"


def parse_message(data: bytes) -> MessageFrame:
    """Parse the payload of a message frame; RemoteProtocolError if shorter than its header."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(data)} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header"
        )
    timestamp, attempts, msg_id = _MSG_HEAD.unpack_from(data)
    return MessageFrame(msg_id, timestamp, attempts, bytes(data[MESSAGE_HEADER_SIZE:]))


class FrameDecoder:
    """Turns a byte stream from nsqd into events. Not thread-safe: one reader owns it.
    A frame announced above ``max_frame_size`` raises :class:`~nsq_sync.errors.FrameTooLarge`
    before any of it is buffered."""

    __slots__ = ("_buf", "_pos", "_eof", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        # bytes while frames are small (slicing a body out is one copy); a bytearray while a
        # large frame arrives in pieces (appending in place, not quadratic copying)
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._eof = False
        self.max_frame_size = max_frame_size

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the connection; ``b""`` signals the end of the stream (data after
        it raises RemoteProtocolError)."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RemoteProtocolError("data received after end of stream")
        buf = self._buf
        pos = self._pos
        left = len(buf) - pos
        if left <= 0:
            # Everything consumed (the common case): keep the new chunk as it is.
            self._buf = data if type(data) is bytes else bytes(data)
            self._pos = 0
        elif type(buf) is bytes and left <= _SMALL_CARRY:
            self._buf = buf[pos:] + data
            self._pos = 0
        else:
            if type(buf) is bytes:
                buf = bytearray(buf[pos:])
                self._pos = 0
            buf += data
            self._buf = buf

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet turned into events."""
        return len(self._buf) - self._pos

    def take_trailing_data(self) -> bytes:
        """Remove and return the bytes not yet decoded: after IDENTIFY, they belong to the TLS or
        compression layer that starts there."""
        data = bytes(self._buf[self._pos :])
        self._buf = b""
        self._pos = 0
        return data

    def next_event(self) -> Event | _Sentinel:
        """The next complete event, :data:`NEED_DATA` or :data:`EOF`.

        Raises:
            FrameTooLarge: a frame announces more than ``max_frame_size`` bytes.
            RemoteProtocolError: garbage (bad size or frame type, an HTTP answer) or a stream that
                ended in the middle of a frame.
        """
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 8:
            return self._need_data(available)
        size, frame_type = _FRAME_HEAD.unpack_from(buf, pos)
        if size == _HTTP_SIZE and buf[pos : pos + 4] == _HTTP:
            # Checked before the size limit: b"HTTP" reads as 1213486160, which a raised
            # max_frame_size (up to 2**31 - 1) would accept and then wait for forever.
            raise RemoteProtocolError(
                "received an HTTP response: this looks like nsqd's HTTP port, not its TCP port"
            )
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
        if bytes(buf[pos + 4 : end]) == _BAD_PROTOCOL:
            # nsqlookupd answers nsqd's magic ("  V2") with a bare E_BAD_PROTOCOL: its size,
            # then text where the frame type should be ("E_BA" reads as 1163870785)
            raise RemoteProtocolError(
                "received E_BAD_PROTOCOL outside any frame: this looks like nsqlookupd's TCP "
                "port, not nsqd's"
            )
        raise RemoteProtocolError(f"unknown frame type {frame_type}")

    def next_messages(self, out: list[RawMessage]) -> Event | _Sentinel:
        """Append every complete message frame at the front of the buffer to ``out`` as a plain
        ``(id, timestamp, attempts, body)`` tuple (:data:`RawMessage`, the consumer's fast path),
        then return what :meth:`next_event` returns. Raises as :meth:`next_event`; the messages
        decoded before garbage are in ``out`` by then."""
        buf = self._buf
        pos = self._pos
        end_of_data = len(buf)
        unpack = _MSG_FRAME_HEAD.unpack_from
        append = out.append
        max_size = self.max_frame_size
        convert = type(buf) is not bytes
        try:
            while end_of_data - pos >= _MSG_FRAME_HEAD_SIZE:
                size, frame_type, timestamp, attempts, msg_id = unpack(buf, pos)
                end = pos + 4 + size
                if (
                    frame_type != FRAME_TYPE_MESSAGE
                    or end > end_of_data
                    or not _MIN_MESSAGE_FRAME <= size <= max_size
                ):
                    break  # anything else, incomplete or invalid: next_event decides
                body = buf[pos + _MSG_FRAME_HEAD_SIZE : end]
                # (a slice of bytes is bytes: copied only out of a bytearray buffer)
                append((msg_id, timestamp, attempts, bytes(body) if convert else body))  # type: ignore[arg-type]
                pos = end
        finally:
            self._pos = pos
        return self.next_event()

    def _check_type_advanced(self) -> None:
        # Compact lazily: drop consumed bytes once they dominate the buffer.
        buf = self._buf
        if self._pos > 65536 and self._pos * 2 > len(buf) and type(buf) is bytearray:
            del buf[: self._pos]
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
