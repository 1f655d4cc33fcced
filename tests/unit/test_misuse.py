"""Issue 11, "misuse gets a clear error at construction": durations, address lists, extras."""

from __future__ import annotations

import datetime
import importlib.util
import logging
from typing import Any

import pytest

from nsq_sync import BatchConsumer, Consumer, Message, Producer
from nsq_sync.config import Config, address_list
from nsq_sync.errors import ConfigError


def test_bad_durations_raise_one_error_type() -> None:
    """Issue 11 misuse: one check for every duration a public method takes."""
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150")
    producer = Producer("127.0.0.1:4150")
    try:
        message = Message(b"0" * 16, b"x", 0, 1)
        for call in (
            lambda: consumer.stop(timeout=-1),
            lambda: consumer.stop(timeout="soon"),
            lambda: message.requeue(delay=-1.0),
            lambda: message.requeue(delay=float("nan")),
            lambda: message.requeue(delay=datetime.timedelta(seconds=-1)),
            lambda: producer.deferred_publish("t", b"x", delay=-1),
            lambda: producer.deferred_publish("t", b"x", delay="later"),
            lambda: producer.publish("t", b"x", timeout=0),
            lambda: producer.publish("t", b"x", timeout=datetime.timedelta(0)),
        ):
            with pytest.raises(ConfigError):
                call()
    finally:
        producer.close(timeout=1.0)
        consumer.stop(timeout=1.0)


def test_durations_accept_timedelta_everywhere() -> None:
    assert Config(dial_timeout=datetime.timedelta(milliseconds=250)).dial_timeout == 0.25
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150")
    assert consumer.stop(timeout=datetime.timedelta(seconds=1)) is True
    # BatchConsumer.stop added the timeout to a float (a TypeError for a timedelta)
    batches = BatchConsumer("t", "c", lambda batch: None, nsqd_tcp_addresses="127.0.0.1:4150")
    assert batches.stop(timeout=datetime.timedelta(seconds=1)) is True
    with pytest.raises(ConfigError, match="timeout"):
        BatchConsumer("t", "c", lambda batch: None, nsqd_tcp_addresses="127.0.0.1:1").stop(-1)


def test_comma_joined_addresses_are_split_and_config_carries_lists() -> None:
    assert address_list("x", "a:1, b:2") == ("a:1", "b:2")
    assert address_list("x", ["a:1"]) == ("a:1",)
    with pytest.raises(ConfigError, match="x"):
        address_list("x", "a:1,,b:2")
    with pytest.raises(ConfigError, match="several addresses"):
        address_list("x", ["a:1,b:2"])
    cfg = Config.from_env(
        environ={
            "NSQ_SYNC_NSQD_TCP_ADDRESSES": "127.0.0.1:4150,127.0.0.1:4152",
            "NSQ_SYNC_LOOKUPD_HTTP_ADDRESSES": "http://127.0.0.1:4161",
        }
    )
    assert cfg.nsqd_tcp_addresses == ("127.0.0.1:4150", "127.0.0.1:4152")
    assert Config.from_mapping({"lookupd-http-addresses": ["h:4161"]}).lookupd_http_addresses == (
        "h:4161",
    )
    consumer = Consumer("t", "c", lambda m: None, config=cfg)
    assert consumer._discovery.direct == ["127.0.0.1:4150", "127.0.0.1:4152"]
    split = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:1,127.0.0.1:2")
    assert split._discovery.direct == ["127.0.0.1:1", "127.0.0.1:2"]
    with pytest.raises(ConfigError, match="nsqd_tcp_addresses"):
        Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:1,")
    with Producer("127.0.0.1:1, 127.0.0.1:2") as producer:
        assert producer.addresses == ["127.0.0.1:1", "127.0.0.1:2"]
    with Producer([], config=cfg) as producer:
        assert producer.addresses == ["127.0.0.1:4150", "127.0.0.1:4152"]


def test_snappy_without_python_snappy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "snappy" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"nsq_sync\[snappy\]"):
        Config(snappy=True)
    with pytest.raises(ConfigError, match=r"nsq_sync\[snappy\]"):
        Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:1", snappy=True)


def test_max_in_flight_zero_warns_at_start(caplog: pytest.LogCaptureFixture) -> None:
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:1", max_in_flight=0)
    with caplog.at_level(logging.WARNING):
        consumer.start()
        consumer.stop(timeout=2.0)
    assert any("paused" in r.getMessage() for r in caplog.records)


def ship(message: Message) -> None:
    pass


def insert(messages: list[Message]) -> None:
    pass


@pytest.mark.parametrize(
    ("make", "order"),
    [
        (lambda: Consumer("orders", ship, nsqd_tcp_addresses="127.0.0.1:4150"), "handler"),
        (lambda: Consumer("orders", ship, "x", nsqd_tcp_addresses="127.0.0.1:4150"), "handler"),
        (lambda: BatchConsumer("orders", insert, nsqd_tcp_addresses="127.0.0.1:4150"), "handle_batch"),
        (lambda: BatchConsumer("orders", insert, 500, nsqd_tcp_addresses="127.0.0.1:4150"), "handle_batch"),
    ],
)  # fmt: skip
def test_a_forgotten_channel_is_named_with_the_order_of_the_arguments(
    make: Any, order: str
) -> None:
    """Issue 39: Consumer("orders", handle, ...) raised "missing 1 required positional
    argument: 'handler'" (or "handle_batch must be callable, got 500"): the channel it lacks was
    not named."""
    with pytest.raises(ConfigError) as raised:
        make()
    text = str(raised.value)
    assert "channel is missing" in text, text
    assert f"(topic, channel, {order}, ...)" in text, text
    assert "'orders', 'my-channel', " in text, text


def test_a_missing_handler_is_named_too() -> None:
    with pytest.raises(ConfigError, match=r"needs a handler: the arguments are Consumer\(topic, "):
        Consumer("orders", "export", nsqd_tcp_addresses="127.0.0.1:4150")
