"""Bad input, case by case: the exact exception class, a check of its message, and proof that
nothing reached nsqd when the input could be rejected locally.

Local rejections (names, bodies, options, addresses) run against the shared nsqd: after each
case its ``/stats`` must list no new topic, and the producer must never have connected.
Server-side rejections (an HTTP port given as the TCP port, a certificate that does not verify,
a wrong AUTH secret, an auth server that is down) run against nsqds started for the case: the
Producer raises, the Consumer logs and keeps retrying (asserted on its log records).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.auth_server import AuthServer, grant
from support.certs import Pki, make_pki
from support.nsq import connected_addresses, free_closed_port, message_count

from nsq_sync import Config, Consumer, NsqdHTTPClient, Producer
from nsq_sync.errors import (
    ConfigError,
    InvalidBody,
    InvalidName,
    PublishError,
    RemoteProtocolError,
    ServerAuthFailed,
    ServerUnauthorized,
    TLSError,
)
from nsq_sync.testing import NsqdProcess

from .helpers import CHANNEL, wait_for

pytestmark = pytest.mark.integration

MAX_MSG = 1024 * 1024  # Config's default max_msg_size
MAX_BODY = 5 * 1024 * 1024  # Config's default max_body_size


def _handler(message: Any) -> None:
    pass


# --------------------------------------------------------------------------- local: publish

# (id, call(producer, topic), error class, message regex)
PUBLISH_CASES: list[tuple[str, Callable[[Producer, str], Any], type[Exception], str]] = [
    (
        "topic with a space",
        lambda p, t: p.publish("bad topic", b"x"),
        InvalidName,
        r"^invalid topic name 'bad topic': only \[\.a-zA-Z0-9_-\] allowed",
    ),
    (
        "empty topic",
        lambda p, t: p.publish("", b"x"),
        InvalidName,
        r"^invalid topic name '': length 0, must be 1-64$",
    ),
    (
        "topic of 65 characters",
        lambda p, t: p.publish("t" * 65, b"x"),
        InvalidName,
        r"length 65, must be 1-64$",
    ),
    (
        "topic with a newline",
        lambda p, t: p.publish("topic\n", b"x"),
        InvalidName,
        r"^invalid topic name 'topic\\n': only",
    ),
    (
        "topic with two #ephemeral",
        lambda p, t: p.publish("t#ephemeral#ephemeral", b"x"),
        InvalidName,
        r"optional '#ephemeral' suffix$",
    ),
    (
        "topic not ASCII",
        lambda p, t: p.publish(b"caf\xe9", b"x"),
        InvalidName,
        r"^invalid topic name b'caf\\xe9': not ASCII$",
    ),
    (
        "topic not a string",
        lambda p, t: p.publish(42, b"x"),  # type: ignore[arg-type]
        InvalidName,
        r"^invalid topic name 42: expected str, got int$",
    ),
    (
        "empty body",
        lambda p, t: p.publish(t, b""),
        InvalidBody,
        r"^message body is empty; nsqd rejects empty messages$",
    ),
    (
        "body one byte over max_msg_size",
        lambda p, t: p.publish(t, b"x" * (MAX_MSG + 1)),
        InvalidBody,
        rf"^message body of {MAX_MSG + 1} bytes exceeds max_msg_size {MAX_MSG}$",
    ),
    (
        "body not bytes",
        lambda p, t: p.publish(t, 123),  # type: ignore[arg-type]
        InvalidBody,
        r"^message body must be bytes or str, got int$",
    ),
    (
        "MPUB of nothing",
        lambda p, t: p.multi_publish(t, []),
        InvalidBody,
        r"^MPUB needs at least one message$",
    ),
    (
        "MPUB with an empty body",
        lambda p, t: p.multi_publish(t, [b"a", b""]),
        InvalidBody,
        r"^message body \(message 1\) is empty",
    ),
    (
        "MPUB over max_body_size",
        lambda p, t: p.multi_publish(t, [b"x" * MAX_MSG] * 6),
        InvalidBody,
        rf"^MPUB batch of \d+ bytes exceeds max_body_size {MAX_BODY}$",
    ),
    (
        "DPUB negative delay",
        lambda p, t: p.deferred_publish(t, b"x", -1),
        ConfigError,
        r"^delay must be between 0 and max_defer \(3600\.0 s\), got -1$",
    ),
    (
        "DPUB NaN delay",
        lambda p, t: p.deferred_publish(t, b"x", math.nan),
        ConfigError,
        r"got nan$",
    ),
    (
        "DPUB delay over max_defer",
        lambda p, t: p.deferred_publish(t, b"x", 3601),
        ConfigError,
        r"got 3601$",
    ),
]


def _topics(nsqd: NsqdProcess) -> set[str]:
    with NsqdHTTPClient(nsqd.http_url) as client:
        return {t["topic_name"] for t in client.stats(include_clients=False).get("topics") or []}


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [case[1:] for case in PUBLISH_CASES],
    ids=[case[0] for case in PUBLISH_CASES],
)
def test_publish_rejects_locally(
    nsqd: NsqdProcess,
    nsq_topic: str,
    call: Callable[[Producer, str], Any],
    error: type[Exception],
    pattern: str,
) -> None:
    before = _topics(nsqd)
    with Producer(nsqd.tcp_address) as producer:
        with pytest.raises(error) as info:
            call(producer, nsq_topic)
        assert type(info.value) is error
        assert re.search(pattern, str(info.value)), str(info.value)
        assert all(slot.conn is None for slot in producer._slots), "it connected to nsqd"
    assert _topics(nsqd) == before, "a topic was created: something reached nsqd"


# --------------------------------------------------------------------------- local: construction

A = "127.0.0.1:4150"  # never dialled: construction does no I/O

# (id, build(), error class, message regex)
CONSTRUCTION_CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "channel with a slash",
        lambda: Consumer("t", "bad/channel", _handler, nsqd_tcp_addresses=A),
        InvalidName,
        r"^invalid channel name 'bad/channel': only",
    ),
    (
        "channel of 65 characters",
        lambda: Consumer("t", "c" * 65, _handler, nsqd_tcp_addresses=A),
        InvalidName,
        r"^invalid channel name 'c{65}': length 65, must be 1-64$",
    ),
    (
        "consumer topic invalid",
        lambda: Consumer("a b", "c", _handler, nsqd_tcp_addresses=A),
        InvalidName,
        r"^invalid topic name 'a b'",
    ),
    (
        "concurrency=0",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, concurrency=0),
        ConfigError,
        r"^concurrency must be an int >= 1, got 0$",
    ),
    (
        "concurrency=True",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, concurrency=True),
        ConfigError,
        r"^concurrency must be an int >= 1, got True$",
    ),
    (
        "max_in_flight=-1",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, max_in_flight=-1),
        ConfigError,
        r"^max_in_flight=-1 is out of range \[0, 2147483647\]$",
    ),
    (
        "max_attempts=-1",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, max_attempts=-1),
        ConfigError,
        r"^max_attempts=-1 is out of range \[0, 65535\]$",
    ),
    (
        "heartbeat_interval not below read_timeout",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, heartbeat_interval=60),
        ConfigError,
        r"^heartbeat_interval \(60\.0\) must be less than read_timeout \(60\.0\)",
    ),
    (
        "lookupd_poll_jitter=1.5",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, lookupd_poll_jitter=1.5),
        ConfigError,
        r"^lookupd_poll_jitter=1\.5 is out of range \[0\.0, 1\.0\]$",
    ),
    (
        "read_timeout not a duration",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, read_timeout="soon"),
        ConfigError,
        r"^read_timeout: expected seconds or a duration like '250ms', '5s', got 'soon'$",
    ),
    (
        "unknown option",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, max_in_fligth=3),
        ConfigError,
        r"^unknown option\(s\): max_in_fligth$",
    ),
    (
        "handler not callable",
        lambda: Consumer("t", "c", "handler", nsqd_tcp_addresses=A),  # type: ignore[arg-type]
        ConfigError,
        r"^handler must be callable, got 'handler'$",
    ),
    (
        "unknown runtime",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=A, runtime="asyncio"),
        ConfigError,
        r"^runtime must be 'auto', 'threads' or 'gevent', got 'asyncio'$",
    ),
    (
        "no address at all",
        lambda: Consumer("t", "c", _handler),
        ConfigError,
        r"^Consumer needs nsqd_tcp_addresses and/or lookupd_http_addresses$",
    ),
    (
        "nsqd address is a URL",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses="http://127.0.0.1:4150"),
        ConfigError,
        r"^invalid nsqd TCP address 'http://127\.0\.0\.1:4150': expected 'host:port', not a URL$",
    ),
    (
        "nsqd address without port",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=["127.0.0.1"]),
        ConfigError,
        r"^invalid nsqd TCP address '127\.0\.0\.1': missing port \(expected 'host:port'\)$",
    ),
    (
        "nsqd port 0",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses="127.0.0.1:0"),
        ConfigError,
        r"^invalid nsqd TCP address '127\.0\.0\.1:0': port 0 is out of range 1-65535$",
    ),
    (
        "nsqd port out of range",
        lambda: Producer("127.0.0.1:70000"),
        ConfigError,
        r"^invalid nsqd TCP address '127\.0\.0\.1:70000': port 70000 is out of range 1-65535$",
    ),
    (
        "nsqd IPv6 address without brackets",
        lambda: Producer("::1:4150"),
        ConfigError,
        r"^invalid nsqd TCP address '::1:4150': IPv6 addresses must be bracketed, as in "
        r"'\[::1\]:4150'$",
    ),
    (
        "nsqd address is a bare port number (consumer)",
        lambda: Consumer("t", "c", _handler, nsqd_tcp_addresses=4150),  # type: ignore[arg-type]
        ConfigError,
        r"^nsqd_tcp_addresses must be 'host:port' or a list of them, got 4150$",
    ),
    (
        "nsqd address is a bare port number (producer)",
        lambda: Producer(4150),  # type: ignore[arg-type]
        ConfigError,
        r"^nsqd_tcp_addresses must be 'host:port' or a list of them, got 4150$",
    ),
    (
        "producer without addresses",
        lambda: Producer([]),
        ConfigError,
        r"^Producer needs at least one nsqd TCP address$",
    ),
    (
        "lookupd with an ftp scheme",
        lambda: Consumer("t", "c", _handler, lookupd_http_addresses="ftp://127.0.0.1:4161"),
        ConfigError,
        r"^invalid HTTP address 'ftp://127\.0\.0\.1:4161': scheme must be http or https",
    ),
    (
        "lookupd without port",
        lambda: Consumer("t", "c", _handler, lookupd_http_addresses=["127.0.0.1"]),
        ConfigError,
        r"^invalid HTTP address '127\.0\.0\.1': missing port",
    ),
    (
        "lookupd with a path",
        lambda: Consumer(
            "t", "c", _handler, lookupd_http_addresses="http://127.0.0.1:4161/lookup?topic=t"
        ),
        ConfigError,
        r"without a path$",
    ),
    (
        "lookupd port out of range",
        lambda: Consumer("t", "c", _handler, lookupd_http_addresses="127.0.0.1:99999"),
        ConfigError,
        r"port 99999 is out of range 1-65535$",
    ),
    (
        "lookupd address is a bare port number",
        lambda: Consumer("t", "c", _handler, lookupd_http_addresses=4161),  # type: ignore[arg-type]
        ConfigError,
        r"^lookupd_http_addresses must be 'host:port' or a list of them, got 4161$",
    ),
    (
        "Config tls_cert without tls_key",
        lambda: Config(tls_cert="client.pem"),
        ConfigError,
        r"^tls_cert and tls_key must be given together$",
    ),
    (
        "Config snappy and deflate",
        lambda: Config(snappy=True, deflate=True),
        ConfigError,
        r"^snappy and deflate cannot both be enabled$",
    ),
    (
        "Config dial_timeout=0",
        lambda: Config(dial_timeout=0),
        ConfigError,
        r"^dial_timeout=0 is out of range \[0\.01, 300\.0\]$",
    ),
]


@pytest.mark.parametrize(
    ("build", "error", "pattern"),
    [case[1:] for case in CONSTRUCTION_CASES],
    ids=[case[0] for case in CONSTRUCTION_CASES],
)
def test_construction_rejects(
    build: Callable[[], Any], error: type[Exception], pattern: str
) -> None:
    """Construction does no I/O: these fail before any socket exists (nothing to check on an
    nsqd; the addresses are never dialled)."""
    with pytest.raises(error) as info:
        build()
    assert type(info.value) is error
    assert re.search(pattern, str(info.value)), str(info.value)


def test_invalid_consumer_sends_nothing(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """A consumer rejected at construction never subscribes: nsqd has no topic or channel."""
    before = _topics(nsqd)
    with pytest.raises(ConfigError):
        Consumer(nsq_topic, CHANNEL, _handler, nsqd_tcp_addresses=nsqd.tcp_address, concurrency=0)
    with pytest.raises(InvalidName):
        Consumer(nsq_topic, "bad channel", _handler, nsqd_tcp_addresses=nsqd.tcp_address)
    assert _topics(nsqd) == before


# --------------------------------------------------------------------------- server-side


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    with AuthServer({"good": grant(), "wrong": (403, "unknown secret")}) as server:
        yield server


def _nsqd_for(case: str, nsqd_factory: Any, pki: Pki, auth: AuthServer) -> NsqdProcess:
    if case == "tls certificate does not verify":
        return nsqd_factory(
            f"--tls-cert={pki.self_signed_cert}", f"--tls-key={pki.self_signed_key}"
        )
    if case == "auth server down":
        return nsqd_factory(f"--auth-http-address=127.0.0.1:{free_closed_port()}")
    if case in ("wrong auth secret", "auth secret without permission"):
        return nsqd_factory(f"--auth-http-address={auth.address}")
    return nsqd_factory()


# (case, client options, address kind, publish error, publish reason class or None, regex,
#  consumer log regex)
SERVER_CASES: list[tuple[str, dict[str, Any], str, type[Exception], Any, str, str]] = [
    (
        "http port given as tcp port",
        {},
        "http",
        PublishError,
        RemoteProtocolError,
        r"this looks like nsqd's HTTP port, not its TCP port",
        r"cannot subscribe on nsqd .*: received an HTTP response: this looks like nsqd's HTTP "
        r"port.*configuration error",
    ),
    (
        "tls certificate does not verify",
        {"tls_v1": True},
        "tcp",
        PublishError,
        TLSError,
        r"TLS certificate did not verify: self[- ]signed certificate",
        r"cannot subscribe on nsqd .*: TLS certificate did not verify.*configuration error",
    ),
    (
        "wrong auth secret",
        {"auth_secret": "wrong"},
        "tcp",
        PublishError,
        ServerAuthFailed,
        r"E_AUTH_FAILED",
        r"cannot connect to nsqd .*: E_AUTH_FAILED",
    ),
    (
        "auth secret without permission",
        {"auth_secret": "no-such-grant"},
        "tcp",
        ServerUnauthorized,
        None,
        r"^E_UNAUTHORIZED ",
        r"cannot subscribe on nsqd .*: E_UNAUTHORIZED .*configuration error",
    ),
    (
        "auth server down",
        {"auth_secret": "good"},
        "tcp",
        PublishError,
        ServerAuthFailed,
        r"E_AUTH_FAILED",
        r"cannot connect to nsqd .*: E_AUTH_FAILED",
    ),
]


@pytest.mark.parametrize(
    ("case", "options", "kind", "error", "reason", "pattern", "log_pattern"),
    SERVER_CASES,
    ids=[case[0] for case in SERVER_CASES],
)
def test_server_side_rejection(
    nsqd_factory: Any,
    pki: Pki,
    auth_server: AuthServer,
    nsq_topic: str,
    caplog: pytest.LogCaptureFixture,
    case: str,
    options: dict[str, Any],
    kind: str,
    error: type[Exception],
    reason: Any,
    pattern: str,
    log_pattern: str,
) -> None:
    server = _nsqd_for(case, nsqd_factory, pki, auth_server)
    address = server.http_address if kind == "http" else server.tcp_address

    # Producer: raises, within publish_timeout (configuration errors: at once).
    publish_timeout = 2.0
    with Producer(address, publish_timeout=publish_timeout, **options) as producer:
        t0 = time.monotonic()
        with pytest.raises(error) as info:
            producer.publish(nsq_topic, b"never")
        took = time.monotonic() - t0
    assert type(info.value) is error
    if reason is not None:
        assert type(info.value.reason) is reason, info.value.reason  # type: ignore[attr-defined]
    assert re.search(pattern, str(info.value)), str(info.value)
    assert took < publish_timeout + 1.0, f"publish took {took:.1f} s"

    # Consumer: logs the failure and keeps retrying (a configuration error at ERROR every time,
    # any other failure at WARNING once, then at DEBUG: issue 39)
    caplog.set_level(logging.DEBUG, logger="nsq_sync")
    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        _handler,
        nsqd_tcp_addresses=address,
        reconnect_backoff_max=0.3,  # what a configuration error waits between retries
        **options,
    )
    consumer.start()
    try:

        def failures() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name.startswith("nsq_sync") and re.search(log_pattern, r.getMessage())
            ]

        wait_for(lambda: len(failures()) >= 2, f"two logged attempts matching {log_pattern!r}")
        warned = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and re.search(log_pattern, r.getMessage())
        ]
        assert warned, "the first failure is a WARNING or an ERROR"
        assert connected_addresses(consumer) == []
        assert consumer.wait_connected(0) is False
    finally:
        assert consumer.stop(timeout=5.0) is True
    assert message_count(server.http_address, nsq_topic) == 0
