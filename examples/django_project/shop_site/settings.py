"""Settings of the example shop: the parts that matter are INSTALLED_APPS and NSQ.

Environment: NSQD_TCP_ADDRESSES (comma-separated, default 127.0.0.1:4150), ORDERS_TOPIC
(default "shop_orders"), SHOP_DB (the sqlite file, default db.sqlite3 next to manage.py).
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "nsq_sync.contrib.django",
    "shop",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shop_site.urls"
WSGI_APPLICATION = "shop_site.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DB", str(BASE_DIR / "db.sqlite3")),
        "TEST": {"NAME": os.environ.get("SHOP_TEST_DB") or None},
        # two gunicorn workers write at once: wait for sqlite's lock rather than fail
        "OPTIONS": {"timeout": 30},
    }
}

NSQ = {
    "nsqd_tcp_addresses": os.environ.get("NSQD_TCP_ADDRESSES", "127.0.0.1:4150").split(","),
    "max_in_flight": 10,
}
ORDERS_TOPIC = os.environ.get("ORDERS_TOPIC", "shop_orders")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "nsq_sync": {"handlers": ["console"], "level": "INFO"},
        "shop": {"handlers": ["console"], "level": "INFO"},
        "django.request": {"handlers": ["console"], "level": "ERROR"},
    },
}
