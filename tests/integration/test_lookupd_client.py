"""LookupdClient against a real nsqlookupd v1.3.0 (and nsqds registered with it) on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import requests

from nsq_sync.errors import LookupdError, Stopped
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.http.lookupd import LookupdClient, ProducerInfo
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture
def lookupd(nsqlookupd: NsqlookupdProcess) -> Iterator[LookupdClient]:
    with LookupdClient(nsqlookupd.http_url) as c:
        yield c


@pytest.fixture
def nsqd_http(nsqd: NsqdProcess) -> Iterator[NsqdHTTPClient]:
    with NsqdHTTPClient(nsqd.http_address) as c:
        yield c


def _eventually(
    probe: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float = 10.0
) -> T:
    """Poll ``probe`` until ``ok(result)``; nsqd registers with nsqlookupd asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if ok(result):
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}; last: {result!r}")
        time.sleep(0.02)


def _is(nsqd: NsqdProcess) -> Callable[[ProducerInfo], bool]:
    return lambda p: p.tcp_port == nsqd.tcp_port and p.http_port == nsqd.http_port


def test_ping_and_info(lookupd: LookupdClient) -> None:
    assert lookupd.ping() is True
    assert lookupd.info() == {"version": "1.3.0"}


def test_lookup_finds_the_nsqd_after_a_publish(
    lookupd: LookupdClient, nsqd_http: NsqdHTTPClient, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    assert lookupd.lookup(nsq_topic) == []  # 404 TOPIC_NOT_FOUND is "no producers"
    nsqd_http.pub(nsq_topic, b"x")
    producers = _eventually(
        lambda: lookupd.lookup(nsq_topic), lambda ps: any(map(_is(nsqd), ps)), "lookup to list nsqd"
    )
    (mine,) = [p for p in producers if _is(nsqd)(p)]
    assert mine.broadcast_address == "127.0.0.1"
    assert mine.tcp_address == nsqd.tcp_address
    assert mine.http_address == nsqd.http_address
    assert mine.version == "1.3.0"
    assert mine.hostname  # whatever the machine is called
    assert nsq_topic in lookupd.topics()


def test_channels(lookupd: LookupdClient, nsqd_http: NsqdHTTPClient, nsq_topic: str) -> None:
    assert lookupd.channels(nsq_topic) == []  # unknown topic: 200 with an empty list
    nsqd_http.create_topic(nsq_topic)
    nsqd_http.create_channel(nsq_topic, "ch")
    nsqd_http.create_channel(nsq_topic, "eph#ephemeral")
    channels = _eventually(
        lambda: lookupd.channels(nsq_topic), lambda cs: len(cs) == 2, "both channels to register"
    )
    assert sorted(channels) == ["ch", "eph#ephemeral"]


def test_nodes(
    lookupd: LookupdClient, nsqd_http: NsqdHTTPClient, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    nodes = lookupd.nodes()
    assert any(map(_is(nsqd), nodes))
    nsqd_http.create_topic(nsq_topic)

    def mine() -> dict[str, Any]:
        producers: list[dict[str, Any]] = lookupd.nodes_raw()["producers"]
        (entry,) = [p for p in producers if p["tcp_port"] == nsqd.tcp_port]
        return entry

    entry = _eventually(mine, lambda e: nsq_topic in e["topics"], "nodes to list the topic")
    # /nodes reports a tombstone flag per topic, in the same order.
    assert len(entry["tombstones"]) == len(entry["topics"])
    assert entry["remote_address"].startswith("127.0.0.1:")


def test_topic_and_channel_admin(lookupd: LookupdClient, nsq_topic: str) -> None:
    lookupd.create_topic(nsq_topic)
    lookupd.create_topic(nsq_topic)  # idempotent
    assert nsq_topic in lookupd.topics()
    # Registered, but no nsqd carries it: 200 with no producers.
    assert lookupd.lookup(nsq_topic) == []

    lookupd.create_channel(nsq_topic, "ch")
    assert lookupd.channels(nsq_topic) == ["ch"]
    lookupd.delete_channel(nsq_topic, "ch")
    assert lookupd.channels(nsq_topic) == []

    lookupd.delete_topic(nsq_topic)
    assert nsq_topic not in lookupd.topics()
    lookupd.delete_topic(nsq_topic)  # unknown topics are fine

    # Creating a channel registers its topic too.
    lookupd.create_channel(nsq_topic, "other")
    assert nsq_topic in lookupd.topics()
    assert lookupd.channels(nsq_topic) == ["other"]
    lookupd.delete_topic(nsq_topic)


def test_tombstone(
    lookupd: LookupdClient, nsqd_http: NsqdHTTPClient, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    nsqd_http.pub(nsq_topic, b"x")
    producers = _eventually(
        lambda: lookupd.lookup(nsq_topic), lambda ps: any(map(_is(nsqd), ps)), "lookup to list nsqd"
    )
    (mine,) = [p for p in producers if _is(nsqd)(p)]

    lookupd.tombstone_topic_producer(nsq_topic, mine.http_address)

    # Tombstoning is synchronous in nsqlookupd: the next lookup already leaves the nsqd out.
    assert not any(map(_is(nsqd), lookupd.lookup(nsq_topic)))
    (entry,) = [p for p in lookupd.nodes_raw()["producers"] if p["tcp_port"] == nsqd.tcp_port]
    assert entry["tombstones"][entry["topics"].index(nsq_topic)] is True
    # Only that topic: the nsqd is still a node, and other topics still find it.
    assert any(map(_is(nsqd), lookupd.nodes()))

    # An unknown node is silently accepted by nsqlookupd.
    lookupd.tombstone_topic_producer(nsq_topic, "127.0.0.1:1")


def test_lookup_merges_a_cluster(nsq_cluster: Any, nsq_topic: str) -> None:
    cluster = nsq_cluster(2)
    for proc in cluster.nsqds:
        with NsqdHTTPClient(proc.http_address) as c:
            c.pub(nsq_topic, b"x")
    with LookupdClient(cluster.lookupd.http_address) as lookupd:
        producers = _eventually(
            lambda: lookupd.lookup(nsq_topic), lambda ps: len(ps) == 2, "both nsqds to register"
        )
        assert {p.tcp_address for p in producers} == {p.tcp_address for p in cluster.nsqds}
        assert {p.tcp_address for p in lookupd.nodes()} == {p.tcp_address for p in cluster.nsqds}


# ------------------------------------------------------------------------------ errors


def test_server_error_carries_status_and_body(lookupd: LookupdClient, nsq_topic: str) -> None:
    with pytest.raises(LookupdError) as info:
        lookupd.delete_channel(nsq_topic, "missing")
    err = info.value
    assert err.status == 404
    assert "CHANNEL_NOT_FOUND" in err.body
    assert err.url.startswith(f"{lookupd.base_url}/channel/delete?")
    assert "CHANNEL_NOT_FOUND" in str(err)


def test_a_404_that_is_not_topic_not_found_is_an_error(nsqd: NsqdProcess) -> None:
    # nsqd has no /lookup: its 404 NOT_FOUND must not pass for "topic has no producers".
    with LookupdClient(nsqd.http_address) as wrong:
        with pytest.raises(LookupdError) as info:
            wrong.lookup("t")
        assert info.value.status == 404
        assert "NOT_FOUND" in info.value.body
        with pytest.raises(LookupdError) as info:
            wrong.topics()
        assert info.value.status == 404


def test_closed_port_is_an_error_without_status() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with LookupdClient(f"127.0.0.1:{port}", timeout=2.0) as c:
        for call in (c.ping, c.nodes, lambda: c.lookup("t")):
            with pytest.raises(LookupdError) as info:
                call()
            assert info.value.status is None
            assert isinstance(info.value.__cause__, requests.ConnectionError)


def test_close_and_context_manager(nsqlookupd: NsqlookupdProcess) -> None:
    with LookupdClient(nsqlookupd.http_address) as c:
        assert c.ping()
    with pytest.raises(Stopped):
        c.lookup("t")
