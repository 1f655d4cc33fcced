"""Options of the ``nsq`` data source, parsed and validated without pyspark into picklable values.

They run while Spark plans the query, so a bad or unknown option (any Config option is accepted
too) raises :class:`~nsq_sync.errors.ConfigError` naming it from ``save()``/``start()``, before
anything is sent, and not in a task on an executor.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nsq_sync.addresses import address_list, parse_address, parse_http_address
from nsq_sync.config import Config
from nsq_sync.durations import parse_duration
from nsq_sync.errors import ConfigError
from nsq_sync.protocol.names import validate_channel, validate_topic

__all__ = ["SinkOptions", "SourceOptions", "sink_options", "source_options"]

#: options Spark itself adds or that belong to it, never to nsq_sync
_SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})
_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))


@dataclass(frozen=True)
class SinkOptions:
    """What a sink task needs: where to publish and how to cut MPUB batches."""

    nsqd_tcp_addresses: tuple[str, ...]
    topic: str | None
    batch_size: int
    config: Config


@dataclass(frozen=True)
class SourceOptions:
    """What the source needs: the driver-side consumer, or the parallel mode (``parallelism``)."""

    topic: str
    channel: str
    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    max_messages_per_batch: int
    commit_flush_after: float
    drain_idle_timeout: float
    config: Config
    #: parallel mode (executors read; 0: the driver-side source)
    parallelism: int = 0
    staging_location: str | None = None
    nsqd_http_addresses: tuple[str, ...] = ()
    partition_timeout: float = 60.0
    chunk_size: int = 1000


def _split(name: str, value: str | None) -> tuple[str, ...]:
    """An address option (a comma-separated string); unset or empty means none."""
    if value is None or not str(value).strip():
        return ()
    return address_list(f"option {name}", str(value))


def _checked(name: str, value: str | None, parse: Callable[[str], Any]) -> tuple[str, ...]:
    """An address-list option, each address checked by ``parse``."""
    addresses = _split(name, value)
    for address in addresses:
        try:
            parse(address)
        except ConfigError as exc:
            raise ConfigError(f"option {name}: {exc}") from None
    return addresses


def _http_addresses(name: str, options: dict[str, Any]) -> tuple[str, ...]:
    """An option listing HTTP addresses (``host:port`` or URLs)."""
    return _checked(name, options.get(name), parse_http_address)


def _int(name: str, value: Any, default: int, lo: int, hi: int) -> int:
    if value is None:
        return default
    try:
        result = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {value!r}") from None
    if not lo <= result <= hi:
        raise ConfigError(f"option {name} must be between {lo} and {hi}, got {result}")
    return result


def _seconds(name: str, value: Any, default: float, lo: float, hi: float) -> float:
    if value is None:
        return default
    result = parse_duration(value, f"option {name}")
    if not lo <= result <= hi:
        raise ConfigError(f"option {name} must be between {lo} and {hi} seconds, got {value!r}")
    return result


def _split_options(
    options: Mapping[str, str], own: frozenset[str], what: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(this source's own options, Config options); unknown keys raise."""
    mine: dict[str, str] = {}
    config: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).strip().lower().replace("-", "_")
        if name in own:
            mine[name] = value
        elif name in _CONFIG_FIELDS:
            config[name] = value
        elif name not in _SPARK_OPTIONS:
            raise ConfigError(
                f"unknown option {key!r} for the nsq {what} (options: "
                f"{', '.join(sorted(own))}, or any nsq_sync Config option)"
            )
    return mine, config


def _tcp_addresses(value: str | None, *, required: bool) -> tuple[str, ...]:
    addresses = _checked("nsqd_tcp_addresses", value, parse_address)
    if required and not addresses:
        raise ConfigError(
            "option nsqd_tcp_addresses is required: 'host:port' or a comma-separated list"
        )
    return addresses


