"""The parallel nsq source on a real Spark standalone cluster (two executors) against a real nsqd
at its defaults: executors consume and stage, every body arrives once, the staging location is
left empty, a killed Python worker and a killed driver lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import (
    channel,
    drained,
    kill_driver,
    nsq_stream,
    parquet_bodies,
    preload,
    spark_submit,
    staged_files,
    staging_worker,
)
from support.nsq import wait_for

pytestmark = pytest.mark.slow

CHANNEL = "spark"
DRIVER_APP = Path(__file__).resolve().parent / "driver_restart_app.py"


def _stream(spark: Any, nsqd: Any, topic: str, staging: Path | str, **options: Any) -> Any:
    return nsq_stream(
        spark,
        nsqd,
        topic,
        CHANNEL,
        nsqd_http_addresses=nsqd.http_address,
        staging_location=staging,
        **{"parallelism": 4, **options},
    )


def _run(df: Any, sink: Any, checkpoint: Path) -> Any:
    return (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _manifests(staging: Path) -> list[dict[str, Any]]:
    """Every MANIFEST staged now (a batch's staging lives until Spark commits the batch)."""
    return [json.loads(p.read_text()) for p in sorted(staging.glob("batch-*/part-*/MANIFEST"))]


def _run_once(spark: Any, df: Any, sink: Any, tmp_path: Path, bodies: list[bytes]) -> None:
    """Run ``df`` availableNow into ``sink`` (which writes Parquet to ``tmp_path / "out"``) to
    the end; every body is there exactly once."""
    query = _run(df, sink, tmp_path / "checkpoint")
    assert query.awaitTermination(300), "availableNow did not end"
    assert query.exception() is None
    seen = parquet_bodies(spark, tmp_path / "out")
    assert sorted(seen) == sorted(bodies)
    assert set(seen.values()) == {1}


def test_available_now_reads_on_the_executors_into_parquet_once(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 10_000)
    out, staging = tmp_path / "out", tmp_path / "staging"
    manifests: list[dict[str, Any]] = []
    batch_rows: list[int] = []

    def sink(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))
        manifests.extend(_manifests(staging))  # before Spark commits this batch
        batch_rows.append(batch.count())  # a second action on the batch replays its staging

    df = _stream(spark, nsqd, nsq_topic, staging, max_messages_per_batch=5000)
    _run_once(spark, df, sink, tmp_path, bodies)
    assert sum(batch_rows) == 10_000 and all(rows <= 5000 for rows in batch_rows)
    stats = drained(nsqd, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    # The rows were consumed by at least two executor processes (Python workers).
    consumed_by = {(m["info"]["host"], m["info"]["pid"]) for m in manifests if any(m["rows"])}
    assert len(consumed_by) >= 2, manifests
    assert os.getpid() not in {pid for _, pid in consumed_by}
    # Spark committed every batch, the last one through the empty batch: nothing is left.
    assert list(staging.iterdir()) == []


def test_available_now_stages_to_s3(
    spark: Any, s3_server: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """The same query with staging_location s3://... (an S3 server on loopback): the driver
    marks the batches, the executors stage to S3 and replay from it, every body arrives once
    and the commits leave no object behind."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 3000)
    out, location = tmp_path / "out", s3_server.location()
    staged: list[list[str]] = []

    def sink(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))
        staged.append(staged_files(location))  # before Spark commits this batch

    df = _stream(spark, nsqd, nsq_topic, location, max_messages_per_batch=1500)
    _run_once(spark, df, sink, tmp_path, bodies)
    drained(nsqd, nsq_topic, CHANNEL)
    manifests = [name for files in staged for name in files if name.endswith("/MANIFEST")]
    assert len(manifests) >= 8, staged  # two batches (or more) of four partitions, on S3
    assert staged_files(location) == []


def test_a_wrong_staging_location_fails_when_the_query_starts(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    location = str(blocker / "staging")
    with pytest.raises(Exception, match=f"staging_location '{location}' is not writable"):
        query = _run(
            _stream(spark, nsqd, nsq_topic, location),
            lambda batch, batch_id: None,
            tmp_path / "checkpoint",
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()


def test_a_driver_killed_after_the_sink_replays_the_staging_when_restarted(
    spark: Any, spark_cluster: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """A driver program (spark-submit, an application of its own) is SIGKILLed after batch 0's
    sink wrote it and before Spark committed it. Started again on the same checkpoint, Spark
    runs batch 0 again: it reads the staged rows (the same ids), consumes nothing twice, and
    the query goes on to the end."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 3000)
    work = tmp_path / "work"
    work.mkdir()
    args = [nsqd.tcp_address, nsqd.http_address, nsq_topic, str(work)]
    log = (tmp_path / "crash.log").open("w")
    driver = spark_submit(
        spark_cluster, DRIVER_APP, [*args, "crash"], tmp_path / "local", stdout=log, stderr=log
    )
    try:
        wait_for(
            lambda: (work / "sunk-0").exists() or driver.poll() is not None,
            "batch 0 written by the first driver",
            timeout=300,
        )
        assert (work / "sunk-0").exists(), (tmp_path / "crash.log").read_text()[-3000:]
    finally:
        kill_driver(driver)
        log.close()
    crashed = json.loads((work / "rows-0-crash.json").read_text())
    assert len(crashed) == 2000
    stats = channel(nsqd.http_address, nsq_topic, CHANNEL)
    assert stats["depth"] == 1000 and stats["in_flight_count"] == 0  # batch 0 was FINed

    driver = spark_submit(
        spark_cluster,
        DRIVER_APP,
        [*args, "resume"],
        tmp_path / "local",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = driver.communicate(timeout=300)
    finally:
        kill_driver(driver)
    assert driver.returncode == 0 and "resume: done" in output, output[-3000:]
    assert json.loads((work / "rows-0-resume.json").read_text()) == crashed  # ids included
    seen = parquet_bodies(spark, work / "out")
    assert sorted(seen) == sorted(bodies) and set(seen.values()) == {1}
    stats = drained(nsqd, nsq_topic, CHANNEL)
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0  # nothing read twice
    assert list((work / "staging").iterdir()) == []


def test_a_killed_python_worker_loses_nothing(
    spark: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """An executor's Python worker is killed (SIGKILL) after it staged chunks and before its
    MANIFEST: Spark retries the task, which adopts those chunks; what the dead worker had not
    staged comes back from nsqd after msg_timeout. Every body arrives; duplicates are bounded
    by what was received and not staged."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 2000)
    out, staging = tmp_path / "out", tmp_path / "staging"
    manifests: list[dict[str, Any]] = []
    killed: list[int] = []
    done = threading.Event()

    def killer() -> None:
        # Kill a worker that staged a chunk, before its partition's MANIFEST. A partition that
        # gets fewer than its share idles (drain_idle_timeout) first; one that gets its share
        # ends at once, so the window is only its consuming: max_in_flight 100 paces that to a
        # chunk per round trip, and this looks every 10 ms (CI once missed it at 50 ms).
        while not done.wait(0.01) and not killed:
            pid = staging_worker(staging)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    def sink(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))
        manifests.extend(_manifests(staging))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        query = _run(
            _stream(
                spark,
                nsqd,
                nsq_topic,
                staging,
                parallelism=2,
                chunk_size=100,
                max_in_flight=100,
                drain_idle_timeout="6s",
                msg_timeout="5s",
            ),
            sink,
            tmp_path / "checkpoint",
        )
        assert query.awaitTermination(300), "availableNow did not end"
    finally:
        done.set()
        thread.join()
    assert query.exception() is None
    assert killed, "no Python worker was killed"
    seen = parquet_bodies(spark, out)
    assert set(seen) == set(bodies)  # nothing lost
    duplicates = sum(seen.values()) - len(seen)
    assert duplicates <= 100, f"{duplicates} duplicates: more than one unstaged chunk"
    assert any(m["adopted"] for m in manifests), "the retry did not adopt the staged chunks"
    assert all(m["info"]["pid"] not in killed for m in manifests)
    drained(nsqd, nsq_topic, CHANNEL)
    assert list(staging.iterdir()) == []


def test_an_nsqd_restart_mid_batch_loses_nothing(
    spark: Any, nsqd_factory: Any, nsq_topic: str, tmp_path: Path, record_property: Any
) -> None:
    """nsqd restarts (gracefully: it keeps what was in flight on disk) while the executors
    read: they reconnect and go on; what was in flight comes back, so a message staged whose
    FIN was lost arrives twice, nothing is lost."""
    server = nsqd_factory()
    bodies = preload(server.tcp_address, nsq_topic, 20_000)
    out, staging = tmp_path / "out", tmp_path / "staging"
    restarted = threading.Event()
    failures: list[BaseException] = []

    def restart_mid_batch() -> None:
        try:
            wait_for(
                lambda: any(staging.glob("batch-*/part-*/chunk-*.arrow")),
                "the executors to stage a chunk",
                timeout=240,
                interval=0.02,
            )
            server.restart()
            restarted.set()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=restart_mid_batch)
    thread.start()
    try:
        query = _run(
            _stream(
                spark,
                server,
                nsq_topic,
                staging,
                parallelism=2,
                chunk_size=200,
                drain_idle_timeout="3s",
                max_messages_per_batch=20_000,
            ),
            lambda batch, batch_id: batch.write.mode("append").parquet(str(out)),
            tmp_path / "checkpoint",
        )
        assert query.awaitTermination(300), "availableNow did not end"
    finally:
        thread.join(300)
    assert not failures, failures
    assert restarted.is_set()
    assert query.exception() is None
    seen = parquet_bodies(spark, out)
    assert set(seen) == set(bodies)  # nothing lost
    duplicates = sum(seen.values()) - len(seen)
    record_property("duplicates", duplicates)
    # Only messages in flight at the restart can come back: at most max_in_flight per partition.
    assert duplicates <= 2 * 2500
    drained(server, nsq_topic, CHANNEL)
    assert list(staging.iterdir()) == []
