"""The nsq sink on a real Spark standalone cluster (executors in their own JVM and Python
workers) against a real nsqd."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import spark_slow
from spark_helpers import channel, drain, topic_stats
from support.nsq import wait_for

from nsq_sync import NsqdHTTPClient

pytestmark = pytest.mark.slow


def _writer(df: Any, tcp_address: str, topic: str | None = None, **options: Any) -> Any:
    writer = df.write.format("nsq").option("nsqd_tcp_addresses", tcp_address).mode("append")
    if topic is not None:
        writer = writer.option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, str(value))
    return writer


def test_100k_rows_arrive_complete(spark: Any, nsqd: Any, nsq_topic: str) -> None:
    df = spark.range(0, 100_000, numPartitions=4).selectExpr("cast(id as string) as body")
    _writer(df, nsqd.tcp_address, nsq_topic).save()
    stats = topic_stats(nsqd.http_address, nsq_topic)
    # Counted by nsqd: every row once (a clean run publishes no duplicate).
    assert stats["message_count"] == 100_000
    assert stats["depth"] == 100_000


def test_topic_column_routes_each_row(spark: Any, nsqd: Any, nsq_topic: str) -> None:
    a, b, fallback = f"{nsq_topic[:50]}_a", f"{nsq_topic[:50]}_b", f"{nsq_topic[:50]}_d"
    rows = [(f"a{i}".encode(), a) for i in range(30)]
    rows += [(f"b{i}".encode(), b) for i in range(20)]
    rows += [(f"d{i}".encode(), None) for i in range(10)]  # null topic: the topic option
    df = spark.createDataFrame(rows, "body binary, topic string").repartition(3)
    for name in (a, b, fallback):
        with NsqdHTTPClient(nsqd.http_address) as client:
            client.create_topic(name)
            client.create_channel(name, "check")
    _writer(df, nsqd.tcp_address, fallback, batch_size=7).save()
    for name, prefix, n in ((a, b"a", 30), (b, b"b", 20), (fallback, b"d", 10)):
        seen = drain(nsqd.tcp_address, name, "check", n)
        assert sorted(seen) == sorted(f"{prefix.decode()}{i}".encode() for i in range(n))
        assert set(seen.values()) == {1}


def test_string_bodies_are_published_as_utf8(spark: Any, nsqd: Any, nsq_topic: str) -> None:
    with NsqdHTTPClient(nsqd.http_address) as client:
        client.create_topic(nsq_topic)
        client.create_channel(nsq_topic, "check")
    df = spark.createDataFrame([("héllo",), ("wörld",)], "body string")
    _writer(df, nsqd.tcp_address, nsq_topic).save()
    assert set(drain(nsqd.tcp_address, nsq_topic, "check", 2)) == {
        "héllo".encode(),
        "wörld".encode(),
    }


def test_an_nsqd_restart_mid_write_loses_nothing(
    spark: Any, nsqd_factory: Any, nsq_topic: str, record_property: Any
) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(spark_slow)
    server = nsqd_factory()
    with NsqdHTTPClient(server.http_address) as client:
        client.create_topic(nsq_topic)
        client.create_channel(nsq_topic, "check")
    n = 60_000
    df = (
        spark.range(0, n, numPartitions=2)
        .selectExpr("cast(id as string) as body")
        .mapInArrow(spark_slow.trickle, "body string")
    )
    restarted = threading.Event()
    failures: list[BaseException] = []

    def restart_when_half_way() -> None:
        try:
            wait_for(
                lambda: channel(server.http_address, nsq_topic, "check").get("depth", 0) >= 5_000,
                "the write to start",
                timeout=240,
                interval=0.05,
            )
            server.restart()
            restarted.set()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=restart_when_half_way)
    thread.start()
    context = spark.sparkContext
    group = f"restart-{nsq_topic}"
    context.setJobGroup(group, "nsqd restart mid-write")
    try:
        _writer(df, server.tcp_address, nsq_topic, batch_size=500).save()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        thread.join(240)
    assert not failures, failures
    assert restarted.is_set()
    # The publishes were retried inside the tasks: no task failed (Spark did not have to retry).
    tracker = context.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup(group)
        for stage in tracker.getJobInfo(job).stageIds
    ]
    assert stages
    assert [s.numFailedTasks for s in stages if s is not None] == [0] * len(stages)
    # nsqd's topic pump hands messages to the channel after the MPUB has answered: the last
    # batch can still be on its way (CI once read 59,505 right after the write returned), and
    # with the restart's duplicates the channel can count n before the last originals are in
    wait_for(
        lambda: (
            topic_stats(server.http_address, nsq_topic).get("depth") == 0
            and channel(server.http_address, nsq_topic, "check")["depth"] >= n
        ),
        "every message moved from the topic to the channel",
        timeout=30,
    )
    depth = channel(server.http_address, nsq_topic, "check")["depth"]
    seen = drain(server.tcp_address, nsq_topic, "check", depth)
    missing = n - len(seen)
    duplicates = sum(seen.values()) - len(seen)
    record_property("spark_restart_duplicates", duplicates)
    assert missing == 0
    assert set(seen) == {str(i).encode() for i in range(n)}


def test_an_unreachable_nsqd_fails_the_write_naming_it(spark: Any, nsq_topic: str) -> None:
    from support.nsq import free_closed_port

    address = f"127.0.0.1:{free_closed_port()}"
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match=address.replace(".", r"\.")):
        _writer(df, address, nsq_topic, publish_timeout="1s").save()


@pytest.mark.parametrize(
    ("ddl", "options", "named"),
    [
        ("payload binary", {"topic": "t"}, "'body'"),
        ("body int", {"topic": "t"}, "'body' must be binary or string"),
        ("body binary, topic int", {}, "'topic' must be a string"),
        ("body binary", {}, "option 'topic'"),
        ("body binary, extra string", {"topic": "t"}, "'extra'"),
        ("body binary", {"topic": "t", "batch_sise": "5"}, "batch_sise"),
        ("body binary", {"topic": "t", "batch_size": "0"}, "batch_size"),
        ("body binary", {"topic": "bad topic!"}, "option topic"),
        ("body binary", {"topic": "t", "publish_timeout": "soon"}, "publish_timeout"),
    ],
)
def test_bad_schema_or_option_fails_at_planning_naming_it(
    spark: Any, nsqd: Any, ddl: str, options: dict[str, str], named: str
) -> None:
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=named.replace("(", r"\(")) as info:
        _writer(df, nsqd.tcp_address, **options).save()
    assert "ConfigError" in str(info.value)


def test_a_bad_address_fails_at_planning(spark: Any) -> None:
    df = spark.createDataFrame([], "body binary")
    with pytest.raises(Exception, match="nsqd_tcp_addresses"):
        _writer(df, "not-an-address", "t").save()


def test_overwrite_mode_is_refused(spark: Any, nsqd: Any) -> None:
    df = spark.createDataFrame([], "body binary")
    with pytest.raises(Exception, match="only appends"):
        _writer(df, nsqd.tcp_address, "t").mode("overwrite").save()
