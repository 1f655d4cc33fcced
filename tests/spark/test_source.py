"""The nsq streaming source on a real Spark standalone cluster against a real nsqd: FIN waits
for Spark's commit, the zero-row tick commits the last batch, a failed or stopped query leaves
nothing lost and nothing stuck in flight."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import channel, drain, drained, nsq_stream, parquet_bodies, preload
from support.nsq import wait_for

from nsq_sync import NsqdHTTPClient

pytestmark = pytest.mark.slow

CHANNEL = "spark"


def _run(df: Any, sink: Any, checkpoint: Path | str, **trigger: Any) -> Any:
    """Start ``df`` into ``foreachBatch(sink)`` (default trigger: availableNow)."""
    return (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )


def test_available_now_reads_a_preloaded_topic_into_parquet_once(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 2500)
    out = tmp_path / "out"
    in_flight_seen: list[tuple[int, int, int]] = []

    def sink(batch: Any, batch_id: int) -> None:
        rows = batch.count()
        # This batch is not committed yet: its messages must still be in flight at nsqd.
        stats = channel(nsqd.http_address, nsq_topic, CHANNEL)
        in_flight_seen.append((batch_id, rows, stats["in_flight_count"]))
        batch.write.mode("append").parquet(str(out))

    query = _run(
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=1000),
        sink,
        str(tmp_path / "checkpoint"),
    )
    assert query.awaitTermination(240), "availableNow did not end"
    assert query.exception() is None
    seen = parquet_bodies(spark, out)
    assert sorted(seen) == sorted(bodies)
    assert set(seen.values()) == {1}
    data_batches = [(b, rows, fl) for b, rows, fl in in_flight_seen if rows]
    assert len(data_batches) >= 3  # at most 1000 per batch
    assert all(rows <= 1000 for _, rows, _ in data_batches)
    for batch_id, rows, in_flight in data_batches:
        assert in_flight >= rows, f"batch {batch_id}: {rows} rows but {in_flight} in flight"
    final = drained(nsqd, nsq_topic, CHANNEL)
    assert final["requeue_count"] == 0
    assert final["timeout_count"] == 0
    rows = spark.read.parquet(str(out)).collect()
    assert {r.topic for r in rows} == {nsq_topic}
    assert {r.channel for r in rows} == {CHANNEL}
    assert {r.nsqd_address for r in rows} == {nsqd.tcp_address}
    assert {r.attempts for r in rows} == {1}
    assert all(len(r.id) == 16 and r.timestamp is not None for r in rows)


def test_a_batch_whose_sink_fails_is_delivered_by_the_next_run(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 300)
    checkpoint = str(tmp_path / "checkpoint")

    def failing(batch: Any, batch_id: int) -> None:
        if batch.count():
            raise RuntimeError("the sink is down")

    first = _run(
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=100), failing, checkpoint
    )
    with pytest.raises(Exception, match="the sink is down"):
        first.awaitTermination(240)
    # Stopping the failed query requeued what its reader held: nothing waits for msg_timeout.
    wait_for(
        lambda: channel(nsqd.http_address, nsq_topic, CHANNEL)["in_flight_count"] == 0,
        "the failed run's messages to be requeued",
        timeout=30,
    )
    got: collections.Counter[bytes] = collections.Counter()

    def collect(batch: Any, batch_id: int) -> None:
        got.update(bytes(r.body) for r in batch.select("body").collect())

    second = _run(
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=100), collect, checkpoint
    )
    assert second.awaitTermination(240)
    assert sorted(got) == sorted(bodies)
    assert set(got.values()) == {1}
    drained(nsqd, nsq_topic, CHANNEL)


def test_a_stopped_query_leaves_nothing_in_flight(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 1000)
    got: collections.Counter[bytes] = collections.Counter()

    def collect(batch: Any, batch_id: int) -> None:
        got.update(bytes(r.body) for r in batch.select("body").collect())

    query = _run(
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=100),
        collect,
        str(tmp_path / "checkpoint"),
        processingTime="1 second",
    )
    try:
        wait_for(lambda: len(got) >= 200, "two batches", timeout=180, interval=0.1)
    finally:
        query.stop()
    stopped = time.monotonic()
    # msg_timeout is 60 s: everything held comes back long before that (REQ 0 on stop).
    wait_for(
        lambda: channel(nsqd.http_address, nsq_topic, CHANNEL)["in_flight_count"] == 0,
        "nothing in flight after stop",
        timeout=30,
    )
    assert time.monotonic() - stopped < 30
    assert channel(nsqd.http_address, nsq_topic, CHANNEL)["timeout_count"] == 0
    # What the query did not commit is back in the channel; nothing is lost.
    rest = channel(nsqd.http_address, nsq_topic, CHANNEL)["depth"]
    remaining = drain(nsqd.tcp_address, nsq_topic, CHANNEL, rest) if rest else collections.Counter()
    assert set(got) | set(remaining) == set(bodies)


def test_held_messages_are_touched_past_msg_timeout(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 200)
    got: collections.Counter[bytes] = collections.Counter()

    def slow(batch: Any, batch_id: int) -> None:
        rows = batch.select("body", "attempts").collect()
        if rows:
            time.sleep(4.5)  # three times msg_timeout
        got.update(bytes(r.body) for r in rows)

    query = _run(
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=100, msg_timeout="1.5s"),
        slow,
        str(tmp_path / "checkpoint"),
    )
    assert query.awaitTermination(240)
    assert sorted(got) == sorted(bodies)
    stats = channel(nsqd.http_address, nsq_topic, CHANNEL)
    assert stats["timeout_count"] == 0
    assert set(got.values()) == {1}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"channel": None}, "option channel is required"),
        ({"max_messages_per_batch": "2000", "max_in_flight": "3000"}, "max_messages_per_batch"),
        ({"max_in_flite": "5"}, "max_in_flite"),
        ({"nsqd_tcp_addresses": None}, "nsqd_tcp_addresses or lookupd_http_addresses"),
        ({"msg_timeout": "0.1s"}, "msg_timeout"),
    ],
)
def test_bad_source_options_fail_when_the_query_starts(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    reader = spark.readStream.format("nsq")
    base = {"nsqd_tcp_addresses": nsqd.tcp_address, "topic": nsq_topic, "channel": CHANNEL}
    base.update(options)
    for key, value in base.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(Exception, match=named):
        query = (
            reader.load()
            .writeStream.format("console")
            .option("checkpointLocation", str(tmp_path / "c"))
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()


def test_nsq_to_nsq_through_the_streaming_sink(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 1500)
    target = f"{nsq_topic[:55]}_out"
    with NsqdHTTPClient(nsqd.http_address) as client:
        client.create_topic(target)
        client.create_channel(target, "check")
    query = (
        nsq_stream(spark, nsqd, nsq_topic, CHANNEL, max_messages_per_batch=500)
        .select("body")
        .writeStream.format("nsq")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 1500
    seen = drain(nsqd.tcp_address, target, "check", 1500)
    assert sorted(seen) == sorted(bodies)
    assert set(seen.values()) == {1}
    drained(nsqd, nsq_topic, CHANNEL)
