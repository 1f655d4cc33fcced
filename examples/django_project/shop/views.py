"""Publishing from a view: the order and its NSQ message commit together or not at all."""

from __future__ import annotations

import json
import os

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse

from nsq_sync.contrib.django import get_producer, publish

from .models import Order


def create_order(request: HttpRequest) -> JsonResponse:
    """``/orders?item=book``: save an Order; publish it once the transaction commits."""
    item = request.GET.get("item", "book")
    with transaction.atomic():
        order = Order.objects.create(item=item)
        body = json.dumps({"order_id": order.id, "item": item}).encode()
        publish(settings.ORDERS_TOPIC, body, on_commit=True)
    return JsonResponse({"order_id": order.id, "pid": os.getpid()})


def runtime(request: HttpRequest) -> JsonResponse:
    """``/runtime``: this worker's pid and the runtime its producer runs on."""
    return JsonResponse({"pid": os.getpid(), "runtime": get_producer().runtime.name})
