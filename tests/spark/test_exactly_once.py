"""Exactly one row per message (docs/spark.md, "Exactly once into a table") on a real cluster:
the parallel source writes what it delivers, duplicates included, into a raw Parquet table
(bronze); a second query deduplicates those rows on ``(nsqd_address, id)`` within a watermark on
``timestamp`` into the table (silver). Faults during the bronze query make nsqd redeliver: a
Python worker stopped (SIGSTOP) past ``msg_timeout`` stages the messages nsqd meanwhile gave to
another reader, a Python worker killed (SIGKILL) mid-batch, and nsqd restarted (same data) while
a batch is read. The raw table shows the redeliveries; the table holds every body once."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import channel, preload
from support.nsq import wait_for

pytestmark = pytest.mark.slow

CHANNEL = "spark"
MESSAGES = 12_000
PER_BATCH = 2500  # at least five batches: one for each fault, and batches after them
MSG_TIMEOUT = 3.0  # seconds: a stopped worker's messages time out quickly
WATERMARK = "10 minutes"  # far longer than any redelivery here (msg_timeout, the restart)


def _bronze(spark: Any, server: Any, topic: str, staging: Path, raw: Path, ckpt: Path) -> Any:
    """The parallel source into raw Parquet, as it delivers (at least once)."""
    rows = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", server.tcp_address)
        .option("nsqd_http_addresses", server.http_address)
        .option("topic", topic)
        .option("channel", CHANNEL)
        .option("parallelism", "2")
        .option("staging_location", str(staging))
        .option("max_messages_per_batch", str(PER_BATCH))
        .option("chunk_size", "100")
        # paces a partition to a chunk per round trip: the faults find it mid-batch
        .option("max_in_flight", "100")
        .option("msg_timeout", f"{MSG_TIMEOUT:g}s")
        # longer than the stop below: the stopped partition goes on consuming when resumed
        .option("drain_idle_timeout", "5s")
        .load()
    )
    return (
        rows.writeStream.format("parquet")
        .option("path", str(raw))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )


def _silver(spark: Any, raw: Path, table: Path, ckpt: Path) -> Any:
    """The recipe: the raw rows, deduplicated on (nsqd_address, id) within a watermark on
    timestamp, into the table. A few raw files per batch, so that the state carries the ids
    from one batch to the next."""
    from nsq_sync.spark import SOURCE_SCHEMA

    rows = spark.readStream.schema(SOURCE_SCHEMA).option("maxFilesPerTrigger", 3).parquet(str(raw))
    return (
        rows.withWatermark("timestamp", WATERMARK)
        .dropDuplicatesWithinWatermark(["nsqd_address", "id"])
        .writeStream.format("parquet")
        .option("path", str(table))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )


class _Faults:
    """Injects the faults one after the other from a thread of its own, each in a later batch
    than the one before, on a partition still consuming (a staged chunk, no MANIFEST yet)."""

    def __init__(self, server: Any, topic: str, staging: Path) -> None:
        self.server, self.topic, self.staging = server, topic, staging
        self.stopped: list[int] = []
        self.killed: list[int] = []
        self.restarted: list[int] = []  # the batch nsqd restarted in
        self.failures: list[BaseException] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def _run(self) -> None:
        try:
            batch, pid = self._consuming(after=0)
            self._stop_past_msg_timeout(pid)
            batch, pid = self._consuming(after=batch)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
            batch, _ = self._consuming(after=batch)
            self.server.restart()
            self.restarted.append(batch)
        except BaseException as exc:  # reported by the test
            self.failures.append(exc)

    def _consuming(self, after: int) -> tuple[int, int]:
        """(batch, pid of a Python worker) of a partition of a batch after ``after`` that
        staged a chunk and has no MANIFEST yet. Looks every 10 ms (a partition that gets its
        share ends as soon as it has it)."""
        deadline = time.monotonic() + 240
        while not self.done.wait(0.01):
            for chunk in self.staging.glob("batch-*/part-*/chunk-*.arrow"):
                batch = int(chunk.parent.parent.name.split("-")[1])
                if batch > after and not (chunk.parent / "MANIFEST").exists():
                    return batch, int(chunk.name.split("-")[2])
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"no partition consuming in a batch after {after}")

    def _stop_past_msg_timeout(self, pid: int) -> None:
        """SIGSTOP the worker until nsqd timed out what it had sent it (msg_timeout after it
        sent it) and requeued those messages for the other readers; then SIGCONT: the worker
        stages them too."""
        before = self._timeouts()
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self.stopped.append(pid)
        try:
            wait_for(
                lambda: (
                    time.monotonic() - stopped_at > MSG_TIMEOUT + 0.2 and self._timeouts() > before
                ),
                "nsqd to time out the stopped worker's messages",
                timeout=60,
            )
        finally:
            os.kill(pid, signal.SIGCONT)

    def _timeouts(self) -> int:
        return int(channel(self.server.http_address, self.topic, CHANNEL)["timeout_count"])


def _in_flight(server: Any, topic: str) -> int:
    return int(channel(server.http_address, topic, CHANNEL)["in_flight_count"])


def _rows(spark: Any, path: Path) -> list[Any]:
    return spark.read.parquet(str(path)).select("id", "nsqd_address", "body", "attempts").collect()


def test_recipe_writes_each_message_once_through_redeliveries(
    spark: Any, nsqd_factory: Any, nsq_topic: str, tmp_path: Path, record_property: Any
) -> None:
    server = nsqd_factory()
    bodies = preload(server.tcp_address, nsq_topic, MESSAGES)
    staging, raw, table = tmp_path / "staging", tmp_path / "raw", tmp_path / "table"
    faults = _Faults(server, nsq_topic, staging)
    faults.thread.start()
    try:
        bronze = _bronze(spark, server, nsq_topic, staging, raw, tmp_path / "bronze-ckpt")
        assert bronze.awaitTermination(300), "the bronze query (availableNow) did not end"
    finally:
        faults.done.set()
        faults.thread.join(120)
    assert not faults.failures, faults.failures
    assert faults.stopped and faults.killed and faults.restarted
    assert bronze.exception() is None

    # The raw rows: every body, and nsqd's redeliveries (the same id, more attempts).
    delivered = _rows(spark, raw)
    assert {bytes(r.body) for r in delivered} == set(bodies)  # nothing lost
    copies = collections.Counter((r.nsqd_address, r.id) for r in delivered)
    duplicates = sum(copies.values()) - len(copies)
    record_property("raw_rows", len(delivered))
    record_property("duplicates", duplicates)
    assert duplicates >= 1, "no message was delivered twice: the faults did not redeliver"
    assert any(r.attempts > 1 for r in delivered)
    assert len(copies) == MESSAGES  # one id per body: a duplicate row is a redelivery
    wait_for(lambda: not _in_flight(server, nsq_topic), "nothing in flight", timeout=30)
    assert channel(server.http_address, nsq_topic, CHANNEL)["depth"] == 0
    assert list(staging.iterdir()) == []

    silver = _silver(spark, raw, table, tmp_path / "silver-ckpt")
    assert silver.awaitTermination(300), "the silver query (availableNow) did not end"
    assert silver.exception() is None
    progress = [p for p in silver.recentProgress if p["stateOperators"]]
    assert len(progress) >= 2  # the state carried ids across batches
    assert sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress) == 0

    written = _rows(spark, table)
    seen = collections.Counter(bytes(r.body) for r in written)
    assert sorted(seen) == sorted(bodies) and set(seen.values()) == {1}  # each body once
    assert len({(r.nsqd_address, r.id) for r in written}) == MESSAGES
