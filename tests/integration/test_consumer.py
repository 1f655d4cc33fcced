"""The Consumer against real nsqd processes.

Every test is bounded: waits poll against a deadline (never a fixed sleep), and a watchdog dumps
every stack and exits if a test hangs anyway. The same tests run under plain threads
(``pytest``) and under gevent (``python tests/run_gevent.py``): the consumer's ``runtime="auto"``
follows the monkey patching, and the helpers here only use patched primitives.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.nsq import bounded, connected_addresses
from support.nsq import wait_for as _wait_for

from nsq_sync import BatchConsumer, Consumer, Message, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

T = TypeVar("T")

TIMEOUT = 20.0  # the longest any single wait may take
WATCHDOG = 120.0  # a whole test, setup and teardown included
CHANNEL = "ch"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    """Bound every test (see support.nsq.bounded)."""
    yield from bounded(WATCHDOG)


# support.nsq.wait_for with this module's longer default timeout and finer polling
wait_for = functools.partial(_wait_for, timeout=TIMEOUT, interval=0.01)


class Recorder:
    """A handler that records what it handled (thread-safe) and can be told what to do."""

    def __init__(self, action: Callable[[Message], Any] | None = None) -> None:
        self.action = action
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.attempts: list[int] = []
        self.addresses: list[str] = []
        self.calls = 0

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls += 1
        if self.action is not None:
            self.action(message)  # may raise: then the message does not count as handled
        with self.lock:
            self.bodies.append(message.body)
            self.attempts.append(message.attempts)
            self.addresses.append(message.nsqd_address)

    @property
    def handled(self) -> int:
        with self.lock:
            return len(self.bodies)


def http(nsqd: NsqdProcess) -> NsqdHTTPClient:
    return NsqdHTTPClient(nsqd.http_url)


def prepare(nsqd: NsqdProcess, topic: str, bodies: list[bytes] = ()) -> NsqdHTTPClient:  # type: ignore[assignment]
    """Create topic and channel (so nothing depends on who comes first), then publish."""
    client = http(nsqd)
    client.create_topic(topic)
    client.create_channel(topic, CHANNEL)
    if bodies:
        client.mpub(topic, bodies)
    return client


def channel(client: NsqdHTTPClient, topic: str) -> dict[str, Any]:
    stats = client.channel_stats(topic, CHANNEL)
    assert stats is not None, f"nsqd has no channel {topic}/{CHANNEL}"
    return stats


def drained(client: NsqdHTTPClient, topic: str) -> bool:
    stats = channel(client, topic)
    return stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["deferred_count"] == 0


def ready_counts(client: NsqdHTTPClient, topic: str) -> list[int]:
    return [c["ready_count"] for c in channel(client, topic)["clients"]]


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey is not None and monkey.is_module_patched("socket"))


# --------------------------------------------------------------------------- basics


def test_consumes_everything_and_finishes_it(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    client = prepare(nsqd, nsq_topic, bodies(300))
    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=20,
        concurrency=4,
    )
    consumer.start()
    wait_for(lambda: handler.handled == 300, "300 messages handled")
    assert sorted(handler.bodies) == sorted(bodies(300))
    assert set(handler.attempts) == {1}
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    stats = consumer.stats()
    assert stats.finished == 300 and stats.requeued == 0 and stats.gave_up == 0
    assert stats.total_rdy == 20 and stats.max_in_flight == 20
    assert consumer.stop(timeout=10.0) is True


# --------------------------------------------------------------------------- heartbeats


def test_slow_handler_keeps_its_connection_through_heartbeats(
    nsqd_factory: Callable[..., NsqdProcess], nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """A 3 s handler with a 1 s heartbeat and a 2.5 s read timeout: the reader answers the
    heartbeats itself, so the connection survives and the message is handled exactly once."""
    nsqd = nsqd_factory("--msg-timeout=30s")
    client = prepare(nsqd, nsq_topic, [b"slow"])
    started = threading.Event()

    def slow(message: Message) -> None:
        started.set()
        time.sleep(3.0)  # the work itself; longer than read_timeout

    handler = Recorder(slow)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        heartbeat_interval=1.0,
        read_timeout=2.5,
    )
    consumer.start()
    assert started.wait(TIMEOUT)
    conn = consumer._connections.conns[nsqd.tcp_address]
    wait_for(lambda: handler.handled == 1, "the slow message handled", timeout=15)
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    assert handler.calls == 1 and handler.attempts == [1]
    stats = channel(client, nsq_topic)
    assert stats["timeout_count"] == 0 and stats["requeue_count"] == 0
    assert stats["message_count"] == 1
    # the same connection, still alive: heartbeats kept it open while the handler ran
    assert consumer._connections.conns.get(nsqd.tcp_address) is conn
    assert not conn.closed
    assert stats["client_count"] == 1


# --------------------------------------------------------------------------- max_attempts


def test_max_attempts_gives_up_on_the_third_attempt(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    client = prepare(nsqd, nsq_topic, bodies(3))
    given_up: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def fail(message: Message) -> None:
        raise RuntimeError("always fails")

    def giving_up(message: Message) -> None:
        with lock:
            given_up.append((message.body, message.attempts))

    handler = Recorder(fail)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=3,
        max_attempts=3,
        default_requeue_delay=0,
        max_backoff_duration=0,
        giving_up=giving_up,
    )
    consumer.start()
    wait_for(lambda: len(given_up) == 3, "three messages given up")
    assert sorted(given_up) == [(b, 3) for b in bodies(3)]
    assert handler.calls == 9  # attempts 1, 2 and 3 of each message ran the handler
    wait_for(lambda: drained(client, nsq_topic), "an empty channel (depth 0, in flight 0)")
    stats = consumer.stats()
    assert stats.gave_up == 3 and stats.requeued == 6 and stats.finished == 3
    assert not stats.in_backoff


# --------------------------------------------------------------------------- reconnect


def test_reconnects_after_nsqd_restart(
    nsqd_factory: Callable[..., NsqdProcess], nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    nsqd = nsqd_factory()
    client = prepare(nsqd, nsq_topic, bodies(10, "before"))
    handler = Recorder()
    consumer = consumers(
        nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=5
    )
    consumer.start()
    wait_for(lambda: handler.handled == 10, "the first 10 messages")
    first = consumer._connections.conns[nsqd.tcp_address]
    wait_for(lambda: drained(client, nsq_topic), "the first batch finished on nsqd")

    nsqd.restart()
    wait_for(lambda: first.closed, "the old connection noticed the restart")
    client = http(nsqd)
    client.mpub(nsq_topic, bodies(20, "after"))

    def reconnected() -> bool:
        conn = consumer._connections.conns.get(nsqd.tcp_address)
        return conn is not None and conn is not first and not conn.closed

    wait_for(reconnected, "a new connection to the restarted nsqd")
    wait_for(lambda: handler.handled == 30, "the 20 messages published after the restart")
    assert sorted(b for b in handler.bodies if b.startswith(b"after")) == sorted(
        bodies(20, "after")
    )
    wait_for(lambda: drained(client, nsq_topic), "an empty channel after the restart")


# --------------------------------------------------------------------------- stop


@pytest.mark.parametrize(("max_in_flight", "concurrency"), [(1, 1), (50, 8), (2500, 4)])
def test_stop_under_load_leaves_nothing_in_flight(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Callable[..., Consumer],
    max_in_flight: int,
    concurrency: int,
) -> None:
    """A fast handler keeps nsqd writing: when stop() begins, messages are still on the wire.
    They must be requeued, not dropped with the socket (nsqd would keep them in flight until
    --msg-timeout), and the requeues must not come straight back (a requeue storm)."""
    nsqd = nsqd_factory()
    published = 10_000
    client = prepare(nsqd, nsq_topic)
    for batch in range(5):
        client.mpub(nsq_topic, bodies(2000, f"b{batch}-"))

    handler = Recorder()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=max_in_flight,
        concurrency=concurrency,
    )
    consumer.start()
    wait_for(lambda: handler.handled >= 200, "the consumer under load", interval=0.001)
    assert consumer.stop(timeout=10.0) is True
    handled = handler.handled
    assert handled < published, "stop came too late to test anything"

    def settled() -> dict[str, Any] | None:
        stats = channel(client, nsq_topic)
        return stats if stats["in_flight_count"] == 0 and stats["client_count"] == 0 else None

    # nsqd processes the last FIN/REQ a moment after the socket closes; a dropped message
    # would stay in flight for the whole --msg-timeout (60 s), far beyond this wait.
    stats = wait_for(settled, "0 in flight and no client on nsqd", timeout=5.0)
    assert stats["deferred_count"] == 0
    assert handled + stats["depth"] == published
    assert len(set(handler.bodies)) == handled  # nothing handled twice
    consumer_stats = consumer.stats()
    assert consumer_stats.finished == handled
    # every requeue on the way out was a message that arrived after RDY 0: at most one RDY's
    # worth per connection, not a storm
    assert consumer_stats.requeued <= max_in_flight
    assert stats["requeue_count"] == consumer_stats.requeued


def test_stop_is_idempotent_and_final(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    prepare(nsqd, nsq_topic)
    consumer = consumers(nsq_topic, CHANNEL, Recorder(), nsqd_tcp_addresses=nsqd.tcp_address)
    consumer.start()
    wait_for(lambda: connected_addresses(consumer), "a connection")
    assert consumer.stop(timeout=5.0) is True
    assert consumer.stop(timeout=5.0) is True
    assert connected_addresses(consumer) == []
    from nsq_sync.errors import Stopped

    with pytest.raises(Stopped):
        consumer.start()


# --------------------------------------------------------------------------- backoff


@pytest.mark.slow  # ~10 s of real backoff (1, 2, 4 s levels); test_backoff_climbs_two_levels_* runs everywhere
def test_backoff_on_failures_then_recovery(
    nsqd_factory: Callable[..., NsqdProcess], nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    nsqd = nsqd_factory()
    total, failing = 20, 3
    client = prepare(nsqd, nsq_topic, bodies(total))
    failures = 0
    lock = threading.Lock()

    def flaky(message: Message) -> None:
        nonlocal failures
        with lock:
            if failures < failing:
                failures += 1
                raise RuntimeError(f"failure {failures}")

    handler = Recorder(flaky)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=5,
        default_requeue_delay=0,
        backoff_multiplier=0.5,  # 1 s at level 1, 2 s at level 2...
        max_backoff_duration=4.0,
    )

    samples: list[tuple[bool, list[int]]] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        sampler_client = http(nsqd)
        while not stop_sampling.is_set():
            samples.append((consumer.stats().in_backoff, ready_counts(sampler_client, nsq_topic)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        consumer.start()
        wait_for(lambda: handler.handled == total, "all messages handled after backing off")
    finally:
        stop_sampling.set()
        sampler.join(TIMEOUT)
    assert failures == failing
    assert any(in_backoff for in_backoff, _ in samples), "the consumer never backed off"
    assert any(counts == [0] for in_backoff, counts in samples if in_backoff), (
        "nsqd never saw RDY 0 during backoff"
    )
    wait_for(lambda: not consumer.stats().in_backoff, "backoff to end")
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    wait_for(lambda: ready_counts(client, nsq_topic) == [5], "full RDY back on nsqd")
    assert consumer.stats().backoff_level == 0
    assert sorted(handler.bodies) == sorted(bodies(total))


def test_backoff_climbs_two_levels_and_comes_back_down(
    nsqd_factory: Callable[..., NsqdProcess], nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """max_in_flight 1, so every result counts: fail, fail (the probe) -> level 2; then the
    probes succeed: level 1 (a new, shorter timer: a FIN must wake the RDY timer), level 0."""
    nsqd = nsqd_factory()
    total = 6
    client = prepare(nsqd, nsq_topic, bodies(total))
    outcomes = iter([False, False] + [True] * 20)
    levels: list[int] = []

    def scripted(message: Message) -> None:
        levels.append(consumer.stats().backoff_level)
        if not next(outcomes):
            raise RuntimeError("scripted failure")

    handler = Recorder(scripted)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=1,
        default_requeue_delay=0,
        backoff_multiplier=0.2,  # 0.4 s at level 1, 0.8 s at level 2
        max_backoff_duration=2.0,
    )
    consumer.start()
    wait_for(lambda: handler.handled == total, "every message after backing off", timeout=15)
    # handled while at level: 0 (fails), 1 (probe fails), 2 (probe ok), 1 (probe ok), 0...
    assert levels[:5] == [0, 1, 2, 1, 0], levels
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    assert not consumer.stats().in_backoff
    wait_for(lambda: ready_counts(client, nsq_topic) == [1], "RDY 1 (= max_in_flight) on nsqd")


# --------------------------------------------------------------------------- pause / resume


def test_set_max_in_flight_zero_pauses_and_resume_consumes(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    client = prepare(nsqd, nsq_topic, bodies(5, "a"))
    handler = Recorder()
    consumer = consumers(
        nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=4
    )
    consumer.start()
    wait_for(lambda: handler.handled == 5, "the first 5 messages")
    consumer.set_max_in_flight(0)
    wait_for(lambda: ready_counts(client, nsq_topic) == [0], "RDY 0 on nsqd")
    wait_for(lambda: channel(client, nsq_topic)["in_flight_count"] == 0, "nothing in flight")
    client.mpub(nsq_topic, bodies(5, "b"))
    # The new messages reach the channel and stay there: nsqd holds them back at RDY 0.
    wait_for(lambda: channel(client, nsq_topic)["depth"] == 5, "5 messages waiting on nsqd")
    stats = channel(client, nsq_topic)
    assert stats["in_flight_count"] == 0 and ready_counts(client, nsq_topic) == [0]
    assert handler.handled == 5
    assert consumer.stats().total_rdy == 0

    consumer.set_max_in_flight(3)
    wait_for(lambda: handler.handled == 10, "the 5 messages published while paused")
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    assert consumer.stats().max_in_flight == 3
    assert 1 <= ready_counts(client, nsq_topic)[0] <= 3


# --------------------------------------------------------------------------- touch / async


@pytest.mark.slow  # ~8 s: nsqd starts scanning a new channel for timeouts only up to 5 s later
def test_touch_keeps_a_message_past_msg_timeout(
    nsqd_factory: Callable[..., NsqdProcess], nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    """Two long jobs on an nsqd with a 1 s message timeout: the one that does not TOUCH is timed
    out and redelivered (the control: nsqd only starts scanning a new channel for timeouts after
    its next channel-list refresh, up to 5 s later), the one that TOUCHes every 0.25 s all along
    and for 2.5 s after that is not."""
    nsqd = nsqd_factory("--msg-timeout=1s")
    client = prepare(nsqd, nsq_topic, [b"control", b"touched"])
    timed_out = threading.Event()

    def long_job(message: Message) -> None:
        if message.body == b"control":
            if message.attempts == 1:
                assert timed_out.wait(TIMEOUT), "nsqd never timed the control message out"
            return
        while not timed_out.is_set():
            time.sleep(0.25)
            message.touch()
        for _ in range(10):  # 2.5 s, well past the 1 s timeout, with nsqd scanning the channel
            time.sleep(0.25)
            message.touch()

    handler = Recorder(long_job)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=2,
        concurrency=2,
    )
    consumer.start()
    wait_for(
        lambda: channel(client, nsq_topic)["timeout_count"] >= 1, "nsqd to time out the control"
    )
    timed_out.set()
    wait_for(lambda: b"touched" in handler.bodies, "the touched job", timeout=TIMEOUT)
    wait_for(lambda: handler.bodies.count(b"control") == 2, "the control's redelivery")
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    assert channel(client, nsq_topic)["timeout_count"] == 1, "the touched message timed out too"
    touched = [a for b, a in zip(handler.bodies, handler.attempts) if b == b"touched"]
    assert touched == [1]
    assert sorted(a for b, a in zip(handler.bodies, handler.attempts) if b == b"control") == [1, 2]


def test_enable_async_and_finish_from_another_thread(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    client = prepare(nsqd, nsq_topic, bodies(20))
    handed_off: list[Message] = []
    lock = threading.Lock()
    finisher_done = threading.Event()

    def hand_off(message: Message) -> None:
        message.enable_async()
        with lock:
            handed_off.append(message)

    handler = Recorder(hand_off)
    consumer = consumers(
        nsq_topic, CHANNEL, handler, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=20
    )

    def finisher() -> None:
        """Answers from another thread; "m7" and "m17" are requeued on their first attempt."""
        answered = 0
        deadline = time.monotonic() + TIMEOUT
        while answered < 20 and time.monotonic() < deadline:
            with lock:
                batch, handed_off[:] = handed_off[:], []
            for message in batch:
                if message.body.endswith(b"7") and message.attempts == 1:
                    message.requeue(0, backoff=False)
                else:
                    message.finish()
                    answered += 1
            time.sleep(0.01)
        finisher_done.set()

    consumer.start()
    worker = threading.Thread(target=finisher, daemon=True)
    worker.start()
    assert finisher_done.wait(TIMEOUT + 5)
    worker.join(TIMEOUT)
    wait_for(lambda: drained(client, nsq_topic), "an empty channel")
    stats = consumer.stats()
    assert stats.finished == 20 and stats.requeued == 2
    assert sorted(set(handler.bodies)) == sorted(bodies(20))
    assert handler.handled == 22  # two messages came back once


# --------------------------------------------------------------------------- starvation


def test_is_starved_while_handlers_hold_max_in_flight(
    nsqd: NsqdProcess, nsq_topic: str, consumers: Callable[..., Consumer]
) -> None:
    client = prepare(nsqd, nsq_topic, bodies(6))
    release = threading.Event()

    def block(message: Message) -> None:
        if not release.wait(TIMEOUT):
            raise RuntimeError("never released")

    handler = Recorder(block)
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=2,
        concurrency=2,
    )
    assert consumer.is_starved() is False
    consumer.start()
    wait_for(lambda: consumer.stats().in_flight == 2, "2 messages in flight")
    assert consumer.is_starved() is True
    assert channel(client, nsq_topic)["in_flight_count"] == 2
    release.set()
    wait_for(lambda: handler.handled == 6, "all messages")
    wait_for(lambda: consumer.stats().in_flight == 0, "nothing in flight")
    assert consumer.is_starved() is False


# --------------------------------------------------------------------------- run() and SIGTERM


RUN_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    if os.environ.get("NSQ_SYNC_TEST_GEVENT") == "1":
        from gevent import monkey

        monkey.patch_all()

    import time

    from nsq_sync import Consumer
    address, topic, channel = sys.argv[1:4]

    def handler(message):
        print("handling", message.body.decode(), flush=True)
        time.sleep(0.2)

    consumer = Consumer(topic, channel, handler, nsqd_tcp_addresses=address, max_in_flight=5,
                        concurrency=2)
    consumer.run()
    stats = consumer.stats()
    print("stopped", stats.finished, stats.requeued, flush=True)
    """
)


