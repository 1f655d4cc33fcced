"""The way back from a dead-letter topic against a real nsqd: ``dead_letter.replay`` and
``nsq-sync dead-letter list/replay`` (bodies byte-identical in the original topic, the
dead-letter channel empty), and replays interrupted by SIGTERM and by an nsqd restart (every
message in exactly one of the two places; duplicates counted, at most what was in flight)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from support.nsq import bounded, prepare_channel, settled_channel, wait_for

from nsq_sync import Consumer, DeadLetter, Message, NsqdHTTPClient
from nsq_sync import dead_letter as dl
from nsq_sync.consumer.envelope import encode
from nsq_sync.testing import NsqdProcess

pytestmark = [pytest.mark.integration]

CHANNEL = "ch"
if os.environ.get("NSQ_SYNC_TEST_RUNTIME", "").strip().lower() == "gevent":
    NSQ_SYNC_CMD = [
        sys.executable,
        "-c",
        "from gevent import monkey; monkey.patch_all(); import runpy; "
        "runpy.run_module('nsq_sync', run_name='__main__', alter_sys=True)",
    ]
else:
    NSQ_SYNC_CMD = [sys.executable, "-m", "nsq_sync"]


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(180.0)


def dead_topic(topic: str) -> str:
    return f"{topic[-40:]}.dead"


def bodies_of(nsqd: NsqdProcess, topic: str, channel: str) -> Counter[bytes]:
    """Every body the channel holds (each finished), with how often it holds it."""
    got: Counter[bytes] = Counter()
    lock = threading.Lock()

    def take(message: Message) -> None:
        with lock:
            got[message.body] += 1

    consumer = Consumer(
        topic, channel, take, nsqd_tcp_addresses=nsqd.tcp_address, max_in_flight=500, max_attempts=0
    )
    consumer.run(idle_timeout=0.5, timeout=60.0)
    return got


def originals_in(nsqd: NsqdProcess, dead: str) -> Counter[bytes]:
    """The original bodies of every envelope in the dead-letter channel (each finished)."""
    return Counter({dl.parse(k).body: v for k, v in bodies_of(nsqd, dead, dl.CHANNEL).items()})


def fill(nsqd: NsqdProcess, topic: str, dead: str, n: int) -> list[bytes]:
    """``n`` envelopes (binary bodies, unique) in the dead-letter topic, as a consumer of
    ``topic``/``ch`` would have published them; ``topic``/``ch`` exists and is empty."""
    client = prepare_channel(nsqd, topic, CHANNEL)
    client.create_topic(dead)
    client.create_channel(dead, dl.CHANNEL)
    bodies = [b"\x00\xff" + i.to_bytes(4, "big") + b"\n" for i in range(n)]
    envelopes = []
    for i, body in enumerate(bodies):
        message = Message(f"{i:016x}".encode(), body, time.time_ns(), 5)
        envelope = encode(message, topic, CHANNEL, ("ValueError", f"boom {i}"), time.time())
        assert envelope is not None
        envelopes.append(envelope)
    for start in range(0, n, 500):
        client.mpub(dead, envelopes[start : start + 500])
    return bodies


def nsq_sync(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*NSQ_SYNC_CMD, *args], capture_output=True, timeout=timeout, check=False)


def test_replay_round_trip_where_to_and_max_messages(nsqd: NsqdProcess, nsq_topic: str) -> None:
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL)
    other = f"{nsq_topic[-40:]}.other"
    client.create_topic(other)
    client.create_channel(other, CHANNEL)
    poison = [b"p\x00\xff" + bytes([i]) for i in range(5)]
    broken = [b"b\n" + bytes([i]) for i in range(4)]
    client.mpub(nsq_topic, poison + broken)

    def handler(message: Message) -> None:
        if message.body.startswith(b"p"):
            raise DeadLetter("bad input")
        raise ValueError("database down")

    Consumer(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        dead_letter_topic=dead,
        max_attempts=1,
        max_backoff_duration=0,
    ).run(idle_timeout=0.5, timeout=60.0)
    servers = {"nsqd_tcp_addresses": nsqd.tcp_address, "idle_timeout": 0.5}

    # only the ones whose error contains the text; the others stay, unread by nobody
    summary = dl.replay(dead, where="database down", **servers)
    assert (summary.replayed, summary.skipped, summary.failed, summary.ok) == (4, 5, 0, True)
    assert bodies_of(nsqd, nsq_topic, CHANNEL) == Counter(broken)  # byte-identical, once each
    # two of the rest to another topic, then the others back where they came from
    summary = dl.replay(dead, to=other, max_messages=2, **servers)
    assert (summary.replayed, summary.reason) == (2, "max_messages")
    moved = bodies_of(nsqd, other, CHANNEL)
    assert sum(moved.values()) == 2 and set(moved) <= set(poison)
    summary = dl.replay(dead, **servers)
    assert (summary.replayed, summary.reason) == (3, "idle")
    assert bodies_of(nsqd, nsq_topic, CHANNEL) + moved == Counter(poison)
    left = settled_channel(client, dead, dl.CHANNEL)
    assert (left["depth"], left["in_flight_count"], left["deferred_count"]) == (0, 0, 0)


@pytest.mark.slow  # CPython 3.11 only, threads and gevent: subprocesses, many messages
def test_cli_list_shows_every_message_and_puts_it_back(nsqd: NsqdProcess, nsq_topic: str) -> None:
    dead = dead_topic(nsq_topic)
    fill(nsqd, nsq_topic, dead, 3)
    client = NsqdHTTPClient(nsqd.http_url)
    client.pub(dead, b"not an envelope")
    done = nsq_sync(
        "dead-letter", "list", dead, "--idle-timeout", "0.5", "--nsqd-tcp-address", nsqd.tcp_address
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0].split() == ["ID", "AGE", "ATTEMPTS", "FROM", "ERROR", "PREVIEW"]
    rows = lines[1:]
    assert len(rows) == 4
    for i in range(3):
        [row] = [r for r in rows if r.startswith(f"{i:016x}")]
        assert " 5 " in row and f"{nsq_topic}/{CHANNEL}" in row and f"ValueError: boom {i}" in row
        assert "\\x00\\xff" in row or "\\x00" in row  # the preview escapes binary
    assert any("(not a dead-letter envelope)" in r and "not an envelope" in r for r in rows)
    assert "4 message(s) in" in done.stderr.decode()
    kept = settled_channel(client, dead, dl.CHANNEL)
    assert (kept["depth"], kept["in_flight_count"]) == (4, 0)  # listing removed nothing
    # bad usage: exit 2, nothing read
    bad = nsq_sync("dead-letter", "replay", "no good", "--nsqd-tcp-address", nsqd.tcp_address)
    assert bad.returncode == 2 and b"no good" in bad.stderr


@pytest.mark.slow  # CPython 3.11 only, threads and gevent: subprocesses, many messages
def test_cli_replay_stopped_by_sigterm_loses_nothing(nsqd: NsqdProcess, nsq_topic: str) -> None:
    dead = dead_topic(nsq_topic)
    n, in_flight = 4000, 20
    bodies = fill(nsqd, nsq_topic, dead, n)
    client = NsqdHTTPClient(nsqd.http_url)
    proc = subprocess.Popen(
        [*NSQ_SYNC_CMD, "dead-letter", "replay", dead, "--nsqd-tcp-address", nsqd.tcp_address,
         "--max-in-flight", str(in_flight)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(
            lambda: client.channel_stats(nsq_topic, CHANNEL)["depth"] >= 200, "some replayed", 60
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()  # a graceful stop is success
    assert b"ended: signal" in stderr
    back = bodies_of(nsqd, nsq_topic, CHANNEL)
    still = originals_in(nsqd, dead)
    assert sum(back.values()) > 0 and sum(still.values()) > 0, "stopped half way"
    assert not set(back) & set(still)  # in exactly one of the two places
    assert set(back) | set(still) == set(bodies)  # none lost
    duplicates = sum(back.values()) + sum(still.values()) - n
    assert duplicates == 0  # a graceful stop finishes what it republished


@pytest.mark.slow  # CPython 3.11 only, threads and gevent: subprocesses, many messages
def test_replay_rides_out_an_nsqd_restart(nsqd_factory: Any, nsq_topic: str) -> None:
    nsqd = nsqd_factory()
    dead = dead_topic(nsq_topic)
    n, in_flight = 3000, 50
    bodies = fill(nsqd, nsq_topic, dead, n)
    client = NsqdHTTPClient(nsqd.http_url)
    result: list[dl.ReplaySummary] = []
    replay = threading.Thread(
        target=lambda: result.append(
            dl.replay(
                dead,
                nsqd_tcp_addresses=nsqd.tcp_address,
                idle_timeout=3.0,
                timeout=120.0,
                max_in_flight=in_flight,
                reconnect_backoff_max=0.5,
            )
        )
    )
    replay.start()
    try:
        wait_for(
            lambda: client.channel_stats(nsq_topic, CHANNEL)["depth"] >= 300, "some replayed", 60
        )
        left = client.channel_stats(dead, dl.CHANNEL)
        assert left["depth"] > 0, "the replay ended before the restart"  # it is interrupted
        nsqd.restart()
    finally:
        replay.join(150.0)
    assert not replay.is_alive()
    [summary] = result
    back = bodies_of(nsqd, nsq_topic, CHANNEL)
    still = originals_in(nsqd, dead)
    assert not set(back) & set(still)
    assert set(back) | set(still) == set(bodies)  # none lost
    duplicates = sum(back.values()) + sum(still.values()) - n
    print(f"nsqd restart during replay: {summary}; {duplicates} duplicate(s)")
    assert 0 <= duplicates <= in_flight  # republished, FIN lost with the connection
    assert summary.replayed >= sum(back.values()) - duplicates


@pytest.mark.slow  # CPython 3.11 only, threads and gevent: subprocesses, many messages
def test_cli_drain_moves_a_message_failed_too_often_to_the_dead_letter_topic(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL)
    client.pub(nsq_topic, b"poison\x00")
    deliveries: list[int] = []

    def requeue(message: Message) -> None:  # another consumer of the channel keeps failing
        deliveries.append(message.attempts)
        message.requeue(0.0, backoff=False)

    failing = Consumer(
        nsq_topic, CHANNEL, requeue, nsqd_tcp_addresses=nsqd.tcp_address, max_attempts=0
    )
    failing.start()
    try:
        wait_for(lambda: len(deliveries) >= 4, "four failed deliveries")
    finally:
        assert failing.stop(10.0)
    client.pub(nsq_topic, b"good")
    done = nsq_sync(
        "drain", nsq_topic, CHANNEL, "--idle-timeout", "0.5", "--nsqd-tcp-address",
        nsqd.tcp_address, "--dead-letter-topic", dead, "--max-attempts", "3",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # a message was given up: cron alerts
    assert done.stdout == b"good\n"
    left = settled_channel(client, nsq_topic, CHANNEL)
    assert (left["depth"], left["in_flight_count"], left["deferred_count"]) == (0, 0, 0)
    assert originals_in(nsqd, dead) == Counter([b"poison\x00"])
    # --max-attempts alone would give messages up with nowhere to keep them: bad usage
    for command in ("drain", "tail"):
        args = [command, nsq_topic, *([CHANNEL] if command == "drain" else [])]
        bad = nsq_sync(*args, "--max-attempts", "3", "--nsqd-tcp-address", nsqd.tcp_address)
        assert bad.returncode == 2 and b"--dead-letter-topic" in bad.stderr