_SINK_OWN = frozenset({"nsqd_tcp_addresses", "topic", "batch_size"})


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the sink's options (``df.write.format("nsq")``).

    Raises:
        ConfigError: a missing, malformed, out-of-range or unknown option (named).
    """
    mine, config_opts = _split_options(options, _SINK_OWN, "sink")
    addresses = _tcp_addresses(mine.get("nsqd_tcp_addresses"), required=True)
    topic = mine.get("topic")
    if topic is not None:
        try:
            topic = validate_topic(topic)
        except ValueError as exc:
            raise ConfigError(f"option topic: {exc}") from None
    # A short nsqd outage (a restart) must not fail the task: publishes are retried for a minute.
    config_opts.setdefault("publish_timeout", "60")
    config = _config(config_opts)
    batch_size = _int("batch_size", mine.get("batch_size"), 500, 1, 1_000_000)
    return SinkOptions(addresses, topic, batch_size, config)


_SOURCE_OWN = frozenset(
    {
        "nsqd_tcp_addresses",
        "lookupd_http_addresses",
        "topic",
        "channel",
        "max_messages_per_batch",
        "commit_flush_after",
        "drain_idle_timeout",
        "parallelism",
        "staging_location",
        "nsqd_http_addresses",
        "partition_timeout",
        "chunk_size",
    }
)


def source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the streaming source's options (``spark.readStream.format("nsq")``).

    Raises:
        ConfigError: a missing, malformed, out-of-range or unknown option (named), or
            ``max_messages_per_batch`` above half of ``max_in_flight``.
    """
    mine, config_opts = _split_options(options, _SOURCE_OWN, "source")
    names: dict[str, str] = {}
    for name, check in (("topic", validate_topic), ("channel", validate_channel)):
        value = mine.get(name)
        if value is None:
            raise ConfigError(f"option {name} is required for the nsq source")
        try:
            names[name] = check(value)
        except ValueError as exc:
            raise ConfigError(f"option {name}: {exc}") from None
    direct = _tcp_addresses(mine.get("nsqd_tcp_addresses"), required=False)
    lookupds = _http_addresses("lookupd_http_addresses", mine)
    if not direct and not lookupds:
        raise ConfigError(
            "the nsq source needs option nsqd_tcp_addresses or lookupd_http_addresses"
        )
    # what both modes read: the validated topic, channel and where to find nsqds
    source = functools.partial(SourceOptions, names["topic"], names["channel"], direct, lookupds)
    if mine.get("parallelism") is not None:
        return _parallel_options(mine, config_opts, source, direct, lookupds)
    for name in sorted(_PARALLEL_ONLY & set(mine)):
        raise ConfigError(f"option {name} needs option parallelism (the parallel mode)")
    per_batch = _int("max_messages_per_batch", mine.get("max_messages_per_batch"), 1000, 1, 10**7)
    # Batch N waits for its commit while N+1 fills: each may hold half of the credit.
    config_opts.setdefault("max_in_flight", str(2 * per_batch))
    # We must know nsqd's message timeout to TOUCH in time: ask for nsqd's default explicitly.
    config_opts.setdefault("msg_timeout", "60")
    # Spark, not the attempt count, decides what a row is worth: never give up on a message.
    config_opts.setdefault("max_attempts", "0")
    config = _config(config_opts)
    if per_batch > config.max_in_flight // 2:
        raise ConfigError(
            f"option max_messages_per_batch ({per_batch}) must be at most half of "
            f"max_in_flight ({config.max_in_flight}): the batch awaiting its commit and the "
            "next one share the in-flight credit"
        )
    return source(
        max_messages_per_batch=per_batch,
        commit_flush_after=_seconds(
            "commit_flush_after", mine.get("commit_flush_after"), 0.5, 0.0, 3600.0
        ),
        drain_idle_timeout=_seconds(
            "drain_idle_timeout", mine.get("drain_idle_timeout"), 2.0, 0.05, 3600.0
        ),
        config=config,
    )


_PARALLEL_ONLY = frozenset(
    {"staging_location", "nsqd_http_addresses", "partition_timeout", "chunk_size"}
)


def _parallel_options(
    mine: dict[str, str],
    config_opts: dict[str, str],
    source: Callable[..., SourceOptions],
    direct: tuple[str, ...],
    lookupds: tuple[str, ...],
) -> SourceOptions:
    """The parallel mode's options: executors read, staging makes their FINs safe."""
    parallelism = _int("parallelism", mine.get("parallelism"), 1, 1, 10_000)
    staging = mine.get("staging_location")
    if staging is None or not str(staging).strip():
        raise ConfigError(
            "option staging_location is required with parallelism: an absolute path or a "
            "pyarrow.fs URI (hdfs://..., s3://...) every executor can write, one per query"
        )
    staging = str(staging).strip()
    if "://" not in staging and not staging.startswith("/"):
        raise ConfigError(
            f"option staging_location must be an absolute path or a URI, got {staging!r}"
        )
    https = _http_addresses("nsqd_http_addresses", mine)
    if not lookupds and len(https) != len(direct):
        raise ConfigError(
            "the parallel nsq source plans batches from nsqd's /stats: give "
            "lookupd_http_addresses, or nsqd_http_addresses (one per nsqd_tcp_addresses "
            f"entry; got {len(https)} for {len(direct)})"
        )
    per_batch = _int(
        "max_messages_per_batch", mine.get("max_messages_per_batch"), 1_000_000, 1, 10**8
    )
    chunk = _int("chunk_size", mine.get("chunk_size"), 1000, 1, 1_000_000)
    # nsqd's --max-rdy-count default: a chunk is staged while the next one arrives.
    config_opts.setdefault("max_in_flight", str(max(2500, chunk)))
    config_opts.setdefault("max_attempts", "0")
    config = _config(config_opts)
    if config.max_in_flight < chunk:
        raise ConfigError(
            f"option chunk_size ({chunk}) must be at most max_in_flight ({config.max_in_flight})"
        )
    return source(
        max_messages_per_batch=per_batch,
        commit_flush_after=0.0,
        drain_idle_timeout=_seconds(
            "drain_idle_timeout", mine.get("drain_idle_timeout"), 0.5, 0.05, 3600.0
        ),
        config=config,
        parallelism=parallelism,
        staging_location=staging,
        nsqd_http_addresses=https,
        partition_timeout=_seconds(
            "partition_timeout", mine.get("partition_timeout"), 60.0, 1.0, 86400.0
        ),
        chunk_size=chunk,
    )


def _config(options: Mapping[str, str]) -> Config:
    try:
        return Config.from_mapping(options)
    except ConfigError as exc:
        raise ConfigError(f"nsq data source option: {exc}") from None
