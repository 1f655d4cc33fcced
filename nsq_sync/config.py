"""One frozen, validated :class:`Config` for consumers, producers and connections.

Option names are go-nsq's, in snake_case; durations are float seconds (timedeltas and strings
such as ``"250ms"`` are converted). Every check raises :class:`~nsq_sync.errors.ConfigError`
naming the option. :func:`parse_duration`, :func:`to_seconds` and :data:`Duration`
(:mod:`nsq_sync.durations`) and :func:`address_list` (:mod:`nsq_sync.addresses`) are
importable from here as well. A Config is immutable, so objects share it safely.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsq_sync._version import __version__, install_hint
from nsq_sync.addresses import address_list
from nsq_sync.durations import Duration, parse_duration, to_seconds
from nsq_sync.errors import ConfigError
from nsq_sync.protocol.constants import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MSG_SIZE,
)

__all__ = [
    "Config",
    "Duration",
    "address_list",
    "parse_duration",
    "positive_int",
    "to_seconds",
]

_TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")


def positive_int(name: str, value: object) -> int | None:
    """None, or ``value`` when it is an int >= 1 (not a bool): the check of every count a public
    call takes (``max_messages``, ``batch_size``...). Else ConfigError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    return value


_BACKOFF_STRATEGIES = ("exponential", "full_jitter")


def _opt(
    default: Any, kind: str, lo: float | None = None, hi: float | None = None, **kw: Any
) -> Any:
    # doc= (what the option does) and choices= are read by the docs' configuration reference
    # (docs/_ext/config_options.py), which is generated from this metadata.
    meta = {
        "kind": kind,
        "min": lo,
        "max": hi,
        "doc": kw.pop("doc"),
        "choices": kw.pop("choices", None),
    }
    if "default_factory" in kw:
        return field(default_factory=kw.pop("default_factory"), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True)
