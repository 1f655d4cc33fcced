"""Unit tests of the HTTP clients' pure parts: addresses, timeouts, lookupd answers, input checks.

No server and no sockets. Input checks are shown to happen before any request by calling them on
a *closed* client: a request would raise ``Stopped``, so any other exception proves the check ran
first.
"""

from __future__ import annotations

import dataclasses
import datetime
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import requests

from nsq_sync.addresses import parse_http_address
from nsq_sync.errors import (
    ConfigError,
    HTTPAPIError,
    InvalidBody,
    InvalidName,
    LookupdError,
    Stopped,
)
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.http.base import unwrap_envelope
from nsq_sync.http.lookupd import LookupdClient, ProducerInfo, parse_producers

# ------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize(
    ("address", "base_url", "host_port"),
    [
        ("127.0.0.1:4151", "http://127.0.0.1:4151", "127.0.0.1:4151"),
        ("http://127.0.0.1:4151", "http://127.0.0.1:4151", "127.0.0.1:4151"),
        ("https://nsqd.example.com:443", "https://nsqd.example.com:443", "nsqd.example.com:443"),
        ("HTTP://Host-1.local:4161", "http://Host-1.local:4161", "Host-1.local:4161"),
        ("http://127.0.0.1:4151/", "http://127.0.0.1:4151", "127.0.0.1:4151"),
        ("localhost:4161/", "http://localhost:4161", "localhost:4161"),
        ("  127.0.0.1:4151\n", "http://127.0.0.1:4151", "127.0.0.1:4151"),
        ("my_host:1", "http://my_host:1", "my_host:1"),
        ("127.0.0.1:65535", "http://127.0.0.1:65535", "127.0.0.1:65535"),
        ("127.0.0.1:04151", "http://127.0.0.1:4151", "127.0.0.1:4151"),
        ("[::1]:4151", "http://[::1]:4151", "[::1]:4151"),
        ("https://[2001:db8::1]:443/", "https://[2001:db8::1]:443", "[2001:db8::1]:443"),
    ],
)
def test_parse_http_address_accepts(address: str, base_url: str, host_port: str) -> None:
    assert parse_http_address(address) == (base_url, host_port)
    client = NsqdHTTPClient(address)
    assert (client.base_url, client.address) == (base_url, host_port)
    client.close()


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "missing port"),
        ("http://127.0.0.1", "missing port"),
        ("127.0.0.1:", "missing port"),
        (":4151", "missing host"),
        ("http://:4151", "missing host"),
        ("", "missing port"),
        ("ftp://127.0.0.1:4151", "scheme must be http or https"),
        ("tcp://127.0.0.1:4150", "scheme must be http or https"),
        ("://127.0.0.1:4151", "scheme must be http or https"),
        ("http://127.0.0.1:4151/api", "without a path"),
        ("127.0.0.1:4151/pub", "without a path"),
        ("http://127.0.0.1:4151//", "without a path"),
        ("http://127.0.0.1:4151?topic=x", "without a query"),
        ("http://127.0.0.1:4151#frag", "without a fragment"),
        ("http://user:pw@127.0.0.1:4151", "without credentials"),
        ("127.0.0.1:http", "is not a number"),
        ("127.0.0.1:-1", "is not a number"),
        ("127.0.0.1:4151.0", "is not a number"),
        ("127.0.0.1:0", "out of range"),
        ("127.0.0.1:65536", "out of range"),
        ("127.0.0.1:123456", "out of range"),
        ("::1:4151", "must be bracketed"),
        ("[::1]", "missing port"),
        ("[::1:4151", "unclosed"),
        ("[nothex]:4151", "is not an IPv6 address"),
        ("[fe80::1%eth0]:4151", "is not an IPv6 address"),
        ("bad host:4151", "is not a valid host name"),
        ("höst:4151", "is not a valid host name"),
    ],
)
def test_parse_http_address_rejects_naming_the_address(address: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_http_address(address)
    assert reason in str(info.value)
    assert repr(address) in str(info.value)
    # The clients reject it at construction, before any request could be made.
    with pytest.raises(ConfigError):
        NsqdHTTPClient(address)
    with pytest.raises(ConfigError):
        LookupdClient(address)


@pytest.mark.parametrize("address", [None, 4151, b"127.0.0.1:4151", ("127.0.0.1", 4151)])
def test_parse_http_address_rejects_non_str(address: object) -> None:
    with pytest.raises(ConfigError, match="expected a str"):
        parse_http_address(address)


# Property tests of the address parsers (round trips, IPv6): tests/unit/test_addresses.py


# ------------------------------------------------------------------------------ construction


@pytest.mark.parametrize("cls", [NsqdHTTPClient, LookupdClient])
def test_construction_does_no_io(cls: type[NsqdHTTPClient] | type[LookupdClient]) -> None:
    # A name that cannot resolve: any lookup or connect at construction would fail.
    client = cls("http://nsq.invalid:4151", timeout=1.5)
    assert client.timeout == 1.5
    assert client.address == "nsq.invalid:4151"
    assert repr(client) == f"<{cls.__name__} http://nsq.invalid:4151>"
    assert [client.closed, client.close(), client.closed] == [False, None, True]
    assert repr(client) == f"<{cls.__name__} http://nsq.invalid:4151 closed>"
    client.close()  # idempotent


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), "soon", None, True])
def test_bad_timeout_is_a_config_error(timeout: Any) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        NsqdHTTPClient("127.0.0.1:4151", timeout=timeout)
    with pytest.raises(ConfigError, match="timeout"):
        LookupdClient("127.0.0.1:4161", timeout=timeout)


