"""OpenTelemetry with the real SDK and in-memory exporters, across a real nsqd: span names,
kinds and attributes per the messaging semantic conventions, the metrics' names, units and
values, and (with the opt-in trace envelope) the process span's parent is the send span."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.nsq import read_bodies, wait_for

from nsq_sync import BatchConsumer, Message, Producer, metrics

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

pytestmark = pytest.mark.integration


class Otel:
    """An SDK tracer and meter provider exporting to memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self, name: str) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def metrics(self) -> dict[str, Any]:
        """Every nsq_sync metric by name."""
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            m.name: m
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            if sm.scope.name == "nsq_sync"
            for m in sm.metrics
        }


@pytest.fixture
def otel() -> Iterator[Callable[..., Otel]]:
    def enable(**options: Any) -> Otel:
        o = Otel()
        metrics.enable_otel(o.meter_provider, o.tracer_provider, **options)
        return o

    yield enable
    metrics.disable()


def _total(metric: Any) -> float:
    return sum(p.value for p in metric.data.data_points)


def test_send_and_process_spans_and_metrics_with_the_envelope(
    nsqd: Any, nsq_topic: str, consumers: Any, otel: Callable[..., Otel]
) -> None:
    o = otel(propagation="envelope")
    seen: list[tuple[bytes, int]] = []

    def handle(message: Message) -> None:
        seen.append((message.body, message.attempts))
        if message.body == b"boom" and message.attempts == 1:
            raise ValueError("first attempt fails")

    with Producer(nsqd.tcp_address) as producer:
        producer.publish(nsq_topic, b"one")
        producer.multi_publish(nsq_topic, [b"two", b"boom"])
    consumer = consumers(
        nsq_topic,
        "otel",
        handle,
        nsqd_tcp_addresses=[nsqd.tcp_address],
        default_requeue_delay=0.0,
    )
    consumer.start()
    wait_for(lambda: consumer.stats().finished == 3, "3 messages finished")
    consumer.stop(5.0)

    # the handler saw the original bodies (the envelope is gone)
    assert sorted(seen) == [(b"boom", 1), (b"boom", 2), (b"one", 1), (b"two", 1)]
    host, port = nsqd.tcp_address.rsplit(":", 1)
    sends = o.finished(f"send {nsq_topic}")
    assert len(sends) == 2
    by_op = {s.attributes["messaging.operation.name"]: s for s in sends}
    for span in by_op.values():
        assert span.kind is SpanKind.PRODUCER
        assert span.attributes["messaging.system"] == "nsq"
        assert span.attributes["messaging.destination.name"] == nsq_topic
        assert span.attributes["messaging.operation.type"] == "send"
        assert (span.attributes["server.address"], span.attributes["server.port"]) == (
            host,
            int(port),
        )
    assert by_op["MPUB"].attributes["messaging.batch.message_count"] == 2
    assert by_op["PUB"].attributes["messaging.message.body.size"] == 3

    processes = o.finished(f"process {nsq_topic}")
    assert len(processes) == 4
    for span in processes:
        assert span.kind is SpanKind.CONSUMER
        attributes = span.attributes
        assert attributes["messaging.system"] == "nsq"
        assert attributes["messaging.destination.name"] == nsq_topic
        assert attributes["messaging.consumer.group.name"] == "otel"
        assert attributes["messaging.operation.type"] == "process"
        assert len(attributes["messaging.message.id"]) == 16
        assert attributes["server.address"] == host
        # the parent is the send span of its message, across nsqd
        assert span.parent is not None
        parent = next(s for s in sends if s.context.span_id == span.parent.span_id)
        assert parent.context.trace_id == span.context.trace_id
    failed = [s for s in processes if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes["error.type"] == "ValueError"
    assert failed[0].attributes["messaging.nsq.message.attempts"] == 1
    assert by_op["MPUB"].context.span_id == failed[0].parent.span_id

    found = o.metrics()
    sent = found["messaging.client.sent.messages"]
    assert (sent.unit, _total(sent)) == ("{message}", 3)
    consumed = found["messaging.client.consumed.messages"]
    assert (consumed.unit, _total(consumed)) == ("{message}", 4)  # a redelivery is consumed
    duration = found["messaging.client.operation.duration"]
    assert duration.unit == "s"
    assert sum(p.count for p in duration.data.data_points) == 2
    process = found["messaging.process.duration"]
    assert process.unit == "s"
    points = {p.attributes.get("error.type"): p.count for p in process.data.data_points}
    assert points == {None: 3, "ValueError": 1}


def test_without_propagation_bodies_are_untouched_and_process_spans_are_roots(
    nsqd: Any, nsq_topic: str, consumers: Any, otel: Callable[..., Otel]
) -> None:
    o = otel()
    with Producer(nsqd.tcp_address) as producer:
        producer.publish(nsq_topic, b"plain")
    bodies: list[bytes] = []
    consumer = consumers(
        nsq_topic, "roots", lambda m: bodies.append(m.body), nsqd_tcp_addresses=[nsqd.tcp_address]
    )
    consumer.start()
    wait_for(lambda: consumer.stats().finished == 1, "the message finished")
    assert bodies == [b"plain"]  # (no trace envelope was written or read)
    [span] = o.finished(f"process {nsq_topic}")
    assert span.parent is None


def test_batch_process_span_links_each_send(
    nsqd: Any, nsq_topic: str, otel: Callable[..., Otel]
) -> None:
    o = otel(propagation="envelope")
    with Producer(nsqd.tcp_address) as producer:
        for i in range(3):
            producer.publish(nsq_topic, b"b%d" % i)
    batches: list[list[bytes]] = []
    consumer = BatchConsumer(
        nsq_topic,
        "batch",
        lambda batch: batches.append([m.body for m in batch]),
        batch_size=3,
        batch_timeout=5.0,
        nsqd_tcp_addresses=[nsqd.tcp_address],
    )
    with consumer:
        wait_for(lambda: consumer.stats().finished == 3, "the batch finished")
    assert sorted(b for batch in batches for b in batch) == [b"b0", b"b1", b"b2"]
    sends = {s.context.span_id for s in o.finished(f"send {nsq_topic}")}
    processes = o.finished(f"process {nsq_topic}")
    assert sum(s.attributes["messaging.batch.message_count"] for s in processes) == 3
    assert {link.context.span_id for s in processes for link in s.links} == sends


def test_nothing_is_recorded_and_bodies_untouched_without_an_sdk(nsqd: Any, nsq_topic: str) -> None:
    """The API alone (no SDK configured globally): the envelope is not even written."""
    metrics.enable_otel(propagation="envelope")
    try:
        with Producer(nsqd.tcp_address) as producer:
            producer.publish(nsq_topic, b"as is")
    finally:
        metrics.disable()
    assert read_bodies(nsqd.tcp_address, nsqd.http_address, nsq_topic) == {b"as is": 1}
