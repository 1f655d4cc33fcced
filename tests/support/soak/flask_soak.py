"""The Flask example (examples/flask_app) as the soak serves it under uWSGI: loaded once in the
master, which publishes once at import (its own topic: the soak accounts for the requests' ids),
so that the master holds a live connection when it forks the workers, and at each respawn."""

from __future__ import annotations

import os

from app import app, nsq

nsq.publish(app.config["EVENTS_TOPIC"] + ".master", b"master %d" % os.getpid())

__all__ = ["app"]