@pytest.mark.parametrize("timeout", [1.5, "1500ms", datetime.timedelta(seconds=1.5)])
def test_timeout_takes_any_duration_like_every_other_method(timeout: Any) -> None:
    for cls in (NsqdHTTPClient, LookupdClient):
        with cls("127.0.0.1:4151", timeout=timeout) as client:
            assert client.timeout == 1.5


def test_default_timeout_is_five_seconds() -> None:
    with NsqdHTTPClient("127.0.0.1:4151") as nsqd, LookupdClient("127.0.0.1:4161") as lookupd:
        assert nsqd.timeout == lookupd.timeout == 5.0
    assert nsqd.closed and lookupd.closed


def test_session_must_be_a_requests_session() -> None:
    with pytest.raises(ConfigError, match="session"):
        NsqdHTTPClient("127.0.0.1:4151", session="nope")  # type: ignore[arg-type]


def test_closed_client_raises_stopped() -> None:
    with requests.Session() as session:
        client = LookupdClient("127.0.0.1:4161", session=session)
        client.close()
        with pytest.raises(Stopped, match="closed"):
            client.ping()


# ------------------------------------------------------------------------------ input checks


@pytest.fixture
def closed_nsqd() -> NsqdHTTPClient:
    client = NsqdHTTPClient("127.0.0.1:4151")
    client.close()
    return client


@pytest.fixture
def closed_lookupd() -> LookupdClient:
    client = LookupdClient("127.0.0.1:4161")
    client.close()
    return client


