from __future__ import annotations

from django.db import models


class Order(models.Model):
    """Created by the web view; its id is published to NSQ once the transaction commits."""

    item = models.CharField(max_length=100)


class Shipment(models.Model):
    """Written by the NSQ consumer (``manage.py nsq_consume``) for each order message."""

    order_id = models.BigIntegerField()
    item = models.CharField(max_length=100)
    message_id = models.CharField(max_length=32, unique=True)
