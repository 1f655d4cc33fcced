"""FrameDecoder tests, each fed three ways (h11's rule): the whole input at once, one byte at a
time, and followed by the first bytes of a next frame, which must stay buffered and later decode.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from nsq_sync.errors import (
    FrameTooLarge,
    ProtocolError,
    RemoteProtocolError,
    ServerBadTopic,
    ServerError,
    ServerFinFailed,
    ServerInvalid,
    ServerReqFailed,
    ServerTouchFailed,
)
from nsq_sync.protocol import (
    EOF,
    NEED_DATA,
    ErrorFrame,
    Event,
    FrameDecoder,
    Heartbeat,
    MessageFrame,
    RawMessage,
    Response,
    parse_message,
)

MODES = ["whole", "bytewise", "trailing"]
#: the two ways to read events: one at a time, or the consumer's path (runs of messages first)
APIS = ["events", "next_messages"]


def read_all(decoder: FrameDecoder, api: str = "events") -> list[Event]:
    """Every complete event, through ``decoder.events()`` or ``decoder.next_messages()`` (whose
    plain message tuples are turned into MessageFrames here, so both compare alike)."""
    if api == "events":
        return list(decoder.events())
    out: list[Any] = []
    while True:
        event = decoder.next_messages(out)
        if event is NEED_DATA or event is EOF:
            return [MessageFrame(*e) if type(e) is tuple else e for e in out]
        out.append(event)


def frame(frame_type: int, data: bytes) -> bytes:
    """``[size][frame type][data]`` where size counts the type and the data."""
    return struct.pack(">ll", len(data) + 4, frame_type) + data


def response(data: bytes) -> bytes:
    return frame(0, data)


def error(data: bytes) -> bytes:
    return frame(1, data)


def message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return frame(2, struct.pack(">qH", timestamp, attempts) + msg_id + body)


NEXT_FRAME = response(b"NEXT")
#: the part of NEXT_FRAME that arrives together with the frames under test
NEXT_HEAD = NEXT_FRAME[:5]


class Feeder:
    """Feeds one FrameDecoder in one of the three ways and collects the events."""

    def __init__(self, mode: str, decoder: FrameDecoder | None = None, api: str = "events") -> None:
        self.mode = mode
        self.api = api
        self.decoder = decoder if decoder is not None else FrameDecoder()
        #: chunk size in "bytewise" mode
        self.step = 1

    def _chunks(self, data: bytes) -> list[bytes]:
        if self.mode == "bytewise":
            return [data[i : i + self.step] for i in range(0, len(data), self.step)]
        return [data] if data else []

    def partial(self, data: bytes) -> list[Event]:
        """Feed ``data`` (whole or byte by byte) and return the events it completed."""
        events: list[Event] = []
        for chunk in self._chunks(data):
            self.decoder.receive_data(chunk)
            events.extend(read_all(self.decoder, self.api))
        return events

    def events(self, data: bytes) -> list[Event]:
        """Feed ``data``, which ends on a frame boundary, and return its events.

        In "trailing" mode the head of a next frame arrives in the same chunk: it must stay
        buffered (NEED_DATA), and decode once the rest of that frame arrives.
        """
        if self.mode != "trailing":
            return self.partial(data)
        events = self.partial(data + NEXT_HEAD)
        assert self.decoder.next_event() is NEED_DATA
        assert self.decoder.buffered == len(NEXT_HEAD)
        self.decoder.receive_data(NEXT_FRAME[len(NEXT_HEAD) :])
        assert read_all(self.decoder, self.api) == [Response(b"NEXT")]
        return events

    def eof(self) -> object:
        self.decoder.receive_data(b"")
        return self.decoder.next_event()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=APIS)
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def feeder(mode: str, api: str) -> Feeder:
    return Feeder(mode, api=api)


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize("data", [b"OK", b"CLOSE_WAIT", b'{"max_rdy_count":2500}', b""])
def test_response_frame(feeder: Feeder, data: bytes) -> None:
    assert feeder.events(response(data)) == [Response(data)]


def test_heartbeat_is_its_own_event(feeder: Feeder) -> None:
    assert feeder.events(response(b"_heartbeat_")) == [Heartbeat()]


def test_response_that_merely_contains_heartbeat_is_a_response(feeder: Feeder) -> None:
    data = b"_heartbeat_ and more"
    assert feeder.events(response(data)) == [Response(data)]


def test_need_data_until_the_frame_is_complete(mode: str, api: str) -> None:
    decoder = FrameDecoder()
    assert decoder.next_event() is NEED_DATA
    whole = response(b"OK")
    feeder = Feeder(mode, decoder, api)
    assert feeder.partial(whole[:-1]) == []
    assert decoder.next_event() is NEED_DATA
    assert decoder.buffered == len(whole) - 1
    assert feeder.events(whole[-1:]) == [Response(b"OK")]
    assert decoder.buffered == 0


# --------------------------------------------------------------------------- error frames


def test_error_frame(feeder: Feeder) -> None:
    data = b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'
    [event] = feeder.events(error(data))
    assert event == ErrorFrame(data)
    assert isinstance(event, ErrorFrame)
    assert event.code == "E_BAD_TOPIC"
    exc = event.to_exception()
    assert type(exc) is ServerBadTopic
    assert exc.fatal is True
    assert exc.code == "E_BAD_TOPIC"
    assert exc.text == 'PUB topic name "bad!topic" is not valid'


@pytest.mark.parametrize(
    ("data", "cls", "fatal"),
    [
        (b"E_FIN_FAILED FIN 0a1b2c3d4e5f6789 failed", ServerFinFailed, False),
        (b"E_REQ_FAILED REQ 0a1b2c3d4e5f6789 failed", ServerReqFailed, False),
        (b"E_TOUCH_FAILED TOUCH 0a1b2c3d4e5f6789 failed", ServerTouchFailed, False),
        (b"E_INVALID invalid command FOO", ServerInvalid, True),
        (b"E_BAD_PROTOCOL", ServerError, True),
    ],
)
def test_error_frame_to_exception(
    feeder: Feeder, data: bytes, cls: type[ServerError], fatal: bool
) -> None:
    [event] = feeder.events(error(data))
    assert isinstance(event, ErrorFrame)
    exc = event.to_exception()
    assert type(exc) is cls
    assert exc.fatal is fatal
    assert exc.code == data.split(b" ")[0].decode()


# --------------------------------------------------------------------------- message frames


def test_message_frame_is_parsed(feeder: Feeder) -> None:
    ts = 1_700_000_000_123_456_789
    data = message(ts, 3, b"0a1b2c3d4e5f6789", b"hello\x00world\n")
    [event] = feeder.events(data)
    assert event == MessageFrame(
        id=b"0a1b2c3d4e5f6789", timestamp=ts, attempts=3, body=b"hello\x00world\n"
    )
    assert isinstance(event, MessageFrame)
    assert type(event.body) is bytes
    assert type(event.id) is bytes


def test_message_frame_field_limits(feeder: Feeder) -> None:
    # attempts is an unsigned 16-bit field; the timestamp a signed 64-bit one
    data = message(2**63 - 1, 65535, b"f" * 16, b"")
    assert feeder.events(data) == [MessageFrame(b"f" * 16, 2**63 - 1, 65535, b"")]


def test_message_frame_shorter_than_its_header_is_rejected(feeder: Feeder) -> None:
    with pytest.raises(RemoteProtocolError, match="shorter than the 26-byte header"):
        feeder.events(frame(2, b"x" * 25))


def test_parse_message_on_its_own() -> None:
    payload = struct.pack(">qH", 5, 1) + b"0123456789abcdef" + b"body"
    assert parse_message(payload) == MessageFrame(b"0123456789abcdef", 5, 1, b"body")
    with pytest.raises(RemoteProtocolError):
        parse_message(payload[:10])


def test_several_frames_in_one_chunk(feeder: Feeder) -> None:
    data = (
        response(b"OK")
        + response(b"_heartbeat_")
        + message(1, 1, b"a" * 16, b"first")
        + message(2, 2, b"b" * 16, b"second")
        + error(b"E_FIN_FAILED nope")
        + response(b"CLOSE_WAIT")
    )
    assert feeder.events(data) == [
        Response(b"OK"),
        Heartbeat(),
        MessageFrame(b"a" * 16, 1, 1, b"first"),
        MessageFrame(b"b" * 16, 2, 2, b"second"),
        ErrorFrame(b"E_FIN_FAILED nope"),
        Response(b"CLOSE_WAIT"),
    ]


# --------------------------------------------------------------------------- garbage


def test_frame_too_large_is_refused_from_its_header(mode: str, api: str) -> None:
    # Only the 8-byte header arrives: the decoder must not wait to buffer a huge frame.
    feeder = Feeder(mode, FrameDecoder(max_frame_size=1024), api)
    with pytest.raises(FrameTooLarge, match="frame size 1025 exceeds max_frame_size 1024"):
        feeder.events(struct.pack(">ll", 1025, 0))


def test_frame_of_exactly_max_size_is_accepted(feeder: Feeder) -> None:
    feeder.decoder.max_frame_size = 1024
    data = b"x" * 1020  # + 4 bytes of frame type = 1024
    assert feeder.events(response(data)) == [Response(data)]


def test_frame_too_large_is_a_remote_protocol_error(mode: str, api: str) -> None:
    feeder = Feeder(mode, FrameDecoder(max_frame_size=1024), api)
    with pytest.raises(RemoteProtocolError):
        feeder.events(message(1, 1, b"a" * 16, b"x" * 2000))


HTTP_REPLY = (
    b"HTTP/1.1 400 Bad Request\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n"
    b"400 Bad Request"
)


@pytest.mark.parametrize("max_frame_size", [1024, 64 * 1024 * 1024, 2**31 - 1])
def test_http_reply_means_the_http_port_was_dialled(
    mode: str, api: str, max_frame_size: int
) -> None:
    feeder = Feeder(mode, FrameDecoder(max_frame_size=max_frame_size), api)
    with pytest.raises(RemoteProtocolError, match="HTTP") as info:
        feeder.events(HTTP_REPLY)
    assert "TCP port" in str(info.value)
    assert type(info.value) is RemoteProtocolError


def test_nsqlookupds_bad_protocol_answer_means_its_tcp_port_was_dialled(feeder: Feeder) -> None:
    """nsqlookupd answers nsqd's magic with a bare E_BAD_PROTOCOL (size, then the text): before,
    this read as "unknown frame type 1163870785" ("E_BA")."""
    with pytest.raises(RemoteProtocolError, match="nsqlookupd's TCP port") as info:
        feeder.events(struct.pack(">l", 14) + b"E_BAD_PROTOCOL")
    assert "1163870785" not in str(info.value)


@pytest.mark.parametrize("frame_type", [3, 4, -1, 0x7FFFFFFF])
def test_unknown_frame_type_is_rejected(feeder: Feeder, frame_type: int) -> None:
    with pytest.raises(RemoteProtocolError, match=f"unknown frame type {frame_type}"):
        feeder.events(frame(frame_type, b"data"))


@pytest.mark.parametrize("size", [-1, 0, 3, -(2**31)])
def test_impossible_frame_size_is_rejected(feeder: Feeder, size: int) -> None:
    with pytest.raises(RemoteProtocolError, match=f"invalid frame size {size}"):
        feeder.events(struct.pack(">ll", size, 0) + b"rest")


# --------------------------------------------------------------------------- end of stream


def test_clean_eof_after_complete_frames(feeder: Feeder) -> None:
    assert feeder.events(response(b"OK") + message(1, 1, b"c" * 16, b"m")) == [
        Response(b"OK"),
        MessageFrame(b"c" * 16, 1, 1, b"m"),
    ]
    assert feeder.eof() is EOF
    assert feeder.decoder.next_event() is EOF  # stays at EOF
    assert list(feeder.decoder.events()) == []


def test_eof_on_a_fresh_decoder() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    assert decoder.next_event() is EOF


def test_frames_before_eof_are_still_delivered(mode: str, api: str) -> None:
    # The peer sends its last frames and closes: the close must not swallow them.
    feeder = Feeder(mode, api=api)
    data = response(b"OK") + error(b"E_INVALID bye")
    for chunk in feeder._chunks(data):
        feeder.decoder.receive_data(chunk)
    feeder.decoder.receive_data(b"")
    assert read_all(feeder.decoder, api) == [Response(b"OK"), ErrorFrame(b"E_INVALID bye")]
    assert feeder.decoder.next_event() is EOF


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 20, 35])
def test_truncated_frame_at_eof_is_an_error(feeder: Feeder, cut: int) -> None:
    full = message(1, 1, b"d" * 16, b"body-body")  # 8 + 26 + 9 = 43 bytes
    assert feeder.events(response(b"OK")) == [Response(b"OK")]
    assert feeder.partial(full[:cut]) == []
    with pytest.raises(RemoteProtocolError, match=rf"middle of a frame \({cut} bytes left\)"):
        feeder.eof()


def test_data_after_eof_is_an_error() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="after end of stream"):
        decoder.receive_data(response(b"OK"))


# --------------------------------------------------------------------------- trailing data


def test_take_trailing_data_returns_bytes_after_the_consumed_frames(mode: str) -> None:
    # After the IDENTIFY response the stream switches to TLS/snappy/deflate: bytes read past
    # that frame belong to the new layer and must be handed over untouched.
    upgraded = b"\xff\x06\x00\x00sNaPpY" + b"\x00" * 20 + response(b"looks like a frame")
    data = response(b'{"snappy":true}') + upgraded
    decoder = FrameDecoder()
    chunks = [data] if mode == "whole" else [data[i : i + 1] for i in range(len(data))]
    if mode == "trailing":
        chunks = [data[:10], data[10:30], data[30:]]
    first = None
    for chunk in chunks:
        decoder.receive_data(chunk)
        if first is None:
            event = decoder.next_event()
            if event is not NEED_DATA:
                first = event
    assert first == Response(b'{"snappy":true}')
    assert decoder.buffered == len(upgraded)
    assert decoder.take_trailing_data() == upgraded
    assert decoder.buffered == 0
    assert decoder.take_trailing_data() == b""
    # The decoder stays usable (the decompressed stream may be fed back to it).
    decoder.receive_data(response(b"OK"))
    assert decoder.next_event() == Response(b"OK")


def test_take_trailing_data_of_a_partial_frame(feeder: Feeder) -> None:
    assert feeder.partial(response(b"OK") + b"\x00\x00\x00") == [Response(b"OK")]
    assert feeder.decoder.take_trailing_data() == b"\x00\x00\x00"
    assert feeder.decoder.next_event() is NEED_DATA


# --------------------------------------------------------------------------- large buffers


def _many_messages(count: int, body_size: int) -> tuple[bytes, list[MessageFrame]]:
    expected = []
    parts = []
    for i in range(count):
        msg_id = b"%016x" % i
        body = (b"%08d" % i) * (body_size // 8) + bytes([i % 256])
        expected.append(MessageFrame(msg_id, 1_700_000_000_000_000_000 + i, i % 7 + 1, body))
        parts.append(message(1_700_000_000_000_000_000 + i, i % 7 + 1, msg_id, body))
    return b"".join(parts), expected


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("chunk_size", [7, 1000, 4099, 65537, 300_000])
def test_large_stream_fed_in_chunks_compacts_correctly(chunk_size: int, api: str) -> None:
    # > 200 KB in frames that do not line up with the chunks: the decoder must drop consumed
    # bytes while a partial frame is still buffered, without losing or reordering any. (Every
    # split point inside a frame is covered byte by byte by the small-frame tests; 1-byte chunks
    # here only cost 200,000 rounds.)
    data, expected = _many_messages(1500, 120)
    assert len(data) > 200 * 1024
    decoder = FrameDecoder()
    got: list[Event] = []
    for start in range(0, len(data), chunk_size):
        decoder.receive_data(data[start : start + chunk_size])
        got.extend(read_all(decoder, api))
    assert got == expected
    assert decoder.buffered == 0
    decoder.receive_data(b"")
    assert decoder.next_event() is EOF


def test_one_frame_bigger_than_the_compaction_threshold(feeder: Feeder) -> None:
    # 7-byte chunks rather than single bytes: below 64 KiB every chunk copies the partial frame
    # (the small-carry path), so byte by byte is quadratic; 7 crosses every boundary the same way.
    feeder.step = 7
    big = b"B" * 150_000
    data = response(b"OK") + message(9, 1, b"e" * 16, big) + response(b"CLOSE_WAIT")
    assert feeder.events(data) == [
        Response(b"OK"),
        MessageFrame(b"e" * 16, 9, 1, big),
        Response(b"CLOSE_WAIT"),
    ]


def test_errors_are_protocol_errors() -> None:
    assert issubclass(FrameTooLarge, RemoteProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)


# --------------------------------------------------------------------------- next_messages


def test_next_messages_keeps_what_it_decoded_before_garbage() -> None:
    decoder = FrameDecoder()
    good = [message(1, 1, b"%016d" % i, b"body %d" % i) for i in range(3)]
    decoder.receive_data(b"".join(good) + frame(9, b"garbage"))
    out: list[RawMessage] = []
    with pytest.raises(RemoteProtocolError, match="unknown frame type 9"):
        decoder.next_messages(out)
    assert [body for _, _, _, body in out] == [b"body 0", b"body 1", b"body 2"]


def test_next_messages_stops_at_the_first_other_frame_and_returns_it() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(
        message(1, 1, b"a" * 16, b"one")
        + response(b"_heartbeat_")
        + message(2, 1, b"b" * 16, b"two")
    )
    out: list[RawMessage] = []
    assert decoder.next_messages(out) == Heartbeat()
    assert out == [(b"a" * 16, 1, 1, b"one")]
    assert decoder.next_messages(out) is NEED_DATA
    assert out[1] == (b"b" * 16, 2, 1, b"two")
    # plain (id, timestamp, attempts, body) tuples: no MessageFrame built per message
    assert all(type(m) is tuple for m in out)


@pytest.mark.parametrize("api", APIS)
def test_bodies_are_bytes_also_after_a_large_frame_arrived_in_pieces(api: str) -> None:
    # A frame bigger than what the decoder carries over by copying accumulates in a bytearray;
    # bodies sliced from it must still be bytes (immutable, hashable), as from the fast path.
    big = b"L" * 200_000
    small = [message(5, 1, b"%016d" % i, b"small %d" % i) for i in range(20)]
    data = message(4, 2, b"B" * 16, big) + b"".join(small)
    decoder = FrameDecoder()
    got: list[Event] = []
    for start in range(0, len(data), 70_000):
        decoder.receive_data(data[start : start + 70_000])
        got.extend(read_all(decoder, api))
    assert len(got) == 21
    assert got[0] == MessageFrame(b"B" * 16, 4, 2, big)
    assert [m.body for m in got[1:]] == [b"small %d" % i for i in range(20)]  # type: ignore[union-attr]
    assert all(type(m.body) is bytes for m in got)  # type: ignore[union-attr]
    assert decoder.buffered == 0
