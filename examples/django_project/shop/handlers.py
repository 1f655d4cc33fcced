"""The consumer side: ``manage.py nsq_consume shop_orders shipping --handler shop.handlers.ship``, or
``--handler shop.handlers.ship_batch --batch-size 100`` to write many orders at once. Add
``--dead-letter-topic shop_orders.dead`` to keep what cannot be shipped (``nsq-sync dead-letter
list shop_orders.dead``, then ``replay`` once fixed)."""

from __future__ import annotations

import json
import logging

from django.db import transaction

from nsq_sync import DeadLetter, Message

from .models import Shipment

log = logging.getLogger(__name__)


def ship(message: Message) -> None:
    """Record a Shipment for an order message (returning finishes it; raising requeues it).

    Idempotent: a redelivered message (same id) is recorded once. A body that is not JSON will
    never ship, however often it is retried: DeadLetter gives it up at once (to the dead-letter
    topic with ``--dead-letter-topic``).
    """
    try:
        data = json.loads(message.body)
    except ValueError as exc:
        raise DeadLetter(f"not an order: {exc}") from exc
    if data.get("fail"):
        raise ValueError(f"order {data.get('order_id')} cannot be shipped")
    Shipment.objects.get_or_create(
        message_id=message.id.decode(),
        defaults={"order_id": data["order_id"], "item": data["item"]},
    )


def ship_batch(messages: list[Message]) -> None:
    """Record the Shipments of a batch of order messages in one transaction (returning finishes
    them all; raising requeues them all). Idempotent, as :func:`ship`."""
    orders = {message.id.decode(): json.loads(message.body) for message in messages}
    with transaction.atomic():
        known = set(
            Shipment.objects.filter(message_id__in=orders).values_list("message_id", flat=True)
        )
        Shipment.objects.bulk_create(
            Shipment(message_id=message_id, order_id=data["order_id"], item=data["item"])
            for message_id, data in orders.items()
            if message_id not in known
        )
    log.info("shipped a batch of %d orders", len(messages))
