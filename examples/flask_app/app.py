"""A small Flask app that publishes from a view, and the handler its worker runs.

    pip install ".[flask]" gunicorn     # from the repository's root (and ".[gevent]" for -k gevent)
    export NSQD_TCP_ADDRESSES=127.0.0.1:4150
    gunicorn --preload -w 2 -b 127.0.0.1:8000 app:app            # or -k gevent
    curl 'http://127.0.0.1:8000/publish?body=hello'
    flask --app app nsq consume events archive --handler app:archive
    flask --app app nsq consume events archive --handler app:archive_batch --batch-size 100

Environment: NSQD_TCP_ADDRESSES (comma-separated, default 127.0.0.1:4150), EVENTS_TOPIC
(default "events"), ARCHIVE_FILE (where the handler appends bodies, default archive.log).
"""

from __future__ import annotations

import os

from flask import Flask, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from nsq_sync import DeadLetter, Message
from nsq_sync.contrib.flask import NSQ

app = Flask(__name__)
app.config["NSQ_NSQD_TCP_ADDRESSES"] = os.environ.get("NSQD_TCP_ADDRESSES", "127.0.0.1:4150").split(
    ","
)
app.config["NSQ_PUBLISH_TIMEOUT"] = "5s"
app.config["EVENTS_TOPIC"] = os.environ.get("EVENTS_TOPIC", "events")
app.config["ARCHIVE_FILE"] = os.environ.get("ARCHIVE_FILE", "archive.log")

nsq = NSQ(app)


@app.route("/publish")
def publish() -> ResponseReturnValue:
    """``/publish?body=hello``: publish the body; answer with this worker's pid."""
    body = request.args.get("body", "hello")
    nsq.publish(current_app.config["EVENTS_TOPIC"], body.encode())
    return jsonify(pid=os.getpid())


@app.route("/runtime")
def runtime() -> ResponseReturnValue:
    """``/runtime``: this worker's pid and the runtime its producer runs on."""
    return jsonify(pid=os.getpid(), runtime=nsq.producer.runtime.name)


def archive(message: Message) -> None:
    """The worker's handler (``--handler app:archive``): runs inside an application context,
    so it can read current_app.config. Returning finishes the message; raising requeues it;
    raising DeadLetter gives it up at once (to ``--dead-letter-topic``, if given)."""
    if message.body == b"fail":
        raise ValueError("refusing to archive 'fail'")
    if message.body.startswith(b"poison"):
        raise DeadLetter("poison: never archived")
    with open(current_app.config["ARCHIVE_FILE"], "ab") as archive_file:
        archive_file.write(message.body + b"\n")


def archive_batch(messages: list[Message]) -> None:
    """The batch handler (``--handler app:archive_batch --batch-size N``): appends each batch of
    up to N messages as one line (bodies separated by tabs) in one write, inside an application
    context. Returning finishes the whole batch; raising requeues it."""
    line = b"\t".join(message.body for message in messages)
    with open(current_app.config["ARCHIVE_FILE"], "ab") as archive_file:
        archive_file.write(line + b"\n")
