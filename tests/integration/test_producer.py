"""Producer against real nsqd v1.3.0 processes on 127.0.0.1: TLS, AUTH, concurrency, failover,
fork safety, DPUB/MPUB semantics and input validation.

What a user would check is what these tests check: messages counted by nsqd itself (``/stats``
``message_count``, ``depth``, ``deferred_count``, the ``producers`` client list), and the
exception a failing call raises. Certificates are generated per test with ``cryptography``; the
auth server is a real HTTP server on ``127.0.0.1:0``. Every wait polls against a deadline.

The nsqd flags each test uses are listed in its docstring ("nsqd flags: ...").
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import traceback
import warnings
from typing import Any

import pytest
from support.auth_server import AuthServer, grant
from support.certs import Pki, make_pki
from support.nsq import (
    free_closed_port,
    message_count,
    producer_clients,
    topic_depth,
    wait_for,
    waitpid,
)

from nsq_sync import Config, NsqdHTTPClient, Producer
from nsq_sync.errors import (
    AuthError,
    ConfigError,
    InvalidBody,
    InvalidName,
    NSQError,
    PublishError,
    PublishOutcomeUnknown,
    RemoteProtocolError,
    ServerAuthFailed,
    ServerBadBody,
    ServerBadMessage,
    ServerUnauthorized,
    Stopped,
    TLSError,
)
from nsq_sync.testing import NsqdProcess
from nsq_sync.wire.connection import NsqdConnection

pytestmark = pytest.mark.integration

#: A publish that fails because of configuration must fail well before publish_timeout.
PROMPT = 5.0
SLOW_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_args(pki: Pki, *, self_signed: bool = False) -> list[str]:
    cert, key = (
        (pki.self_signed_cert, pki.self_signed_key)
        if self_signed
        else (pki.server_cert, pki.server_key)
    )
    return [f"--tls-cert={cert}", f"--tls-key={key}"]


def _client_of(http_address: str, topic: str) -> list[dict[str, Any]]:
    """nsqd's producer clients that published to ``topic``."""
    return [
        c
        for c in producer_clients(http_address)
        if any(pc.get("topic") == topic for pc in c.get("pub_counts") or [])
    ]


def _pub_count(client: dict[str, Any], topic: str) -> int:
    return sum(int(pc["count"]) for pc in client.get("pub_counts") or [] if pc["topic"] == topic)


def _expect_prompt_publish_error(producer: Producer, topic: str) -> PublishError:
    started = time.monotonic()
    with pytest.raises(PublishError) as info:
        producer.publish(topic, b"never")
    elapsed = time.monotonic() - started
    assert elapsed < PROMPT, f"configuration error took {elapsed:.1f} s (publish_timeout retries)"
    return info.value


# ------------------------------------------------------------------------------------------- TLS


def test_tls_with_ca_file(nsqd_factory: Any, pki: Pki, nsq_topic: str) -> None:
    """nsqd flags: --tls-cert --tls-key (CA-signed server certificate)."""
    server = nsqd_factory(*_tls_args(pki))
    with Producer(server.tcp_address, tls_v1=True, tls_root_ca_file=str(pki.ca_cert)) as producer:
        producer.publish(nsq_topic, b"over tls")
        producer.multi_publish(nsq_topic, [b"a", b"b"])
        conn = producer._slots[0].conn
        assert conn is not None and conn.identify.tls_v1
        assert conn._transport is not None and conn._transport.tls_version in ("TLSv1.2", "TLSv1.3")
        [client] = _client_of(server.http_address, nsq_topic)
        assert client["tls"] is True, client  # nsqd's own view of the connection
        assert client["tls_version"].startswith("TLS1."), client
    assert message_count(server.http_address, nsq_topic) == 3


