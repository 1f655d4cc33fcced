"""The OpenTelemetry backend of :mod:`nsq_sync.metrics` (opentelemetry-api only).

Spans and metrics follow the messaging semantic conventions (docs/metrics.md lists them): a
``send {topic}`` span per publish call, a ``process {topic}`` span per handler call (per batch
for a BatchConsumer, linked to each message's send span). NSQ messages have no headers, so the
trace context crosses nsqd only with a ``propagation``; without one, process spans are roots.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nsq_sync.metrics.observer import Send

__all__ = ["OtelBackend", "Propagation"]

SYSTEM = "nsq"


class Propagation(Protocol):
    """Carries a trace context inside message bodies (NSQ has no headers). Thread-safe."""

    def inject(self, body: bytes, carrier: dict[str, str]) -> bytes:
        """The body to publish: ``body`` with ``carrier`` (W3C ``traceparent``...) in it."""
        ...

    def extract(self, body: bytes) -> tuple[dict[str, str], bytes]:
        """Return the carrier (``{}`` when there is none) and the body the handler gets."""
        ...


def _server(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return {"server.address": address} if address else {}
    return {"server.address": host.strip("[]"), "server.port": int(port)}


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


class OtelBackend:
    """Tracer, meter and instruments, from the given providers (the global ones when None)."""

    def __init__(
        self,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        propagation: Propagation | None = None,
    ) -> None:
        from opentelemetry import metrics, propagate, trace

        from nsq_sync._version import __version__

        self.trace = trace
        self.propagate = propagate
        self.propagation = propagation
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.tracer = tracers.get_tracer("nsq_sync", __version__)
        meter = meters.get_meter("nsq_sync", __version__)
        self.sent = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Number of messages producers attempted to send to nsqd.",
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Number of messages nsqd delivered to consumers.",
        )
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of publish operations (until nsqd's OK or the error).",
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of processing operations (the handler call).",
        )

    def consumer(self, topic: str, channel: str) -> _Consumer:
        return _Consumer(self, topic, channel)

    def publisher(self) -> _Publisher:
        return _Publisher(self)


class _Publisher:
    def __init__(self, backend: OtelBackend) -> None:
        self.b = backend

    def publish(self, op: str, topic: str, bodies: Sequence[bytes], send: Send) -> None:
        b = self.b
        trace = b.trace
        n = len(bodies)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.type": "send",
            "messaging.operation.name": op,
        }
        span_attributes = dict(attributes)
        if op == "MPUB":
            span_attributes["messaging.batch.message_count"] = n
        else:
            span_attributes["messaging.message.body.size"] = len(bodies[0])
        span = b.tracer.start_span(
            f"send {topic}", kind=trace.SpanKind.PRODUCER, attributes=span_attributes
        )
        start = time.perf_counter()
        try:
            propagation = b.propagation
            if propagation is not None:
                carrier: dict[str, str] = {}
                b.propagate.inject(carrier, context=trace.set_span_in_context(span))
                if carrier:  # (a no-op tracer's span has no context to carry)
                    bodies = [propagation.inject(body, carrier) for body in bodies]
            address = send(bodies)
        except BaseException as exc:
            elapsed = time.perf_counter() - start
            attributes["error.type"] = _error_type(exc)
            span.set_attribute("error.type", attributes["error.type"])
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            span.end()
            b.sent.add(n, attributes)
            b.operation_duration.record(elapsed, attributes)
            raise
        elapsed = time.perf_counter() - start
        server = _server(address)
        span.set_attributes(server)
        span.end()
        attributes.update(server)
        b.sent.add(n, attributes)
        b.operation_duration.record(elapsed, attributes)


class _Consumer:
    def __init__(self, backend: OtelBackend, topic: str, channel: str) -> None:
        self.b = backend
        self.topic = topic
        self.channel = channel
        self.base: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.consumer.group.name": channel,
        }
        self.received_attributes: dict[str, dict[str, Any]] = {}

    def received(self, nsqd: str, n: int, in_flight: int) -> None:
        attributes = self.received_attributes.get(nsqd)
        if attributes is None:
            attributes = {
                **self.base,
                "messaging.operation.type": "receive",
                "messaging.operation.name": "receive",
                **_server(nsqd),
            }
            self.received_attributes[nsqd] = attributes
        self.b.consumed.add(n, attributes)

    # (no semantic convention covers these: the Prometheus backend reports them)
    def answered(self, what: str, nsqd: str, n: int, in_flight: int) -> None:
        pass

    def counted(self, what: str, n: int) -> None:
        pass

    def rdy(self, nsqd: str, count: int) -> None:
        pass

    def connection(self, nsqd: str, up: bool) -> None:
        pass

    def backoff(self, level: int) -> None:
        pass

    def _parent(self, message: Any) -> Any:
        """The context the message's send span travelled in (stripped from its body), or None."""
        propagation = self.b.propagation
        if propagation is None:
            return None
        carrier, body = propagation.extract(message.body)
        if not carrier:
            return None
        message.body = body
        return self.b.propagate.extract(carrier)

    def wrap_handler(self, handler: Callable[[Any], Any], batch: bool) -> Callable[[Any], Any]:
        b = self.b
        trace = b.trace
        requeue = _requeue_class()
        name = f"process {self.topic}"
        attributes: dict[str, Any] = {
            **self.base,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
        }

        def traced(arg: Any) -> Any:
            span_attributes = dict(attributes)
            if batch:
                links = []
                for message in arg:
                    parent = self._parent(message)
                    if parent is not None:
                        context = trace.get_current_span(parent).get_span_context()
                        links.append(trace.Link(context))
                span_attributes["messaging.batch.message_count"] = len(arg)
                span = b.tracer.start_span(
                    name, kind=trace.SpanKind.CONSUMER, attributes=span_attributes, links=links
                )
            else:
                parent = self._parent(arg)
                span_attributes["messaging.message.id"] = arg.id.decode("ascii", "replace")
                span_attributes["messaging.message.body.size"] = len(arg.body)
                span_attributes["messaging.nsq.message.attempts"] = arg.attempts
                span_attributes.update(_server(arg.nsqd_address))
                span = b.tracer.start_span(
                    name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=span_attributes
                )
            start = time.perf_counter()
            try:
                with trace.use_span(
                    span, end_on_exit=False, record_exception=False, set_status_on_exception=False
                ):
                    result = handler(arg)
            except BaseException as exc:
                record = attributes
                if not isinstance(exc, requeue):  # a RequeueMessage is the handler's choice
                    error = _error_type(exc)
                    span.set_attribute("error.type", error)
                    span.record_exception(exc)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                    record = {**attributes, "error.type": error}
                b.process_duration.record(time.perf_counter() - start, record)
                raise
            finally:
                span.end()
            b.process_duration.record(time.perf_counter() - start, attributes)
            return result

        return traced


def _requeue_class() -> type[BaseException]:
    from nsq_sync.errors import RequeueMessage

    return RequeueMessage
