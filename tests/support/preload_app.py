"""A bare WSGI app for gunicorn --preload tests: one Producer made, and used, in the master.

Environment: NSQD_TCP_ADDRESSES, TOPIC. ``/publish?body=...`` publishes through the master's
producer; every answer carries the worker's pid, its producer's runtime and the master's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from nsq_sync import Producer

TOPIC = os.environ["TOPIC"]
producer = Producer(os.environ["NSQD_TCP_ADDRESSES"].split(","))
producer.publish(TOPIC, b"from the master")  # connects in the master, before any fork
MASTER_RUNTIME = producer.runtime.name


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/publish":
        body = parse_qs(environ.get("QUERY_STRING", "")).get("body", ["x"])[0]
        producer.publish(TOPIC, body.encode())
    answer = {"pid": os.getpid(), "runtime": producer.runtime.name, "master": MASTER_RUNTIME}
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(answer).encode()]