def test_tls_self_signed_rejected_by_default(nsqd_factory: Any, pki: Pki, nsq_topic: str) -> None:
    """nsqd flags: --tls-cert --tls-key (self-signed server certificate)."""
    server = nsqd_factory(*_tls_args(pki, self_signed=True))
    conn = NsqdConnection(server.tcp_address, Config(tls_v1=True))
    with pytest.raises(TLSError, match="certificate") as info:
        conn.connect()
    assert "self-signed" in str(info.value) or "self signed" in str(info.value)
    assert conn.closed

    with Producer(server.tcp_address, tls_v1=True, publish_timeout=SLOW_TIMEOUT) as producer:
        error = _expect_prompt_publish_error(producer, nsq_topic)
    assert isinstance(error.reason, TLSError)
    assert "certificate" in str(error)
    assert message_count(server.http_address, nsq_topic) == 0


def test_tls_insecure_skip_verify(nsqd_factory: Any, pki: Pki, nsq_topic: str) -> None:
    """nsqd flags: --tls-cert --tls-key (self-signed server certificate)."""
    server = nsqd_factory(*_tls_args(pki, self_signed=True))
    with Producer(server.tcp_address, tls_v1=True, tls_insecure_skip_verify=True) as producer:
        producer.publish(nsq_topic, b"unverified but encrypted")
        [client] = _client_of(server.http_address, nsq_topic)
        assert client["tls"] is True
    assert message_count(server.http_address, nsq_topic) == 1


def test_tls_required_but_client_did_not_ask(nsqd_factory: Any, pki: Pki, nsq_topic: str) -> None:
    """nsqd flags: --tls-cert --tls-key --tls-required=tcp-https.

    (``--tls-required=true`` behaves the same on TCP but also refuses plain HTTP, including the
    ``/ping`` and ``/stats`` the tests rely on.)"""
    server = nsqd_factory(*_tls_args(pki), "--tls-required=tcp-https")
    with Producer(server.tcp_address, publish_timeout=SLOW_TIMEOUT) as producer:
        error = _expect_prompt_publish_error(producer, nsq_topic)
    assert isinstance(error.reason, TLSError), repr(error.reason)
    assert "requires TLS" in str(error.reason) and "tls_v1=True" in str(error.reason)
    assert message_count(server.http_address, nsq_topic) == 0

    # The same producer settings with TLS turned on work.
    with Producer(server.tcp_address, tls_v1=True, tls_root_ca_file=str(pki.ca_cert)) as producer:
        producer.publish(nsq_topic, b"now over tls")
    assert message_count(server.http_address, nsq_topic) == 1


def test_tls_client_certificate_required(nsqd_factory: Any, pki: Pki, nsq_topic: str) -> None:
    """nsqd flags: --tls-cert --tls-key --tls-client-auth-policy=require-verify
    --tls-root-ca-file=ca.pem --tls-required=tcp-https.

    (A client auth policy makes nsqd default to ``--tls-required=true``, which also refuses plain
    HTTP; ``tcp-https`` keeps TCP identical and leaves ``/stats`` reachable.)"""
    server = nsqd_factory(
        *_tls_args(pki),
        "--tls-client-auth-policy=require-verify",
        f"--tls-root-ca-file={pki.ca_cert}",
        "--tls-required=tcp-https",
    )
    with Producer(
        server.tcp_address,
        tls_v1=True,
        tls_root_ca_file=str(pki.ca_cert),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
    ) as producer:
        producer.publish(nsq_topic, b"mutual tls")
        [client] = _client_of(server.http_address, nsq_topic)
        assert client["tls"] is True
    assert message_count(server.http_address, nsq_topic) == 1

    conn = NsqdConnection(
        server.tcp_address, Config(tls_v1=True, tls_root_ca_file=str(pki.ca_cert))
    )
    with pytest.raises(TLSError, match="certificate"):
        conn.connect()
    with Producer(
        server.tcp_address,
        tls_v1=True,
        tls_root_ca_file=str(pki.ca_cert),
        publish_timeout=SLOW_TIMEOUT,
    ) as producer:
        error = _expect_prompt_publish_error(producer, nsq_topic)
    assert isinstance(error.reason, TLSError) and "certificate" in str(error.reason)
    assert message_count(server.http_address, nsq_topic) == 1


# ------------------------------------------------------------------------------------------ AUTH


@pytest.fixture
def auth_server() -> Any:
    with AuthServer(
        {
            "good": grant(),
            "only-allowed": grant(topic="^allowed_.*$"),
            "forbidden": (403, "go away"),
        }
    ) as server:
        yield server


