"""The dead-letter envelope: any body survives byte for byte, the metadata round-trips, an
envelope never exceeds the size limit it is given (the error text is cut, never the body), and
what is not an envelope is refused with a clear error."""

from __future__ import annotations

import json
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_sync import DeadLetter
from nsq_sync.consumer.dead_letters import check_topic
from nsq_sync.consumer.envelope import ERROR_MESSAGE_MAX, encode, error_of
from nsq_sync.dead_letter import parse
from nsq_sync.errors import ConfigError, InvalidEnvelope, InvalidName
from nsq_sync.message import Message

errors = st.none() | st.tuples(st.text(min_size=1, max_size=50), st.text(max_size=300))


def message(body: bytes, attempts: int = 5) -> Message:
    return Message(b"0a1b2c3d4e5f6a7b", body, 1_700_000_000_123_456_789, attempts)


@given(body=st.binary(min_size=1, max_size=2000), error=errors, attempts=st.integers(1, 65535))
def test_parse_gives_back_what_encode_wrote(
    body: bytes, error: tuple[str, str] | None, attempts: int
) -> None:
    data = encode(message(body, attempts), "orders", "billing", error, 1700000001.5)
    assert data is not None
    record = parse(data)
    assert record.body == body
    assert (record.topic, record.channel, record.id) == ("orders", "billing", "0a1b2c3d4e5f6a7b")
    assert (record.attempts, record.timestamp) == (attempts, 1_700_000_000_123_456_789)
    assert record.dead_lettered_at == 1700000001.5
    assert (record.error_type, record.error_message) == (error or (None, None))
    assert (record.host, record.pid, record.version) == (socket.gethostname(), os.getpid(), 1)


@given(
    body=st.binary(min_size=1, max_size=600), text=st.text(max_size=700), limit=st.integers(1, 1500)
)
def test_an_envelope_fits_its_limit_or_is_refused_whole(body: bytes, text: str, limit: int) -> None:
    data = encode(message(body), "orders", "billing", ("ValueError", text), 1.0, limit)
    bare = encode(message(body), "orders", "billing", ("ValueError", ""), 1.0)
    assert bare is not None
    if data is None:
        # only when not even an empty error text (with the truncation mark) fits
        assert len(bare) + len(b',"error_truncated":true') > limit
        return
    assert len(data) <= limit
    record = parse(data)
    assert record.body == body  # never cut
    assert record.error_message is not None
    if record.error_message != text:
        assert json.loads(data.split(b"\n", 1)[0])["error_truncated"] is True


def test_the_header_is_one_json_line_any_reader_can_split() -> None:
    data = encode(message(b"a\nb"), "orders", "billing", ("KeyError", "line\nbreak"), 2.0)
    assert data is not None
    header, body = data.split(b"\n", 1)
    assert body == b"a\nb"
    fields = json.loads(header)
    assert fields["nsq_sync_dead_letter"] == 1
    assert fields["error"] == {"type": "KeyError", "message": "line\nbreak"}
    assert set(fields) == {
        "nsq_sync_dead_letter", "topic", "channel", "id", "attempts", "timestamp",
        "dead_lettered_at", "error", "host", "pid",
    }  # fmt: skip


def test_error_of_names_the_type_and_bounds_the_message() -> None:
    assert error_of(ValueError("x")) == ("ValueError", "x")
    kind, text = error_of(DeadLetter("y" * 5000))
    assert kind == "nsq_sync.errors.DeadLetter"
    assert len(text) == ERROR_MESSAGE_MAX and text.endswith("[truncated]")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"no newline", "no line break"),
        (b"not json\nbody", "not JSON"),
        (b'{"other": 1}\nbody', "no 'nsq_sync_dead_letter' key"),
        (b'{"nsq_sync_dead_letter": 2}\nbody', "format 2"),
        (b'{"nsq_sync_dead_letter": 1, "topic": "t"}\nbody', "without a valid"),
        (b"\xff\xfe\nbody", "not JSON"),
    ],
)
def test_parse_refuses_what_is_not_an_envelope(body: bytes, why: str) -> None:
    with pytest.raises(InvalidEnvelope, match=why):
        parse(body)
    with pytest.raises(ValueError):  # InvalidEnvelope is a ValueError too
        parse(body)


def test_the_dead_letter_topic_is_checked() -> None:
    assert check_topic(None, "orders") is None
    assert check_topic("orders.dead", "orders") == "orders.dead"
    with pytest.raises(InvalidName):
        check_topic("orders dead", "orders")
    with pytest.raises(ConfigError, match="must not be the consumed topic"):
        check_topic("orders", "orders")
