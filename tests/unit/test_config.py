"""Config: defaults, duration strings, mapping/env loading, validation messages, immutability."""

from __future__ import annotations

import dataclasses
import datetime
import ssl

import pytest

from nsq_sync import __version__
from nsq_sync.config import Config, parse_duration, to_seconds
from nsq_sync.errors import ConfigError

# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    cfg = Config()
    assert cfg.max_in_flight == 1
    assert cfg.read_timeout == 60.0
    assert cfg.heartbeat_interval == 30.0
    assert cfg.dial_timeout == 1.0
    assert cfg.write_timeout == 1.0
    assert cfg.output_buffer_size == 16384
    assert cfg.output_buffer_timeout == 0.25
    assert cfg.msg_timeout is None
    assert cfg.sample_rate == 0
    assert cfg.max_attempts == 5
    assert cfg.snappy is False
    assert cfg.deflate is False
    assert cfg.deflate_level == 6
    assert cfg.tls_v1 is False
    assert cfg.tls_enabled is False
    assert cfg.tls_min_version == "TLSv1.2"
    assert cfg.auth_secret is None
    assert cfg.backoff_strategy == "exponential"
    assert cfg.lookupd_poll_interval == 60.0
    assert cfg.lookupd_poll_jitter == 0.3
    assert cfg.default_requeue_delay == 90.0
    assert cfg.max_requeue_delay == 900.0
    assert cfg.user_agent == f"nsq_sync/{__version__}"


def test_durations_are_float_seconds() -> None:
    cfg = Config()
    for f in dataclasses.fields(cfg):
        if f.metadata["kind"].startswith("duration"):
            value = getattr(cfg, f.name)
            assert value is None or type(value) is float, f.name


def test_equal_configs_compare_equal() -> None:
    assert Config() == Config()
    assert Config(max_in_flight=5) != Config()


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("0.5m", 30.0),
        (".5s", 0.5),
        ("90", 90.0),
        (" 2s ", 2.0),
        ("0", 0.0),
        (5, 5.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    result = parse_duration(text)
    assert result == pytest.approx(seconds)
    assert type(result) is float


@pytest.mark.parametrize("value", ["abc", "5 minutes", "1d", "ms", "", "1.2.3s", True, None, [1]])
def test_parse_duration_rejects_garbage_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigError, match="read_timeout") as info:
        parse_duration(value, "read_timeout")
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("option", "text", "seconds"),
    [
        ("read_timeout", "2m", 120.0),
        ("heartbeat_interval", "10s", 10.0),
        ("output_buffer_timeout", "250ms", 0.25),
        ("msg_timeout", "1h", 3600.0),
        ("lookupd_poll_interval", "15", 15.0),
        ("dial_timeout", 2, 2.0),
    ],
)
def test_duration_options_accept_strings_and_numbers(
    option: str, text: object, seconds: float
) -> None:
    value = getattr(Config(**{option: text}), option)
    assert value == pytest.approx(seconds)
    assert type(value) is float


# --------------------------------------------------------------------------- from_mapping


def test_from_mapping_with_dashes_and_string_values() -> None:
    cfg = Config.from_mapping(
        {
            "max-in-flight": "200",
            "read-timeout": "90s",
            "heartbeat_interval": "10s",
            "output-buffer-timeout": "100ms",
            "snappy": "true",
            "tls-v1": "yes",
            "tls-insecure-skip-verify": "0",
            "client-id": "worker-1",
            "msg-timeout": "none",
            "output_buffer_size": "null",
            "lookupd-poll-jitter": "0.5",
            "Sample-Rate": "10",
        }
    )
    assert cfg.max_in_flight == 200
    assert cfg.read_timeout == 90.0
    assert cfg.heartbeat_interval == 10.0
    assert cfg.output_buffer_timeout == pytest.approx(0.1)
    assert cfg.snappy is True
    assert cfg.tls_v1 is True
    assert cfg.tls_enabled is True
    assert cfg.tls_insecure_skip_verify is False
    assert cfg.client_id == "worker-1"
    assert cfg.msg_timeout is None
    assert cfg.output_buffer_size is None
    assert cfg.lookupd_poll_jitter == 0.5
    assert cfg.sample_rate == 10


def test_from_mapping_of_nothing_is_the_default() -> None:
    assert Config.from_mapping({}) == Config()


