"""nsq_sync.metrics without sockets: the Prometheus series the consumer's parts report to
(a fresh registry, the real ConnectionSet and responder over in-memory connections), the
dead-letter counter, the settings parser, the trace envelope, and the extras' errors. (That
``import nsq_sync.metrics`` imports neither library is checked by
tests/integration/test_import_side_effects.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nsq_sync import metrics
from nsq_sync.errors import ConfigError, RequeueMessage
from nsq_sync.metrics import observer as _observe

from .test_responder import Setup

prometheus_client = pytest.importorskip("prometheus_client")


@pytest.fixture
def registry() -> Iterator[object]:
    reg = prometheus_client.CollectorRegistry()
    metrics.enable_prometheus(reg)
    yield reg
    metrics.disable()


def _value(registry: object, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[attr-defined, no-any-return]


def _observed(setup: Setup) -> None:
    """What Consumer.start() does: attach the consumer's connection set to the backends."""
    setup.conns.observer = _observe.consumer_observer("t", "c")


def test_counters_and_gauges_follow_the_consumers_events(registry: object) -> None:
    s = Setup(max_in_flight=10)
    _observed(s)
    a = s.connect("a:4150")  # (connected by hand: its RDY is reported, not its connection)
    at_a = {"topic": "t", "channel": "c", "nsqd": "a:4150"}
    assert _value(registry, "nsq_sync_rdy", **at_a) == 1  # bootstrap
    messages = s.receive(a, 5)
    assert _value(registry, "nsq_sync_rdy", **at_a) == 10  # its share, once it delivers
    assert _value(registry, "nsq_sync_messages_received_total", **at_a) == 5
    assert _value(registry, "nsq_sync_in_flight", **at_a) == 5
    for m in messages[:3]:
        assert m.claim(None)
    s.responder.finish_many(messages[:3])  # a worker's batch
    messages[3].requeue(0.0, backoff=False)
    messages[4].finish()
    assert _value(registry, "nsq_sync_messages_finished_total", **at_a) == 4
    assert _value(registry, "nsq_sync_messages_requeued_total", **at_a) == 1
    assert _value(registry, "nsq_sync_in_flight", **at_a) == 0
    s.conns.count("failed")
    s.conns.count("gave_up", 2)
    s.conns.count("finished", -1)  # a FIN nsqd rejected: not taken back from the counter
    sub = {"topic": "t", "channel": "c"}
    assert _value(registry, "nsq_sync_messages_failed_total", **sub) == 1
    assert _value(registry, "nsq_sync_messages_gave_up_total", **sub) == 2
    assert _value(registry, "nsq_sync_messages_finished_total", **at_a) == 4
    # the connection closes: its credit, in-flight messages and connection go with it
    s.receive(a, 2, first=10)
    s.conns.on_close(a, None)  # type: ignore[arg-type]
    assert _value(registry, "nsq_sync_connections", **at_a) == 0
    assert _value(registry, "nsq_sync_in_flight", **at_a) == 0
    assert _value(registry, "nsq_sync_rdy", **at_a) == 0


def test_two_consumers_of_one_channel_add_up_in_the_gauges(registry: object) -> None:
    first, second = Setup(max_in_flight=10), Setup(max_in_flight=10)
    _observed(first)
    _observed(second)
    first.receive(first.connect("a:4150"), 3)
    second.receive(second.connect("a:4150"), 2)
    at_a = {"topic": "t", "channel": "c", "nsqd": "a:4150"}
    assert _value(registry, "nsq_sync_in_flight", **at_a) == 5
    assert _value(registry, "nsq_sync_rdy", **at_a) == 20  # 10 each


def test_backoff_level_is_reported(registry: object) -> None:
    s = Setup(backoff=True)
    _observed(s)
    [message] = s.receive(s.connect("a:4150"), 1)
    message.requeue()  # a failure: backoff starts
    assert _value(registry, "nsq_sync_backoff_level", topic="t", channel="c") == 1


def test_dead_lettered_is_counted(registry: object) -> None:
    """The dead-letter path (DeadLetterer.for_consumer) counts each acknowledged dead-letter
    publish with ConnectionSet.count("dead_lettered"): stats() and the series agree."""
    s = Setup()
    _observed(s)
    s.conns.count("dead_lettered")
    s.conns.count("dead_lettered", 2)
    assert _value(registry, "nsq_sync_messages_dead_lettered_total", topic="t", channel="c") == 3
    assert s.conns.counts["dead_lettered"] == 3


def test_handler_wrapper_times_every_call_and_lets_exceptions_through(registry: object) -> None:
    observer = _observe.consumer_observer("t", "c")
    assert observer is not None

    def handler(message: object) -> str:
        if message == "requeue":
            raise RequeueMessage(0.0)
        if message == "boom":
            raise ValueError("boom")
        return "done"

    wrapped = observer.wrap_handler(handler, False)
    assert wrapped("ok") == "done"
    with pytest.raises(RequeueMessage):
        wrapped("requeue")
    with pytest.raises(ValueError, match="boom"):
        wrapped("boom")
    count = _value(registry, "nsq_sync_handler_duration_seconds_count", topic="t", channel="c")
    assert count == 3


def test_enabling_twice_is_one_backend_and_disable_removes_it(registry: object) -> None:
    metrics.enable_prometheus(registry)
    assert len(_observe._backends) == 1
    assert _observe.publisher is not None
    metrics.disable()
    assert _observe.publisher is None and _observe.consumer_observer("t", "c") is None
    metrics.enable_prometheus(registry)  # the series are still registered: used again
    assert _observe.publisher is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("", []),
        ("prometheus", ["prometheus"]),
        ("otel, prometheus", ["otel", "prometheus"]),
        (["prometheus", "prometheus"], ["prometheus"]),
    ],
)
def test_parse_backends(value: object, expected: list[str]) -> None:
    assert metrics.parse_backends(value) == expected


@pytest.mark.parametrize("value", ["statsd", 3, ["prometheus", 1]])
def test_parse_backends_names_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="NSQ_METRICS"):
        metrics.parse_backends(value, "NSQ_METRICS")


def test_trace_envelope_round_trip_and_foreign_bodies() -> None:
    envelope = metrics.TraceEnvelope()
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    body = b'{"order": 1}\nsecond line'
    wrapped = envelope.inject(body, carrier)
    assert wrapped.startswith(b"\x00nsq-trace {")
    assert envelope.extract(wrapped) == (carrier, body)
    for foreign in [
        b"plain",
        b"\x00nsq-trace no newline",
        b"\x00nsq-trace [1]\nx",
        b"\x00nsq-trace {\nx",
    ]:
        assert envelope.extract(foreign) == ({}, foreign)


def test_a_bad_propagation_is_a_config_error() -> None:
    pytest.importorskip("opentelemetry.trace")
    with pytest.raises(ConfigError, match="propagation"):
        metrics.enable_otel(propagation="headers")


@pytest.mark.parametrize(
    ("function", "missing", "extra"),
    [
        ("enable_prometheus", "prometheus_client", "prometheus"),
        ("enable_otel", "opentelemetry", "otel"),
    ],
)
def test_a_missing_library_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, function: str, missing: str, extra: str
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, missing, None)
    for name in list(sys.modules):
        if name.startswith(missing + "."):
            monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=rf'pip install "nsq_sync\[{extra}\]"'):
        getattr(metrics, function)()
    assert _observe.publisher is None