BAD_NAMES = ["", "has space", "x" * 65, "slash/", "ünï", "t#notephemeral"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_topic_is_rejected_before_any_request(closed_nsqd: NsqdHTTPClient, name: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: closed_nsqd.pub(name, b"x"),
        lambda: closed_nsqd.dpub(name, b"x", 1.0),
        lambda: closed_nsqd.mpub(name, [b"x"]),
        lambda: closed_nsqd.stats(name),
        lambda: closed_nsqd.topic_stats(name),
        lambda: closed_nsqd.channel_stats(name, "c"),
        lambda: closed_nsqd.depth(name),
        lambda: closed_nsqd.create_topic(name),
        lambda: closed_nsqd.delete_topic(name),
        lambda: closed_nsqd.empty_topic(name),
        lambda: closed_nsqd.pause_topic(name),
        lambda: closed_nsqd.unpause_topic(name),
        lambda: closed_nsqd.create_channel(name, "c"),
        lambda: closed_nsqd.delete_channel(name, "c"),
        lambda: closed_nsqd.empty_channel(name, "c"),
        lambda: closed_nsqd.pause_channel(name, "c"),
        lambda: closed_nsqd.unpause_channel(name, "c"),
    ]
    for call in calls:
        with pytest.raises(InvalidName, match="topic"):
            call()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_channel_is_rejected_before_any_request(closed_nsqd: NsqdHTTPClient, name: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: closed_nsqd.stats("t", name),
        lambda: closed_nsqd.channel_stats("t", name),
        lambda: closed_nsqd.depth("t", name),
        lambda: closed_nsqd.create_channel("t", name),
        lambda: closed_nsqd.delete_channel("t", name),
        lambda: closed_nsqd.empty_channel("t", name),
        lambda: closed_nsqd.pause_channel("t", name),
        lambda: closed_nsqd.unpause_channel("t", name),
    ]
    for call in calls:
        with pytest.raises(InvalidName, match="channel"):
            call()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_lookupd_bad_names_are_rejected_before_any_request(
    closed_lookupd: LookupdClient, name: str
) -> None:
    lookupd_calls: list[Callable[[], object]] = [
        lambda: closed_lookupd.lookup(name),
        lambda: closed_lookupd.channels(name),
        lambda: closed_lookupd.create_topic(name),
        lambda: closed_lookupd.delete_topic(name),
        lambda: closed_lookupd.create_channel(name, "c"),
        lambda: closed_lookupd.delete_channel(name, "c"),
        lambda: closed_lookupd.tombstone_topic_producer(name, "127.0.0.1:4151"),
    ]
    for call in lookupd_calls:
        with pytest.raises(InvalidName, match="topic"):
            call()
    for call in [
        lambda: closed_lookupd.create_channel("t", name),
        lambda: closed_lookupd.delete_channel("t", name),
    ]:
        with pytest.raises(InvalidName, match="channel"):
            call()


@pytest.mark.parametrize("node", ["127.0.0.1", "127.0.0.1:x", "", "::1:4151", None, 4151])
def test_bad_tombstone_node_is_rejected(closed_lookupd: LookupdClient, node: Any) -> None:
    with pytest.raises(ConfigError, match="tombstone node"):
        closed_lookupd.tombstone_topic_producer("t", node)


def test_valid_calls_on_a_closed_client_raise_stopped(
    closed_nsqd: NsqdHTTPClient, closed_lookupd: LookupdClient
) -> None:
    # The control for the tests above: valid input does reach the (closed) request path.
    with pytest.raises(Stopped):
        closed_nsqd.pub("t", b"x", delay=1.5)
    with pytest.raises(Stopped):
        closed_nsqd.mpub("t", ["a", "b"], binary=False)
    with pytest.raises(Stopped):
        closed_nsqd.channel_stats("t", "c#ephemeral")
    with pytest.raises(Stopped):
        closed_lookupd.tombstone_topic_producer("t", "[::1]:4151")


@pytest.mark.parametrize("body", [b"", "", bytearray(), None, 42, ["x"]])
def test_bad_body_is_rejected_before_any_request(closed_nsqd: NsqdHTTPClient, body: Any) -> None:
    with pytest.raises(InvalidBody):
        closed_nsqd.pub("t", body)
    with pytest.raises(InvalidBody):
        closed_nsqd.dpub("t", body, 1.0)


@pytest.mark.parametrize(
    ("bodies", "binary", "match"),
    [
        ([], True, "at least one"),
        ([], False, "at least one"),
        (iter(()), True, "at least one"),
        (b"single", True, "not a single body"),
        ("single", True, "not a single body"),
        ([b"ok", b""], True, "message 1"),
        ([b"ok", 7], True, "message 1"),
        ([b"a\nb"], False, "newline"),
        (["a", "b\n"], False, "message 1"),
    ],
)
def test_bad_mpub_is_rejected_before_any_request(
    closed_nsqd: NsqdHTTPClient, bodies: Any, binary: bool, match: str
) -> None:
    with pytest.raises(InvalidBody, match=match):
        closed_nsqd.mpub("t", bodies, binary=binary)


@pytest.mark.parametrize("delay", [-0.001, -1, float("nan"), float("inf"), "soon", True, 3e6])
def test_bad_delay_is_rejected_before_any_request(closed_nsqd: NsqdHTTPClient, delay: Any) -> None:
    # The same exception as Producer.deferred_publish and Message.requeue (config.to_seconds).
    with pytest.raises(ConfigError, match="delay") as info:
        closed_nsqd.pub("t", b"x", delay=delay)
    assert repr(delay) in str(info.value)
    with pytest.raises(ConfigError, match="delay"):
        closed_nsqd.dpub("t", b"x", delay)


def test_stats_channel_needs_topic(closed_nsqd: NsqdHTTPClient) -> None:
    with pytest.raises(ConfigError, match="needs a topic"):
        closed_nsqd.stats(channel="c")


# ------------------------------------------------------------------------------ lookupd answers

_P1 = {
    "remote_address": "127.0.0.1:52046",
    "hostname": "vm",
    "broadcast_address": "127.0.0.1",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}
_P2 = {**_P1, "broadcast_address": "10.0.0.2", "hostname": "b", "tcp_port": 5150}
_INFO1 = ProducerInfo("127.0.0.1", "vm", 4150, 4151, "1.3.0")
_INFO2 = ProducerInfo("10.0.0.2", "b", 5150, 4151, "1.3.0")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # nsqlookupd v1.3.0 /lookup, exactly as it answers.
        ({"channels": ["c1"], "producers": [_P1, _P2]}, [_INFO1, _INFO2]),
        # /nodes has extra keys per producer.
        ({"producers": [{**_P1, "tombstones": [False], "topics": ["t"]}]}, [_INFO1]),
        # pre-1.0 envelope
        ({"status_code": 200, "status_txt": "OK", "data": {"producers": [_P2]}}, [_INFO2]),
        ({"channels": [], "producers": []}, []),
        ({"channels": [], "producers": None}, []),
        ({"channels": []}, []),
        # before v0.2.28 the field was "address"; hostname/version may be missing.
        (
            {"producers": [{"address": "h", "tcp_port": 1, "http_port": 2}]},
            [ProducerInfo("h", "", 1, 2, "")],
        ),
        # duplicates are kept, in order
        ({"producers": [_P1, _P1]}, [_INFO1, _INFO1]),
    ],
)
def test_parse_producers(answer: Any, expected: list[ProducerInfo]) -> None:
    before = repr(answer)
    assert parse_producers(answer) == expected
    assert repr(answer) == before  # pure: the input is untouched


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ([], "expected an object"),
        ("producers", "expected an object"),
        (None, "expected an object"),
        ({"producers": {"a": 1}}, "producers is"),
        ({"producers": ["127.0.0.1:4150"]}, "expected an object"),
        ({"producers": [{**_P1, "broadcast_address": ""}]}, "no broadcast_address"),
        ({"producers": [{"tcp_port": 4150, "http_port": 4151}]}, "no broadcast_address"),
        ({"producers": [{**_P1, "tcp_port": "4150"}]}, "tcp_port"),
        ({"producers": [{**_P1, "tcp_port": 0}]}, "tcp_port"),
        ({"producers": [{**_P1, "http_port": 70000}]}, "http_port"),
        ({"producers": [{**_P1, "http_port": True}]}, "http_port"),
        ({"producers": [{k: v for k, v in _P1.items() if k != "tcp_port"}]}, "tcp_port"),
    ],
)
def test_parse_producers_rejects_malformed(answer: Any, match: str) -> None:
    with pytest.raises(LookupdError, match=match) as info:
        parse_producers(answer)
    assert info.value.status is None
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


