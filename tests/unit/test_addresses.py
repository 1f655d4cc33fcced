"""The one host:port parser (nsq_sync.addresses): TCP and HTTP addresses follow one IPv6 rule
(brackets, ``[::1]:4150``), and every bad address is a ConfigError naming it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_sync import Config, Producer
from nsq_sync.addresses import (
    address_list,
    join_host_port,
    parse_address,
    parse_http_address,
    split_host_port,
)
from nsq_sync.errors import ConfigError

_LABELS = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
HOSTS = st.one_of(
    st.lists(_LABELS, min_size=1, max_size=4).map(".".join),
    st.ip_addresses(v=4).map(str),
)
IPV6 = st.ip_addresses(v=6).map(str)
PORTS = st.integers(1, 65535)


@given(
    host=st.one_of(HOSTS, IPV6),
    port=PORTS,
    scheme=st.sampled_from(["", "http://", "https://"]),
)
def test_join_then_parse_round_trips(host: str, port: int, scheme: str) -> None:
    text = join_host_port(host, port)
    assert parse_address(text) == (host, port)
    assert split_host_port(text) == (host, port)
    # The HTTP parser reads the same host:port the same way, and normalising is idempotent.
    base_url = f"{scheme or 'http://'}{text}"
    assert parse_http_address(f"{scheme}{text}") == (base_url, text)
    assert parse_http_address(base_url) == (base_url, text)


@given(host=IPV6, port=PORTS)
def test_ipv6_must_be_bracketed_for_tcp_and_http_alike(host: str, port: int) -> None:
    assert parse_address(f"[{host}]:{port}") == (host, port)
    for parse in (parse_address, parse_http_address):
        with pytest.raises(ConfigError, match="must be bracketed"):
            parse(f"{host}:{port}")


@given(text=st.text(max_size=40))
def test_any_text_parses_or_raises_config_error_naming_it(text: str) -> None:
    try:
        host, port = parse_address(text)
    except ConfigError as exc:
        assert repr(text) in str(exc)
    else:
        assert 1 <= port <= 65535
        assert parse_address(join_host_port(host, port)) == (host, port)


@given(text=st.text(alphabet="[]:.0123456789abcdef-_/xyz", max_size=30))
def test_tcp_and_http_parsers_accept_the_same_host_port(text: str) -> None:
    try:
        tcp = parse_address(text)
    except ConfigError:
        tcp = None
    try:
        http = parse_http_address(text)[1]
    except ConfigError:
        http = None
    if "/" in text:  # a URL path: refused by the TCP parser, trimmed or refused by the HTTP one
        assert tcp is None
    else:
        assert (tcp is None) == (http is None)
        if tcp is not None:
            assert http == join_host_port(*tcp)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "missing port"),
        ("127.0.0.1:", "missing port"),
        (":4150", "missing host"),
        ("127.0.0.1:0", "out of range"),
        ("127.0.0.1:65536", "out of range"),
        ("127.0.0.1:41 50", "is not a number"),
        ("::1:4150", "must be bracketed"),
        ("[::1]", "missing port"),
        ("[::1:4150", "unclosed"),
        ("http://127.0.0.1:4150", "not a URL"),
        ("127.0.0.1:4150/", "not a URL"),
        ("bad host:4150", "is not a valid host name"),
    ],
)
def test_bad_tcp_addresses_are_refused_everywhere_they_are_given(address: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        parse_address(address)
    assert repr(address) in str(info.value)
    with pytest.raises(ConfigError, match=reason):
        Producer(address)
    with pytest.raises(ConfigError, match=reason):
        Producer(nsqd_tcp_addresses=[], config=Config(nsqd_tcp_addresses=[address]))


@pytest.mark.parametrize("address", [None, 4150, b"127.0.0.1:4150", ("127.0.0.1", 4150)])
def test_tcp_address_must_be_a_str(address: object) -> None:
    with pytest.raises(ConfigError, match="expected a str"):
        parse_address(address)


def test_address_lists_split_at_commas() -> None:
    assert address_list("x", "h1:4150, h2:4150") == ("h1:4150", "h2:4150")
    assert address_list("x", ["h1:4150", " h2:4150 "]) == ("h1:4150", "h2:4150")
    with pytest.raises(ConfigError, match="^x: every address must be a non-empty string"):
        address_list("x", "h1:4150,,h2:4150")
