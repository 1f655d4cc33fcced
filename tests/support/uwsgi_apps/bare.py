"""A bare WSGI app for uWSGI: a module-level Producer and NsqdHTTPClient, both used at import in
the master (live connections at the fork).

Environment: NSQD_TCP_ADDRESS, NSQD_HTTP_ADDRESS, NSQ_TOPIC. ``/publish?body=...`` publishes
over TCP, ``/http-publish?body=...`` over nsqd's HTTP API; each answers ``{"pid": ...}``, or
status 500 with the error's class and text. ``noticed`` is the fork generation the worker had
right after uWSGI forked it (1: nsq_sync's uWSGI post-fork hook ran before anything else).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from uwsgidecorators import postfork

from nsq_sync import NsqdHTTPClient, Producer
from nsq_sync import process as _fork

TOPIC = os.environ["NSQ_TOPIC"]
producer = Producer(os.environ["NSQD_TCP_ADDRESS"], publish_timeout=10.0)
http = NsqdHTTPClient(os.environ["NSQD_HTTP_ADDRESS"])
producer.publish(TOPIC, b"master tcp %d" % os.getpid())
http.pub(TOPIC, b"master http %d" % os.getpid())
noticed_at_postfork = -1


@postfork
def _look() -> None:
    # Runs after nsq_sync's own post-fork hook (registered earlier, by the Producer): the
    # fork is already noticed here, before the worker serves anything.
    global noticed_at_postfork
    noticed_at_postfork = _fork.generation


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = parse_qs(environ.get("QUERY_STRING", "")).get("body", [""])[0].encode()
    try:
        if environ["PATH_INFO"] == "/http-publish":
            http.pub(TOPIC, body)
        else:
            producer.publish(TOPIC, body)
    except Exception as exc:  # reported to the test, which decides
        status, answer = "500 Internal Server Error", {"error": f"{type(exc).__name__}: {exc}"}
    else:
        status, answer = "200 OK", {"pid": os.getpid(), "noticed": noticed_at_postfork}
    data = json.dumps(answer).encode()
    start_response(status, [("Content-Type", "application/json")])
    return [data]
