"""Golden bytes for every command encoder, checked against the NSQ TCP protocol spec.

Sizes on the wire are 4-byte big-endian unsigned integers; durations given in float seconds
become integer milliseconds only in these encoders.
"""

from __future__ import annotations

import json
import re
import struct

import pytest

from nsq_sync.errors import ConfigError, InvalidBody, InvalidName, LocalProtocolError, NSQError
from nsq_sync.protocol import commands, validate_channel, validate_topic

MSG_ID = b"0a1b2c3d4e5f6789"

# --------------------------------------------------------------------------- golden bytes


def test_magic_is_space_space_v2() -> None:
    assert commands.magic() == b"  V2"


def test_identify_golden_bytes() -> None:
    assert commands.identify({"client_id": "w1"}) == (
        b'IDENTIFY\n\x00\x00\x00\x12{"client_id":"w1"}'
    )


def test_identify_size_prefix_matches_json_body() -> None:
    data = {
        "client_id": "worker-1",
        "hostname": "h\u00e9te",  # non-ASCII: the size counts bytes, not characters
        "feature_negotiation": True,
        "heartbeat_interval": 30000,
        "msg_timeout": 60000,
        "output_buffer_timeout": -1,
    }
    frame = commands.identify(data)
    assert frame.startswith(b"IDENTIFY\n")
    rest = frame[len(b"IDENTIFY\n") :]
    (size,) = struct.unpack(">I", rest[:4])
    assert size == len(rest) - 4
    assert json.loads(rest[4:].decode("utf-8")) == data


def test_identify_accepts_any_mapping_and_leaves_it_untouched() -> None:
    data = {"feature_negotiation": True}
    assert json.loads(commands.identify(data)[13:]) == {"feature_negotiation": True}
    assert data == {"feature_negotiation": True}


@pytest.mark.parametrize("secret", ["s3cret", b"s3cret"])
def test_auth_golden_bytes(secret: str | bytes) -> None:
    assert commands.auth(secret) == b"AUTH\n\x00\x00\x00\x06s3cret"


def test_auth_utf8_secret_size_counts_bytes() -> None:
    assert commands.auth("\u00e9") == b"AUTH\n\x00\x00\x00\x02\xc3\xa9"


@pytest.mark.parametrize("secret", ["", b""])
def test_auth_rejects_empty_secret(secret: str | bytes) -> None:
    with pytest.raises(LocalProtocolError, match="auth secret is empty"):
        commands.auth(secret)


def test_sub_golden_bytes() -> None:
    assert commands.sub("events", "archive") == b"SUB events archive\n"


def test_sub_accepts_ephemeral_names() -> None:
    assert commands.sub("events#ephemeral", "tail#ephemeral") == (
        b"SUB events#ephemeral tail#ephemeral\n"
    )


def test_pub_golden_bytes() -> None:
    assert commands.pub("test", b"hello") == b"PUB test\n\x00\x00\x00\x05hello"


@pytest.mark.parametrize(
    "body", [b"h\xc3\xa9llo", bytearray(b"h\xc3\xa9llo"), memoryview(b"h\xc3\xa9llo"), "h\u00e9llo"]
)
def test_pub_accepts_bytes_like_and_utf8_str(body: bytes | str) -> None:
    assert commands.pub("test", body) == b"PUB test\n\x00\x00\x00\x06h\xc3\xa9llo"


def test_pub_binary_body_is_sent_verbatim() -> None:
    body = bytes(range(256))
    frame = commands.pub("bin", body)
    assert frame == b"PUB bin\n\x00\x00\x01\x00" + body


def test_mpub_golden_bytes() -> None:
    # [body size = 4 + (4+1) + (4+2) = 15][count = 2][size 1]["a"][size 2]["bc"]
    assert commands.mpub("test", [b"a", b"bc"]) == (
        b"MPUB test\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"
    )


