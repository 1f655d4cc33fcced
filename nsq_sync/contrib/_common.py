"""What the Django and Flask integrations share: settings validation, the per-process Producer,
and running a consumer to an exit status. Must import neither Django nor Flask."""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nsq_sync import metrics
from nsq_sync import process as _fork
from nsq_sync.addresses import address_list, parse_address, parse_http_address
from nsq_sync.config import Config
from nsq_sync.consumer import Consumer
from nsq_sync.consumer.batch import BatchConsumer
from nsq_sync.errors import ConfigError
from nsq_sync.producer import Producer

__all__ = [
    "NsqSettings",
    "ProducerHolder",
    "Problem",
    "find_problems",
    "parse_settings",
    "show_logs",
]

log = logging.getLogger("nsq_sync.contrib")

NSQD = "nsqd_tcp_addresses"
LOOKUPD = "lookupd_http_addresses"
#: metrics backends to enable (nsq_sync.metrics.enable): "prometheus", "otel", or both
METRICS = "metrics"
_OPTIONS = frozenset(f.name for f in dataclasses.fields(Config))
_KNOWN = sorted(_OPTIONS | {NSQD, LOOKUPD, METRICS})


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings; ``kind`` is "unknown", "invalid", "address" (malformed),
    "missing" (no address at all) or "conflict" (options that contradict each other)."""

    key: str
    kind: str
    message: str


@dataclass(frozen=True)
class NsqSettings:
    """Validated settings: where nsqd and nsqlookupd are, and a Config for everything else."""

    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    config: Config
    #: metrics backends the settings ask for ("prometheus", "otel")
    metrics: tuple[str, ...] = ()


def _check_addresses(name: str, key: str, value: Any) -> Problem | None:
    try:
        for address in address_list(name, value):
            if key == NSQD:
                parse_address(address)
            else:
                parse_http_address(address)
    except ConfigError as exc:
        return Problem(name, "address", f"{name}: {exc}")
    return None


def find_problems(
    options: Mapping[str, Any], key_name: Callable[[str], str] = str
) -> list[Problem]:
    """Everything wrong with ``options``, each naming the key as ``key_name`` spells it for the
    user (``NSQ_MAX_IN_FLIGHT`` in Flask)."""
    problems: list[Problem] = []
    config_options: dict[str, Any] = {}
    for raw_key, value in options.items():
        key = str(raw_key).replace("-", "_").lower()
        name = key_name(str(raw_key))
        if key in (NSQD, LOOKUPD):
            problem = _check_addresses(name, key, value)
            if problem is not None:
                problems.append(problem)
        elif key == METRICS:
            try:
                metrics.parse_backends(value, name)
            except ConfigError as exc:
                problems.append(Problem(name, "invalid", str(exc)))
        elif key not in _OPTIONS:
            close = difflib.get_close_matches(key, _KNOWN, n=1)
            hint = f" (did you mean {key_name(close[0])}?)" if close else ""
            problems.append(Problem(name, "unknown", f"unknown option {name}{hint}"))
        else:
            try:
                Config.check_option(key, value)
            except ConfigError as exc:
                problems.append(Problem(name, "invalid", f"{name}: {exc}"))
            else:
                config_options[key] = value
    if problems:
        return problems
    normalised = {str(k).replace("-", "_").lower() for k in options}
    if not normalised & {NSQD, LOOKUPD}:
        problems.append(
            Problem(
                key_name(NSQD),
                "missing",
                f"NSQ settings need {key_name(NSQD)} (to publish) and/or "
                f"{key_name(LOOKUPD)} (to consume)",
            )
        )
    try:
        Config().replace(**config_options)
    except ConfigError as exc:
        problems.append(
            Problem(", ".join(map(key_name, sorted(config_options))), "conflict", str(exc))
        )
    return problems


def parse_settings(options: Mapping[str, Any], key_name: Callable[[str], str] = str) -> NsqSettings:
    """Validate ``options`` and return them as :class:`NsqSettings`.

    Raises:
        ConfigError: every problem :func:`find_problems` reports, joined (each naming its key).
    """
    problems = find_problems(options, key_name)
    if problems:
        raise ConfigError("; ".join(p.message for p in problems))
    by_key = {str(k).replace("-", "_").lower(): v for k, v in options.items()}
    nsqd = address_list(NSQD, by_key.pop(NSQD, []))
    lookupd = address_list(LOOKUPD, by_key.pop(LOOKUPD, []))
    backends = tuple(metrics.parse_backends(by_key.pop(METRICS, None)))
    return NsqSettings(nsqd, lookupd, Config().replace(**by_key), backends)


class ProducerHolder:
    """The process's one Producer, made on first use; a new one in a forked child (the
    parent's copy is dropped without touching its sockets). Closed at interpreter exit.
    Thread-safe."""

    def __init__(self, settings: Callable[[], NsqSettings], what: str) -> None:
        self._settings = settings
        self._what = what
        # the parent's Producer, in a forked child: closed there (outside the fork lock), which
        # drops only the child's copies of its descriptors (see Producer's fork safety)
        self._inherited: list[Producer] = []
        self._producer = _fork.PerProcess(self._make, self._inherited.append, lazy=True)
        # replacing a closed Producer: one thread at a time (a lock per process, so a thread
        # that held it at a fork cannot block the child)
        self._replacing = _fork.PerProcess(threading.Lock)
        self._exit_registered = False

    def _make(self) -> Producer:
        settings = self._settings()
        if not settings.nsqd_tcp_addresses:
            raise ConfigError(f"publishing needs {self._what} (nsqd TCP addresses)")
        if not self._exit_registered:
            self._exit_registered = True
            atexit.register(self.close)
        return Producer(list(settings.nsqd_tcp_addresses), settings.config)

    def get(self) -> Producer:
        """The Producer (a new one after :meth:`close`); raises :class:`ConfigError` without
        an nsqd TCP address, or the settings' own error when they are invalid."""
        producer = self._producer.get()
        while self._inherited:
            try:
                inherited = self._inherited.pop()
            except IndexError:  # another thread took it
                break
            inherited.close(timeout=0)
        if producer.closed:  # close() was called: the next use makes a new one (only one)
            with self._replacing.get():
                producer = self._producer.get()
                if producer.closed:
                    self._producer = _fork.PerProcess(self._make, self._inherited.append, lazy=True)
                    producer = self._producer.get()
        return producer

    def close(self) -> None:
        """Close this process's Producer (a later :meth:`get` makes a new one). Thread-safe."""
        producer = self._producer.peek()
        if producer is not None:
            producer.close()