def test_auth_good_secret_publishes(
    nsqd_factory: Any, auth_server: AuthServer, nsq_topic: str
) -> None:
    """nsqd flags: --auth-http-address=127.0.0.1:<auth server>."""
    server = nsqd_factory(f"--auth-http-address={auth_server.address}")
    with Producer(server.tcp_address, auth_secret="good") as producer:
        producer.publish(nsq_topic, b"authorised")
        producer.multi_publish(nsq_topic, [b"1", b"2"])
        conn = producer._slots[0].conn
        assert conn is not None and conn.identify.auth_required
    assert message_count(server.http_address, nsq_topic) == 3
    [request] = auth_server.requests  # one AUTH per connection (ttl 3600)
    assert request["path"] == "/auth"
    assert request["secret"] == "good"
    assert request["remote_ip"] == "127.0.0.1"
    assert request["tls"] == "false"


def test_auth_bad_secret_is_unauthorized_without_failover(
    nsqd_factory: Any, auth_server: AuthServer, nsq_topic: str
) -> None:
    """nsqd flags: first nsqd --auth-http-address=127.0.0.1:<auth server>; second nsqd none.

    The auth server grants nothing to the secret: nsqd answers E_UNAUTHORIZED. That rejection
    would be the same on a retry, so the producer raises it and does not fail over."""
    guarded = nsqd_factory(f"--auth-http-address={auth_server.address}")
    open_nsqd = nsqd_factory()
    producer = Producer([guarded.tcp_address, open_nsqd.tcp_address], auth_secret="bad")
    with producer, pytest.raises(ServerUnauthorized) as info:
        producer.publish(nsq_topic, b"denied")
    assert info.value.code == "E_UNAUTHORIZED"
    assert "E_UNAUTHORIZED" in str(info.value)
    assert auth_server.secrets_seen() == ["bad"]
    assert message_count(guarded.http_address, nsq_topic) == 0
    assert message_count(open_nsqd.http_address, nsq_topic) == 0


def test_auth_topic_without_permission(
    nsqd_factory: Any, auth_server: AuthServer, nsq_topic: str
) -> None:
    """nsqd flags: --auth-http-address=127.0.0.1:<auth server>.

    The secret may publish to ``allowed_*`` only: PUB elsewhere is E_UNAUTHORIZED (and nsqd
    closes the connection); the next publish to an allowed topic reconnects and works."""
    server = nsqd_factory(f"--auth-http-address={auth_server.address}")
    allowed = "allowed_" + nsq_topic[:50]
    with Producer(server.tcp_address, auth_secret="only-allowed") as producer:
        producer.publish(allowed, b"fine")
        with pytest.raises(ServerUnauthorized):
            producer.publish(nsq_topic, b"not permitted")
        producer.publish(allowed, b"fine again")
    assert message_count(server.http_address, allowed) == 2
    assert message_count(server.http_address, nsq_topic) == 0


@pytest.mark.parametrize("failure", ["server down", "server says 403"])
def test_auth_server_failure_is_auth_failed(
    nsqd_factory: Any, auth_server: AuthServer, nsq_topic: str, failure: str
) -> None:
    """nsqd flags: --auth-http-address=127.0.0.1:<closed port> (server down), or the auth
    server answering 403 (--auth-http-address=127.0.0.1:<auth server>)."""
    if failure == "server down":
        server = nsqd_factory(f"--auth-http-address=127.0.0.1:{free_closed_port()}")
        secret = "good"
    else:
        server = nsqd_factory(f"--auth-http-address={auth_server.address}")
        secret = "forbidden"
    conn = NsqdConnection(server.tcp_address, Config(auth_secret=secret))
    with pytest.raises(ServerAuthFailed) as info:
        conn.connect()
    assert info.value.code == "E_AUTH_FAILED"
    # The auth server may come back: the producer retries until publish_timeout, then reports.
    producer = Producer(server.tcp_address, auth_secret=secret, publish_timeout=1.0)
    with producer, pytest.raises(PublishError) as pub_info:
        producer.publish(nsq_topic, b"x")
    assert isinstance(pub_info.value.reason, ServerAuthFailed)
    assert "E_AUTH_FAILED" in str(pub_info.value)
    assert message_count(server.http_address, nsq_topic) == 0


