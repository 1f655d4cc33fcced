"""nsq_sync.contrib.django in the example shop project, with Django's own test machinery, a real
sqlite database and a real nsqd: publish on commit, get_producer() per process, the system
checks, and the nsq_consume management command as a real subprocess."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.nsq import free_closed_port, message_count, wait_for
from support.web import (
    EXAMPLE,
    all_answered,
    assert_left_clean,
    channel_stats,
    example_env,
    finish,
    in_forked_child,
    migrated_shop,
    setup_django,
    sigterm_when,
    start_command,
)

from nsq_sync import Producer, dead_letter
from nsq_sync.errors import InvalidBody, InvalidName
from nsq_sync.testing.process import NsqdProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _django(tmp_path_factory: pytest.TempPathFactory) -> None:
    setup_django(tmp_path_factory.mktemp("django") / "test.sqlite3")


@pytest.fixture(autouse=True)
def _nsq_setting(request: pytest.FixtureRequest, nsqd: NsqdProcess, nsq_topic: str) -> Any:
    """Each test publishes to the shared nsqd, on its own topic."""
    from django.test import override_settings

    with override_settings(NSQ={"nsqd_tcp_addresses": [nsqd.tcp_address]}, ORDERS_TOPIC=nsq_topic):
        if request.cls is not None:
            request.cls.nsqd = nsqd
            request.cls.topic = nsq_topic
        yield


def _django_test_case() -> Any:
    from django.test import TransactionTestCase

    return TransactionTestCase


class TestPublishOnCommit(_django_test_case()):  # type: ignore[misc]
    """TransactionTestCase: transactions really commit and roll back."""

    nsqd: NsqdProcess
    topic: str

    def test_sent_only_after_the_transaction_commits(self) -> None:
        from django.db import transaction
        from shop.models import Order

        from nsq_sync.contrib.django import publish

        with transaction.atomic():
            Order.objects.create(item="book")
            publish(self.topic, b"order 1", on_commit=True)
            # the producer's own ping: anything sent would be at nsqd before this returns
            publish(self.topic + "_probe", b"probe")
            assert message_count(self.nsqd.http_address, self.topic) == 0
        wait_for(lambda: message_count(self.nsqd.http_address, self.topic) == 1, "the message")

    def test_never_sent_after_a_rollback(self) -> None:
        from django.db import transaction
        from shop.models import Order

        from nsq_sync.contrib.django import publish

        with pytest.raises(RuntimeError), transaction.atomic():
            Order.objects.create(item="book")
            publish(self.topic, b"rolled back", on_commit=True)
            raise RuntimeError("roll back")
        assert not Order.objects.exists()
        # A marker sent afterwards on the same connection: were the rolled-back message sent
        # (at the end of the atomic block, before the marker), nsqd would count 2.
        publish(self.topic, b"marker")
        wait_for(lambda: message_count(self.nsqd.http_address, self.topic) >= 1, "the marker")
        assert message_count(self.nsqd.http_address, self.topic) == 1

    def test_outside_a_transaction_it_is_sent_at_once(self) -> None:
        from nsq_sync.contrib.django import publish

        publish(self.topic, b"now", on_commit=True)
        assert message_count(self.nsqd.http_address, self.topic) == 1

    def test_bad_input_raises_in_the_caller_before_commit(self) -> None:
        from django.db import transaction

        from nsq_sync.contrib.django import publish

        with transaction.atomic():
            with pytest.raises(InvalidName):
                publish("no spaces allowed", b"x", on_commit=True)
            with pytest.raises(InvalidBody):
                publish(self.topic, b"", on_commit=True)
        assert message_count(self.nsqd.http_address, self.topic) == 0


class TestExampleView(_django_test_case()):  # type: ignore[misc]
    nsqd: NsqdProcess
    topic: str

    def test_view_saves_the_order_and_publishes_it(self) -> None:
        from shop.models import Order

        response = self.client.get("/orders", {"item": "lamp"})
        assert response.status_code == 200
        order_id = response.json()["order_id"]
        assert Order.objects.get(id=order_id).item == "lamp"
        assert message_count(self.nsqd.http_address, self.topic) == 1
        runtime = self.client.get("/runtime").json()["runtime"]
        assert runtime == ("gevent" if _patched() else "threads")


def _patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey and monkey.is_module_patched("socket"))


def test_get_producer_is_one_per_process(nsqd: NsqdProcess, nsq_topic: str) -> None:
    from nsq_sync.contrib.django import get_producer

    producer = get_producer()
    assert isinstance(producer, Producer)
    assert get_producer() is producer
    producer.publish(nsq_topic, b"parent")

    def child() -> dict[str, Any]:
        new = get_producer()
        new.publish(nsq_topic, b"child")
        return {"new": new is not producer, "same": get_producer() is new}

    assert in_forked_child(child) == {"new": True, "same": True}
    assert get_producer() is producer  # the parent's is untouched
    producer.publish(nsq_topic, b"parent again")
    assert message_count(nsqd.http_address, nsq_topic) == 3


# ------------------------------------------------------------------------------ system checks


@pytest.mark.parametrize(
    ("nsq", "error_id", "named"),
    [
        (
            {"nsqd_tcp_addresses": ["127.0.0.1:4150"], "max_in_flite": 5},
            "nsq_sync.E002",
            "max_in_flite",
        ),
        (
            {"nsqd_tcp_addresses": ["127.0.0.1:4150"], "max_in_flight": -1},
            "nsq_sync.E003",
            "max_in_flight",
        ),
        (
            {"nsqd_tcp_addresses": ["127.0.0.1:4150"], "dial_timeout": "soon"},
            "nsq_sync.E003",
            "dial_timeout",
        ),
        ({"nsqd_tcp_addresses": ["127.0.0.1"]}, "nsq_sync.E004", "nsqd_tcp_addresses"),
        ({"lookupd_http_addresses": ["ftp://h:1"]}, "nsq_sync.E004", "lookupd_http_addresses"),
        ({"max_in_flight": 5}, "nsq_sync.E005", "nsqd_tcp_addresses"),
        ({"nsqd_tcp_addresses": ["h:1"], "metrics": "statsd"}, "nsq_sync.E003", "metrics"),
        (
            {"nsqd_tcp_addresses": "h:1", "heartbeat_interval": 90},
            "nsq_sync.E006",
            "heartbeat_interval",
        ),
    ],
)
def test_system_checks_name_the_bad_key(nsq: dict[str, Any], error_id: str, named: str) -> None:
    from django.core import checks
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    with override_settings(NSQ=nsq):
        errors = [e for e in checks.run_checks() if e.id.startswith("nsq_sync.")]
        assert [e.id for e in errors] == [error_id]
        assert errors[0].level == checks.ERROR
        assert named in errors[0].msg
        with pytest.raises(SystemCheckError, match=error_id):
            call_command("check")


def test_system_checks_accept_good_settings() -> None:
    from django.core import checks
    from django.test import override_settings

    good = {
        "nsqd_tcp_addresses": ["127.0.0.1:4150"],
        "lookupd_http_addresses": "http://127.0.0.1:4161",
        "max_in_flight": "200",
        "heartbeat_interval": "90s",
        "read_timeout": 120,
    }
    with override_settings(NSQ=good):
        assert [e for e in checks.run_checks() if e.id.startswith("nsq_sync.")] == []


def test_nsq_metrics_setting_enables_prometheus(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """NSQ["metrics"] = "prometheus": enabled when the app is ready (what ready() runs)."""
    from django.test import override_settings
    from prometheus_client import REGISTRY

    from nsq_sync import metrics
    from nsq_sync.contrib.django import apps, get_producer

    with override_settings(NSQ={"nsqd_tcp_addresses": [nsqd.tcp_address], "metrics": "prometheus"}):
        try:
            apps._enable_metrics()
            get_producer().publish(nsq_topic, b"counted")
        finally:
            metrics.disable()
    labels = {"topic": nsq_topic, "outcome": "ok"}
    assert REGISTRY.get_sample_value("nsq_sync_published_messages_total", labels) == 1


def test_manage_py_check_exits_non_zero_on_a_bad_address(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=EXAMPLE,
        env=example_env(SHOP_DB=str(tmp_path / "db.sqlite3"), NSQD_TCP_ADDRESSES="127.0.0.1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "nsq_sync.E004" in result.stderr
    assert "nsqd_tcp_addresses" in result.stderr


# -------------------------------------------------------------------------- database connections


class TestHandlerDatabaseConnections(_django_test_case()):  # type: ignore[misc]
    nsqd: NsqdProcess
    topic: str

    def test_each_handler_call_starts_and_ends_with_old_connections_closed(self) -> None:
        """CONN_MAX_AGE=0 (the default): like a request, every handler call gets a new database
        connection, closed when it returns -- a long-running worker never keeps a dead one."""
        from django.db import connection
        from shop.models import Order

        from nsq_sync.contrib._common import make_consumer
        from nsq_sync.contrib.django import get_settings
        from nsq_sync.contrib.django.management.commands.nsq_consume import (
            with_fresh_connections,
        )

        seen: list[Any] = []

        def handler(message: Any) -> None:
            Order.objects.create(item=message.body.decode())
            seen.append(connection.connection)  # the DB-API connection of this worker

        with Producer(self.nsqd.tcp_address) as producer:
            producer.publish(self.topic, b"a")
        consumer = make_consumer(
            self.topic, "db", with_fresh_connections(handler), get_settings(), concurrency=1
        )
        with consumer:
            wait_for(lambda: len(seen) == 1, "the first message")
            with Producer(self.nsqd.tcp_address) as producer:
                producer.publish(self.topic, b"b")
            wait_for(lambda: len(seen) == 2, "the second message")
            wait_for(lambda: consumer.stats().finished == 2, "both finished")
        assert seen[0] is not seen[1], "the worker reused its database connection"
        assert sorted(Order.objects.values_list("item", flat=True)) == ["a", "b"]


# ------------------------------------------------------------------------- manage.py nsq_consume


def _shipments(db: Path) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:  # `with conn` alone does not close it
        return sorted(conn.execute("SELECT order_id, item FROM shop_shipment").fetchall())


def _publish_orders(nsqd: NsqdProcess, topic: str, orders: list[dict[str, Any]]) -> None:
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(topic, [json.dumps(o).encode() for o in orders])


def _channel(nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    return channel_stats(nsqd.http_address, topic, "shipping")


def _consume(env: dict[str, str], topic: str, *options: str) -> subprocess.Popen[str]:
    return start_command(["manage.py", "nsq_consume", topic, "shipping", *options], EXAMPLE, env)


def _migrated_db(tmp_path: Path, nsqd: NsqdProcess) -> tuple[Path, dict[str, str]]:
    return migrated_shop(tmp_path, NSQD_TCP_ADDRESSES=nsqd.tcp_address)


def test_nsq_consume_writes_through_the_orm_and_exits_0_on_sigterm(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    db, env = _migrated_db(tmp_path, nsqd)
    orders = [{"order_id": i, "item": f"item {i}"} for i in range(5)]
    _publish_orders(nsqd, nsq_topic, orders)
    proc = _consume(env, nsq_topic, "--handler", "shop.handlers.ship", "--concurrency", "2")

    def done() -> bool:
        return len(_shipments(db)) == 5 and all_answered(_channel(nsqd, nsq_topic))

    code, err = sigterm_when(proc, done, "5 shipments in the database, 5 FINs at nsqd")
    assert code == 0, err
    assert _shipments(db) == [(o["order_id"], o["item"]) for o in orders]
    assert_left_clean(lambda: _channel(nsqd, nsq_topic))


def test_nsq_consume_bad_handler_exits_2(tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str) -> None:
    _, env = _migrated_db(tmp_path, nsqd)
    code, err = finish(_consume(env, nsq_topic, "--handler", "shop.handlers.nope"))
    assert code == 2
    assert "shop.handlers.nope" in err


def test_nsq_consume_max_messages_exits_0(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    db, env = _migrated_db(tmp_path, nsqd)
    _publish_orders(nsqd, nsq_topic, [{"order_id": i, "item": "x"} for i in range(5)])
    code, err = finish(
        _consume(env, nsq_topic, "--handler", "shop.handlers.ship", "--max-messages", "3")
    )
    assert code == 0, err
    assert len(_shipments(db)) == 3
    wait_for(lambda: _channel(nsqd, nsq_topic).get("depth") == 2, "2 left at nsqd")


def test_nsq_consume_idle_timeout_exits_1_when_handlers_failed(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    db, env = _migrated_db(tmp_path, nsqd)
    _publish_orders(nsqd, nsq_topic, [{"order_id": 1, "item": "x"}, {"order_id": 2, "fail": True}])
    started = time.monotonic()
    code, err = finish(
        _consume(
            env,
            nsq_topic,
            "--handler",
            "shop.handlers.ship",
            "--idle-timeout",
            "1",
            "--max-messages",
            "2",
        )
    )
    assert code == 1, err
    assert _shipments(db) == [(1, "x")]
    assert time.monotonic() - started < 60
    # the example's LOGGING routes nsq_sync's logs: shown once, by its handler, not twice
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "ValueError: order 2 cannot be shipped" in err, err


def test_nsq_consume_exits_1_when_its_nsqd_cannot_be_reached(
    tmp_path: Path, nsq_topic: str
) -> None:
    """Issue 39: the command waited for ever; now the idle timeout ends it "unreachable"."""
    address = f"127.0.0.1:{free_closed_port()}"
    _, env = migrated_shop(tmp_path, NSQD_TCP_ADDRESSES=address)
    code, err = finish(
        _consume(env, nsq_topic, "--handler", "shop.handlers.ship", "--idle-timeout", "1"),
        timeout=30.0,
    )
    assert code == 1, err
    assert f"cannot connect to nsqd {address}" in err, err
    assert "consumer stopped (unreachable)" in err, err


BARE_SETTINGS = """
INSTALLED_APPS = ["nsq_sync.contrib.django"]
DATABASES = {}
NSQ = {"nsqd_tcp_addresses": ["%s"]}
"""

FAILING_HANDLER = """
def handle(message):
    raise ValueError("cannot handle " + message.body.decode())
