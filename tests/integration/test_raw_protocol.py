"""The sans-IO protocol layer against a real nsqd, over a plain blocking socket.

Only :mod:`nsq_sync.protocol` builds and parses the bytes, so these tests check the encoders and
the decoder against the server itself, independently of the connection/consumer machinery.
Every read has a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from support.nsq import wait_for

from nsq_sync.errors import (
    RemoteProtocolError,
    ServerBadMessage,
    ServerBadTopic,
    ServerError,
    ServerFinFailed,
    ServerInvalid,
)
from nsq_sync.protocol import (
    EOF,
    NEED_DATA,
    ErrorFrame,
    FrameDecoder,
    Heartbeat,
    MessageFrame,
    Response,
    commands,
)

pytestmark = pytest.mark.integration

TIMEOUT = 10.0


class RawConnection:
    """A blocking loopback socket plus a FrameDecoder: send bytes, read the next event."""

    def __init__(self, address: str, timeout: float = TIMEOUT) -> None:
        host, port = address.rsplit(":", 1)
        assert host in ("127.0.0.1", "localhost", "::1"), "integration tests stay on loopback"
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.decoder = FrameDecoder()
        self.closed_by_peer = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def handshake(self, **identify: Any) -> dict[str, Any] | None:
        """Send the magic and IDENTIFY; return the negotiated features (None for a bare OK)."""
        self.send(commands.magic() + commands.identify(identify))
        data = self.response()
        return None if data == b"OK" else json.loads(data)

    def next_event(self, timeout: float = TIMEOUT) -> object:
        """The next event, or EOF once nsqd closed the connection. Fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.decoder.next_event()
            if event is not NEED_DATA:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no frame from nsqd within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue  # the deadline check above reports it
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed_by_peer = True
            self.decoder.receive_data(data)

    def next_non_heartbeat(self, timeout: float = TIMEOUT) -> object:
        """The next event that is not a heartbeat (heartbeats are answered with NOP)."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(max(deadline - time.monotonic(), 0.001))
            if not isinstance(event, Heartbeat):
                return event
            self.send(commands.nop())

    def response(self, timeout: float = TIMEOUT) -> bytes:
        event = self.next_non_heartbeat(timeout)
        assert isinstance(event, Response), f"expected a response, got {event!r}"
        return event.data

    def message(self, timeout: float = TIMEOUT) -> MessageFrame:
        event = self.next_non_heartbeat(timeout)
        assert isinstance(event, MessageFrame), f"expected a message, got {event!r}"
        return event

    def error(self, timeout: float = TIMEOUT) -> ErrorFrame:
        event = self.next_non_heartbeat(timeout)
        assert isinstance(event, ErrorFrame), f"expected an error frame, got {event!r}"
        return event

    def expect_closed(self, timeout: float = TIMEOUT) -> None:
        assert self.next_non_heartbeat(timeout) is EOF
        assert self.closed_by_peer

    def close(self) -> None:
        self.sock.close()


Connect = Callable[..., RawConnection]


@pytest.fixture
def connect(nsqd: Any) -> Iterator[Connect]:
    """``connect(address=nsqd.tcp_address)`` opens a RawConnection, closed after the test."""
    opened: list[RawConnection] = []

    def _connect(address: str | None = None) -> RawConnection:
        conn = RawConnection(address or nsqd.tcp_address)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


def _stats(http_url: str, topic: str) -> dict[str, Any]:
    resp = requests.get(
        f"{http_url}/stats", params={"format": "json", "topic": topic}, timeout=TIMEOUT
    )
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body.get("data", body)  # nsqd < 1.0 wrapped responses in {"data": ...}


def _topic_stats(http_url: str, topic: str) -> dict[str, Any] | None:
    for t in _stats(http_url, topic).get("topics") or []:
        if t["topic_name"] == topic:
            return dict(t)
    return None


def _channel_stats(http_url: str, topic: str, channel: str) -> dict[str, Any] | None:
    t = _topic_stats(http_url, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return dict(c)
    return None


def _subscribe(connect: Connect, topic: str, channel: str, rdy: int) -> RawConnection:
    conn = connect()
    assert conn.handshake(feature_negotiation=True) is not None
    conn.send(commands.sub(topic, channel))
    assert conn.response() == b"OK"
    conn.send(commands.rdy(rdy))
    return conn


def _publish(connect: Connect, topic: str, *bodies: bytes) -> None:
    conn = connect()
    conn.handshake()
    for body in bodies:
        conn.send(commands.pub(topic, body))
        assert conn.response() == b"OK"


# --------------------------------------------------------------------------- handshake


def test_magic_and_plain_identify(connect: Connect) -> None:
    conn = connect()
    assert conn.handshake(client_id="raw-test") is None  # no feature negotiation: bare OK


def test_wrong_magic_is_refused(connect: Connect) -> None:
    conn = connect()
    conn.send(b"  V1")
    err = conn.error()
    assert err.code == "E_BAD_PROTOCOL"
    exc = err.to_exception()
    assert type(exc) is ServerError  # a code the client has no class for keeps its code
    assert exc.code == "E_BAD_PROTOCOL"
    conn.expect_closed()


def test_identify_feature_negotiation(connect: Connect) -> None:
    conn = connect()
    features = conn.handshake(
        client_id="raw-test",
        hostname="localhost",
        user_agent="nsq_sync-tests/0",
        feature_negotiation=True,
        heartbeat_interval=15000,
        msg_timeout=30000,
    )
    assert features is not None
    assert features["version"] == "1.3.0"
    assert features["max_rdy_count"] == 2500
    assert features["msg_timeout"] == 30000
    assert features["max_msg_timeout"] >= 30000
    assert features["auth_required"] is False
    assert features["tls_v1"] is False
    assert features["snappy"] is False
    assert features["deflate"] is False
    assert {"deflate_level", "max_deflate_level", "sample_rate", "output_buffer_size"} <= set(
        features
    )


def test_identify_reports_a_lowered_max_rdy_count(nsqd_factory: Any, connect: Connect) -> None:
    server = nsqd_factory("--max-rdy-count=10")
    conn = connect(server.tcp_address)
    features = conn.handshake(feature_negotiation=True)
    assert features is not None
    assert features["max_rdy_count"] == 10


def test_http_port_is_detected(nsqd: Any, connect: Connect) -> None:
    # A user who gives the HTTP port gets a clear error instead of a hang or a huge allocation.
    http_address = nsqd.http_url.split("://", 1)[1]
    conn = connect(http_address)
    conn.send(commands.magic() + commands.identify({"feature_negotiation": True}))
    with pytest.raises(RemoteProtocolError, match="HTTP port") as info:
        conn.next_event()
    assert "TCP port" in str(info.value)


# --------------------------------------------------------------------------- publishing


def test_pub(nsqd: Any, connect: Connect, nsq_topic: str) -> None:
    conn = connect()
    conn.handshake()
    conn.send(commands.pub(nsq_topic, b"hello"))
    assert conn.response() == b"OK"
    stats = _topic_stats(nsqd.http_url, nsq_topic)
    assert stats is not None
    assert stats["message_count"] == 1


def test_mpub(nsqd: Any, connect: Connect, nsq_topic: str) -> None:
    conn = connect()
    conn.handshake()
    conn.send(commands.mpub(nsq_topic, [b"one", b"two", "thr\u00e9e"]))
    assert conn.response() == b"OK"
    stats = _topic_stats(nsqd.http_url, nsq_topic)
    assert stats is not None
    assert stats["message_count"] == 3


def test_dpub_is_deferred_on_the_channel(nsqd: Any, connect: Connect, nsq_topic: str) -> None:
    # The channel must exist before DPUB: a topic without channels keeps no deferred queue.
    for path, params in (
        ("/topic/create", {"topic": nsq_topic}),
        ("/channel/create", {"topic": nsq_topic, "channel": "deferred"}),
    ):
        requests.post(f"{nsqd.http_url}{path}", params=params, timeout=TIMEOUT).raise_for_status()
    conn = connect()
    conn.handshake()
    conn.send(commands.dpub(nsq_topic, b"later", 60.0))
    assert conn.response() == b"OK"

    def deferred() -> bool:
        channel = _channel_stats(nsqd.http_url, nsq_topic, "deferred")
        return channel is not None and channel["deferred_count"] == 1

    wait_for(deferred, "deferred_count 1 on the channel")
    channel = _channel_stats(nsqd.http_url, nsq_topic, "deferred")
    assert channel is not None
    assert channel["depth"] == 0  # not deliverable yet


def test_pub_over_max_msg_size_is_bad_message(
    nsqd_factory: Any, connect: Connect, nsq_topic: str
) -> None:
    server = nsqd_factory("--max-msg-size=64")
    conn = connect(server.tcp_address)
    conn.handshake()
    conn.send(commands.pub(nsq_topic, b"x" * 65))
    exc = conn.error().to_exception()
    assert isinstance(exc, ServerBadMessage)
    assert exc.fatal
    conn.expect_closed()


# --------------------------------------------------------------------------- consuming


def test_sub_rdy_delivers_messages(connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=10)
    bodies = [b"first", b"second\x00binary", "\u00fcnicode".encode()]
    before = time.time_ns()
    _publish(connect, nsq_topic, *bodies)
    received = [consumer.message() for _ in bodies]
    assert sorted(m.body for m in received) == sorted(bodies)
    for msg in received:
        assert msg.attempts == 1
        assert len(msg.id) == 16
        int(msg.id, 16)  # nsqd ids are hex
        assert before - 5_000_000_000 <= msg.timestamp <= time.time_ns() + 5_000_000_000
    assert len({m.id for m in received}) == 3


def test_rdy_zero_holds_messages_until_raised(nsqd: Any, connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=0)
    _publish(connect, nsq_topic, b"held")

    def queued() -> bool:
        channel = _channel_stats(nsqd.http_url, nsq_topic, "ch")
        return channel is not None and channel["depth"] == 1

    wait_for(queued, "the message to reach the channel")
    channel = _channel_stats(nsqd.http_url, nsq_topic, "ch")
    assert channel is not None
    assert channel["in_flight_count"] == 0  # RDY 0: nothing sent
    consumer.send(commands.rdy(1))
    assert consumer.message().body == b"held"


def test_fin(nsqd: Any, connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=1)
    _publish(connect, nsq_topic, b"done")
    msg = consumer.message()
    consumer.send(commands.fin(msg.id))
    # nsqd handles commands in order: an error for FIN would arrive before CLOSE_WAIT.
    consumer.send(commands.cls())
    assert consumer.response() == b"CLOSE_WAIT"

    def finished() -> bool:
        channel = _channel_stats(nsqd.http_url, nsq_topic, "ch")
        return channel is not None and channel["in_flight_count"] == 0 and channel["depth"] == 0

    wait_for(finished, "the message to leave in-flight")


def test_second_fin_fails_without_closing(connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=1)
    _publish(connect, nsq_topic, b"once")
    msg = consumer.message()
    consumer.send(commands.fin(msg.id))
    consumer.send(commands.fin(msg.id))
    exc = consumer.error().to_exception()
    assert isinstance(exc, ServerFinFailed)
    assert exc.fatal is False
    consumer.send(commands.cls())
    assert consumer.response() == b"CLOSE_WAIT"  # still open


def test_req_redelivers_with_attempts_2(connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=1)
    _publish(connect, nsq_topic, b"again")
    first = consumer.message()
    assert first.attempts == 1
    consumer.send(commands.req(first.id, 0))
    second = consumer.message()
    assert second.id == first.id
    assert second.body == b"again"
    assert second.attempts == 2
    consumer.send(commands.fin(second.id))


def test_touch(connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=1)
    _publish(connect, nsq_topic, b"slow")
    msg = consumer.message()
    consumer.send(commands.touch(msg.id) + commands.touch(msg.id) + commands.fin(msg.id))
    consumer.send(commands.cls())
    assert consumer.response() == b"CLOSE_WAIT"  # no error frame came before it


def test_cls(connect: Connect, nsq_topic: str) -> None:
    consumer = _subscribe(connect, nsq_topic, "ch", rdy=0)
    consumer.send(commands.cls())
    assert consumer.response() == b"CLOSE_WAIT"


# --------------------------------------------------------------------------- heartbeats


def test_heartbeats_answered_with_nop_keep_the_connection(connect: Connect, nsq_topic: str) -> None:
    conn = connect()
    features = conn.handshake(feature_negotiation=True, heartbeat_interval=1000)
    assert features is not None
    start = time.monotonic()
    for _ in range(3):
        assert isinstance(conn.next_event(timeout=5.0), Heartbeat)
        conn.send(commands.nop())
    assert time.monotonic() - start >= 2.0  # three heartbeats one second apart
    conn.send(commands.pub(nsq_topic, b"still here"))
    assert conn.response() == b"OK"


# --------------------------------------------------------------------------- error frames


def test_pub_to_a_bad_topic_name_is_fatal(connect: Connect) -> None:
    conn = connect()
    conn.handshake()
    # Raw bytes: the encoder would refuse this name before it reached nsqd.
    conn.send(b"PUB bad!topic\n" + struct.pack(">I", 5) + b"hello")
    err = conn.error()
    assert err.code == "E_BAD_TOPIC"
    exc = err.to_exception()
    assert isinstance(exc, ServerBadTopic)
    assert exc.fatal
    assert "bad!topic" in exc.text
    conn.expect_closed()


def test_invalid_command(connect: Connect) -> None:
    conn = connect()
    conn.handshake()
    conn.send(b"FOO\n")
    err = conn.error()
    assert err.code == "E_INVALID"
    exc = err.to_exception()
    assert isinstance(exc, ServerInvalid)
    assert "FOO" in exc.text
    conn.expect_closed()


def test_cls_before_sub_is_invalid(connect: Connect) -> None:
    conn = connect()
    conn.handshake()
    conn.send(commands.cls())
    assert isinstance(conn.error().to_exception(), ServerInvalid)
