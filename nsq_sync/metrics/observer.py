"""The seam between the clients and the metrics/tracing backends of :mod:`nsq_sync.metrics`.

Nothing here imports a backend. While none is installed the clients pay one ``is None`` check
where events already come in batches: a consumer's ConnectionSet tells its ``observer`` under
its lock (so gauges follow one consumer's order); the handler is wrapped once, by
:meth:`ConsumerObserver.wrap_handler`, so the worker loop has no metrics code; a Producer reads
:data:`publisher` once per publish call. Combined backends fan out. Started consumers register
here (weakly), so that :func:`install` attaches those started before a backend was enabled.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "Backend",
    "ConsumerObserver",
    "Observed",
    "PublishObserver",
    "consumer_observer",
    "install",
    "publisher",
    "track",
]

#: what a send function returns: the nsqd address that acknowledged the publish
Send = Callable[[Sequence[bytes]], str]


class ConsumerObserver(Protocol):
    """One consumer's (topic, channel) view of a backend. Called under the consumer's lock
    except :meth:`wrap_handler`'s wrappers, which run on workers; must not block."""

    def received(self, nsqd: str, n: int, in_flight: int) -> None:
        """``n`` messages arrived from ``nsqd``; ``in_flight`` are now in flight there."""

    def answered(self, what: str, nsqd: str, n: int, in_flight: int) -> None:
        """``n`` messages were ``what`` ("finished" or "requeued") on ``nsqd``."""

    def counted(self, what: str, n: int) -> None:
        """``n`` more messages ``what``: "failed", "gave_up" or "dead_lettered"."""

    def rdy(self, nsqd: str, count: int) -> None:
        """RDY ``count`` was sent to ``nsqd``."""

    def connection(self, nsqd: str, up: bool) -> None:
        """The connection to ``nsqd`` was subscribed (``up``) or closed."""

    def backoff(self, level: int) -> None:
        """The consumer's backoff level is now ``level`` (0: not backing off)."""

    def wrap_handler(self, handler: Callable[[Any], Any], batch: bool) -> Callable[[Any], Any]:
        """``handler`` (a batch handler with ``batch``), timed and traced."""
        ...


class PublishObserver(Protocol):
    """A backend's view of every Producer of the process."""

    def publish(self, op: str, topic: str, bodies: Sequence[bytes], send: Send) -> None:
        """Publish through ``send(bodies)`` (with a trace envelope, other bodies), recording
        its duration and outcome; re-raise what ``send`` raises. ``op``: "PUB", "MPUB", "DPUB"."""


class Backend(Protocol):
    """What :mod:`nsq_sync.metrics` installs: Prometheus or OpenTelemetry."""

    def consumer(self, topic: str, channel: str) -> ConsumerObserver: ...

    def publisher(self) -> PublishObserver: ...


class Observed(Protocol):
    """A started consumer (:func:`track`): gets its observer again when a backend is added."""

    topic: str
    channel: str

    def observe(self, observer: ConsumerObserver | None) -> None:
        """Report to ``observer`` from now on (None: to nothing)."""


#: the installed backends, in the order they were enabled
_backends: list[Backend] = []
#: every Producer reads this once per publish: None while no backend is installed
publisher: PublishObserver | None = None
#: started consumers (weakly held), given a new observer when a backend is added
_tracked: weakref.WeakSet[Any] | None = None


def install(backend: Backend) -> None:
    """Add ``backend``: producers use it from their next publish, and every started consumer
    gets a new observer at once. Call from one thread at a time (``nsq_sync.metrics`` does)."""
    global publisher
    _backends.append(backend)
    publisher = _fan_publishers([b.publisher() for b in _backends])
    for consumer in list(_tracked or ()):
        consumer.observe(consumer_observer(consumer.topic, consumer.channel))


def uninstall_all() -> None:
    """Remove every backend: producers and started consumers stop reporting at once."""
    global publisher
    _backends.clear()
    publisher = None
    for consumer in list(_tracked or ()):
        consumer.observe(None)


def consumer_observer(topic: str, channel: str) -> ConsumerObserver | None:
    """The observer for a consumer of ``topic``/``channel``; None when no backend is installed."""
    if not _backends:
        return None
    observers = [b.consumer(topic, channel) for b in _backends]
    return observers[0] if len(observers) == 1 else _FanoutConsumer(observers)


def track(consumer: Observed) -> None:
    """Remember a started consumer (weakly) and give it its observer now."""
    global _tracked
    if _tracked is None:
        _tracked = weakref.WeakSet()
    _tracked.add(consumer)
    consumer.observe(consumer_observer(consumer.topic, consumer.channel))


def _fan_publishers(observers: list[PublishObserver]) -> PublishObserver | None:
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else _FanoutPublisher(observers)


class _FanoutConsumer:
    """Several backends' consumer observers as one."""

    def __init__(self, observers: list[ConsumerObserver]) -> None:
        self.observers = observers

    def received(self, nsqd: str, n: int, in_flight: int) -> None:
        for o in self.observers:
            o.received(nsqd, n, in_flight)

    def answered(self, what: str, nsqd: str, n: int, in_flight: int) -> None:
        for o in self.observers:
            o.answered(what, nsqd, n, in_flight)

    def counted(self, what: str, n: int) -> None:
        for o in self.observers:
            o.counted(what, n)

    def rdy(self, nsqd: str, count: int) -> None:
        for o in self.observers:
            o.rdy(nsqd, count)

    def connection(self, nsqd: str, up: bool) -> None:
        for o in self.observers:
            o.connection(nsqd, up)

    def backoff(self, level: int) -> None:
        for o in self.observers:
            o.backoff(level)

    def wrap_handler(self, handler: Callable[[Any], Any], batch: bool) -> Callable[[Any], Any]:
        for o in reversed(self.observers):  # the first backend's wrapper is the outermost
            handler = o.wrap_handler(handler, batch)
        return handler


class _FanoutPublisher:
    """Several backends' publish observers as one: each wraps the next one's send."""

    def __init__(self, observers: list[PublishObserver]) -> None:
        self.observers = observers

    def publish(self, op: str, topic: str, bodies: Sequence[bytes], send: Send) -> None:
        for o in reversed(self.observers[1:]):
            send = _wrapped(o, op, topic, send)
        self.observers[0].publish(op, topic, bodies, send)


def _wrapped(observer: PublishObserver, op: str, topic: str, send: Send) -> Send:
    def call(bodies: Sequence[bytes]) -> str:
        address = ""

        def inner(b: Sequence[bytes]) -> str:
            nonlocal address
            address = send(b)
            return address

        observer.publish(op, topic, bodies, inner)
        return address

    return call
