"""The consumer side: ``manage.py nsq_consume orders shipping --handler shop.handlers.ship``."""

from __future__ import annotations

import json

from nsq_sync import Message

from .models import Shipment


def ship(message: Message) -> None:
    """Record a Shipment for an order message (returning finishes it; raising requeues it).

    Idempotent: a redelivered message (same id) is recorded once.
    """
    data = json.loads(message.body)
    if data.get("fail"):
        raise ValueError(f"order {data.get('order_id')} cannot be shipped")
    Shipment.objects.get_or_create(
        message_id=message.id.decode(),
        defaults={"order_id": data["order_id"], "item": data["item"]},
    )
