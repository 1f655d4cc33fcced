"""A Consumer per uWSGI worker, the recipe of docs/uwsgi.md: started in a
``uwsgidecorators.postfork`` function (in each worker, after uWSGI forked it), stopped by
``uwsgi.atexit`` (so that when uWSGI stops, everything received is finished or requeued and
nothing stays in flight at nsqd).

Environment: NSQD_TCP_ADDRESS, NSQ_TOPIC, HANDLED_FILE (the handler appends ``<pid> <body>``
lines to it), HANDLE_SECONDS (each handler call sleeps that long first, default 0). Every
request answers ``{"pid": ...}``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import uwsgi
from uwsgidecorators import postfork

from nsq_sync import Consumer, Message

consumer: Consumer | None = None


def handle(message: Message) -> None:
    time.sleep(float(os.environ.get("HANDLE_SECONDS", "0")))
    # one write(2) per line on an O_APPEND file: lines of both workers never interleave
    line = b"%d %s\n" % (os.getpid(), message.body)
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@postfork
def start_consumer() -> None:
    global consumer
    consumer = Consumer(
        os.environ["NSQ_TOPIC"],
        "workers",
        handle,
        nsqd_tcp_addresses=[os.environ["NSQD_TCP_ADDRESS"]],
        max_in_flight=10,
    )
    consumer.start()


def stop_consumer() -> None:
    if consumer is not None:
        consumer.stop(timeout=10.0)


uwsgi.atexit = stop_consumer


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"pid": os.getpid()}).encode()]