def test_auth_required_but_no_secret(
    nsqd_factory: Any, auth_server: AuthServer, nsq_topic: str
) -> None:
    """nsqd flags: --auth-http-address=127.0.0.1:<auth server>."""
    server = nsqd_factory(f"--auth-http-address={auth_server.address}")
    conn = NsqdConnection(server.tcp_address, Config())
    with pytest.raises(AuthError, match="requires AUTH.*auth_secret"):
        conn.connect()
    with Producer(server.tcp_address, publish_timeout=SLOW_TIMEOUT) as producer:
        error = _expect_prompt_publish_error(producer, nsq_topic)
    assert isinstance(error.reason, AuthError)
    assert "auth_secret" in str(error)
    assert auth_server.requests == []  # nothing was sent to nsqd's auth server
    assert message_count(server.http_address, nsq_topic) == 0


def test_auth_secret_but_auth_not_required_warns(
    nsqd: NsqdProcess, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd flags: none (shared nsqd, no --auth-http-address)."""
    caplog.set_level(logging.WARNING, logger="nsq_sync")
    with Producer(nsqd.tcp_address, auth_secret="s3cret") as producer:
        producer.publish(nsq_topic, b"no auth needed")
    assert message_count(nsqd.http_address, nsq_topic) == 1
    warnings_logged = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "auth_secret" in r.getMessage()
    ]
    assert warnings_logged, caplog.text
    assert "does not require AUTH" in warnings_logged[0].getMessage()
    assert "s3cret" not in caplog.text  # the secret itself is never logged


# ----------------------------------------------------------------------------------- concurrency


def test_eight_threads_share_one_producer(
    nsqd: NsqdProcess, nsq_topic: str, runtime_mode: str
) -> None:
    """nsqd flags: none (shared nsqd). 8 threads x 1,000 PUBs through one Producer."""
    threads_n, per_thread = 8, 1000
    errors: list[BaseException] = []
    start = threading.Event()

    with Producer(nsqd.tcp_address) as producer:
        assert producer.runtime.name == runtime_mode  # greenlets under the gevent run

        def work(n: int) -> None:
            start.wait(30)
            try:
                for i in range(per_thread):
                    producer.publish(nsq_topic, b"%d-%d" % (n, i))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
        for t in threads:
            t.start()
        start.set()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "publishing threads did not finish"
        assert errors == []
        # one pooled connection carried them all
        [client] = _client_of(nsqd.http_address, nsq_topic)
        assert _pub_count(client, nsq_topic) == threads_n * per_thread
    assert message_count(nsqd.http_address, nsq_topic) == threads_n * per_thread


# -------------------------------------------------------------------------------------- failover


@pytest.mark.parametrize("retry_unknown", [False, True], ids=["no-resend", "retry_unknown"])
@pytest.mark.parametrize("publishers", [1, 4])
def test_failover_when_first_nsqd_stops(
    nsqd_factory: Any, nsq_topic: str, record_property: Any, publishers: int, retry_unknown: bool
) -> None:
    """nsqd flags: none (two fresh nsqds; the first is stopped with SIGTERM mid-run, then
    restarted on the same data path to count what it had persisted).

    By default a PUB in flight when the first nsqd goes away raises PublishOutcomeUnknown and
    is never resent (no duplicate caused by the client); with ``retry_unknown=True`` it is
    resent on the second nsqd (no error, at most one duplicate per publisher)."""
    first, second = nsqd_factory(), nsqd_factory()
    succeeded: list[bytes] = []
    failed: list[tuple[bytes, BaseException]] = []
    stop = threading.Event()

    with Producer([first.tcp_address, second.tcp_address], retry_unknown=retry_unknown) as producer:

        def publish_forever(n: int) -> None:
            i = 0
            while not stop.is_set():
                body = b"m%d-%06d" % (n, i)
                i += 1
                try:
                    producer.publish(nsq_topic, body)
                except BaseException as exc:
                    failed.append((body, exc))
                else:
                    succeeded.append(body)

        threads = [
            threading.Thread(target=publish_forever, args=(n,), name=f"publisher-{n}")
            for n in range(publishers)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(succeeded) >= 300, "300 publishes to the first nsqd")
            # The producer sticks to the first address while it works.
            assert message_count(second.http_address, nsq_topic) == 0
            first.stop()
            at_stop = len(succeeded)
            wait_for(lambda: len(succeeded) >= at_stop + 300, "300 publishes after the failover")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not any(thread.is_alive() for thread in threads)

    if retry_unknown:
        assert failed == [], f"{len(failed)} publishes raised: {failed[:3]}"
    else:
        # at most the PUB each publisher had in flight, each saying the outcome is unknown
        assert len(failed) <= publishers, failed
        assert all(isinstance(exc, PublishOutcomeUnknown) for _, exc in failed), failed
    on_second = message_count(second.http_address, nsq_topic)
    assert on_second >= 300
    first.restart()
    on_first = topic_depth(first.http_address, nsq_topic)  # persisted on SIGTERM, nothing consumed
    total = on_first + on_second
    duplicates = total - len(succeeded)
    record_property("failover_published", len(succeeded))
    record_property("failover_duplicates", duplicates)
    print(
        f"failover with {publishers} publisher(s): {len(succeeded)} acked, "
        f"{on_first} on first + {on_second} on second, {duplicates} duplicate(s)"
    )
    assert total >= len(succeeded), "an acknowledged message was lost"
    if retry_unknown:
        # Only a PUB in flight when the first nsqd went away can be published twice.
        assert duplicates <= publishers
    else:
        # nothing resent: nsqd holds the acknowledged bodies plus at most the unknown ones
        assert duplicates <= len(failed)


# ------------------------------------------------------------------------------------------ fork


def test_forked_child_reconnects(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd). Works under threads and under gevent (gevent's fork)."""
    child_count = 50
    with Producer(nsqd.tcp_address) as producer:
        producer.publish(nsq_topic, b"parent before fork")
        parent_conn = producer._slots[0].conn
        assert parent_conn is not None
        [parent_client] = _client_of(nsqd.http_address, nsq_topic)

        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a multi-threaded process may deadlock; the
            # producer is exactly what has to cope with that (gunicorn, celery, Spark workers).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 3
            try:
                os.close(ready_r)
                os.close(go_w)
                for i in range(child_count):
                    producer.publish(nsq_topic, b"child %d" % i)
                os.write(ready_w, b"1")
                select.select([go_r], [], [], 30.0)  # the parent looks at /stats meanwhile
                producer.close()
                code = 0
            except BaseException:
                traceback.print_exc()
                code = 2
            finally:
                os._exit(code)

        os.close(ready_w)
        os.close(go_r)
        try:
            readable, _, _ = select.select([ready_r], [], [], 30.0)
            assert readable and os.read(ready_r, 1) == b"1", "the child did not publish"
            clients = _client_of(nsqd.http_address, nsq_topic)
            by_address = {c["remote_address"]: _pub_count(c, nsq_topic) for c in clients}
            # two connections: the parent's (1 message) and the child's own (child_count)
            assert len(by_address) == 2, by_address
            assert by_address[parent_client["remote_address"]] == 1
            assert sorted(by_address.values()) == [1, child_count]
        finally:
            os.close(go_w)
            os.close(ready_r)
            exit_code = waitpid(pid, 30.0)
        assert exit_code == 0

        # The child dropped its copy of the parent's socket without shutting it down.
        producer.publish(nsq_topic, b"parent after fork")
        assert producer._slots[0].conn is parent_conn
        # the child's connection is gone once nsqd has read its close
        wait_for(lambda: len(_client_of(nsqd.http_address, nsq_topic)) == 1, "one connection")
        [client] = _client_of(nsqd.http_address, nsq_topic)
        assert client["remote_address"] == parent_client["remote_address"]
        assert _pub_count(client, nsq_topic) == 2
    assert message_count(nsqd.http_address, nsq_topic) == 1 + child_count + 1


# -------------------------------------------------------------------------------------- DPUB/MPUB


def test_deferred_publish_shows_as_deferred(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    with NsqdHTTPClient(nsqd.http_address) as http:
        http.create_topic(nsq_topic)
        http.create_channel(nsq_topic, "ch")
        with Producer(nsqd.tcp_address) as producer:
            producer.deferred_publish(nsq_topic, b"later", delay=60.0)
            producer.deferred_publish(nsq_topic, b"later too", delay=30)
            producer.publish(nsq_topic, b"now")

        # nsqd's topic pump copies the three to the channel in order, after the acks: wait
        # until the last one (the immediate one) is there too
        def settled() -> dict[str, Any] | None:
            ch = http.channel_stats(nsq_topic, "ch")
            return ch if ch is not None and ch["deferred_count"] + ch["depth"] == 3 else None

        channel = wait_for(settled, "the 3 messages in the channel")
        assert (channel["depth"], channel["deferred_count"]) == (1, 2)  # the 2 deferred hidden
    assert message_count(nsqd.http_address, nsq_topic) == 3


def test_mpub_is_atomic_on_the_server(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: --max-msg-size=1000 (client-side check disabled with max_msg_size=None)."""
    server = nsqd_factory("--max-msg-size=1000")
    with Producer(server.tcp_address, max_msg_size=None) as producer:
        with pytest.raises(ServerBadMessage) as info:
            producer.multi_publish(nsq_topic, [b"a" * 10, b"b" * 999, b"c" * 1001, b"d" * 10])
        assert "too big" in str(info.value)
        assert message_count(server.http_address, nsq_topic) == 0  # none of the batch
        assert topic_depth(server.http_address, nsq_topic) == 0
        # nsqd closed that connection; the producer reconnects for the next batch
        producer.multi_publish(nsq_topic, [b"a" * 10, b"b" * 1000])
    assert message_count(server.http_address, nsq_topic) == 2


def test_oversize_body_rejected_before_sending(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: --max-msg-size=1000."""
    server = nsqd_factory("--max-msg-size=1000")
    with Producer(server.tcp_address, max_msg_size=1000) as producer:
        producer.publish(nsq_topic, b"ok")
        conn = producer._slots[0].conn
        with pytest.raises(InvalidBody, match=r"message 2\) of 1001 bytes exceeds max_msg_size"):
            producer.multi_publish(nsq_topic, [b"a", b"b" * 1000, b"c" * 1001])
        with pytest.raises(InvalidBody, match="1001 bytes exceeds max_msg_size 1000"):
            producer.publish(nsq_topic, b"x" * 1001)
        with pytest.raises(InvalidBody, match="exceeds max_msg_size"):
            producer.deferred_publish(nsq_topic, "é" * 501, delay=1.0)  # 1002 bytes as UTF-8
        producer.publish(nsq_topic, b"still fine")
        assert producer._slots[0].conn is conn  # nothing reached nsqd, no error, no reconnect
    assert message_count(server.http_address, nsq_topic) == 2

    # The default limit (1 MiB, nsqd's default --max-msg-size) is checked client-side too.
    producer = Producer(server.tcp_address)
    with producer, pytest.raises(InvalidBody, match="exceeds max_msg_size 1048576"):
        producer.publish(nsq_topic, b"x" * (1024 * 1024 + 1))
    assert message_count(server.http_address, nsq_topic) == 2


# ------------------------------------------------------------------------------------- bad input


@pytest.fixture
def producer(nsqd: NsqdProcess) -> Any:
    with Producer(nsqd.tcp_address) as p:
        yield p


@pytest.mark.parametrize(
    "bad_topic",
    ["", "a" * 65, "has space", "slash/topic", "new\nline", "t\u00f6pic", "x#ephemeralz", b"\xff"],
)
def test_invalid_topic_names(
    producer: Producer, nsqd: NsqdProcess, nsq_topic: str, bad_topic: Any
) -> None:
    """nsqd flags: none (shared nsqd)."""
    producer.publish(nsq_topic, b"before")
    conn = producer._slots[0].conn
    with pytest.raises(InvalidName, match="invalid topic name"):
        producer.publish(bad_topic, b"x")
    with pytest.raises(InvalidName, match="invalid topic name"):
        producer.multi_publish(bad_topic, [b"x"])
    with pytest.raises(InvalidName, match="invalid topic name"):
        producer.deferred_publish(bad_topic, b"x", delay=1.0)
    producer.publish(nsq_topic, b"after")
    assert producer._slots[0].conn is conn
    assert message_count(nsqd.http_address, nsq_topic) == 2


def test_empty_and_wrongly_typed_bodies(
    producer: Producer, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """nsqd flags: none (shared nsqd)."""
    producer.publish(nsq_topic, b"before")
    conn = producer._slots[0].conn
    for empty in (b"", "", bytearray(), memoryview(b"")):
        with pytest.raises(InvalidBody, match="empty"):
            producer.publish(nsq_topic, empty)
        with pytest.raises(InvalidBody, match="empty"):
            producer.deferred_publish(nsq_topic, empty, delay=1.0)
    with pytest.raises(InvalidBody, match=r"message 1\) is empty"):
        producer.multi_publish(nsq_topic, [b"ok", b"", b"ok"])
    with pytest.raises(InvalidBody, match="must be bytes or str, got int"):
        producer.publish(nsq_topic, 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidBody, match="not a single body"):
        producer.multi_publish(nsq_topic, b"one body, not a list")
    producer.publish(nsq_topic, b"after")
    assert producer._slots[0].conn is conn
    assert message_count(nsqd.http_address, nsq_topic) == 2


def test_empty_mpub(producer: Producer, nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    with pytest.raises(InvalidBody, match="at least one message"):
        producer.multi_publish(nsq_topic, [])
    with pytest.raises(InvalidBody, match="at least one message"):
        producer.multi_publish(nsq_topic, iter(()))
    assert message_count(nsqd.http_address, nsq_topic) == 0
    producer.multi_publish(nsq_topic, (b"%d" % i for i in range(3)))  # any iterable works
    assert message_count(nsqd.http_address, nsq_topic) == 3


def test_mpub_over_max_body_size(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd; client max_body_size lowered)."""
    with Producer(nsqd.tcp_address, max_body_size=1000) as producer:
        with pytest.raises(InvalidBody, match="exceeds max_body_size 1000"):
            producer.multi_publish(nsq_topic, [b"x" * 400] * 3)
        producer.multi_publish(nsq_topic, [b"x" * 400] * 2)
    assert message_count(nsqd.http_address, nsq_topic) == 2


def test_mpub_body_size_is_held_to_the_limit_as_nsqd_holds_it(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """A batch whose MPUB body (count, then each size and message: 4 + 2 * (4 + 494)) is
    exactly nsqd's --max-body-size is sent and taken; one byte more is refused before anything
    is sent, with nsqd's own answer to it shown by a producer without the limit. (The check
    used to count the command's header too, refusing batches nsqd would take.)
    nsqd flags: --max-body-size=1000."""
    server: NsqdProcess = nsqd_factory("--max-body-size=1000")
    with Producer(server.tcp_address, max_body_size=1000) as producer:
        producer.multi_publish(nsq_topic, [b"x" * 494] * 2)
        with pytest.raises(InvalidBody, match="MPUB batch of 1001 bytes exceeds max_body_size"):
            producer.multi_publish(nsq_topic, [b"x" * 494, b"x" * 495])
    assert message_count(server.http_address, nsq_topic) == 2
    unlimited = Producer(server.tcp_address, max_body_size=None)
    with unlimited, pytest.raises(ServerBadBody, match="body too big 1001 > 1000"):
        unlimited.multi_publish(nsq_topic, [b"x" * 494, b"x" * 495])
    assert message_count(server.http_address, nsq_topic) == 2


@pytest.mark.parametrize("delay", [-1, -0.001, 3600.001, 86400, float("nan"), float("inf"), True])
def test_bad_defer(producer: Producer, nsqd: NsqdProcess, nsq_topic: str, delay: Any) -> None:
    """nsqd flags: none (shared nsqd; max_defer is 3600 s like nsqd's --max-req-timeout)."""
    with pytest.raises(ConfigError, match="max_defer"):
        producer.deferred_publish(nsq_topic, b"x", delay=delay)
    assert message_count(nsqd.http_address, nsq_topic) == 0
    producer.deferred_publish(nsq_topic, b"x", delay=3600)  # the limit itself is fine
    assert message_count(nsqd.http_address, nsq_topic) == 1


def test_defer_limit_is_configurable(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    with Producer(nsqd.tcp_address, max_defer=10.0) as producer:
        with pytest.raises(ConfigError, match=r"max_defer \(10.0 s\), got 10.5"):
            producer.deferred_publish(nsq_topic, b"x", delay=10.5)
        producer.deferred_publish(nsq_topic, b"x", delay=10.0)
    assert message_count(nsqd.http_address, nsq_topic) == 1


def test_publish_after_close(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd)."""
    producer = Producer(nsqd.tcp_address)
    producer.publish(nsq_topic, b"before close")
    producer.close()
    producer.close()  # idempotent
    assert producer.closed
    with pytest.raises(Stopped, match="closed"):
        producer.publish(nsq_topic, b"x")
    with pytest.raises(Stopped):
        producer.multi_publish(nsq_topic, [b"x"])
    with pytest.raises(Stopped):
        producer.deferred_publish(nsq_topic, b"x", delay=1.0)
    assert message_count(nsqd.http_address, nsq_topic) == 1
    # the connection is really gone from nsqd's point of view
    wait_for(lambda: not _client_of(nsqd.http_address, nsq_topic), "nsqd to drop the connection")


def test_http_port_given_as_tcp_port(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """nsqd flags: none (shared nsqd; its HTTP port is given as the TCP address)."""
    with Producer(nsqd.http_address, publish_timeout=SLOW_TIMEOUT) as producer:
        error = _expect_prompt_publish_error(producer, nsq_topic)
        assert isinstance(error.reason, RemoteProtocolError)
        assert "HTTP port" in str(error.reason)
        assert "HTTP port" in str(error)
        # the next attempt does not hammer the address either
        error = _expect_prompt_publish_error(producer, nsq_topic)
        assert "HTTP port" in str(error)
    assert message_count(nsqd.http_address, nsq_topic) == 0


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.0.0.1:",
        ":4150",
        "127.0.0.1:http",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        "http://127.0.0.1:4150",
        "127.0.0.1:4150/",
        "",
        ["127.0.0.1:4150", "nope"],
        [],
        4150,
        b"127.0.0.1:4150",
        None,
    ],
)
def test_malformed_address_at_construction(address: Any) -> None:
    """nsqd flags: no nsqd needed (construction does no I/O)."""
    with pytest.raises(ConfigError) as info:
        Producer(address)
    message = str(info.value)
    if address == []:
        assert "at least one" in message
    else:  # names the argument and the bad value
        assert "nsqd TCP address" in message or "nsqd_tcp_addresses" in message
        assert repr(address[-1] if isinstance(address, list) else address) in message
        shown = address[-1] if isinstance(address, list) else address
        assert repr(shown) in message


def test_unknown_option_at_construction() -> None:
    """nsqd flags: no nsqd needed."""
    with pytest.raises(ConfigError, match="unknown option.*snapy"):
        Producer("127.0.0.1:4150", snapy=True)
    with pytest.raises(ConfigError, match="snappy and deflate"):
        Producer("127.0.0.1:4150", snappy=True, deflate=True)


def test_unreachable_nsqd_fails_within_publish_timeout(nsq_topic: str) -> None:
    """nsqd flags: no nsqd (a closed loopback port)."""
    port = free_closed_port()
    with Producer(f"127.0.0.1:{port}", publish_timeout=1.0) as producer:
        started = time.monotonic()
        with pytest.raises(PublishError, match="publish failed on every nsqd") as info:
            producer.publish(nsq_topic, b"x")
        assert time.monotonic() - started < 1.0 + PROMPT
    assert isinstance(info.value.reason, NSQError)
    assert f"127.0.0.1:{port}" in str(info.value)
