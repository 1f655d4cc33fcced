"""Django integration (``INSTALLED_APPS += ["nsq_sync.contrib.django"]``): the ``NSQ`` setting,
:func:`publish` and ``manage.py nsq_consume``, described in docs/django.md."""

from __future__ import annotations

from typing import Any

from nsq_sync._version import install_hint

try:
    import django  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"nsq_sync.contrib.django needs Django: {install_hint('django')}") from exc

from nsq_sync.contrib._common import NsqSettings, ProducerHolder, parse_settings, setting_name
from nsq_sync.producer import Producer
from nsq_sync.protocol import commands

__all__ = ["get_producer", "get_settings", "publish"]


def get_settings() -> NsqSettings:
    """The ``NSQ`` setting, validated.

    Raises:
        django.core.exceptions.ImproperlyConfigured: ``NSQ`` is missing or invalid (names the key).
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from nsq_sync.errors import ConfigError

    options = getattr(settings, "NSQ", None)
    if not isinstance(options, dict):
        raise ImproperlyConfigured(
            "settings.NSQ must be a dict such as {'nsqd_tcp_addresses': ['127.0.0.1:4150']}"
        )
    try:
        return parse_settings(options, setting_name)
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


_holder = ProducerHolder(get_settings, "NSQ['nsqd_tcp_addresses']")


def get_producer() -> Producer:
    """The process's one Producer, a new one in a forked child (such as a gunicorn worker).
    Thread-safe; closed at interpreter exit.

    Raises:
        django.core.exceptions.ImproperlyConfigured: bad ``NSQ`` settings.
        nsq_sync.errors.ConfigError: ``NSQ`` has no ``nsqd_tcp_addresses``.
    """
    return _holder.get()


def publish(topic: str, body: Any, on_commit: bool = False, using: str = "default") -> None:
    """Publish ``body`` to ``topic`` through :func:`get_producer`. Thread-safe.

    Args:
        on_commit: send only once the transaction open on ``using`` (a database alias) commits,
            never after a rollback; at once when no transaction is open.

    Raises:
        InvalidName, InvalidBody: a bad topic or body, at once (also with ``on_commit``).
        PublishError, ServerError: as :meth:`Producer.publish`; with ``on_commit``, from the
            commit (the transaction is committed by then).
        django.core.exceptions.ImproperlyConfigured, ConfigError: as :func:`get_producer`.
    """
    commands.pub(topic, body)  # bad input fails here, in the caller, not at commit time
    if not on_commit:
        get_producer().publish(topic, body)
        return
    from django.db import transaction

    def send() -> None:
        get_producer().publish(topic, body)

    transaction.on_commit(send, using=using)