"""


def test_nsq_consume_shows_a_failing_handler_without_any_logging_setting(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """A project whose settings say nothing about logging: the command itself shows the
    handler's failure with its traceback on stderr (before, nothing at all), and exits 1."""
    (tmp_path / "bare_settings.py").write_text(BARE_SETTINGS % nsqd.tcp_address)
    (tmp_path / "failing.py").write_text(FAILING_HANDLER)
    with Producer(nsqd.tcp_address) as producer:
        producer.publish(nsq_topic, b"order 7")
    env = {k: v for k, v in example_env().items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path), DJANGO_SETTINGS_MODULE="bare_settings")
    began = time.monotonic()
    args = ["-m", "django", "nsq_consume", nsq_topic, "shipping", "--handler", "failing.handle"]
    code, err = finish(start_command([*args, "--max-messages", "1"], tmp_path, env))
    assert code == 1, err
    assert time.monotonic() - began < 60, err
    assert "handler failed on message" in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "ValueError: cannot handle order 7" in err, err
    assert "consumer stopped (max_messages): 1 handled, 1 failed" in err, err


def test_nsq_consume_batch_size_writes_batches_through_the_orm(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    db, env = _migrated_db(tmp_path, nsqd)
    orders = [{"order_id": i, "item": f"item {i}"} for i in range(6)]
    _publish_orders(nsqd, nsq_topic, orders)
    # a long --batch-timeout: batches close because they are full, not because time passed
    proc = _consume(
        env,
        nsq_topic,
        "--handler",
        "shop.handlers.ship_batch",
        "--batch-size",
        "3",
        "--batch-timeout",
        "30",
    )

    def done() -> bool:
        return len(_shipments(db)) == 6 and all_answered(_channel(nsqd, nsq_topic))

    code, err = sigterm_when(proc, done, "6 shipments in the database, 6 FINs at nsqd")
    assert code == 0, err
    assert _shipments(db) == [(o["order_id"], o["item"]) for o in orders]
    assert err.count("shipped a batch of 3 orders") == 2, err
    assert "shipped a batch of" not in err.replace("shipped a batch of 3 orders", ""), err
    assert_left_clean(lambda: _channel(nsqd, nsq_topic))


def test_nsq_consume_batch_timeout_needs_batch_size(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    _, env = _migrated_db(tmp_path, nsqd)
    code, err = finish(
        _consume(env, nsq_topic, "--handler", "shop.handlers.ship_batch", "--batch-timeout", "1")
    )
    assert code == 2
    assert "--batch-timeout needs --batch-size" in err


def test_nsq_consume_dead_letter_topic_keeps_what_cannot_ship(
    tmp_path: Path, nsqd: NsqdProcess, nsq_topic: str
) -> None:
    db, env = _migrated_db(tmp_path, nsqd)
    dead = f"{nsq_topic[-40:]}.dead"
    not_json = b"\xff{not an order"
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(
            nsq_topic, [json.dumps({"order_id": 1, "item": "x"}).encode(), not_json]
        )
    code, err = finish(
        _consume(
            env,
            nsq_topic,
            "--handler",
            "shop.handlers.ship",
            "--dead-letter-topic",
            dead,
            "--idle-timeout",
            "1",
        )
    )
    assert code == 1, err  # a message was given up: cron alerts
    assert "1 dead-lettered" in err
    assert _shipments(db) == [(1, "x")]
    assert_left_clean(lambda: _channel(nsqd, nsq_topic))
    listing = dead_letter.list_messages(dead, nsqd_tcp_addresses=nsqd.tcp_address, idle_timeout=1.0)
    [record] = [entry.record for entry in listing.messages]
    assert record is not None and record.body == not_json
    assert (record.topic, record.channel, record.attempts) == (nsq_topic, "shipping", 1)
    assert record.error_type == "nsq_sync.errors.DeadLetter"
    assert record.error_message is not None and record.error_message.startswith("not an order")