def test_producer_info() -> None:
    assert _INFO1.tcp_address == "127.0.0.1:4150"
    assert _INFO1.http_address == "127.0.0.1:4151"
    v6 = ProducerInfo("::1", "h", 4150, 4151, "1.3.0")
    assert v6.tcp_address == "[::1]:4150"
    assert v6.http_address == "[::1]:4151"
    assert len({_INFO1, ProducerInfo("127.0.0.1", "vm", 4150, 4151, "1.3.0"), _INFO2}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        _INFO1.tcp_port = 1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(_INFO1)) == _INFO1


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"status_code": 200, "status_txt": "OK", "data": {"a": 1}}, {"a": 1}),
        ({"status_code": 200, "status_txt": "OK", "data": None}, None),
        ({"version": "1.3.0"}, {"version": "1.3.0"}),
        ({"status_code": 200, "data": 1}, {"status_code": 200, "data": 1}),
        ([1, 2], [1, 2]),
        ("OK", "OK"),
    ],
)
def test_unwrap_envelope(data: Any, expected: Any) -> None:
    assert unwrap_envelope(data) == expected


def test_errors_are_in_the_hierarchy() -> None:
    assert issubclass(LookupdError, HTTPAPIError)
    err = LookupdError("boom", "http://h:1/lookup?topic=t", 404, '{"message":"TOPIC_NOT_FOUND"}')
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.url, copy.status, copy.body) == (err.url, err.status, err.body)