class Config:
    """Every consumer, producer and connection option, validated at construction.

    Thread-safe (immutable). Use :meth:`replace` to derive a changed copy.

    Raises:
        ConfigError: an option has the wrong type, is out of range, or contradicts another.
    """

    # --- connection
    dial_timeout: float = _opt(
        1.0, "duration", 0.01, 300.0, doc="Time allowed to open the TCP connection to an nsqd."
    )
    read_timeout: float = _opt(
        60.0,
        "duration",
        0.1,
        300.0,
        doc="A connection that receives nothing (not even a heartbeat) for this long is closed; must exceed heartbeat_interval.",
    )
    write_timeout: float = _opt(
        1.0, "duration", 0.01, 300.0, doc="Time allowed for one write to an nsqd socket."
    )
    heartbeat_interval: float = _opt(
        30.0,
        "duration",
        1.0,
        300.0,
        doc="Interval at which nsqd sends heartbeats (sent in IDENTIFY); the reader answers each with NOP.",
    )
    client_id: str | None = _opt(
        None, "str?", doc="Client identifier sent in IDENTIFY (nsqd's default: the short hostname)."
    )
    hostname: str | None = _opt(
        None,
        "str?",
        doc="Hostname sent in IDENTIFY (default: this host's name, looked up at connect time).",
    )
    user_agent: str = _opt(
        f"nsq_sync/{__version__}",
        "str",
        doc="User agent sent in IDENTIFY, shown by nsqadmin and /stats.",
    )
    output_buffer_size: int | None = _opt(
        16384,
        "int?",
        64,
        64 * 1024 * 1024,
        doc="Bytes nsqd buffers before writing to this client (IDENTIFY); None: no buffer, nsqd writes each message at once (IDENTIFY's -1: the lowest latency, a system call per message). 64 is the smallest buffer.",
    )
    output_buffer_timeout: float | None = _opt(
        0.25,
        "duration?",
        0.001,
        300.0,
        doc="Longest time nsqd holds buffered data before writing it (IDENTIFY); None disables nsqd's output buffering timeout.",
    )
    sample_rate: int = _opt(
        0,
        "int",
        0,
        99,
        doc="Percentage of the channel's messages nsqd sends to this client (0 = all).",
    )
    msg_timeout: float | None = _opt(
        None,
        "duration?",
        1.0,
        86400.0,
        doc="Per-connection message timeout asked of nsqd (IDENTIFY); None keeps nsqd's --msg-timeout.",
    )
    max_frame_size: int = _opt(
        DEFAULT_MAX_FRAME_SIZE,
        "int",
        1024,
        2**31 - 1,
        doc="Largest frame accepted from nsqd; a bigger one closes the connection with FrameTooLarge.",
    )
    # --- TLS
    tls_v1: bool = _opt(
        False, "bool", doc="Negotiate TLS with nsqd (IDENTIFY tls_v1); certificates are verified."
    )
    tls_root_ca_file: str | None = _opt(
        None, "str?", doc="CA bundle (PEM) used to verify nsqd's certificate."
    )
    tls_cert: str | None = _opt(
        None,
        "str?",
        doc="Client certificate (PEM) for nsqd's --tls-client-auth-policy; needs tls_key.",
    )
    tls_key: str | None = _opt(None, "str?", doc="Private key (PEM) of tls_cert.")
    tls_insecure_skip_verify: bool = _opt(
        False, "bool", doc="Skip certificate and hostname verification (testing only)."
    )
    tls_min_version: str = _opt(
        "TLSv1.2", "str", choices=_TLS_VERSIONS, doc="Lowest TLS version accepted."
    )
    tls_server_name: str | None = _opt(
        None,
        "str?",
        doc="Server name checked against nsqd's certificate (default: the host of its address).",
    )
    ssl_context: ssl.SSLContext | None = _opt(
        None,
        "ssl",
        compare=False,
        doc="A ready ssl.SSLContext used instead of the tls_* options (enables TLS).",
    )
    # --- compression
    snappy: bool = _opt(
        False,
        "bool",
        doc="Snappy-compress the connection (needs the snappy extra); not together with deflate.",
    )
    deflate: bool = _opt(
        False, "bool", doc="Deflate-compress the connection (zlib); not together with snappy."
    )
    deflate_level: int = _opt(6, "int", 1, 9, doc="Deflate compression level.")
    # --- auth
    auth_secret: str | None = _opt(
        None,
        "str?",
        repr=False,
        doc="Secret sent in AUTH when nsqd requires authentication (never shown in repr).",
    )
    # --- where (optional: Consumer and Producer also take them as arguments)
    nsqd_tcp_addresses: tuple[str, ...] = _opt(
        (),
        "addresses",
        doc="nsqd TCP addresses (host:port) to connect to directly; a list or one comma-separated string.",
    )
    lookupd_http_addresses: tuple[str, ...] = _opt(
        (),
        "addresses",
        doc="nsqlookupd HTTP addresses a consumer polls to discover nsqds; a list or one comma-separated string.",
    )
    # --- consumer
    max_in_flight: int = _opt(
        1,
        "int",
        0,
        2**31 - 1,
        doc="Most messages a consumer holds at once over all its connections (0 starts paused).",
    )
    max_attempts: int = _opt(
        5,
        "int",
        0,
        65535,
        doc="Deliveries after which a message is given up (giving_up handler, then FIN); 0 never gives up.",
    )
    lookupd_poll_interval: float = _opt(
        60.0,
        "duration",
        0.01,
        3600.0,
        doc="Interval between two polls of every nsqlookupd (sooner while it lists no nsqd for the topic: 1 s, doubling up to this).",
    )
    lookupd_poll_jitter: float = _opt(
        0.3,
        "float",
        0.0,
        1.0,
        doc="Random fraction of lookupd_poll_interval added to every poll, so consumers do not poll in step.",
    )
    lookupd_http_timeout: float = _opt(
        5.0, "duration", 0.01, 300.0, doc="Timeout of one nsqlookupd HTTP request."
    )
    default_requeue_delay: float = _opt(
        90.0,
        "duration",
        0.0,
        3600.0,
        doc="Requeue delay after a handler raises, multiplied by the attempt number and capped at max_requeue_delay.",
    )
    max_requeue_delay: float = _opt(900.0, "duration", 0.0, 86400.0, doc="Longest requeue delay.")
    backoff_strategy: str = _opt(
        "exponential",
        "str",
        choices=_BACKOFF_STRATEGIES,
        doc="How the consumer's backoff time grows with consecutive failures.",
    )
    max_backoff_duration: float = _opt(
        120.0,
        "duration",
        0.0,
        3600.0,
        doc="Longest backoff after handler failures (0 disables backoff).",
    )
    backoff_multiplier: float = _opt(
        1.0,
        "duration",
        0.0,
        3600.0,
        doc="Unit of the backoff time (the first step of the strategy); 0 disables backoff.",
    )
    low_rdy_idle_timeout: float = _opt(
        10.0,
        "duration",
        0.1,
        300.0,
        doc="When max_in_flight < connections (or a backoff probe is out): how long after an nsqd was found empty it is tried again (the slow probe of an idle consumer); an nsqd that sends nothing gives its credit on at once, see docs/consumer.md.",
    )
    rdy_redistribute_interval: float = _opt(
        5.0,
        "duration",
        0.001,
        300.0,
        doc="When max_in_flight < connections: the longest a busy connection keeps its credit while another nsqd may have messages.",
    )
    # --- producer
    max_msg_size: int | None = _opt(
        DEFAULT_MAX_MSG_SIZE,
        "int?",
        1,
        2**31 - 1,
        doc="Largest body a producer sends in PUB/DPUB (nsqd's --max-msg-size); bigger raises before sending. None: no check.",
    )
    max_body_size: int | None = _opt(
        DEFAULT_MAX_BODY_SIZE,
        "int?",
        1,
        2**31 - 1,
        doc="Largest MPUB payload (nsqd's --max-body-size); bigger raises before sending. None: no check.",
    )
    max_defer: float = _opt(
        3600.0,
        "duration",
        0.0,
        86400.0 * 365,
        doc="Largest deferred_publish delay (nsqd's --max-req-timeout).",
    )
    publish_timeout: float = _opt(
        10.0,
        "duration",
        0.01,
        3600.0,
        doc="Default timeout of one publish: connecting, the handshake and the wait for nsqd's OK.",
    )
    reconnect_backoff_max: float = _opt(
        30.0,
        "duration",
        0.0,
        3600.0,
        doc="Longest wait between two attempts to reconnect to an nsqd.",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            coerced = _check_field(f, value)
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)
        self._check_cross_fields()

    @classmethod
    def check_option(cls, name: str, value: Any) -> Any:
        """Validate one option on its own (type and range; not the rules that relate options,
        which construction checks) and return it converted (``"250ms"`` -> 0.25).

        Raises:
            ConfigError: an unknown name, or a value of the wrong type or out of range.
        """
        f = _FIELDS.get(name)
        if f is None:
            raise ConfigError(f"unknown option: {name}")
        return _check_field(f, value)

    def _check_cross_fields(self) -> None:
        if self.heartbeat_interval >= self.read_timeout:
            raise ConfigError(
                f"heartbeat_interval ({self.heartbeat_interval}) must be less than "
                f"read_timeout ({self.read_timeout}), or every idle connection would time out"
            )
        if self.snappy and self.deflate:
            raise ConfigError("snappy and deflate cannot both be enabled")
        if self.snappy and importlib.util.find_spec("snappy") is None:
            raise ConfigError(
                "snappy=True needs python-snappy, which is not installed: " + install_hint("snappy")
            )
        if self.deflate and importlib.util.find_spec("zlib") is None:
            raise ConfigError("deflate=True needs the zlib module, which this Python lacks")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together")
        if self.tls_min_version not in _TLS_VERSIONS:
            raise ConfigError(
                f"tls_min_version must be one of {_TLS_VERSIONS}, got {self.tls_min_version!r}"
            )
        if self.backoff_strategy not in _BACKOFF_STRATEGIES:
            raise ConfigError(
                f"backoff_strategy must be one of {_BACKOFF_STRATEGIES}, got {self.backoff_strategy!r}"
            )
        if self.default_requeue_delay > self.max_requeue_delay:
            raise ConfigError(
                f"default_requeue_delay ({self.default_requeue_delay}) exceeds "
                f"max_requeue_delay ({self.max_requeue_delay})"
            )
        if self.ssl_context is not None and not isinstance(self.ssl_context, ssl.SSLContext):
            raise ConfigError(
                f"ssl_context must be an ssl.SSLContext, got {type(self.ssl_context).__name__}"
            )

    @property
    def tls_enabled(self) -> bool:
        """True when TLS is requested (``tls_v1`` or an explicit ``ssl_context``)."""
        return self.tls_v1 or self.ssl_context is not None

    def replace(self, **changes: Any) -> Config:
        """Return a validated copy with ``changes`` applied.

        Raises:
            ConfigError: an unknown option name, or an invalid value.
        """
        if not changes:
            return self
        unknown = sorted(set(changes) - _FIELD_NAMES)
        if unknown:
            raise ConfigError(f"unknown option(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> Config:
        """Build a Config from a dict such as Django settings or an INI section.

        Keys may use ``-`` or ``_``; values may be strings (``"true"``, ``"250ms"``, ``"200"``).
        ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` take a list or a comma-separated
        string (``NSQ_SYNC_LOOKUPD_HTTP_ADDRESSES=http://h1:4161,http://h2:4161``).

        Raises:
            ConfigError: an unknown key or an invalid value.
        """
        normalised = {str(k).replace("-", "_").lower(): v for k, v in options.items()}
        return cls().replace(**normalised)

    @classmethod
    def from_env(
        cls, prefix: str = "NSQ_SYNC_", environ: Mapping[str, str] | None = None
    ) -> Config:
        """Build a Config from environment variables such as ``NSQ_SYNC_MAX_IN_FLIGHT=200``.

        Variables with the prefix that name no option raise, so typos do not pass silently.

        Raises:
            ConfigError: an unknown option or an invalid value.
        """
        env = os.environ if environ is None else environ
        picked = {k[len(prefix) :]: v for k, v in env.items() if k.startswith(prefix)}
        return cls.from_mapping(picked)


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_FIELD_NAMES = frozenset(_FIELDS)


def _check_field(f: dataclasses.Field[Any], value: Any) -> Any:
    coerced = _coerce(f.name, f.metadata["kind"], value)
    lo, hi = f.metadata["min"], f.metadata["max"]
    numeric = isinstance(coerced, (int, float)) and not isinstance(coerced, bool)
    if numeric and (lo is not None and coerced < lo or hi is not None and coerced > hi):
        raise ConfigError(f"{f.name}={value!r} is out of range [{lo}, {hi}]")
    return coerced


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, kind: str, value: Any) -> Any:
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if value is None:
        if optional or base == "ssl":
            return None
        raise ConfigError(f"{name} must not be None")
    if optional and isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
        return None
    if base == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name} must be a bool, got {value!r}")
    if base == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an int, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name} must be an int, got {value!r}")
    if base in ("float", "duration"):
        result = parse_duration(value, name) if base == "duration" else _to_float(name, value)
        if not math.isfinite(result):
            raise ConfigError(f"{name} must be finite, got {value!r}")
        return result
    if base == "addresses":  # an empty setting (NSQ_SYNC_NSQD_TCP_ADDRESSES=) means none
        return () if isinstance(value, str) and not value.strip() else address_list(name, value)
    if base == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a str, got {type(value).__name__}")
        return value
    return value


def _to_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
