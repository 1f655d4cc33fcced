"""System checks of the ``NSQ`` setting: one Error per problem, naming the key (ids are public)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from nsq_sync.contrib._common import find_problems, setting_name

_IDS = {
    "unknown": "E002",
    "invalid": "E003",
    "address": "E004",
    "missing": "E005",
    "conflict": "E006",
}
_HINTS = {
    "unknown": "Option names are nsq_sync.Config's fields (go-nsq's names in snake_case).",
    "address": "nsqd_tcp_addresses take 'host:port'; lookupd_http_addresses 'http://host:port'.",
    "missing": "Add nsqd_tcp_addresses to publish, lookupd_http_addresses to consume.",
}


def check_nsq_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    options = getattr(settings, "NSQ", None)
    if not isinstance(options, dict):
        return [
            checks.Error(
                f"settings.NSQ must be a dict, got {type(options).__name__}",
                hint="NSQ = {'nsqd_tcp_addresses': ['127.0.0.1:4150']}",
                id="nsq_sync.E001",
            )
        ]
    return [
        checks.Error(
            problem.message,
            hint=_HINTS.get(problem.kind),
            obj="settings.NSQ",
            id=f"nsq_sync.{_IDS[problem.kind]}",
        )
        for problem in find_problems(options, setting_name)
    ]
