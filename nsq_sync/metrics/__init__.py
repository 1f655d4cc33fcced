"""Metrics and traces: Prometheus and OpenTelemetry, for every client of the process.

Turned on once, at start-up, before or after the clients are made (running consumers are
attached too). While nothing is enabled the clients pay one ``is None`` check per batch of
events, and neither library is imported until its ``enable_*`` function is called.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from nsq_sync._version import install_hint
from nsq_sync.errors import ConfigError
from nsq_sync.metrics import observer as _observe

__all__ = [
    "TraceEnvelope",
    "disable",
    "enable",
    "enable_otel",
    "enable_prometheus",
    "serve_prometheus",
]

#: what enable() and the integrations' settings accept
BACKENDS = ("prometheus", "otel")

#: the Prometheus backends made so far, by registry (the series stay registered there)
_registries: dict[int, Any] = {}
#: the backends installed now, by key (enabling twice is a no-op)
_enabled: dict[tuple[Any, ...], Any] = {}


def _require(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise ImportError(f"{module} is not installed: {install_hint(extra)} ({exc})") from exc


def enable_prometheus(registry: Any = None) -> None:
    """Report every client of the process to Prometheus as the ``nsq_sync_*`` series, registered
    in ``registry`` (prometheus_client's default ``REGISTRY`` when None). Works in multiprocess
    mode. Serving ``/metrics`` is the application's (e.g. :func:`serve_prometheus`). Calling it
    again with the same registry does nothing. Not thread-safe: call at start-up.

    Raises:
        ImportError: prometheus_client is missing (``pip install 'nsq_sync[prometheus]'``).
    """
    _require("prometheus_client", "prometheus")
    from nsq_sync.metrics._prometheus import PrometheusBackend

    key = ("prometheus", id(registry))
    if key in _enabled:
        return
    backend = _registries.get(id(registry))
    if backend is None:
        backend = _registries[id(registry)] = PrometheusBackend(registry)
    _enabled[key] = backend
    _observe.install(backend)


def enable_otel(
    meter_provider: Any = None, tracer_provider: Any = None, *, propagation: Any = None
) -> None:
    """Report every client of the process to OpenTelemetry: ``send {topic}`` and ``process
    {topic}`` spans and the ``messaging.*`` metrics, from ``meter_provider`` and
    ``tracer_provider`` (the global ones when None; with no SDK, nothing is recorded). Calling
    it again with the same arguments does nothing. Not thread-safe: call at start-up.

    Args:
        propagation: How the trace context travels inside message bodies (NSQ has no headers),
            so that a process span's parent is its message's send span: ``"envelope"`` (a
            :class:`TraceEnvelope`), or an object with ``inject(body, carrier) -> bytes`` and
            ``extract(body) -> (carrier, body)``; every producer and consumer of the messages
            must use the same one. None: bodies are untouched and process spans are roots.

    Raises:
        ImportError: opentelemetry-api is missing (``pip install 'nsq_sync[otel]'``).
        ConfigError: ``propagation`` is neither None, "envelope" nor an inject/extract object.
    """
    _require("opentelemetry.trace", "otel")
    if propagation == "envelope":
        propagation = TraceEnvelope()
    elif propagation is not None and not (
        callable(getattr(propagation, "inject", None))
        and callable(getattr(propagation, "extract", None))
    ):
        raise ConfigError(
            "propagation must be None, 'envelope' or an object with inject(body, carrier) and "
            f"extract(body) methods, got {propagation!r}"
        )
    from nsq_sync.metrics._otel import OtelBackend

    key = ("otel", id(meter_provider), id(tracer_provider), type(propagation))
    if key in _enabled:
        return
    backend = OtelBackend(meter_provider, tracer_provider, propagation)
    _enabled[key] = backend
    _observe.install(backend)


def enable(backends: str | Iterable[str] | None, setting: str = "metrics") -> None:
    """Enable backends by name ("prometheus", "otel", comma-separated or a list; None or ""
    for none), as the Django and Flask settings name them.

    Raises:
        ConfigError: an unknown name (the message names ``setting``).
        ImportError: the backend's library is missing (the message names the extra).
    """
    for name in parse_backends(backends, setting):
        if name == "prometheus":
            enable_prometheus()
        else:
            enable_otel()


def parse_backends(backends: Any, setting: str = "metrics") -> list[str]:
    """The backend names in ``backends`` (see :func:`enable`), checked; raises
    :class:`ConfigError` naming ``setting`` for anything else."""
    if backends is None or backends is False or backends == "":
        return []
    if isinstance(backends, str):
        names = [part.strip() for part in backends.split(",") if part.strip()]
    elif isinstance(backends, (list, tuple)) and all(isinstance(b, str) for b in backends):
        names = [b.strip() for b in backends]
    else:
        raise ConfigError(
            f"{setting} must be 'prometheus', 'otel' or a list of them, got {backends!r}"
        )
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ConfigError(
            f"{setting}: unknown metrics backend {unknown[0]!r} (use 'prometheus' or 'otel')"
        )
    return list(dict.fromkeys(names))


def disable() -> None:
    """Stop reporting: every backend is removed (the Prometheus series stay registered, for a
    later :func:`enable_prometheus` with the same registry). Not thread-safe."""
    _enabled.clear()
    _observe.uninstall_all()


def serve_prometheus(port: int, address: str = "0.0.0.0") -> int:
    """Serve prometheus_client's default registry (or, under ``PROMETHEUS_MULTIPROC_DIR``, every
    process's values) at ``http://address:port/metrics`` from a daemon thread; return the port.

    Raises:
        ImportError: prometheus_client is missing.
        OSError: the port cannot be bound.
    """
    _require("prometheus_client", "prometheus")
    import os

    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry: Any = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _ = start_http_server(port, addr=address, registry=registry)
    return int(server.server_port)


class TraceEnvelope:
    """The trace envelope of ``enable_otel(propagation="envelope")``: the published body is
    ``b"\\x00nsq-trace "``, the carrier as one line of JSON (W3C ``traceparent``, and
    ``tracestate``/``baggage`` when set), ``b"\\n"``, then the original body byte for byte.
    A consumer using it hands its handler the original body; a body without the marker is left
    alone. Thread-safe."""

    MARKER = b"\x00nsq-trace "

    def inject(self, body: bytes, carrier: dict[str, str]) -> bytes:
        line = json.dumps(carrier, separators=(",", ":"), sort_keys=True).encode("utf-8")
        return self.MARKER + line + b"\n" + body

    def extract(self, body: bytes) -> tuple[dict[str, str], bytes]:
        marker = self.MARKER
        if not body.startswith(marker):
            return {}, body
        end = body.find(b"\n", len(marker))
        if end < 0:
            return {}, body
        try:
            carrier = json.loads(body[len(marker) : end])
        except ValueError:
            return {}, body
        if not isinstance(carrier, dict):
            return {}, body
        return {str(k): str(v) for k, v in carrier.items()}, body[end + 1 :]
