"""The Django example (examples/django_project) as the soak serves it: its ``/orders`` view
publishes with ``on_commit=True``; ``/soak/publish?id=ID`` publishes at once, outside any
transaction. Both bodies are JSON with the id under ``item``. Loaded once in the server's master
(gunicorn ``--preload``, uWSGI without ``--lazy-apps``), which publishes once at import."""

from __future__ import annotations

import json
import os

# isort: off
from shop_site.wsgi import application  # first: it sets Django up

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path
from shop_site import urls

from nsq_sync.contrib.django import publish

# isort: on


def publish_now(request: HttpRequest) -> JsonResponse:
    """``/soak/publish?item=ID``: publish ``{"item": ID}`` at once (no transaction)."""
    item = request.GET["item"]
    publish(settings.ORDERS_TOPIC, json.dumps({"item": item}).encode())
    return JsonResponse({"pid": os.getpid()})


urls.urlpatterns.append(path("soak/publish", publish_now))

# As tests/support/uwsgi_apps/django_warm.py: one publish at import, in the master, so that the
# master holds a live connection when it forks the workers (and again at each respawn). Its own
# topic: the soak's accounting is of the requests' ids.
publish(settings.ORDERS_TOPIC + ".master", b"master %d" % os.getpid())

__all__ = ["application"]
