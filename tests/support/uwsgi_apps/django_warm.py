"""The Django example (examples/django_project) as uWSGI loads it: once, in the master, which
then forks the workers from C. It publishes once at import through the integration's
producer, so the master holds a live connection at the fork."""

from __future__ import annotations

import os

from shop_site.wsgi import application

from nsq_sync.contrib.django import publish

publish(os.environ["ORDERS_TOPIC"], b"master %d" % os.getpid())

__all__ = ["application"]