def test_from_mapping_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(ConfigError, match="unknown option") as info:
        Config.from_mapping({"max-in-flite": 10, "bogus": 1, "read_timeout": "5s"})
    message = str(info.value)
    assert "max_in_flite" in message
    assert "bogus" in message
    assert "read_timeout" not in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_in_flight", "lots"),
        ("max_in_flight", "1.5"),
        ("snappy", "maybe"),
        ("read_timeout", "soon"),
        ("lookupd_poll_jitter", "half"),
    ],
)
def test_from_mapping_rejects_bad_strings_naming_the_option(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        Config.from_mapping({key: value})
    assert value in str(info.value)


# --------------------------------------------------------------------------- from_env


def test_from_env_with_a_given_environ() -> None:
    environ = {
        "NSQ_SYNC_MAX_IN_FLIGHT": "50",
        "NSQ_SYNC_DEFLATE": "1",
        "NSQ_SYNC_DEFLATE_LEVEL": "3",
        "NSQ_SYNC_LOOKUPD_POLL_INTERVAL": "30s",
        "NSQ_SYNC_AUTH_SECRET": "s3cret",
        "HOME": "/root",
        "NSQD_TCP_ADDRESS": "127.0.0.1:4150",  # another prefix: ignored
    }
    cfg = Config.from_env(environ=environ)
    assert cfg.max_in_flight == 50
    assert cfg.deflate is True
    assert cfg.deflate_level == 3
    assert cfg.lookupd_poll_interval == 30.0
    assert cfg.auth_secret == "s3cret"


def test_from_env_with_a_custom_prefix() -> None:
    environ = {"MYAPP_NSQ_MAX_IN_FLIGHT": "7", "NSQ_SYNC_MAX_IN_FLIGHT": "99"}
    assert Config.from_env(prefix="MYAPP_NSQ_", environ=environ).max_in_flight == 7


def test_from_env_with_no_variables_is_the_default() -> None:
    assert Config.from_env(environ={"PATH": "/usr/bin"}) == Config()


def test_from_env_rejects_unknown_variables_naming_them() -> None:
    with pytest.raises(ConfigError, match="max_inflight"):
        Config.from_env(environ={"NSQ_SYNC_MAX_INFLIGHT": "10"})


def test_from_env_reports_bad_values_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        Config.from_env(environ={"NSQ_SYNC_MAX_IN_FLIGHT": "-5"})


# --------------------------------------------------------------------------- ranges and types


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_in_flight", -1),
        ("sample_rate", 100),
        ("sample_rate", -1),
        ("deflate_level", 0),
        ("deflate_level", 10),
        ("lookupd_poll_jitter", 1.5),
        ("lookupd_poll_jitter", -0.1),
        ("heartbeat_interval", 0.5),
        ("heartbeat_interval", "250ms"),
        ("read_timeout", "10m"),
        ("dial_timeout", 0),
        ("output_buffer_size", 63),
        ("max_attempts", 65536),
        ("msg_timeout", "500ms"),
        ("max_frame_size", 2**31),
    ],
)
def test_range_errors_name_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{option}=.* is out of range"):
        Config(**{option: value})


def _bounded_options() -> list[tuple[str, float, float | None]]:
    found = []
    for f in dataclasses.fields(Config):
        lo, hi = f.metadata["min"], f.metadata["max"]
        if lo is not None:
            found.append((f.name, lo, hi))
    return found


@pytest.mark.parametrize(("option", "lo", "hi"), _bounded_options())
def test_every_bound_is_enforced(option: str, lo: float, hi: float | None) -> None:
    kind = next(f.metadata["kind"] for f in dataclasses.fields(Config) if f.name == option)
    step = 1 if kind.startswith("int") else 0.001
    with pytest.raises(ConfigError, match=option):
        Config(**{option: lo - step})
    if hi is not None:
        with pytest.raises(ConfigError, match=option):
            Config(**{option: hi + step})


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("max_in_flight", 1.5, "must be an int"),
        ("max_in_flight", True, "must be an int"),
        ("max_in_flight", None, "must not be None"),
        ("snappy", "maybe", "must be a bool"),
        ("snappy", 2, "must be a bool"),
        ("read_timeout", float("nan"), "must be finite"),
        ("read_timeout", float("inf"), "must be finite"),
        ("read_timeout", True, "expected seconds"),
        ("lookupd_poll_jitter", "x", "must be a number"),
        ("client_id", 5, "must be a str"),
        ("user_agent", None, "must not be None"),
    ],
)
def test_type_errors_name_the_option(option: str, value: object, problem: str) -> None:
    with pytest.raises(ConfigError, match=option) as info:
        Config(**{option: value})
    assert problem in str(info.value)


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        Config(max_in_flight=-1)


# --------------------------------------------------------------------------- cross-field rules


@pytest.mark.parametrize(("heartbeat", "read_timeout"), [(30, 30), (60, 59), ("1m", "30s")])
def test_heartbeat_must_be_shorter_than_read_timeout(
    heartbeat: object, read_timeout: object
) -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval") as info:
        Config(heartbeat_interval=heartbeat, read_timeout=read_timeout)
    assert "read_timeout" in str(info.value)


def test_heartbeat_just_below_read_timeout_is_fine() -> None:
    cfg = Config(heartbeat_interval=5, read_timeout=5.5)
    assert (cfg.heartbeat_interval, cfg.read_timeout) == (5.0, 5.5)


def test_snappy_and_deflate_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="snappy and deflate"):
        Config(snappy=True, deflate=True)
    assert Config(snappy=True).snappy is True
    assert Config(deflate=True).deflate is True


