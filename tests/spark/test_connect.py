"""The nsq data source through Spark Connect: a thin client (``SparkSession.builder.remote``)
talks to a real Spark Connect server (pyspark's ``sbin/start-connect-server.sh``) whose
application runs on the test cluster; the data source's Python runs in the server's and the
executors' Python, never in this process. What a user checks: rows counted at nsqd after the
sink, bodies read back exactly once by both source modes, the channel left with nothing in
flight, and a bad option failing with its name.

A foreachBatch function would run in the server's Python here, so these queries write Parquet
and the test reads it back."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import (
    channel,
    drain,
    drained,
    nsq_stream,
    parquet_bodies,
    preload,
    topic_stats,
)
from support.nsq import wait_for

pytestmark = pytest.mark.slow

CHANNEL = "spark"
#: the longest one Connect query may take (a first streaming query loads Spark's classes)
QUERY_TIMEOUT = 240


def _into_parquet(df: Any, tmp_path: Path, **trigger: Any) -> Any:
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )


def _await(query: Any) -> None:
    assert query.awaitTermination(QUERY_TIMEOUT), "availableNow did not end"
    assert query.exception() is None


def test_the_sink_publishes_every_row(spark_connect: Any, nsqd: Any, nsq_topic: str) -> None:
    df = spark_connect.range(0, 5000, numPartitions=2).selectExpr("cast(id as string) as body")
    df.write.format("nsq").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
        "topic", nsq_topic
    ).mode("append").save()
    stats = topic_stats(nsqd.http_address, nsq_topic)
    assert stats["message_count"] == 5000
    seen = drain(nsqd.tcp_address, nsq_topic, "check", 5000)
    assert seen == collections.Counter(str(i).encode() for i in range(5000))


def test_the_streaming_sink_publishes_every_row(
    spark_connect: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    files = tmp_path / "in"
    spark_connect.range(0, 2000, numPartitions=2).selectExpr(
        "concat('s', cast(id as string)) as body"
    ).write.parquet(str(files))
    query = (
        spark_connect.readStream.schema("body string")
        .parquet(str(files))
        .writeStream.format("nsq")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("topic", nsq_topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    _await(query)
    assert topic_stats(nsqd.http_address, nsq_topic)["message_count"] == 2000


def test_the_driver_side_source_reads_a_topic_into_parquet_once(
    spark_connect: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 3000)
    _await(
        _into_parquet(
            nsq_stream(spark_connect, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=1000),
            tmp_path,
        )
    )
    seen = parquet_bodies(spark_connect, tmp_path / "out")
    assert seen == collections.Counter(bodies)
    stats = drained(nsqd, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0


def test_the_parallel_source_reads_a_topic_into_parquet_once(
    spark_connect: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 4000)
    staging = tmp_path / "staging"
    df = nsq_stream(
        spark_connect,
        nsqd,
        nsq_topic,
        CHANNEL,
        nsqd_http_addresses=nsqd.http_address,
        parallelism=2,
        staging_location=staging,
        max_messages_per_batch=2000,
    )
    _await(_into_parquet(df, tmp_path))
    seen = parquet_bodies(spark_connect, tmp_path / "out")
    assert seen == collections.Counter(bodies)
    stats = drained(nsqd, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    assert list(staging.iterdir()) == []  # every batch committed, the last one too


def test_a_stopped_driver_side_query_leaves_nothing_in_flight(
    spark_connect: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """Stopping the query stops the server's source process (SIGTERM): what its reader held
    is requeued at once, not after msg_timeout."""
    preload(nsqd.tcp_address, nsq_topic, 2000)
    df = nsq_stream(spark_connect, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=500)
    query = _into_parquet(df, tmp_path, processingTime="60 seconds")
    try:
        wait_for(
            lambda: channel(nsqd.http_address, nsq_topic, CHANNEL).get("in_flight_count", 0) > 0,
            "messages in flight to the source",
            timeout=QUERY_TIMEOUT,
        )
    finally:
        query.stop()
    stats = wait_for(
        lambda: (s := channel(nsqd.http_address, nsq_topic, CHANNEL))["in_flight_count"] == 0 and s,
        "the stopped query's messages to be requeued",
        timeout=30,
    )
    assert stats["timeout_count"] == 0 and stats["requeue_count"] > 0
    # The first batch was never committed (the next trigger was a minute away): all is back.
    assert stats["depth"] == 2000


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_messages_per_batch": "0"}, "max_messages_per_batch"),
        ({"parallelism": "2"}, "staging_location"),
    ],
)
def test_a_bad_source_option_fails_naming_it(
    spark_connect: Any,
    nsqd: Any,
    nsq_topic: str,
    tmp_path: Path,
    options: dict[str, str],
    named: str,
) -> None:
    with pytest.raises(Exception, match=named) as info:
        _await(
            _into_parquet(nsq_stream(spark_connect, nsqd, nsq_topic, CHANNEL, **options), tmp_path)
        )
    assert "ConfigError" in str(info.value)


def test_a_bad_sink_option_fails_at_planning_naming_it(spark_connect: Any, nsqd: Any) -> None:
    df = spark_connect.createDataFrame([(b"x",)], "body binary")
    writer = df.write.format("nsq").option("nsqd_tcp_addresses", nsqd.tcp_address)
    with pytest.raises(Exception, match="unknown option 'batch_sise'") as info:
        writer.option("topic", "t").option("batch_sise", "5").mode("append").save()
    assert "ConfigError" in str(info.value)
