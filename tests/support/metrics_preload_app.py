"""A WSGI app for gunicorn --preload with prometheus_client's multiprocess mode: metrics are
enabled and a Producer made (and used once) in the master, before the workers fork.

Environment: NSQD_TCP_ADDRESSES, TOPIC, PROMETHEUS_MULTIPROC_DIR. ``/publish?body=...``
publishes through the producer and answers with the worker's pid; ``/metrics`` serves every
process's values (prometheus_client's MultiProcessCollector).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from nsq_sync import Producer, metrics

TOPIC = os.environ["TOPIC"]
metrics.enable_prometheus()
producer = Producer(os.environ["NSQD_TCP_ADDRESSES"].split(","))
producer.publish(TOPIC, b"from the master")


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/metrics":
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [generate_latest(registry)]
    if environ["PATH_INFO"] == "/publish":
        body = parse_qs(environ.get("QUERY_STRING", "")).get("body", ["x"])[0]
        producer.publish(TOPIC, body.encode())
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"pid": os.getpid()}).encode()]