@pytest.mark.parametrize(
    "options", [{"tls_cert": "/etc/client.pem"}, {"tls_key": "/etc/client.key"}]
)
def test_tls_cert_and_key_come_together(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        Config(**options)


def test_tls_cert_and_key_pair_is_accepted() -> None:
    cfg = Config(tls_v1=True, tls_cert="/etc/client.pem", tls_key="/etc/client.key")
    assert (cfg.tls_cert, cfg.tls_key) == ("/etc/client.pem", "/etc/client.key")


@pytest.mark.parametrize("version", ["TLSv1.1", "TLSv1", "tls1.2", ""])
def test_bad_tls_version(version: str) -> None:
    with pytest.raises(ConfigError, match="tls_min_version") as info:
        Config(tls_min_version=version)
    assert repr(version) in str(info.value)


def test_tls_13_is_accepted() -> None:
    assert Config(tls_min_version="TLSv1.3").tls_min_version == "TLSv1.3"


@pytest.mark.parametrize("strategy", ["linear", "Exponential", ""])
def test_bad_backoff_strategy(strategy: str) -> None:
    with pytest.raises(ConfigError, match="backoff_strategy") as info:
        Config(backoff_strategy=strategy)
    assert repr(strategy) in str(info.value)


def test_full_jitter_strategy_is_accepted() -> None:
    assert Config(backoff_strategy="full_jitter").backoff_strategy == "full_jitter"


def test_default_requeue_delay_cannot_exceed_the_maximum() -> None:
    with pytest.raises(ConfigError, match="default_requeue_delay"):
        Config(default_requeue_delay=120, max_requeue_delay=60)


def test_ssl_context_must_be_an_ssl_context() -> None:
    with pytest.raises(ConfigError, match="ssl_context"):
        Config(ssl_context="yes please")  # type: ignore[arg-type]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cfg = Config(ssl_context=ctx)
    assert cfg.ssl_context is ctx
    assert cfg.tls_enabled is True


# --------------------------------------------------------------------------- immutability


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_in_flight = 5  # type: ignore[misc]
    assert cfg.max_in_flight == 1


def test_replace_returns_a_new_validated_object() -> None:
    cfg = Config()
    changed = cfg.replace(max_in_flight=10, read_timeout="2m")
    assert changed is not cfg
    assert changed.max_in_flight == 10
    assert changed.read_timeout == 120.0
    assert cfg.max_in_flight == 1
    assert cfg.read_timeout == 60.0


def test_replace_keeps_other_options() -> None:
    cfg = Config(client_id="a", max_in_flight=3)
    assert cfg.replace(max_in_flight=4).client_id == "a"


def test_replace_validates() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        Config().replace(max_in_flight=-1)
    with pytest.raises(ConfigError, match="snappy and deflate"):
        Config(snappy=True).replace(deflate=True)


def test_replace_rejects_unknown_options_naming_them() -> None:
    with pytest.raises(ConfigError, match="unknown option.*max_inflight"):
        Config().replace(max_inflight=10)


def test_replace_without_changes_is_equal() -> None:
    cfg = Config(max_in_flight=2)
    assert cfg.replace() == cfg


def test_auth_secret_is_not_in_repr() -> None:
    assert "s3cret" not in repr(Config(auth_secret="s3cret"))


# ----------------------------------------------------------------------------- delays, everywhere


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), "soon", True, b"1"])
def test_a_bad_delay_raises_config_error_everywhere_naming_it(delay: object) -> None:
    """One name (delay), one unit (seconds, timedelta or "250ms") and one exception for every
    delay a public method takes, raised before anything is sent (no server is running here)."""
    from nsq_sync import Message, NsqdHTTPClient, Producer
    from nsq_sync.protocol import commands

    calls = {
        "Producer.deferred_publish": lambda: Producer("127.0.0.1:1").deferred_publish(
            "t", b"x", delay=delay
        ),
        "NsqdHTTPClient.pub": lambda: NsqdHTTPClient("127.0.0.1:1").pub("t", b"x", delay=delay),
        "NsqdHTTPClient.dpub": lambda: NsqdHTTPClient("127.0.0.1:1").dpub("t", b"x", delay),
        "Message.requeue": lambda: Message(b"0" * 16, b"x", 0, 1).requeue(delay=delay),
    }
    if not isinstance(delay, str):  # the encoders take seconds only (public methods convert)
        calls["commands.dpub"] = lambda: commands.dpub("t", b"x", delay)  # type: ignore[arg-type]
    for where, call in calls.items():
        with pytest.raises(ConfigError, match="delay") as info:
            call()
        assert repr(delay) in str(info.value), where


def test_delays_take_seconds_timedeltas_and_duration_strings_alike() -> None:
    from nsq_sync.protocol import commands

    for delay in (1.5, datetime.timedelta(milliseconds=1500), "1500ms"):
        seconds = to_seconds(delay, "delay")
        assert commands.dpub("t", b"x", seconds).startswith(b"DPUB t 1500\n")


def test_producer_close_checks_its_timeout_like_every_other_duration() -> None:
    from nsq_sync import Producer

    producer = Producer("127.0.0.1:1")
    with pytest.raises(ConfigError, match="timeout must be seconds >= 0, got -1"):
        producer.close(timeout=-1)
    assert not producer.closed  # refused before anything was closed
    producer.close(timeout=datetime.timedelta(milliseconds=10))
    assert producer.closed
