"""NsqdHTTPClient against a real nsqd v1.3.0 on loopback."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from support.nsq import wait_for

from nsq_sync.errors import HTTPAPIError, Stopped
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.protocol import commands
from nsq_sync.protocol.commands import Body
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def client(nsqd: NsqdProcess) -> Iterator[NsqdHTTPClient]:
    with NsqdHTTPClient(nsqd.http_address) as c:
        yield c


@pytest.fixture
def channel_of(client: NsqdHTTPClient, nsq_topic: str) -> str:
    """Create ``topic`` with channel ``ch`` so that published messages show up as channel depth."""
    client.create_topic(nsq_topic)
    client.create_channel(nsq_topic, "ch")
    return "ch"


def _free_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _topic(client: NsqdHTTPClient, topic: str) -> dict[str, Any]:
    stats = client.topic_stats(topic)
    assert stats is not None, f"topic {topic} not in stats"
    return stats


def _channel(client: NsqdHTTPClient, topic: str, channel: str) -> dict[str, Any]:
    stats = client.channel_stats(topic, channel)
    assert stats is not None, f"channel {topic}/{channel} not in stats"
    return stats


# ------------------------------------------------------------------------------ health and info


def test_ping_and_info(client: NsqdHTTPClient, nsqd: NsqdProcess) -> None:
    assert client.ping() is True
    info = client.info()
    assert info["version"] == "1.3.0"
    assert info["tcp_port"] == nsqd.tcp_port
    assert info["http_port"] == nsqd.http_port
    assert info["broadcast_address"] == "127.0.0.1"


def test_address_forms_reach_the_same_server(nsqd: NsqdProcess) -> None:
    for address in (nsqd.http_address, nsqd.http_url, nsqd.http_url + "/"):
        with NsqdHTTPClient(address) as c:
            assert c.base_url == nsqd.http_url
            assert c.info()["http_port"] == nsqd.http_port


def test_stats_shape(client: NsqdHTTPClient, nsq_topic: str) -> None:
    client.create_topic(nsq_topic)
    stats = client.stats()
    assert stats["version"] == "1.3.0"
    assert stats["health"] == "OK"
    assert isinstance(stats["start_time"], int)
    assert isinstance(stats["topics"], list)
    # nsqd answers "producers": null when nothing publishes over TCP; the client gives [].
    assert isinstance(stats["producers"], list)
    assert nsq_topic in {t["topic_name"] for t in stats["topics"]}


def test_stats_filters(client: NsqdHTTPClient, nsq_topic: str, channel_of: str) -> None:
    client.create_topic(nsq_topic + "_other")
    only = client.stats(nsq_topic)
    assert [t["topic_name"] for t in only["topics"]] == [nsq_topic]
    assert [c["channel_name"] for c in only["topics"][0]["channels"]] == [channel_of]

    one_channel = client.stats(nsq_topic, channel_of)
    assert [c["channel_name"] for c in one_channel["topics"][0]["channels"]] == [channel_of]

    # nsqd answers "topics": null for an unknown topic, and [] for an unknown channel.
    assert client.stats(nsq_topic + "_missing")["topics"] == []
    assert client.stats(nsq_topic, "missing")["topics"] == []
    assert client.topic_stats(nsq_topic + "_missing") is None
    assert client.channel_stats(nsq_topic, "missing") is None
    assert client.channel_stats(nsq_topic + "_missing", channel_of) is None
    assert client.depth(nsq_topic + "_missing") is None
    assert client.depth(nsq_topic, "missing") is None


def test_stats_include_clients(client: NsqdHTTPClient, nsqd: NsqdProcess, nsq_topic: str) -> None:
    # A real subscriber: the TCP protocol's magic and SUB, answered by OK.
    with socket.create_connection(("127.0.0.1", nsqd.tcp_port), timeout=5) as sock:
        sock.sendall(commands.magic() + commands.sub(nsq_topic, "subscribed"))
        response = b""
        while len(response) < 10:
            chunk = sock.recv(10 - len(response))
            assert chunk, "nsqd closed the connection"
            response += chunk
        assert response == struct.pack(">II", 6, 0) + b"OK"

        with_clients = client.channel_stats(nsq_topic, "subscribed")
        assert with_clients is not None
        assert with_clients["client_count"] == 1
        assert len(with_clients["clients"]) == 1

        # nsqd answers "clients": null here; the client gives [].
        without = client.channel_stats(nsq_topic, "subscribed", include_clients=False)
        assert without is not None
        assert without["client_count"] == 1
        assert without["clients"] == []


# ------------------------------------------------------------------------------ publishing


def test_pub_without_channel_counts_in_the_topic(client: NsqdHTTPClient, nsq_topic: str) -> None:
    client.pub(nsq_topic, b"one")
    client.pub(nsq_topic, "h\u00e9llo")  # str is sent as UTF-8: 6 bytes
    stats = client.topic_stats(nsq_topic)
    assert stats is not None
    assert stats["depth"] == 2
    assert stats["message_count"] == 2
    assert stats["message_bytes"] == 3 + 6
    assert client.depth(nsq_topic) == 2


def test_pub_reaches_the_channel(client: NsqdHTTPClient, nsq_topic: str, channel_of: str) -> None:
    client.pub(nsq_topic, b"\x00binary\nbody\xff")
    client.pub(nsq_topic, b"x", delay=0)  # no delay
    client.pub(nsq_topic, bytearray(b"y"))
    client.pub(nsq_topic, memoryview(b"z"))
    # handed on to the channel (by nsqd's topic pump, after each publish has answered)
    wait_for(lambda: client.depth(nsq_topic, channel_of) == 4, "messages to reach the channel")
    assert client.depth(nsq_topic) == 0


def test_dpub_is_deferred(client: NsqdHTTPClient, nsq_topic: str, channel_of: str) -> None:
    client.dpub(nsq_topic, b"later", 60.0)
    client.pub(nsq_topic, b"later too", delay=1.5)  # fractional seconds -> 1500 ms
    client.pub(nsq_topic, b"now")

    def counts() -> tuple[int, int] | None:
        stats = client.channel_stats(nsq_topic, channel_of)
        return None if stats is None else (stats["deferred_count"], stats["depth"])

    wait_for(lambda: counts() == (2, 1), "2 deferred and 1 ready message in the channel")


def test_mpub_binary(client: NsqdHTTPClient, nsq_topic: str, channel_of: str) -> None:
    bodies: list[Any] = [b"a\nb", b"\x00" * 100, "c\u00e9", bytearray(b"d")]
    client.mpub(nsq_topic, bodies)
    stats = client.topic_stats(nsq_topic)
    assert stats is not None
    assert stats["message_count"] == 4
    assert stats["message_bytes"] == 3 + 100 + 3 + 1
    wait_for(lambda: client.depth(nsq_topic, channel_of) == 4, "messages to reach the channel")


def test_mpub_text(client: NsqdHTTPClient, nsq_topic: str, channel_of: str) -> None:
    bodies: list[Body] = [b"one", "two", b"three"]
    client.mpub(nsq_topic, (b for b in bodies), binary=False)  # any iterable
    stats = client.topic_stats(nsq_topic)
    assert stats is not None
    assert stats["message_count"] == 3
    assert stats["message_bytes"] == 3 + 3 + 5
    wait_for(lambda: client.depth(nsq_topic, channel_of) == 3, "messages to reach the channel")


# ------------------------------------------------------------------------------ admin


def test_topic_round_trip(client: NsqdHTTPClient, nsq_topic: str) -> None:
    assert client.topic_stats(nsq_topic) is None
    client.create_topic(nsq_topic)
    client.create_topic(nsq_topic)  # idempotent
    stats = client.topic_stats(nsq_topic)
    assert stats is not None
    assert (stats["depth"], stats["paused"], stats["channels"]) == (0, False, [])

    client.pause_topic(nsq_topic)
    assert _topic(client, nsq_topic)["paused"] is True
    client.unpause_topic(nsq_topic)
    assert _topic(client, nsq_topic)["paused"] is False

    client.mpub(nsq_topic, [b"1", b"2", b"3"])
    assert client.depth(nsq_topic) == 3
    client.empty_topic(nsq_topic)
    assert client.depth(nsq_topic) == 0

    client.delete_topic(nsq_topic)
    assert client.topic_stats(nsq_topic) is None


def test_paused_topic_keeps_messages_from_channels(
    client: NsqdHTTPClient, nsq_topic: str, channel_of: str
) -> None:
    client.pause_topic(nsq_topic)
    client.mpub(nsq_topic, [b"1", b"2"])
    assert client.depth(nsq_topic) == 2
    assert client.depth(nsq_topic, channel_of) == 0
    client.unpause_topic(nsq_topic)
    # The topic hands the messages on asynchronously once unpaused.
    wait_for(lambda: client.depth(nsq_topic, channel_of) == 2, "messages to reach the channel")
    assert client.depth(nsq_topic) == 0


def test_channel_round_trip(client: NsqdHTTPClient, nsq_topic: str) -> None:
    client.create_topic(nsq_topic)
    client.create_channel(nsq_topic, "ch")
    client.create_channel(nsq_topic, "ch")  # idempotent
    client.create_channel(nsq_topic, "tmp#ephemeral")  # '#' must be URL-encoded
    names = {c["channel_name"] for c in _topic(client, nsq_topic)["channels"]}
    assert names == {"ch", "tmp#ephemeral"}

    client.pause_channel(nsq_topic, "ch")
    assert _channel(client, nsq_topic, "ch")["paused"] is True
    client.pub(nsq_topic, b"queued while paused")
    # (nsqd's topic pump copies a message to the channels after the publish has answered)
    wait_for(lambda: client.depth(nsq_topic, "ch") == 1, "the message to reach the channel")
    client.unpause_channel(nsq_topic, "ch")
    assert _channel(client, nsq_topic, "ch")["paused"] is False

    client.dpub(nsq_topic, b"deferred", 60.0)
    wait_for(
        lambda: _channel(client, nsq_topic, "ch")["deferred_count"] == 1,
        "the deferred message to reach the channel",
    )
    client.empty_channel(nsq_topic, "ch")
    stats = client.channel_stats(nsq_topic, "ch")
    assert stats is not None
    assert (stats["depth"], stats["deferred_count"]) == (0, 0)

    client.delete_channel(nsq_topic, "ch")
    assert client.channel_stats(nsq_topic, "ch") is None
    assert client.topic_stats(nsq_topic) is not None


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("call", "status", "code", "path"),
    [
        (lambda c, t: c.delete_topic(t), 404, "TOPIC_NOT_FOUND", "/topic/delete"),
        (lambda c, t: c.pause_topic(t), 404, "TOPIC_NOT_FOUND", "/topic/pause"),
        (lambda c, t: c.empty_topic(t), 404, "TOPIC_NOT_FOUND", "/topic/empty"),
        # nsqd v1.3.0 creates channels only on existing topics.
        (lambda c, t: c.create_channel(t, "ch"), 404, "TOPIC_NOT_FOUND", "/channel/create"),
        (lambda c, t: c.pause_channel(t, "ch"), 404, "TOPIC_NOT_FOUND", "/channel/pause"),
        # defer beyond nsqd's --max-req-timeout (1 h)
        (lambda c, t: c.dpub(t, b"x", 7200.0), 400, "INVALID_DEFER", "/pub"),
    ],
)
def test_server_errors_carry_status_and_body(
    client: NsqdHTTPClient, nsq_topic: str, call: Any, status: int, code: str, path: str
) -> None:
    with pytest.raises(HTTPAPIError) as info:
        call(client, nsq_topic)
    err = info.value
    assert err.status == status
    assert code in err.body
    assert err.url.startswith(f"{client.base_url}{path}?")
    assert f"topic={nsq_topic}" in err.url
    assert code in str(err) and str(status) in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.url, copy.status, copy.body) == (err.url, err.status, err.body)


def test_missing_channel_is_404(client: NsqdHTTPClient, nsq_topic: str) -> None:
    client.create_topic(nsq_topic)
    with pytest.raises(HTTPAPIError) as info:
        client.delete_channel(nsq_topic, "missing")
    assert info.value.status == 404
    assert "CHANNEL_NOT_FOUND" in info.value.body


def test_message_too_big_is_413(nsqd_factory: Any, nsq_topic: str) -> None:
    small = nsqd_factory("--max-msg-size=16", "--max-body-size=64")
    with NsqdHTTPClient(small.http_address) as c:
        c.pub(nsq_topic, b"x" * 16)
        with pytest.raises(HTTPAPIError) as info:
            c.pub(nsq_topic, b"x" * 17)
        assert (info.value.status, "MSG_TOO_BIG" in info.value.body) == (413, True)
        with pytest.raises(HTTPAPIError) as info:
            c.mpub(nsq_topic, [b"x" * 10] * 10)
        assert (info.value.status, "BODY_TOO_BIG" in info.value.body) == (413, True)
        assert c.depth(nsq_topic) == 1


def test_closed_port_is_an_error_without_status() -> None:
    with NsqdHTTPClient(f"127.0.0.1:{_free_closed_port()}", timeout=2.0) as c:
        for call in (c.ping, c.info, lambda: c.pub("t", b"x")):
            with pytest.raises(HTTPAPIError) as info:
                call()
            assert info.value.status is None
            assert info.value.body == ""
            assert isinstance(info.value.__cause__, requests.ConnectionError)


def test_silent_server_times_out() -> None:
    # A socket that listens but never answers: the connect succeeds, the read times out.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        with NsqdHTTPClient(f"127.0.0.1:{port}", timeout=0.2) as c:
            with pytest.raises(HTTPAPIError, match="no response within 0.2 s") as info:
                c.stats()
            assert info.value.status is None
            assert isinstance(info.value.__cause__, requests.Timeout)


def test_not_an_nsqd_is_an_error(client: NsqdHTTPClient, nsqlookupd: Any) -> None:
    # nsqlookupd has no /pub; its 404 is reported, not mistaken for success.
    with NsqdHTTPClient(nsqlookupd.http_address) as wrong:
        with pytest.raises(HTTPAPIError) as info:
            wrong.pub("t", b"x")
        assert info.value.status in (404, 405)


# ------------------------------------------------------------------------------ lifecycle


def test_close_and_context_manager(nsqd: NsqdProcess) -> None:
    with NsqdHTTPClient(nsqd.http_address) as c:
        assert c.ping()
    assert c.closed
    with pytest.raises(Stopped):
        c.ping()


def test_given_session_is_used_and_left_open(nsqd: NsqdProcess) -> None:
    seen: list[str] = []
    with requests.Session() as session:
        session.hooks["response"].append(lambda r, *args, **kwargs: seen.append(r.url))
        client = NsqdHTTPClient(nsqd.http_url, session=session)
        assert client.ping()
        client.close()
        assert seen == [f"{nsqd.http_url}/ping"]
        # Still the caller's to use.
        assert session.get(f"{nsqd.http_url}/ping", timeout=5).text == "OK"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_usable_after_fork(client: NsqdHTTPClient, nsq_topic: str) -> None:
    client.pub(nsq_topic, b"parent")  # leaves a pooled keep-alive connection behind
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with threads; the child only does HTTP.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            client.pub(nsq_topic, b"child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    client.pub(nsq_topic, b"parent again")
    assert client.depth(nsq_topic) == 3