def test_run_stops_gracefully_on_sigterm(nsqd: NsqdProcess, nsq_topic: str, tmp_path: Path) -> None:
    published = 30
    client = prepare(nsqd, nsq_topic, bodies(published))
    script = tmp_path / "run_consumer.py"
    script.write_text(RUN_SCRIPT)
    out = tmp_path / "out.txt"
    env = dict(os.environ, NSQ_SYNC_TEST_GEVENT="1" if gevent_patched() else "0")
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(script), nsqd.tcp_address, nsq_topic, CHANNEL],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(lambda: out.read_text().count("handling") >= 3, "the subprocess to consume")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
    text = out.read_text()
    assert code == 0, text
    last = text.strip().splitlines()[-1].split()
    assert last[0] == "stopped", text
    finished = int(last[1])
    assert finished == text.count("handling")  # every handler that started was finished

    def settled() -> dict[str, Any] | None:
        stats = channel(client, nsq_topic)
        return stats if stats["in_flight_count"] == 0 and stats["client_count"] == 0 else None

    stats = wait_for(settled, "0 in flight on nsqd after the subprocess exited", timeout=5.0)
    assert finished + stats["depth"] == published


def test_wait_connected_and_configuration_errors_are_logged_as_errors(
    nsqd: NsqdProcess, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd flags: none (shared). A consumer pointed at nsqd's HTTP port cannot connect: it
    says so at ERROR (a configuration error, retried slowly), and wait_connected() times out;
    pointed at the TCP port, wait_connected() returns True."""
    wrong = Consumer(nsq_topic, "ch", lambda m: None, nsqd_tcp_addresses=[nsqd.http_address])
    caplog.set_level(logging.ERROR, logger="nsq_sync")
    wrong.start()
    try:
        assert not wrong.wait_connected(timeout=1.0)
        assert any("configuration error" in r.getMessage() for r in caplog.records)
        assert any("HTTP" in r.getMessage() for r in caplog.records)
    finally:
        wrong.stop(5.0)
    right = Consumer(nsq_topic, "ch", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp_address])
    right.start()
    try:
        assert right.wait_connected(timeout=10.0)
        assert connected_addresses(right) == [nsqd.tcp_address]
    finally:
        right.stop(5.0)


def test_a_failed_handler_logs_when_the_retry_comes(
    nsqd: NsqdProcess,
    nsq_topic: str,
    consumers: Callable[..., Consumer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 39: "requeueing" did not say when; default_requeue_delay (90 s times the attempt)
    was found only by reading Config(). A BatchConsumer's line says it too."""
    caplog.set_level(logging.ERROR, logger="nsq_sync")
    with NsqdHTTPClient(nsqd.http_url) as client:
        client.create_topic(nsq_topic)
        client.create_channel(nsq_topic, CHANNEL)
        client.pub(nsq_topic, b"x")

    def fail(message: Message) -> None:
        raise ValueError("no")

    consumer = consumers(
        nsq_topic, CHANNEL, fail, nsqd_tcp_addresses=[nsqd.tcp_address], max_backoff_duration=0
    )
    consumer.start()
    wait_for(lambda: consumer.stats().requeued == 1, "the REQ")
    failed = [r.getMessage() for r in caplog.records if "handler failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].endswith("(attempt 1); requeueing in 90 s"), failed
    consumer.stop(5.0)

    batch_topic = "b_" + nsq_topic[-40:]
    batches = BatchConsumer(
        batch_topic, CHANNEL, lambda batch: fail(batch[0]), 2, 0.1,
        nsqd_tcp_addresses=[nsqd.tcp_address], default_requeue_delay=2.5, max_backoff_duration=0,
    )  # fmt: skip
    with NsqdHTTPClient(nsqd.http_url) as client:
        client.create_topic(batch_topic)
        client.create_channel(batch_topic, CHANNEL)
        client.mpub(batch_topic, [b"a", b"b"])
    batches.start()
    try:
        wait_for(lambda: batches.stats().requeued == 2, "the REQs")
    finally:
        batches.stop(5.0)
    lines = [r.getMessage() for r in caplog.records if "batch handler failed" in r.getMessage()]
    assert lines and lines[0].endswith("requeueing 2 in 2.5 s"), lines
