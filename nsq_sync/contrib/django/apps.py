"""The Django app: registers the system checks of the ``NSQ`` setting, and enables the metrics
backends ``NSQ["metrics"]`` names when the app registry is ready."""

from __future__ import annotations

from django.apps import AppConfig


class NsqSyncConfig(AppConfig):
    name = "nsq_sync.contrib.django"
    label = "nsq_sync"
    verbose_name = "NSQ (nsq_sync)"

    def ready(self) -> None:
        from django.core import checks
        from django.core.signals import setting_changed

        from nsq_sync.contrib.django.checks import check_nsq_settings

        checks.register(check_nsq_settings)
        setting_changed.connect(_on_setting_changed, dispatch_uid="nsq_sync.setting_changed")
        _enable_metrics()


def _enable_metrics() -> None:
    """Enable the backends ``NSQ["metrics"]`` names; an invalid ``NSQ`` is left to the checks."""
    from django.core.exceptions import ImproperlyConfigured

    from nsq_sync import metrics
    from nsq_sync.contrib.django import get_settings

    try:
        backends = get_settings().metrics
    except ImproperlyConfigured:
        return
    metrics.enable(backends, "NSQ['metrics']")


def _on_setting_changed(setting: str, **kwargs: object) -> None:
    # override_settings(NSQ=...) in tests: the next get_producer() follows the new setting.
    if setting == "NSQ":
        from nsq_sync.contrib.django import _holder

        _holder.close()
