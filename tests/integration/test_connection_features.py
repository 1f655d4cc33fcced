"""NsqdConnection features against real nsqd v1.3.0 processes on 127.0.0.1: snappy and deflate
(alone and over TLS) with bodies spanning many compression frames, heartbeats on an idle
connection, idempotent close, and pipelined requests from many threads.

Messages are published with the Producer and read back over a raw NsqdConnection (subscribe, RDY,
FIN), so both directions of every compressed stream are checked byte for byte; nsqd's ``/stats``
confirms what it negotiated and counted. Every wait polls against a deadline.

The nsqd flags each test uses are listed in its docstring ("nsqd flags: ...").
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.certs import Pki, make_pki
from support.nsq import Collector, message_count, producer_clients, wait_for

from nsq_sync import Config, NsqdHTTPClient, Producer
from nsq_sync.errors import ConnectionClosed, NSQConnectionError, ServerBadMessage
from nsq_sync.protocol import commands
from nsq_sync.testing import NsqdProcess
from nsq_sync.wire.connection import NsqdConnection

pytestmark = pytest.mark.integration

CHANNEL = "ch"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _bodies(seed: int) -> tuple[list[bytes], list[bytes]]:
    """Single bodies of 200 KB and 900 KB, and a batch of 300; half random (incompressible),
    half repetitive, so compressed frames are both full-size and tiny."""
    rng = random.Random(seed)
    singles = [
        rng.randbytes(100_000) + b"abc" * 33_334,
        b"0123456789" * 45_000 + rng.randbytes(450_000),
    ]
    batch = [
        rng.randbytes(5_000) + (b"%04d" % i) * 1_250 if i % 2 else rng.randbytes(10_000)
        for i in range(300)
    ]
    return singles, batch


def _client_for(http_address: str, topic: str) -> dict[str, Any]:
    [client] = [
        c
        for c in producer_clients(http_address)
        if any(pc.get("topic") == topic for pc in c.get("pub_counts") or [])
    ]
    return client


def _read_back(address: str, config: Config, topic: str, expected: list[bytes]) -> NsqdConnection:
    """Subscribe over a raw connection, receive every message, check the bytes, FIN them."""
    collector = Collector()
    conn = NsqdConnection(address, config, handler=collector)
    conn.connect()
    try:
        conn.subscribe(topic, CHANNEL)
        conn.start_reader()
        conn.send(commands.rdy(len(expected)))
        messages = collector.wait_messages(len(expected), timeout=30.0)
        assert len(messages) == len(expected)
        assert sorted(m.body for m in messages) == sorted(expected)
        assert all(m.attempts == 1 for m in messages)
        for m in messages:
            conn.send(commands.fin(m.id))
        return conn
    except BaseException:
        conn.close()
        raise


def _wait_all_finished(http_address: str, topic: str, n: int) -> None:
    with NsqdHTTPClient(http_address) as http:

        def finished() -> bool:
            ch = http.channel_stats(topic, CHANNEL)
            return (
                ch is not None
                and ch["message_count"] == n
                and ch["depth"] == 0
                and ch["in_flight_count"] == 0
                and ch["requeue_count"] == 0
            )

        wait_for(finished, f"all {n} messages FINished in {topic}/{CHANNEL}")


def _round_trip(server: NsqdProcess, topic: str, options: dict[str, Any], compression: str) -> None:
    singles, batch = _bodies({"snappy": 1, "deflate": 2}[compression])
    with Producer(server.tcp_address, **options) as producer:
        for body in singles:
            producer.publish(topic, body)
        producer.multi_publish(topic, batch)
        conn = producer._slots[0].conn
        assert conn is not None
        assert getattr(conn.identify, compression) is True
        client = _client_for(server.http_address, topic)  # nsqd's own view
        assert client[compression] is True, client
        assert client["tls"] is bool(options.get("tls_v1")), client
    expected = singles + batch
    assert message_count(server.http_address, topic) == len(expected)

    reader = _read_back(server.tcp_address, Config(**options), topic, expected)
    try:
        assert getattr(reader.identify, compression) is True
        _wait_all_finished(server.http_address, topic, len(expected))
    finally:
        reader.close()
        assert reader.join(10.0)
    assert reader.close_error is None


# ------------------------------------------------------------------------------- compression


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compressed_round_trip(nsqd: NsqdProcess, nsq_topic: str, compression: str) -> None:
    """nsqd flags: none (shared nsqd; --snappy and --deflate default to true in v1.3.0)."""
    _round_trip(nsqd, nsq_topic, {compression: True}, compression)


def test_deflate_level_is_negotiated(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: --max-deflate-level=3."""
    server = nsqd_factory("--max-deflate-level=3")
    with Producer(server.tcp_address, deflate=True, deflate_level=9) as producer:
        producer.publish(nsq_topic, b"z" * 100_000)
        conn = producer._slots[0].conn
        assert conn is not None and conn.identify.deflate
        assert conn.identify.deflate_level == 3  # nsqd caps the level at its maximum
    _read_back(server.tcp_address, Config(deflate=True), nsq_topic, [b"z" * 100_000]).close()
    _wait_all_finished(server.http_address, nsq_topic, 1)


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compression_over_tls_round_trip(
    nsqd_factory: Any, pki: Pki, nsq_topic: str, compression: str
) -> None:
    """nsqd flags: --tls-cert --tls-key (compression layered over TLS)."""
    server = nsqd_factory(f"--tls-cert={pki.server_cert}", f"--tls-key={pki.server_key}")
    options = {"tls_v1": True, "tls_root_ca_file": str(pki.ca_cert), compression: True}
    _round_trip(server, nsq_topic, options, compression)


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compression_disabled_on_nsqd_warns(
    nsqd_factory: Any, nsq_topic: str, compression: str, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd flags: --snappy=false or --deflate=false."""
    server = nsqd_factory(f"--{compression}=false")
    caplog.set_level(logging.WARNING, logger="nsq_sync")
    with Producer(server.tcp_address, **{compression: True}) as producer:
        producer.publish(nsq_topic, b"uncompressed after all")
        client = _client_for(server.http_address, nsq_topic)
        assert client[compression] is False
    assert message_count(server.http_address, nsq_topic) == 1
    assert f"compression {compression} requested but not enabled on nsqd" in caplog.text


# -------------------------------------------------------------------------------- heartbeats


def _count_nops(conn: NsqdConnection) -> list[int]:
    """Wrap the connection's transport so that NOP writes (heartbeat answers) are counted."""
    transport = conn._transport
    assert transport is not None
    sent = [0]
    original = transport.send

    def send(data: bytes) -> None:
        if data == commands.NOP:
            sent[0] += 1
        original(data)

    transport.send = send  # type: ignore[method-assign]
    return sent


def test_heartbeats_answered_on_idle_connection(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd; IDENTIFY heartbeat_interval=1 s, read_timeout=3 s)."""
    collector = Collector()
    conn = NsqdConnection(
        nsqd.tcp_address, Config(heartbeat_interval=1.0, read_timeout=3.0), handler=collector
    )
    conn.connect()
    try:
        nops = _count_nops(conn)
        conn.start_reader()
        # Three heartbeats one second apart: nsqd closes a client that has sent nothing for two
        # heartbeat intervals, so without our NOPs the connection would be gone by the third.
        wait_for(lambda: nops[0] >= 3 or conn.closed, "3 heartbeats answered", timeout=15.0)
        assert not conn.closed, conn.close_error
        assert conn.reader_alive
        assert conn.request(commands.pub(nsq_topic, b"after idling"), timeout=10.0) == b"OK"
        assert collector.closed == []
    finally:
        conn.close()
        conn.join(10.0)
    assert message_count(nsqd.http_address, nsq_topic) == 1


def test_producer_survives_idle_period(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd; Producer heartbeat_interval=1 s, read_timeout=3 s).

    Publishing connections read only while a publish waits, so they IDENTIFY with heartbeats
    disabled: an idle producer must not be dropped by nsqd for unanswered heartbeats."""
    with Producer(nsqd.tcp_address, heartbeat_interval=1.0, read_timeout=3.0) as producer:
        producer.publish(nsq_topic, b"before idling")
        conn = producer._slots[0].conn
        assert conn is not None
        address = _client_for(nsqd.http_address, nsq_topic)["remote_address"]
        # Idle for longer than two heartbeat intervals (with a second to spare): with heartbeats
        # on and nobody answering them, nsqd would have closed the connection after 2 s.
        threading.Event().wait(3.0)
        assert not conn.closed, conn.close_error
        producer.publish(nsq_topic, b"after idling")
        assert producer._slots[0].conn is conn  # no reconnect was needed
        assert _client_for(nsqd.http_address, nsq_topic)["remote_address"] == address
    assert message_count(nsqd.http_address, nsq_topic) == 2


# ------------------------------------------------------------------------------------- close


def test_close_is_idempotent(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    collector = Collector()
    conn = NsqdConnection(nsqd.tcp_address, handler=collector)
    conn.connect()
    conn.start_reader()
    assert conn.request(commands.pub(nsq_topic, b"x"), timeout=10.0) == b"OK"

    closers = [threading.Thread(target=conn.close) for _ in range(4)]
    for t in closers:
        t.start()
    conn.close()
    for t in closers:
        t.join(10.0)
    conn.close()
    assert conn.join(10.0)
    assert conn.closed and not conn.reader_alive
    assert collector.closed == [None]  # reported once, as a local close (no error)
    assert conn.close_error is None
    with pytest.raises(ConnectionClosed) as info:
        conn.request(commands.pub(nsq_topic, b"y"), timeout=1.0)
    assert info.value.by_server is False
    with pytest.raises(ConnectionClosed):
        conn.send(commands.nop())
    wait_for(
        lambda: (
            not any(
                any(pc.get("topic") == nsq_topic for pc in c.get("pub_counts") or [])
                for c in producer_clients(nsqd.http_address)
            )
        ),
        "nsqd to see the connection closed",
    )
    assert message_count(nsqd.http_address, nsq_topic) == 1


def test_close_before_connect_and_after_failed_connect() -> None:
    """nsqd flags: no nsqd (nothing listens on the port)."""
    from support.nsq import free_closed_port

    conn = NsqdConnection(f"127.0.0.1:{free_closed_port()}", Config(dial_timeout=1.0))
    conn.close()
    conn.close()
    with pytest.raises(NSQConnectionError, match="cannot connect"):
        conn.connect()
    conn.close()
    assert conn.closed and conn.join(1.0)


def test_producer_close_is_idempotent_and_thread_safe(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    producer = Producer(nsqd.tcp_address)
    producer.publish(nsq_topic, b"x")
    closers = [threading.Thread(target=producer.close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(15.0)
    assert not any(t.is_alive() for t in closers)
    producer.close()
    with producer:  # __exit__ closes again
        pass
    assert producer.closed
    assert message_count(nsqd.http_address, nsq_topic) == 1


# -------------------------------------------------------------------------------- pipelining


@pytest.fixture
def raw_conn(nsqd: NsqdProcess) -> Iterator[NsqdConnection]:
    conn = NsqdConnection(nsqd.tcp_address)
    conn.connect()
    conn.start_reader()
    yield conn
    conn.close()
    conn.join(10.0)


def test_pipelined_requests_from_many_threads(
    raw_conn: NsqdConnection, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """nsqd flags: none (shared nsqd). 16 threads x 200 requests on one NsqdConnection, each
    thread on its own topic and mixing PUB, MPUB and DPUB."""
    threads_n, per_thread = 16, 200
    answers: dict[int, list[bytes]] = {n: [] for n in range(threads_n)}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        t = f"{nsq_topic[:56]}_{n}"
        try:
            for i in range(per_thread):
                if i % 10 == 1:
                    data = commands.mpub(t, [b"%d-%d-a" % (n, i), b"%d-%d-b" % (n, i)])
                elif i % 10 == 2:
                    data = commands.dpub(t, b"%d-%d" % (n, i), 60.0)
                else:
                    data = commands.pub(t, b"%d-%d" % (n, i))
                answers[n].append(raw_conn.request(data, timeout=30.0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert all(a == [b"OK"] * per_thread for a in answers.values())
    per_topic = per_thread + per_thread // 10  # each MPUB carries two messages
    for n in range(threads_n):
        assert message_count(nsqd.http_address, f"{nsq_topic[:56]}_{n}") == per_topic
    assert not raw_conn.closed


def test_pipelined_error_reaches_its_own_request(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: --max-msg-size=100. One thread sends an oversize PUB while 8 others pipeline
    good ones on the same connection: only that thread gets E_BAD_MESSAGE, every OK anyone
    received is a message nsqd counted, and requests behind the error see the connection close."""
    server = nsqd_factory("--max-msg-size=100")
    conn = NsqdConnection(server.tcp_address)
    conn.connect()
    conn.start_reader()
    oks = [0] * 8
    outcomes: dict[str, BaseException] = {}
    progress = threading.Event()

    def good(n: int) -> None:
        try:
            while True:
                conn.request(commands.pub(nsq_topic, b"good %d" % n), timeout=30.0)
                oks[n] += 1
                if sum(oks) >= 400:
                    progress.set()
        except BaseException as exc:  # the connection closes after the bad request
            outcomes[f"good{n}"] = exc

    def bad() -> None:
        progress.wait(30.0)
        try:
            conn.request(commands.pub(nsq_topic, b"x" * 101), timeout=30.0)
        except BaseException as exc:
            outcomes["bad"] = exc

    threads = [threading.Thread(target=good, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=bad))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        assert not any(t.is_alive() for t in threads)
    finally:
        conn.close()
        conn.join(10.0)
    assert isinstance(outcomes["bad"], ServerBadMessage), outcomes
    assert "too big" in str(outcomes["bad"])
    others = [e for k, e in outcomes.items() if k != "bad"]
    assert len(others) == 8
    assert all(isinstance(e, NSQConnectionError) for e in others), others
    assert sum(oks) >= 400
    assert message_count(server.http_address, nsq_topic) == sum(oks)


def test_close_waits_for_a_write_another_task_has_under_way(
    raw_conn: NsqdConnection, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """A consumer's stop closes its connections once every message was answered locally; a FIN
    or REQ another task (the reader answering a late message) is still writing must reach nsqd,
    not be cut off by the close (nsqd would hold the message in flight until --msg-timeout).
    Here a second task holds the writer role with a PUB buffered, and starts writing only once
    close() is under way (nothing to wait on from outside close(): a short head start)."""
    transport = raw_conn._transport
    assert transport is not None
    first = transport.enqueue(commands.pub(nsq_topic, b"on its way"))
    assert first is not None  # the writer role, with the PUB to write
    outcome: list[BaseException | None] = []

    def writer() -> None:
        time.sleep(0.2)  # close() is waiting by now
        try:
            transport.drain(first)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    task = threading.Thread(target=writer)
    task.start()
    raw_conn.close()
    task.join(10.0)
    assert outcome == [None]
    wait_for(lambda: message_count(nsqd.http_address, nsq_topic) == 1, "the PUB reached nsqd")
