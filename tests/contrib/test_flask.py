"""nsq_sync.contrib.flask with Flask's test client and the example app, against a real nsqd:
config keys, per-process producer, and ``flask nsq consume`` as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, current_app
from support.nsq import free_closed_port, message_count
from support.web import (
    FLASK_EXAMPLE,
    all_answered,
    assert_left_clean,
    channel_stats,
    finish,
    in_forked_child,
    sigterm_when,
    start_command,
)

from nsq_sync import Producer, dead_letter
from nsq_sync.contrib.flask import NSQ
from nsq_sync.errors import ConfigError
from nsq_sync.testing.process import NsqdProcess

pytestmark = pytest.mark.integration


def _app(**config: Any) -> Flask:
    app = Flask("test_app")
    app.config.update(config)
    return app


@pytest.fixture
def app(nsqd: NsqdProcess, nsq_topic: str) -> Any:
    app = _app(NSQ_NSQD_TCP_ADDRESSES=[nsqd.tcp_address], NSQ_MAX_IN_FLIGHT="20", TOPIC=nsq_topic)
    nsq = NSQ(app)

    @app.route("/publish")
    def publish() -> str:
        nsq.publish(current_app.config["TOPIC"], b"from a view")
        return "ok"

    app.extensions["test_nsq"] = nsq
    yield app
    nsq.close()


def test_a_view_publishes(app: Flask, nsqd: NsqdProcess, nsq_topic: str) -> None:
    client = app.test_client()
    for _ in range(3):
        assert client.get("/publish").status_code == 200
    assert message_count(nsqd.http_address, nsq_topic) == 3
    nsq: NSQ = app.extensions["test_nsq"]
    assert nsq.producer.config.max_in_flight == 20  # NSQ_<OPTION> reached the Config


def test_init_app_in_a_factory_binds_through_the_app_context(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    nsq = NSQ()
    app = _app(NSQ_NSQD_TCP_ADDRESSES=nsqd.tcp_address)
    nsq.init_app(app)
    with pytest.raises(RuntimeError):
        nsq.publish(nsq_topic, b"no app context")
    with app.app_context():
        nsq.publish(nsq_topic, b"in an app context")
        producer = nsq.producer
        assert nsq.producer is producer
        nsq.close()
    assert producer.closed
    assert message_count(nsqd.http_address, nsq_topic) == 1


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"NSQ_NSQD_TCP_ADDRESSES": ["h:1"], "NSQ_MAX_IN_FLITE": 5}, "NSQ_MAX_IN_FLITE"),
        ({"NSQ_NSQD_TCP_ADDRESSES": ["h:1"], "NSQ_MAX_IN_FLIGHT": "lots"}, "NSQ_MAX_IN_FLIGHT"),
        ({"NSQ_NSQD_TCP_ADDRESSES": ["h"]}, "NSQ_NSQD_TCP_ADDRESSES"),
        ({"NSQ_LOOKUPD_HTTP_ADDRESSES": "ftp://h:1"}, "NSQ_LOOKUPD_HTTP_ADDRESSES"),
        ({"NSQ_MAX_IN_FLIGHT": 5}, "NSQ_NSQD_TCP_ADDRESSES"),
        ({"NSQ_NSQD_TCP_ADDRESSES": ["h:1"], "NSQ_METRICS": "statsd"}, "NSQ_METRICS"),
        ({"NSQ_NSQD_TCP_ADDRESSES": ["h:1"], "NSQ_METRICS": 1}, "NSQ_METRICS"),
    ],
)
def test_init_app_raises_naming_the_bad_key(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        NSQ(_app(**config))


def test_nsq_metrics_enables_prometheus(nsqd: NsqdProcess, nsq_topic: str) -> None:
    from prometheus_client import REGISTRY

    from nsq_sync import metrics

    nsq = NSQ(_app(NSQ_NSQD_TCP_ADDRESSES=[nsqd.tcp_address], NSQ_METRICS="prometheus"))
    try:
        nsq.publish(nsq_topic, b"counted")
    finally:
        metrics.disable()
        nsq.close()
    labels = {"topic": nsq_topic, "outcome": "ok"}
    assert REGISTRY.get_sample_value("nsq_sync_published_messages_total", labels) == 1


def test_unknown_key_suggests_the_option() -> None:
    with pytest.raises(ConfigError, match="did you mean NSQ_MAX_IN_FLIGHT"):
        NSQ(_app(NSQ_NSQD_TCP_ADDRESSES="h:1", NSQ_MAX_IN_FLITE=5))


def test_producer_is_one_per_process(app: Flask, nsqd: NsqdProcess, nsq_topic: str) -> None:
    nsq: NSQ = app.extensions["test_nsq"]
    producer = nsq.producer
    assert nsq.producer is producer
    nsq.publish(nsq_topic, b"parent")

    def child() -> dict[str, Any]:
        new = nsq.producer
        nsq.publish(nsq_topic, b"child")
        return {"new": new is not producer, "same": nsq.producer is new}

    assert in_forked_child(child) == {"new": True, "same": True}
    assert nsq.producer is producer
    nsq.publish(nsq_topic, b"parent again")
    assert message_count(nsqd.http_address, nsq_topic) == 3


# -------------------------------------------------------------------------- flask nsq consume


def _example_env(nsqd: NsqdProcess, archive: Path, topic: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NSQD_TCP_ADDRESSES=nsqd.tcp_address, ARCHIVE_FILE=str(archive), EVENTS_TOPIC=topic)
    return env


def _flask_consume(env: dict[str, str], topic: str, *options: str) -> subprocess.Popen[str]:
    args = ["-m", "flask", "--app", "app", "nsq", "consume", topic, "archive", *options]
    return start_command(args, FLASK_EXAMPLE, env)


def _channel(nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    return channel_stats(nsqd.http_address, topic, "archive")


def _archived(path: Path) -> list[bytes]:
    return sorted(path.read_bytes().splitlines()) if path.exists() else []


def test_flask_consume_runs_handlers_in_an_app_context_and_exits_0_on_sigterm(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    archive = tmp_path / "archive.log"
    bodies = [b"event %d" % i for i in range(5)]
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, bodies)
    proc = _flask_consume(
        _example_env(nsqd, archive, nsq_topic),
        nsq_topic,
        "--handler",
        "app:archive",
        "--concurrency",
        "2",
    )

    def done() -> bool:
        return _archived(archive) == bodies and all_answered(_channel(nsqd, nsq_topic))

    # the handler finds ARCHIVE_FILE through current_app: it ran in an app context
    code, err = sigterm_when(proc, done, "5 archived bodies, 5 FINs at nsqd")
    assert code == 0, err
    assert_left_clean(lambda: _channel(nsqd, nsq_topic))


def test_flask_consume_bad_handler_exits_2(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """The error names the path as given and its real cause (it was werkzeug's message, cut
    after "Possible reasons are:", naming app.nope)."""
    env = _example_env(nsqd, tmp_path / "a.log", nsq_topic)
    code, err = finish(_flask_consume(env, nsq_topic, "--handler", "app:nope"))
    assert code == 2
    assert "--handler" in err and "app:nope: app has no attribute 'nope'" in err, err
    code, err = finish(_flask_consume(env, nsq_topic, "--handler", "no_such_module:f"))
    assert code == 2
    assert "No module named 'no_such_module'" in err, err


def test_flask_consume_max_messages_exits_0(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    archive = tmp_path / "archive.log"
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, [b"a", b"b", b"c"])
    env = _example_env(nsqd, archive, nsq_topic)
    code, err = finish(
        _flask_consume(env, nsq_topic, "--handler", "app:archive", "--max-messages", "2")
    )
    assert code == 0, err
    assert len(_archived(archive)) == 2


def test_flask_consume_idle_timeout_exits_1_when_a_handler_failed(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    archive = tmp_path / "archive.log"
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, [b"ok", b"fail"])
    env = _example_env(nsqd, archive, nsq_topic)
    began = time.monotonic()
    code, err = finish(
        _flask_consume(
            env, nsq_topic, "--handler", "app:archive", "--idle-timeout", "1", "--max-messages", "2"
        )
    )
    assert code == 1, err
    assert time.monotonic() - began < 60, err
    assert _archived(archive) == [b"ok"]
    # the app configures no logging: the command shows the failure, with its traceback, on
    # stderr (it printed nothing: the library adds only a NullHandler)
    assert "handler failed on message" in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "ValueError: refusing to archive 'fail'" in err, err
    assert "consumer stopped (max_messages): 2 handled, 1 failed" in err, err


def test_flask_consume_exits_1_when_its_nsqd_cannot_be_reached(
    tmp_path: Path, nsq_topic: str
) -> None:
    """Issue 39: the command waited for ever; now the idle timeout ends it "unreachable"."""
    address = f"127.0.0.1:{free_closed_port()}"
    env = dict(os.environ)
    env.update(
        NSQD_TCP_ADDRESSES=address, ARCHIVE_FILE=str(tmp_path / "a.log"), EVENTS_TOPIC=nsq_topic
    )
    code, err = finish(
        _flask_consume(env, nsq_topic, "--handler", "app:archive", "--idle-timeout", "1"),
        timeout=30.0,
    )
    assert code == 1, err
    assert f"cannot connect to nsqd {address}" in err, err
    assert "consumer stopped (unreachable)" in err, err


def test_flask_consume_batch_size_hands_batches_to_the_handler_in_an_app_context(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    archive = tmp_path / "archive.log"
    bodies = [b"event %d" % i for i in range(4)]
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, bodies)
    env = _example_env(nsqd, archive, nsq_topic)
    # a long --batch-timeout: batches close because they are full, not because time passed
    proc = _flask_consume(
        env,
        nsq_topic,
        "--handler",
        "app:archive_batch",
        "--batch-size",
        "2",
        "--batch-timeout",
        "30",
    )

    def done() -> bool:
        return len(_archived(archive)) == 2 and all_answered(_channel(nsqd, nsq_topic))

    # archive_batch finds ARCHIVE_FILE through current_app: it ran in an app context
    code, err = sigterm_when(proc, done, "2 archived batches, 4 FINs at nsqd")
    assert code == 0, err
    batches = [line.split(b"\t") for line in _archived(archive)]
    assert [len(batch) for batch in batches] == [2, 2]
    assert sorted(body for batch in batches for body in batch) == bodies
    assert_left_clean(lambda: _channel(nsqd, nsq_topic))


def test_flask_consume_batch_size_with_concurrency_is_a_usage_error(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    env = _example_env(nsqd, tmp_path / "a.log", nsq_topic)
    code, err = finish(
        _flask_consume(
            env,
            nsq_topic,
            "--handler",
            "app:archive_batch",
            "--batch-size",
            "2",
            "--concurrency",
            "2",
        )
    )
    assert code == 2
    assert "no --concurrency" in err


def test_flask_consume_dead_letter_topic_keeps_the_poison(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    archive = tmp_path / "archive.log"
    dead = f"{nsq_topic[-40:]}.dead"
    poison = b"poison \x00\xff\n"
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, [b"ok", poison])
    env = _example_env(nsqd, archive, nsq_topic)
    options = ("--handler", "app:archive", "--dead-letter-topic", dead, "--idle-timeout", "1")
    code, err = finish(_flask_consume(env, nsq_topic, *options))
    assert code == 1, err  # a message was given up
    assert _archived(archive) == [b"ok"]
    channel = _channel(nsqd, nsq_topic)
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0)
    listing = dead_letter.list_messages(dead, nsqd_tcp_addresses=nsqd.tcp_address, idle_timeout=1.0)
    [record] = [entry.record for entry in listing.messages]
    assert record is not None and record.body == poison
    assert (record.topic, record.channel) == (nsq_topic, "archive")
    assert (record.error_type, record.error_message) == (
        "nsq_sync.errors.DeadLetter",
        "poison: never archived",
    )
