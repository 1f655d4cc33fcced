"""Property tests: frames survive any chunking, garbage only ever raises ProtocolError, and the
publish encoders' length prefixes always match their payloads.

How many examples each test tries comes from the Hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import math
import re
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nsq_sync.errors import InvalidName, ProtocolError
from nsq_sync.protocol import (
    EOF,
    NEED_DATA,
    ErrorFrame,
    Event,
    FrameDecoder,
    Heartbeat,
    MessageFrame,
    Response,
    commands,
    is_valid_name,
    validate_topic,
)

from .test_decoder import APIS, read_all

# --------------------------------------------------------------------------- frame strategies


def _frame(frame_type: int, data: bytes) -> bytes:
    return struct.pack(">ll", len(data) + 4, frame_type) + data


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, Event]:
    """One encoded frame and the event it must decode to."""
    kind = draw(st.sampled_from(["response", "heartbeat", "error", "message"]))
    if kind == "response":
        data = draw(st.binary(max_size=100))
        return _frame(0, data), (Heartbeat() if data == b"_heartbeat_" else Response(data))
    if kind == "heartbeat":
        return _frame(0, b"_heartbeat_"), Heartbeat()
    if kind == "error":
        code = "E_" + draw(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=20))
        text = draw(st.binary(max_size=100))
        data = code.encode() + (b" " + text if text else b"")
        return _frame(1, data), ErrorFrame(data)
    timestamp = draw(st.integers(-(2**63), 2**63 - 1))
    attempts = draw(st.integers(0, 65535))
    msg_id = draw(st.binary(min_size=16, max_size=16))
    body = draw(st.binary(max_size=200))
    payload = struct.pack(">qH", timestamp, attempts) + msg_id + body
    return _frame(2, payload), MessageFrame(msg_id, timestamp, attempts, body)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


# --------------------------------------------------------------------------- decoder


@pytest.mark.parametrize("api", APIS)
@given(
    items=st.lists(frames(), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_frames_round_trip_through_any_chunking(
    api: str, items: list[tuple[bytes, Event]], cuts: list[int]
) -> None:
    """Through any chunking, both ways of reading (one event at a time, and the consumer's
    runs of messages first) yield every event in order."""
    data = b"".join(encoded for encoded, _ in items)
    decoder = FrameDecoder()
    got: list[Event] = []
    for chunk in _split(data, cuts):
        decoder.receive_data(chunk)
        got.extend(read_all(decoder, api))
        assert decoder.next_event() is NEED_DATA
    assert got == [event for _, event in items]
    assert decoder.buffered == 0
    decoder.receive_data(b"")
    assert decoder.next_event() is EOF


@given(
    items=st.lists(frames(), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10),
    tail=st.binary(min_size=1, max_size=50),
)
def test_trailing_data_is_exactly_what_follows_the_decoded_frames(
    items: list[tuple[bytes, Event]], cuts: list[int], tail: bytes
) -> None:
    data = b"".join(encoded for encoded, _ in items)
    decoder = FrameDecoder()
    got: list[Event] = []
    for chunk in _split(data + tail, cuts):
        decoder.receive_data(chunk)
        while len(got) < len(items):
            event = decoder.next_event()
            if event is NEED_DATA:
                break
            assert event is not EOF
            got.append(event)
    assert got == [event for _, event in items]
    assert decoder.take_trailing_data() == tail


@given(
    data=st.binary(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=20),
    max_frame_size=st.sampled_from([4, 64, 1024, 64 * 1024 * 1024, 2**31 - 1]),
)
def test_garbage_only_ever_raises_protocol_errors(
    data: bytes, cuts: list[int], max_frame_size: int
) -> None:
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    try:
        for chunk in [*_split(data, cuts), b""]:
            decoder.receive_data(chunk)
            for event in decoder.events():
                assert isinstance(event, (Response, Heartbeat, ErrorFrame, MessageFrame))
        assert decoder.next_event() is EOF
    except ProtocolError:
        pass


@given(data=st.binary(min_size=8, max_size=200))
def test_garbage_with_a_plausible_header_only_raises_protocol_errors(data: bytes) -> None:
    # Force a small, valid-looking size so the garbage reaches frame-type and message parsing.
    size = len(data) - 4
    garbage = struct.pack(">l", size) + data[4:]
    decoder = FrameDecoder()
    decoder.receive_data(garbage)
    try:
        list(decoder.events())
    except ProtocolError:
        pass


# --------------------------------------------------------------------------- names and encoders

PLAIN_NAME = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
EPHEMERAL_NAME = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}", fullmatch=True).map(
    lambda n: n + "#ephemeral"
)
NAMES = st.one_of(PLAIN_NAME, EPHEMERAL_NAME)
BODIES = st.one_of(st.binary(min_size=1, max_size=2000), st.text(min_size=1, max_size=200))


def _as_bytes(body: bytes | str) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else body


@given(name=st.text(max_size=80))
@example(name="topic\n")  # Python's `$` matches before a final newline; nsqd's Go regexp doesn't
@example(name="a" * 54 + "#ephemeral")
@example(name="a" * 55 + "#ephemeral")
def test_name_validation_agrees_with_nsqd_rule(name: str) -> None:
    expected = (
        1 <= len(name) <= 64 and re.fullmatch(r"[.a-zA-Z0-9_-]+(#ephemeral)?", name) is not None
    )
    assert is_valid_name(name) is expected
    try:
        validate_topic(name)
    except InvalidName as exc:
        assert not expected
        assert repr(name) in str(exc)
    else:
        assert expected
        assert not any(c.isspace() for c in name)


@given(name=NAMES, body=BODIES)
def test_pub_length_prefix_matches_the_body(name: str, body: bytes | str) -> None:
    encoded = commands.pub(name, body)
    line, rest = encoded.split(b"\n", 1)
    assert line == b"PUB " + name.encode("ascii")
    (size,) = struct.unpack(">I", rest[:4])
    assert size == len(rest) - 4
    assert rest[4:] == _as_bytes(body)


@given(name=NAMES, bodies=st.lists(BODIES, min_size=1, max_size=20))
def test_mpub_length_prefixes_match_the_bodies(name: str, bodies: list[bytes | str]) -> None:
    encoded = commands.mpub(name, bodies)
    line, rest = encoded.split(b"\n", 1)
    assert line == b"MPUB " + name.encode("ascii")
    (total,) = struct.unpack(">I", rest[:4])
    payload = rest[4:]
    assert total == len(payload)
    (count,) = struct.unpack(">I", payload[:4])
    assert count == len(bodies)
    pos = 4
    for body in bodies:
        (size,) = struct.unpack(">I", payload[pos : pos + 4])
        assert payload[pos + 4 : pos + 4 + size] == _as_bytes(body)
        pos += 4 + size
    assert pos == len(payload)


@given(
    name=NAMES,
    delay=st.floats(min_value=0, max_value=2_000_000, allow_nan=False),
    body=BODIES,
)
def test_dpub_sends_the_delay_in_whole_milliseconds(
    name: str, delay: float, body: bytes | str
) -> None:
    encoded = commands.dpub(name, body, delay)
    line, rest = encoded.split(b"\n", 1)
    verb, topic, ms = line.split(b" ")
    assert (verb, topic) == (b"DPUB", name.encode("ascii"))
    assert abs(int(ms) - delay * 1000) <= 0.5 + 1e-6 * delay
    assert math.isclose(int(ms) / 1000, delay, abs_tol=0.0005 + 1e-9 * delay)
    (size,) = struct.unpack(">I", rest[:4])
    assert size == len(rest) - 4 == len(_as_bytes(body))