def make_consumer(
    topic: str,
    channel: str,
    handler: Callable[[Any], Any],
    settings: NsqSettings,
    *,
    concurrency: int = 1,
    max_in_flight: int | None = None,
    batch_size: int | None = None,
    batch_timeout: float | None = None,
    dead_letter_topic: str | None = None,
) -> Consumer | BatchConsumer:
    """A Consumer on the settings' addresses, or with ``batch_size`` a BatchConsumer (whose
    ``batch_timeout`` defaults to 1). ``max_in_flight`` defaults to the settings' value, raised
    to ``concurrency`` (or ``batch_size``) so that every worker (or a whole batch) can have one.

    Raises:
        InvalidName, ConfigError: a bad name, no address, a bad option, ``batch_timeout``
            without ``batch_size``, or ``concurrency`` with it (batches run one at a time).
    """
    kind: type[Consumer] | type[BatchConsumer]
    options: dict[str, Any]
    if batch_size is None:
        if batch_timeout is not None:
            raise ConfigError("--batch-timeout needs --batch-size")
        kind, floor, options = Consumer, concurrency, {"concurrency": concurrency}
    else:
        if concurrency != 1:
            raise ConfigError("--batch-size handles one batch at a time: no --concurrency")
        kind, floor = BatchConsumer, batch_size
        options = {
            "batch_size": batch_size,
            "batch_timeout": 1.0 if batch_timeout is None else batch_timeout,
        }
    if max_in_flight is None:
        max_in_flight = max(settings.config.max_in_flight, floor)
    return kind(
        topic,
        channel,
        handler,
        max_in_flight=max_in_flight,
        nsqd_tcp_addresses=list(settings.nsqd_tcp_addresses),
        lookupd_http_addresses=list(settings.lookupd_http_addresses),
        config=settings.config,
        dead_letter_topic=dead_letter_topic,
        **options,
    )


def run_to_exit_status(
    consumer: Consumer | BatchConsumer, idle_timeout: float | None, max_messages: int | None
) -> int:
    """Run ``consumer`` until SIGTERM/SIGINT, ``idle_timeout`` or ``max_messages``; log how it
    ended and return :attr:`~nsq_sync.consumer.running.RunSummary.exit_status`."""
    summary = consumer.run(idle_timeout=idle_timeout, max_messages=max_messages)
    log.log(
        logging.INFO if summary.ok else logging.WARNING,
        "consumer stopped (%s): %d handled, %d failed, %d gave up (%d dead-lettered)",
        summary.reason,
        summary.handled,
        summary.failed,
        summary.gave_up,
        summary.dead_lettered,
    )
    return summary.exit_status


def _routed(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` reaches a handler other than a NullHandler."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def show_logs(level: int) -> bool:
    """For the consume commands: if the application routes nsq_sync's logs nowhere, send them to
    stderr from ``level`` up, so that a failing handler is seen; return whether it did. Call it
    from the main thread before the consumer starts.
    """
    logger = logging.getLogger("nsq_sync")
    if _routed(logger):
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return True


def setting_name(key: str) -> str:
    """How Django users write a key of the ``NSQ`` setting: ``NSQ['max_in_flight']``."""
    return f"NSQ[{key!r}]"