def test_mpub_sizes_and_count_for_a_larger_batch() -> None:
    bodies = [b"x" * n for n in (1, 10, 300, 70000)]
    frame = commands.mpub("batch", bodies)
    header, payload = frame.split(b"\n", 1)
    assert header == b"MPUB batch"
    (total,) = struct.unpack(">I", payload[:4])
    assert total == len(payload) - 4
    (count,) = struct.unpack(">I", payload[4:8])
    assert count == 4
    pos, seen = 8, []
    for _ in range(count):
        (size,) = struct.unpack(">I", payload[pos : pos + 4])
        seen.append(payload[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(payload)
    assert seen == bodies


def test_mpub_accepts_a_generator_and_str_bodies() -> None:
    frame = commands.mpub("test", (b for b in ["a", b"bc"]))
    assert frame == commands.mpub("test", [b"a", b"bc"])


@pytest.mark.parametrize(
    ("delay", "ms"),
    [
        (0, b"0"),
        (0.0, b"0"),
        (0.25, b"250"),
        (1.5, b"1500"),
        (2, b"2000"),
        (0.0014, b"1"),  # rounded to the nearest millisecond
        (0.0016, b"2"),
        (3600.0, b"3600000"),
    ],
)
def test_dpub_converts_float_seconds_to_milliseconds(delay: float, ms: bytes) -> None:
    assert commands.dpub("test", b"hi", delay) == b"DPUB test " + ms + b"\n\x00\x00\x00\x02hi"


@pytest.mark.parametrize(
    ("count", "line"), [(0, b"RDY 0\n"), (1, b"RDY 1\n"), (2500, b"RDY 2500\n")]
)
def test_rdy_golden_bytes(count: int, line: bytes) -> None:
    assert commands.rdy(count) == line


def test_rdy_accepts_the_int32_maximum() -> None:
    assert commands.rdy(2**31 - 1) == b"RDY 2147483647\n"


@pytest.mark.parametrize("msg_id", [MSG_ID, bytearray(MSG_ID)])
def test_fin_golden_bytes(msg_id: bytes) -> None:
    assert commands.fin(msg_id) == b"FIN 0a1b2c3d4e5f6789\n"


@pytest.mark.parametrize(
    ("delay", "ms"), [(0, b"0"), (0.1, b"100"), (2.5, b"2500"), (60, b"60000")]
)
def test_req_converts_seconds_to_milliseconds(delay: float, ms: bytes) -> None:
    assert commands.req(MSG_ID, delay) == b"REQ 0a1b2c3d4e5f6789 " + ms + b"\n"


def test_touch_golden_bytes() -> None:
    assert commands.touch(MSG_ID) == b"TOUCH 0a1b2c3d4e5f6789\n"


def test_cls_and_nop_golden_bytes() -> None:
    assert commands.cls() == b"CLS\n"
    assert commands.nop() == b"NOP\n"


# --------------------------------------------------------------------------- names


def test_name_of_64_chars_is_accepted() -> None:
    name = "a" * 64
    assert commands.pub(name, b"x").startswith(b"PUB " + name.encode() + b"\n")
    assert commands.sub(name, name) == b"SUB " + name.encode() + b" " + name.encode() + b"\n"


def test_name_of_65_chars_is_rejected_with_its_length() -> None:
    name = "a" * 65
    with pytest.raises(InvalidName, match=r"length 65, must be 1-64") as info:
        commands.pub(name, b"x")
    assert name in str(info.value)


def test_ephemeral_suffix_counts_towards_the_64_chars() -> None:
    ok = "a" * 54 + "#ephemeral"
    assert len(ok) == 64
    assert commands.sub(ok, ok).startswith(b"SUB " + ok.encode())
    with pytest.raises(InvalidName, match="length 65"):
        commands.sub("a" * 55 + "#ephemeral", "c")


def test_single_character_and_punctuation_names_are_valid() -> None:
    assert commands.sub("a", "b") == b"SUB a b\n"
    assert commands.sub("a.b-c_D9", "x.y") == b"SUB a.b-c_D9 x.y\n"


BAD_NAMES = [
    "bad!topic",
    "with space",
    "tab\tname",
    "line\nbreak",
    "trailing\n",  # Python's `$` would let this through and split the command line
    "h\u00e9",
    "#ephemeral",  # the suffix alone is not a name
    "x#ephemeral#ephemeral",
    "x#other",
    "x#",
    "slash/name",
    "colon:name",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_topic_is_rejected_naming_the_topic(name: str) -> None:
    for encode in (
        lambda: commands.pub(name, b"x"),
        lambda: commands.mpub(name, [b"x"]),
        lambda: commands.dpub(name, b"x", 1.0),
        lambda: commands.sub(name, "channel"),
    ):
        with pytest.raises(InvalidName) as info:
            encode()
        message = str(info.value)
        assert "topic" in message
        assert repr(name) in message


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_channel_is_rejected_naming_the_channel(name: str) -> None:
    with pytest.raises(InvalidName, match=r"invalid channel name") as info:
        commands.sub("topic", name)
    assert repr(name) in str(info.value)


def test_empty_names_are_rejected() -> None:
    with pytest.raises(InvalidName, match=r"invalid topic name '': length 0"):
        commands.pub("", b"x")
    with pytest.raises(InvalidName, match=r"invalid channel name '': length 0"):
        commands.sub("topic", "")


@pytest.mark.parametrize("name", [None, 42, 1.5, ["topic"]])
def test_non_string_names_are_rejected(name: object) -> None:
    with pytest.raises(InvalidName, match="expected str"):
        commands.pub(name, b"x")  # type: ignore[arg-type]


def test_validators_return_str_and_accept_ascii_bytes() -> None:
    assert validate_topic("events") == "events"
    assert validate_topic(b"events") == "events"
    assert validate_channel(b"c#ephemeral") == "c#ephemeral"
    with pytest.raises(InvalidName, match="not ASCII"):
        validate_topic(b"\xff\xfe")


def test_name_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        commands.pub("bad topic", b"x")
    assert issubclass(InvalidName, NSQError)


# --------------------------------------------------------------------------- bodies


@pytest.mark.parametrize("body", [b"", "", bytearray(), memoryview(b"")])
def test_empty_body_is_rejected(body: object) -> None:
    with pytest.raises(InvalidBody, match="message body is empty"):
        commands.pub("test", body)  # type: ignore[arg-type]
    with pytest.raises(InvalidBody, match="message body is empty"):
        commands.dpub("test", body, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [None, 42, 1.5, [b"x"], {"a": 1}])
def test_non_bytes_body_is_rejected_naming_the_type(body: object) -> None:
    with pytest.raises(InvalidBody, match=f"must be bytes or str, got {type(body).__name__}"):
        commands.pub("test", body)  # type: ignore[arg-type]


@pytest.mark.parametrize("bodies", [[], (), iter([])])
def test_mpub_without_messages_is_rejected(bodies: object) -> None:
    with pytest.raises(InvalidBody, match="MPUB needs at least one message"):
        commands.mpub("test", bodies)  # type: ignore[arg-type]


def test_mpub_names_the_empty_message_in_the_batch() -> None:
    with pytest.raises(InvalidBody, match=r"message body \(message 1\) is empty"):
        commands.mpub("test", [b"ok", b"", b"ok"])


def test_mpub_names_the_message_of_the_wrong_type() -> None:
    with pytest.raises(InvalidBody, match=r"\(message 2\) must be bytes or str, got int"):
        commands.mpub("test", [b"a", b"b", 3])  # type: ignore[list-item]


@pytest.mark.parametrize("single", [b"abc", "abc", bytearray(b"abc"), memoryview(b"abc")])
def test_mpub_rejects_a_single_body_instead_of_a_batch(single: object) -> None:
    # Iterating b"abc" would publish three one-byte messages (or fail on ints): refuse instead.
    with pytest.raises(InvalidBody, match="sequence of bodies, not a single body"):
        commands.mpub("test", single)  # type: ignore[arg-type]


def test_body_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        commands.pub("test", b"")


# --------------------------------------------------------------------------- delays, counts, ids


@pytest.mark.parametrize("delay", [-1, -0.001, float("nan"), float("inf"), float("-inf")])
def test_dpub_rejects_negative_or_non_finite_delays(delay: float) -> None:
    with pytest.raises(ConfigError, match="delay") as info:
        commands.dpub("test", b"x", delay)
    assert repr(delay) in str(info.value)


@pytest.mark.parametrize("delay", [-1, -0.5, float("nan"), float("inf")])
def test_req_rejects_negative_or_non_finite_delays(delay: float) -> None:
    with pytest.raises(ConfigError, match="requeue delay") as info:
        commands.req(MSG_ID, delay)
    assert repr(delay) in str(info.value)


@pytest.mark.parametrize("delay", ["5", None, True, b"1"])
def test_delays_must_be_numbers_of_seconds(delay: object) -> None:
    with pytest.raises(ConfigError, match="must be a number of seconds"):
        commands.dpub("test", b"x", delay)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a number of seconds"):
        commands.req(MSG_ID, delay)  # type: ignore[arg-type]


def test_delays_that_overflow_int32_milliseconds_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"at most 2147483\.647 s, got 3000000\.0"):
        commands.dpub("test", b"x", 3_000_000.0)
    with pytest.raises(ConfigError, match="at most"):
        commands.req(MSG_ID, 3_000_000)


@pytest.mark.parametrize("count", [-1, 2**31, 1.5, True, "10", None])
def test_rdy_rejects_bad_counts(count: object) -> None:
    with pytest.raises(
        LocalProtocolError, match=re.escape(f"RDY count must be an int >= 0, got {count!r}")
    ):
        commands.rdy(count)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "msg_id", [b"", b"0a1b2c3d4e5f678", b"0a1b2c3d4e5f67890", "0a1b2c3d4e5f6789", None, 16]
)
def test_message_ids_must_be_16_bytes(msg_id: object) -> None:
    for encode in (
        lambda: commands.fin(msg_id),  # type: ignore[arg-type]
        lambda: commands.req(msg_id, 0),  # type: ignore[arg-type]
        lambda: commands.touch(msg_id),  # type: ignore[arg-type]
    ):
        with pytest.raises(LocalProtocolError, match="message id must be 16 alphanumeric") as info:
            encode()
        assert repr(msg_id) in str(info.value)


@pytest.mark.parametrize(
    "msg_id", [b"0a1b2c3d4e5f678\n", b"0a1b 2c3d4e5f678", b"0a1b2c3d4e5f67\xff\x00"]
)
def test_message_ids_with_separators_are_rejected(msg_id: bytes) -> None:
    # a space or newline inside an id would split the command on the wire
    for encode in (commands.fin, commands.touch, lambda i: commands.req(i, 0)):
        with pytest.raises(LocalProtocolError, match="message id must be 16 alphanumeric"):
            encode(msg_id)


def test_validation_happens_before_any_bytes_are_built() -> None:
    # A bad name wins over a bad body: the first problem the user has to fix is reported.
    with pytest.raises(InvalidName):
        commands.pub("bad topic", b"")
