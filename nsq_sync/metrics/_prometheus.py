"""The Prometheus backend of :mod:`nsq_sync.metrics` (prometheus_client).

- Every series is a plain Counter, Gauge or Histogram updated where its event happens, never a
  custom collector: multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) supports none. Gauges add
  up over the live processes (``livesum``), except the backoff level (``livemax``).
- A gauge moves by the difference from what this consumer last reported (``inc``, never
  ``set``), so two consumers of one topic/channel in a process add up, not overwrite.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nsq_sync.metrics.observer import Send

__all__ = ["PrometheusBackend"]

#: handler and publish durations, in seconds: from 0.5 ms to 30 s
BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_SUB = ("topic", "channel")
_NSQD = ("topic", "channel", "nsqd")


class PrometheusBackend:
    """The nsq_sync series, registered in ``registry`` (the default one when None)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        self.registry = reg

        def counter(name: str, doc: str, labels: Sequence[str]) -> Any:
            return Counter(name, doc, labels, registry=reg)

        def gauge(name: str, doc: str, labels: Sequence[str], mode: Any) -> Any:
            return Gauge(name, doc, labels, registry=reg, multiprocess_mode=mode)

        self.received = counter(
            "nsq_sync_messages_received", "Messages nsqd delivered to this consumer.", _NSQD
        )
        self.finished = counter(
            "nsq_sync_messages_finished", "Messages finished (FIN sent to nsqd).", _NSQD
        )
        self.requeued = counter(
            "nsq_sync_messages_requeued",
            "Messages requeued (REQ sent): after a failure, by message.requeue(), at stop.",
            _NSQD,
        )
        self.failed = counter(
            "nsq_sync_messages_failed", "Handler calls that raised (RequeueMessage aside).", _SUB
        )
        self.gave_up = counter(
            "nsq_sync_messages_gave_up",
            "Messages handed to the give-up handler after max_attempts.",
            _SUB,
        )
        self.dead_lettered = counter(
            "nsq_sync_messages_dead_lettered",
            "Messages published to the dead-letter topic, then finished.",
            _SUB,
        )
        self.published = counter(
            "nsq_sync_published_messages",
            "Messages published, by outcome (ok: nsqd acknowledged; error: the publish raised).",
            ("topic", "outcome"),
        )
        self.in_flight = gauge(
            "nsq_sync_in_flight", "Messages delivered and not yet answered.", _NSQD, "livesum"
        )
        self.rdy = gauge("nsq_sync_rdy", "The RDY count last sent to nsqd.", _NSQD, "livesum")
        self.connections = gauge(
            "nsq_sync_connections", "Subscribed connections to nsqd.", _NSQD, "livesum"
        )
        self.backoff_level = gauge(
            "nsq_sync_backoff_level",
            "The consumer's backoff level (0: not backing off).",
            _SUB,
            "livemax",
        )
        self.handler_duration = Histogram(
            "nsq_sync_handler_duration_seconds",
            "Time spent in the handler (a BatchConsumer's: in handle_batch, per batch).",
            _SUB,
            buckets=BUCKETS,
            registry=reg,
        )
        self.publish_duration = Histogram(
            "nsq_sync_publish_duration_seconds",
            "Publish round trip: from the call until nsqd's OK (or the error).",
            ("topic",),
            buckets=BUCKETS,
            registry=reg,
        )

    def consumer(self, topic: str, channel: str) -> _Consumer:
        return _Consumer(self, topic, channel)

    def publisher(self) -> _Publisher:
        return _Publisher(self)


class _Nsqd:
    """One (topic, channel, nsqd)'s series, bound once (``labels()`` costs a lock and a dict)."""

    __slots__ = ("received", "finished", "requeued", "in_flight", "rdy", "connections", "last")

    def __init__(self, m: PrometheusBackend, labels: tuple[str, str, str]) -> None:
        self.received = m.received.labels(*labels)
        self.finished = m.finished.labels(*labels)
        self.requeued = m.requeued.labels(*labels)
        self.in_flight = m.in_flight.labels(*labels)
        self.rdy = m.rdy.labels(*labels)
        self.connections = m.connections.labels(*labels)
        #: what this consumer last reported: in flight, RDY, connections
        self.last = [0, 0, 0]

    def move(self, index: int, gauge: Any, value: int) -> None:
        delta = value - self.last[index]
        if delta:
            self.last[index] = value
            gauge.inc(delta)


class _Consumer:
    """A consumer's observer (called under its lock: its gauge deltas are in order)."""

    def __init__(self, m: PrometheusBackend, topic: str, channel: str) -> None:
        self.m = m
        self.topic = topic
        self.channel = channel
        self.nsqds: dict[str, _Nsqd] = {}
        self.counters = {
            "failed": m.failed.labels(topic, channel),
            "gave_up": m.gave_up.labels(topic, channel),
            "dead_lettered": m.dead_lettered.labels(topic, channel),
        }
        self.backoff_gauge = m.backoff_level.labels(topic, channel)
        self.level = 0
        self.duration = m.handler_duration.labels(topic, channel)

    def _nsqd(self, nsqd: str) -> _Nsqd:
        series = self.nsqds.get(nsqd)
        if series is None:
            series = self.nsqds[nsqd] = _Nsqd(self.m, (self.topic, self.channel, nsqd))
        return series

    def received(self, nsqd: str, n: int, in_flight: int) -> None:
        series = self._nsqd(nsqd)
        series.received.inc(n)
        series.move(0, series.in_flight, in_flight)

    def answered(self, what: str, nsqd: str, n: int, in_flight: int) -> None:
        series = self._nsqd(nsqd)
        (series.finished if what == "finished" else series.requeued).inc(n)
        series.move(0, series.in_flight, in_flight)

    def counted(self, what: str, n: int) -> None:
        counter = self.counters.get(what)
        if counter is not None:
            counter.inc(n)

    def rdy(self, nsqd: str, count: int) -> None:
        series = self._nsqd(nsqd)
        series.move(1, series.rdy, count)

    def connection(self, nsqd: str, up: bool) -> None:
        series = self._nsqd(nsqd)
        series.move(2, series.connections, int(up))
        if not up:  # its credit and in-flight messages went with it
            series.move(0, series.in_flight, 0)
            series.move(1, series.rdy, 0)

    def backoff(self, level: int) -> None:
        if level != self.level:
            self.level = level
            self.backoff_gauge.set(level)

    def wrap_handler(self, handler: Callable[[Any], Any], batch: bool) -> Callable[[Any], Any]:
        observe = self.duration.observe
        clock = time.perf_counter

        def timed(arg: Any) -> Any:
            start = clock()
            try:
                return handler(arg)
            finally:
                observe(clock() - start)

        return timed


class _Publisher:
    """Every producer's publishes: outcome counts and round trips, by topic."""

    def __init__(self, m: PrometheusBackend) -> None:
        self.m = m
        self.topics: dict[str, tuple[Any, Any, Any]] = {}

    def publish(self, op: str, topic: str, bodies: Sequence[bytes], send: Send) -> None:
        series = self.topics.get(topic)
        if series is None:
            m = self.m
            series = (
                m.published.labels(topic, "ok"),
                m.published.labels(topic, "error"),
                m.publish_duration.labels(topic),
            )
            self.topics[topic] = series
        start = time.perf_counter()
        try:
            send(bodies)
        except BaseException:
            series[2].observe(time.perf_counter() - start)
            series[1].inc(len(bodies))
            raise
        series[2].observe(time.perf_counter() - start)
        series[0].inc(len(bodies))
