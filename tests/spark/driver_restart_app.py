"""A streaming driver program for test_parallel's driver-restart test, run with spark-submit.

    spark-submit ... driver_restart_app.py NSQD_TCP NSQD_HTTP TOPIC WORK_DIR {crash,resume}

An ``availableNow`` query of the parallel nsq source (parallelism 2, 2,000 rows per batch)
into ``foreachBatch``, which writes each batch to Parquet under WORK_DIR/out and its sorted
``(id, body)`` rows to WORK_DIR/rows-<batch>-<mode>.json. In ``crash`` mode, once batch 0 is
written it creates WORK_DIR/sunk-0 and waits to be killed: the driver dies after the batch's
sink and before Spark commits it. ``resume`` runs the query from the same checkpoint to the end
and prints ``resumed: done``.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from nsq_sync.spark import NsqDataSource


def main() -> None:
    tcp, http, topic, work_dir, mode = sys.argv[1:6]
    work = Path(work_dir)
    spark = SparkSession.builder.appName(f"nsq_sync driver restart ({mode})").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(NsqDataSource)

    def sink(batch: Any, batch_id: int) -> None:
        rows = sorted((r.id, bytes(r.body).decode()) for r in batch.select("id", "body").collect())
        batch.write.mode("overwrite").parquet(str(work / "out" / f"batch={batch_id}"))
        (work / f"rows-{batch_id}-{mode}.json").write_text(json.dumps(rows))
        if mode == "crash" and batch_id == 0:
            (work / "sunk-0").write_text("written, not committed")
            threading.Event().wait()  # until the test kills this driver

    query = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", tcp)
        .option("nsqd_http_addresses", http)
        .option("topic", topic)
        .option("channel", "spark")
        .option("parallelism", "2")
        .option("max_messages_per_batch", "2000")
        .option("staging_location", str(work / "staging"))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"{mode}: done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
