"""The Flask example (examples/flask_app) as uWSGI loads it: once, in the master, which then
forks the workers from C. Its producer publishes once at import, as an app that warms its
connections at start-up does, so the master holds a live connection at the fork."""

from __future__ import annotations

import os

from app import app, nsq

nsq.publish(app.config["EVENTS_TOPIC"], b"master %d" % os.getpid())

__all__ = ["app"]
