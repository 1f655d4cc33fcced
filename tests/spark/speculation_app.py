"""A streaming driver program for test_speculation, run with spark-submit on a cluster whose two
workers Spark takes for two hosts, with speculative execution on.

    spark-submit ... speculation_app.py NSQD_TCP NSQD_HTTP TOPIC WORK_DIR UI_PORT

An ``availableNow`` query of the parallel nsq source (parallelism 2, chunks of 100 rows) into
``foreachBatch``, which writes each batch to Parquet under WORK_DIR/out and the staging's
MANIFESTs (read before Spark commits the batch and deletes them) to WORK_DIR/manifests.json. At
the end it writes the application's tasks, as its own UI's REST API lists them, to
WORK_DIR/tasks.json and prints ``speculation: done``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import requests
from pyspark.sql import SparkSession

from nsq_sync.spark import NsqDataSource


def _tasks(spark: Any, ui_port: str) -> list[dict[str, Any]]:
    """Every task attempt of the application: stage, index, attempt, speculative, host,
    status."""
    app = spark.sparkContext.applicationId
    url = f"http://127.0.0.1:{ui_port}/api/v1/applications/{app}/stages"
    stages = requests.get(url, params={"details": "true"}, timeout=30).json()
    return [
        {
            "stage": stage["stageId"],
            "index": task["index"],
            "attempt": task["attempt"],
            "speculative": task["speculative"],
            "host": task["host"],
            "status": task["status"],
        }
        for stage in stages
        for task in stage.get("tasks", {}).values()
    ]


def main() -> None:
    tcp, http, topic, work_dir, ui_port = sys.argv[1:6]
    work = Path(work_dir)
    staging = work / "staging"
    spark = SparkSession.builder.appName("nsq_sync speculation").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(NsqDataSource)
    manifests: list[dict[str, Any]] = []

    def sink(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(work / "out"))
        for path in sorted(staging.glob("batch-*/part-*/MANIFEST")):
            manifests.append(
                {"path": str(path.relative_to(staging)), **json.loads(path.read_text())}
            )

    query = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", tcp)
        .option("nsqd_http_addresses", http)
        .option("topic", topic)
        .option("channel", "spark")
        .option("parallelism", "2")
        .option("chunk_size", "100")
        .option("max_in_flight", "100")
        .option("drain_idle_timeout", "4s")
        .option("msg_timeout", "5s")
        .option("staging_location", str(staging))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    (work / "manifests.json").write_text(json.dumps(manifests))
    (work / "tasks.json").write_text(json.dumps(_tasks(spark, ui_port)))
    print("speculation: done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
