"""A tiny WSGI app for the gunicorn fork test: one Producer made at import time.

With ``gunicorn --preload`` the module is imported (and the Producer connects, by publishing
once) in the master before it forks the workers, as a Django or Flask app that publishes at
startup does. Every request publishes the body given in the query string (``?body=...``) and
answers ``200 <pid>``, or ``500 <pid> <error class> <error>`` when the publish raised.

Environment: ``NSQD_TCP_ADDRESS`` and ``NSQ_TOPIC``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Callable
from urllib.parse import parse_qs

from nsq_sync import Producer

TOPIC = os.environ["NSQ_TOPIC"]
producer = Producer(os.environ["NSQD_TCP_ADDRESS"], publish_timeout=10.0)
producer.publish(TOPIC, b"master %d" % os.getpid())


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = parse_qs(environ.get("QUERY_STRING", "")).get("body", [""])[0].encode()
    try:
        producer.publish(TOPIC, body)
    except Exception as exc:  # reported to the test, which decides
        status, text = "500 Internal Server Error", f"{os.getpid()} {type(exc).__name__} {exc}"
    else:
        status, text = "200 OK", str(os.getpid())
    data = text.encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
    return [data]
