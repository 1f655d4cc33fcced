"""``manage.py nsq_consume TOPIC CHANNEL --handler dotted.path``: run a Consumer (a BatchConsumer
with ``--batch-size``) until SIGTERM, or ``--idle-timeout`` / ``--max-messages`` for cron.
Exit status: 0 after SIGTERM/SIGINT or when nothing failed, 1 when handlers failed or gave up,
2 for bad usage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils.module_loading import import_string

from nsq_sync.cli.arguments import positive_int, positive_seconds
from nsq_sync.contrib._common import make_consumer, run_to_exit_status, show_logs
from nsq_sync.contrib.django import get_settings
from nsq_sync.errors import NSQError
from nsq_sync.message import Message

#: --verbosity (0-3) -> the lowest level shown when nsq_sync's logs go to stderr
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}


def load_handler(path: str) -> Callable[[Message], Any]:
    """Import ``package.module.function`` (or ``package.module:function``).

    Raises:
        CommandError: (exit status 2) it cannot be imported or is not callable.
    """
    try:
        handler = import_string(path.replace(":", "."))
    except ImportError as exc:
        raise CommandError(f"--handler {path}: {exc}", returncode=2) from exc
    if not callable(handler):
        raise CommandError(f"--handler {path} is not callable", returncode=2)
    return handler  # type: ignore[no-any-return]


def with_fresh_connections(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Run ``handler`` between two ``close_old_connections()``, as Django's request cycle does,
    so a long-running worker never uses a dead or expired database connection."""

    def handle(message: Any) -> Any:
        close_old_connections()
        try:
            return handler(message)
        finally:
            close_old_connections()

    return handle


class Command(BaseCommand):
    help = "Consume TOPIC/CHANNEL from NSQ with a handler, until SIGTERM (exit 0)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("topic")
        parser.add_argument("channel")
        parser.add_argument(
            "--handler",
            required=True,
            help="dotted path of a function called with each message, or with a list of them "
            "with --batch-size (returns: FIN; raises: REQ)",
        )
        parser.add_argument("--concurrency", type=positive_int, default=1)
        parser.add_argument(
            "--max-in-flight",
            type=positive_int,
            default=None,
            help="default: NSQ['max_in_flight'], at least --concurrency",
        )
        parser.add_argument(
            "--idle-timeout",
            type=positive_seconds,
            default=None,
            help="stop after this many seconds without a message",
        )
        parser.add_argument(
            "--max-messages", type=positive_int, default=None, help="stop after N messages"
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="the handler receives a list of up to N messages (one batch at a time)",
        )
        parser.add_argument(
            "--batch-timeout",
            type=positive_seconds,
            default=None,
            help="seconds a batch waits for more messages after its first (default 1)",
        )
        parser.add_argument(
            "--dead-letter-topic",
            default=None,
            help="publish messages given up (NSQ['max_attempts'] used, or nsq_sync.DeadLetter "
            "raised) to this topic before finishing them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        handler = with_fresh_connections(load_handler(options["handler"]))
        # nsq_sync's logs go where LOGGING sends them; if it sends them nowhere, to stderr
        show_logs(_LEVELS.get(options["verbosity"], logging.DEBUG))
        settings = get_settings()
        try:
            consumer = make_consumer(
                options["topic"],
                options["channel"],
                handler,
                settings,
                concurrency=options["concurrency"],
                max_in_flight=options["max_in_flight"],
                batch_size=options["batch_size"],
                batch_timeout=options["batch_timeout"],
                dead_letter_topic=options["dead_letter_topic"],
            )
        except (NSQError, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        status = run_to_exit_status(consumer, options["idle_timeout"], options["max_messages"])
        if status:
            raise CommandError("some messages failed (see the log)", returncode=status)
