"""Dead-letter topics against a real nsqd: a message given up is published to the dead-letter
topic (envelope: metadata, then the body byte for byte) and only then finished; a dead-letter
publish that fails (nsqd stopped, an envelope over --max-msg-size) loses nothing and
dead-letters the message once the cause is gone."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.nsq import bounded, message_count, prepare_channel, settled_channel, wait_for

from nsq_sync import BatchConsumer, Consumer, DeadLetter, Message
from nsq_sync import dead_letter as dl
from nsq_sync.errors import ConfigError, InvalidName
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

CHANNEL = "ch"
#: bodies a dead-letter envelope must keep byte for byte: binary, newlines, JSON-looking text
BODIES = [
    bytes(range(256)),
    b"\n",
    b"\n\n{not json}\n",
    b'{"nsq_sync_dead_letter":1}',
    "caf\u00e9 \u2603".encode(),
    b"\xff\xfe\x00\x00",
    *[f"m{i}".encode() for i in range(14)],
]


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(150.0)


def dead_topic(topic: str) -> str:
    return f"{topic[-40:]}.dead"


class Failing:
    """A handler that always raises ``ValueError("boom <body size>")``; records each message's
    id and timestamp, and calls ``on_attempt(message)`` first."""

    def __init__(self, on_attempt: Any = None) -> None:
        self.lock = threading.Lock()
        self.seen: dict[bytes, tuple[bytes, int]] = {}
        self.on_attempt = on_attempt

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.seen[message.body] = (message.id, message.timestamp)
        if self.on_attempt is not None:
            self.on_attempt(message)
        raise ValueError(f"boom {len(message.body)}")


def dead_letter_channel(nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    with NsqdHTTPClient(nsqd.http_url) as client:
        return wait_for(
            lambda: client.channel_stats(topic, dl.CHANNEL), f"channel {topic}/{dl.CHANNEL}"
        )


def listed(nsqd: NsqdProcess, topic: str) -> list[dl.DeadLetterRecord]:
    listing = dl.list_messages(topic, nsqd_tcp_addresses=nsqd.tcp_address, idle_timeout=0.5)
    assert listing.complete
    records = [entry.record for entry in listing.messages]
    assert None not in records
    return [r for r in records if r is not None]


def test_an_always_failing_handler_dead_letters_each_message_once(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL)
    client.mpub(nsq_topic, BODIES)
    order: list[str] = []

    def giving_up(message: Message) -> None:
        # runs after nsqd acknowledged the envelope, before the FIN: the dead-letter topic
        # counts it already (its copy into the channel comes a moment later, from nsqd's pump)
        earlier = len(order)  # give-ups before this one: their envelopes are in nsqd too
        published = message_count(nsqd.http_address, dead)
        order.append(f"giving_up {message.body!r} dead-lettered>={published}")
        assert published >= earlier + 1, (published, earlier)

    handler = Failing()
    began = time.time()
    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[nsqd.tcp_address],
        dead_letter_topic=dead,
        giving_up=giving_up,
        max_attempts=3,
        default_requeue_delay=0.0,
        max_backoff_duration=0,
        max_in_flight=5,
        concurrency=2,
    )
    summary = consumer.run(idle_timeout=1.5, timeout=90.0)
    assert summary.dead_lettered == len(BODIES) == summary.gave_up
    stats = consumer.stats()
    assert stats.dead_lettered == len(BODIES) and stats.gave_up == len(BODIES)
    assert len(order) == len(BODIES)
    original = settled_channel(client, nsq_topic, CHANNEL)
    assert (original["depth"], original["in_flight_count"], original["deferred_count"]) == (0, 0, 0)
    assert dead_letter_channel(nsqd, dead)["depth"] == len(BODIES)

    records = listed(nsqd, dead)
    assert sorted(r.body for r in records) == sorted(BODIES)  # each exactly once, unchanged
    for record in records:
        msg_id, timestamp = handler.seen[record.body]
        assert (record.topic, record.channel) == (nsq_topic, CHANNEL)
        assert record.id == msg_id.decode()
        assert record.attempts == 3
        assert record.timestamp == timestamp
        assert began <= record.dead_lettered_at <= time.time()
        assert (record.error_type, record.error_message) == (
            "ValueError",
            f"boom {len(record.body)}",
        )
        assert (record.host, record.pid) == (socket.gethostname(), os.getpid())
        assert record.version == 1
    # listing put every message back, as it was
    assert dead_letter_channel(nsqd, dead)["depth"] == len(BODIES)


def test_dead_letter_from_a_handler_skips_the_retries_and_a_batch_handler_too(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 6)

    def poison(message: Message) -> None:
        raise DeadLetter(f"cannot parse {message.body.decode()}")

    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        poison,
        nsqd_tcp_addresses=nsqd.tcp_address,
        dead_letter_topic=dead,
        max_backoff_duration=0,
    )
    summary = consumer.run(idle_timeout=0.5, timeout=60.0)
    assert (summary.dead_lettered, summary.gave_up, summary.requeued) == (6, 6, 0)
    assert not summary.ok  # cron alerts: messages were given up
    records = listed(nsqd, dead)
    assert sorted(r.body for r in records) == sorted(f"m{i}".encode() for i in range(6))
    assert {r.attempts for r in records} == {1}
    assert {r.error_type for r in records} == {"nsq_sync.errors.DeadLetter"}
    assert {r.error_message for r in records} == {f"cannot parse m{i}" for i in range(6)}

    # BatchConsumer: DeadLetter from handle_batch dead-letters every message it left unanswered
    client.mpub(nsq_topic, [b"b0", b"b1", b"b2"])

    def batch(messages: list[Message]) -> None:
        for message in messages:
            if message.body == b"b0":
                message.finish()
        raise DeadLetter("bad batch")

    batches = BatchConsumer(
        nsq_topic,
        CHANNEL,
        batch,
        batch_size=3,
        batch_timeout=0.5,
        nsqd_tcp_addresses=nsqd.tcp_address,
        dead_letter_topic=dead,
        max_backoff_duration=0,
    )
    summary = batches.run(idle_timeout=0.5, timeout=60.0)
    assert summary.dead_lettered == 2 and batches.stats().dead_lettered == 2
    bodies = sorted(r.body for r in listed(nsqd, dead))
    assert bodies == sorted([b"b1", b"b2", *(f"m{i}".encode() for i in range(6))])
    original = settled_channel(client, nsq_topic, CHANNEL)
    assert (original["depth"], original["in_flight_count"], original["deferred_count"]) == (0, 0, 0)


def test_bad_dead_letter_topics_are_refused_before_anything_is_sent(nsq_topic: str) -> None:
    with pytest.raises(InvalidName):
        Consumer(
            nsq_topic, CHANNEL, print, nsqd_tcp_addresses="127.0.0.1:1", dead_letter_topic="a b"
        )
    with pytest.raises(ConfigError, match="must not be the consumed topic"):
        Consumer(
            nsq_topic, CHANNEL, print, nsqd_tcp_addresses="127.0.0.1:1", dead_letter_topic=nsq_topic
        )


def test_a_stopped_nsqd_loses_nothing_and_the_message_is_dead_lettered_once_it_is_back(
    nsqd_factory: Any, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="nsq_sync")
    nsqd = nsqd_factory()
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL, 1)
    stopped = threading.Event()

    def stop_nsqd_on_the_last_attempt(message: Message) -> None:
        if message.attempts == 2 and not stopped.is_set():
            nsqd.stop()  # the dead-letter publish that follows finds no nsqd
            stopped.set()

    handler = Failing(stop_nsqd_on_the_last_attempt)
    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        handler,
        nsqd_tcp_addresses=nsqd.tcp_address,
        dead_letter_topic=dead,
        max_attempts=2,
        default_requeue_delay=0.0,
        max_backoff_duration=0,
        reconnect_backoff_max=0.5,
    )
    consumer.start()
    try:
        wait_for(stopped.is_set, "the handler to stop nsqd", 30.0)
        wait_for(lambda: "failed" in caplog.text and "requeueing it" in caplog.text, "the ERROR")
        msg_id = handler.seen[b"m0"][0].decode()
        assert f"dead-lettering message {msg_id} to {dead}" in caplog.text
        assert consumer.stats().dead_lettered == 0
        nsqd.restart()
        wait_for(lambda: consumer.stats().dead_lettered == 1, "the message to be dead-lettered")
    finally:
        consumer.stop()
    client = NsqdHTTPClient(nsqd.http_url)
    original = settled_channel(client, nsq_topic, CHANNEL)
    assert (original["depth"], original["in_flight_count"], original["deferred_count"]) == (0, 0, 0)
    [record] = listed(nsqd, dead)
    assert record.body == b"m0" and record.id == msg_id
    assert record.attempts == 3  # redelivered after the restart, given up at once
    assert (record.error_type, record.error_message) == ("ValueError", "boom 2")  # remembered


def test_an_envelope_over_max_msg_size_cuts_the_error_or_waits_for_a_larger_limit(
    nsqd_factory: Any, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="nsq_sync")
    limit = 2048
    nsqd = nsqd_factory(f"--max-msg-size={limit}")
    dead = dead_topic(nsq_topic)
    client = prepare_channel(nsqd, nsq_topic, CHANNEL)
    at_limit = bytes(range(256)) * (limit // 256)  # the largest body nsqd takes
    long_error = b"e" * 1500  # fits, with a shorter error text
    client.pub(nsq_topic, at_limit)
    client.pub(nsq_topic, long_error)

    def fail(message: Message) -> None:
        raise RuntimeError("x" * 900)

    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        fail,
        nsqd_tcp_addresses=nsqd.tcp_address,
        dead_letter_topic=dead,
        max_attempts=1,
        default_requeue_delay=0.2,
        max_backoff_duration=0,
        reconnect_backoff_max=0.5,
    )
    consumer.start()
    try:
        wait_for(lambda: consumer.stats().dead_lettered == 1, "the smaller one dead-lettered")
        wait_for(lambda: "cannot be dead-lettered" in caplog.text, "the ERROR about the other")
        assert f"(limit of {limit} bytes" in caplog.text or f"of {limit} bytes" in caplog.text
        # not lost: requeued (again and again, with backoff) while the limit stays
        assert consumer.stats().dead_lettered == 1
        http = NsqdHTTPClient(nsqd.http_url)

        def counts() -> tuple[int, int, int]:
            stats = http.channel_stats(nsq_topic, CHANNEL) or {}
            return (stats.get("depth"), stats.get("in_flight_count"), stats.get("deferred_count"))

        # the smaller one's FIN has reached nsqd (else the restart could lose it, and nsqd would
        # deliver it again: a duplicate envelope), the larger one waits for its next delivery
        wait_for(lambda: counts() == (0, 0, 1), "only the larger one left, deferred")
        nsqd._extra_args = (f"--max-msg-size={4 * limit}",)  # the operator raises the limit
        nsqd.restart()
        wait_for(lambda: consumer.stats().dead_lettered == 2, "the larger one dead-lettered", 60.0)
        wait_for(lambda: counts() == (0, 0, 0), "nothing left in the original channel")
    finally:
        consumer.stop()
    original = settled_channel(NsqdHTTPClient(nsqd.http_url), nsq_topic, CHANNEL)
    assert (original["depth"], original["in_flight_count"], original["deferred_count"]) == (0, 0, 0)
    entries = listed(nsqd, dead)
    records = {r.body: r for r in entries}
    assert set(records) == {at_limit, long_error} and len(entries) == 2  # once each
    cut = records[long_error]
    assert cut.error_type == "RuntimeError"
    assert cut.error_message is not None and cut.error_message.endswith("[truncated]")
    assert len(cut.error_message) < 900
    assert records[at_limit].error_message == "x" * 900  # remembered, whole: it fits now
