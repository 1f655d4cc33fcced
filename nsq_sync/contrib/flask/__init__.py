"""Flask integration: the :class:`NSQ` extension (settings from ``NSQ_<OPTION>`` keys of
``app.config``) and ``flask nsq consume``, whose handlers run inside an application context."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsq_sync._version import install_hint

try:
    import click
    from flask import Flask, current_app
    from flask.cli import AppGroup
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"nsq_sync.contrib.flask needs Flask: {install_hint('flask')}") from exc

from nsq_sync import metrics
from nsq_sync.contrib._common import (
    NsqSettings,
    ProducerHolder,
    make_consumer,
    parse_settings,
    run_to_exit_status,
    show_logs,
)
from nsq_sync.errors import NSQError
from nsq_sync.message import Message
from nsq_sync.producer import Producer

__all__ = ["NSQ"]

_PREFIX = "NSQ_"


def _config_key(key: str) -> str:
    return _PREFIX + key.upper()


@dataclass
class _State:
    settings: NsqSettings
    holder: ProducerHolder


class NSQ:
    """The Flask extension: settings from ``app.config``, a per-process Producer, and the
    ``flask nsq consume`` command. Pass ``app`` here or to :meth:`init_app` (an app factory).
    Thread-safe once initialised.
    """

    def __init__(self, app: Flask | None = None) -> None:
        self.app = app
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read and validate the ``NSQ_*`` keys of ``app.config``, enable the metrics backends
        ``NSQ_METRICS`` names, and add ``flask nsq``.

        Raises:
            ConfigError: an unknown ``NSQ_*`` key, a bad value or address, or no address.
        """
        options = {k[len(_PREFIX) :]: v for k, v in app.config.items() if k.startswith(_PREFIX)}
        settings = parse_settings(options, _config_key)
        metrics.enable(settings.metrics, "NSQ_METRICS")  # NSQ_METRICS = "prometheus" / "otel"
        app.extensions["nsq"] = _State(
            settings, ProducerHolder(lambda: settings, "NSQ_NSQD_TCP_ADDRESSES")
        )
        app.cli.add_command(nsq_cli)

    def _state(self) -> _State:
        app = self.app if self.app is not None else current_app
        try:
            state: _State = app.extensions["nsq"]
        except KeyError:
            raise RuntimeError("NSQ.init_app(app) was not called for this app") from None
        return state

    @property
    def producer(self) -> Producer:
        """This process's Producer for the app (a new one in a forked child, such as a gunicorn
        worker); closed at interpreter exit. Thread-safe.

        Raises:
            ConfigError: no ``NSQ_NSQD_TCP_ADDRESSES``.
            RuntimeError: no app bound and no application context.
        """
        return self._state().holder.get()

    def publish(self, topic: str, body: Any) -> None:
        """``self.producer.publish(topic, body)``: waits for nsqd's OK. Thread-safe.

        Raises:
            InvalidName, InvalidBody, PublishError, ServerError: as :meth:`Producer.publish`.
        """
        self.producer.publish(topic, body)

    def close(self) -> None:
        """Close this process's producer (a later publish makes a new one). Thread-safe."""
        self._state().holder.close()


def load_handler(path: str) -> Callable[[Message], Any]:
    """Import ``module:function`` (or ``module.function``; ``module:object.method`` too).

    Raises:
        click.BadParameter: (exit status 2) it cannot be imported or is not callable.
    """
    module_name, colon, name = path.partition(":")
    if not colon:
        module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise click.BadParameter(f"{path}: expected module:function", param_hint="--handler")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # the module's own import error is the cause to show
        raise click.BadParameter(
            f"{path}: cannot import {module_name}: {type(exc).__name__}: {exc}",
            param_hint="--handler",
        ) from None
    for part in name.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise click.BadParameter(
                f"{path}: {module_name} has no attribute {name!r}", param_hint="--handler"
            ) from None
    if not callable(target):
        raise click.BadParameter(f"{path} is not callable", param_hint="--handler")
    return target  # type: ignore[no-any-return]


nsq_cli = AppGroup("nsq", help="NSQ commands (nsq_sync).")


@nsq_cli.command("consume")
@click.argument("topic")
@click.argument("channel")
@click.option("--handler", required=True, help="module:function called with each message.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=None,
    help="Default: NSQ_MAX_IN_FLIGHT, at least --concurrency.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many seconds without a message.",
)
@click.option("--max-messages", type=click.IntRange(min=1), default=None, help="Stop after N.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="The handler receives a list of up to N messages (one batch at a time).",
)
@click.option(
    "--batch-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a batch waits for more messages after its first (default 1).",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More logs: -v info, -vv debug (default: warnings and errors, such as a handler's "
    "failure with its traceback). Only when the app routes no nsq_sync logs itself.",
)
@click.option(
    "--dead-letter-topic",
    default=None,
    help="Publish messages given up (NSQ_MAX_ATTEMPTS used, or nsq_sync.DeadLetter raised) to "
    "this topic before finishing them.",
)
def consume(
    topic: str,
    channel: str,
    handler: str,
    concurrency: int,
    max_in_flight: int | None,
    idle_timeout: float | None,
    max_messages: int | None,
    batch_size: int | None,
    batch_timeout: float | None,
    verbose: int,
    dead_letter_topic: str | None = None,
) -> None:
    """Consume TOPIC/CHANNEL with a handler until SIGTERM (exit 0); exit 1 when handlers failed
    in a run ended by --idle-timeout or --max-messages. With --batch-size the handler receives a
    list of messages."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    function = load_handler(handler)
    show_logs(logging.WARNING - 10 * min(verbose, 2))

    def in_app_context(message: Any) -> Any:  # a Message, or a list of them (--batch-size)
        with app.app_context():
            return function(message)

    state: _State | None = app.extensions.get("nsq")
    if state is None:
        raise click.UsageError("the app has no NSQ extension (NSQ(app) or nsq.init_app(app))")
    try:
        consumer = make_consumer(
            topic,
            channel,
            in_app_context,
            state.settings,
            concurrency=concurrency,
            max_in_flight=max_in_flight,
            batch_size=batch_size,
            batch_timeout=batch_timeout,
            dead_letter_topic=dead_letter_topic,
        )
    except (NSQError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    sys.exit(run_to_exit_status(consumer, idle_timeout, max_messages))
