"""NSQ and Spark both ways: Parquet -> NSQ with the batch sink, then NSQ -> Parquet with the
streaming source (``trigger(availableNow=True)``: the query ends once the channel is drained).

Needs the spark extra (``pip install nsq_sync[spark]``) and Java 17. Against the README demo's
throwaway nsqd, in local mode:

    scripts/demo examples/spark_pipeline.py

on a standalone cluster (``scripts/spark-cluster`` prints its URL):

    scripts/demo examples/spark_pipeline.py --master spark://127.0.0.1:7077

or through spark-submit, with your own nsqd:

    NSQD_TCP_ADDRESS=127.0.0.1:4150 spark-submit --master spark://127.0.0.1:7077 \\
        examples/spark_pipeline.py --rows 10000

Exits 0 when every row published came back exactly once, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nsqd-tcp-address", default=os.environ.get("NSQD_TCP_ADDRESS", "127.0.0.1:4150")
    )
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, or local[2])")
    parser.add_argument("--rows", type=int, default=10_000, help="rows to send through NSQ")
    parser.add_argument("--topic", default=f"spark_demo_{uuid.uuid4().hex[:8]}")
    parser.add_argument("--channel", default="to_parquet")
    parser.add_argument("--work-dir", help="where the Parquet files go (default: a temp folder)")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from nsq_sync.spark import NsqDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need nsq_sync too
    builder = SparkSession.builder.appName("nsq_sync spark_pipeline")
    if args.master:
        builder = builder.master(args.master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: local mode
        builder = builder.master("local[2]")
    spark = (
        builder.config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(NsqDataSource)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="spark_pipeline_"))
    nsqd = args.nsqd_tcp_address
    print(f"nsqd {nsqd}, topic {args.topic}, master {spark.sparkContext.master}, files in {work}")

    # 1. Some orders in Parquet (the input of a batch job).
    orders = spark.range(args.rows, numPartitions=2).selectExpr(
        "to_json(named_struct('order', id, 'amount', id % 100)) AS body"
    )
    orders.write.mode("overwrite").parquet(str(work / "orders.parquet"))

    # The channel must exist before publishing, or nsqd would keep the messages only in the
    # topic (a channel gets the messages published after it was created).
    _create_channel(nsqd, args.topic, args.channel)

    # 2. Parquet -> NSQ: each partition MPUBs its rows and waits for nsqd's acks.
    started = time.monotonic()
    (
        spark.read.parquet(str(work / "orders.parquet"))
        .write.format("nsq")
        .option("nsqd_tcp_addresses", nsqd)
        .option("topic", args.topic)
        .mode("append")
        .save()
    )
    print(f"Parquet -> NSQ: {args.rows} rows in {time.monotonic() - started:.1f} s")

    # 3. NSQ -> Parquet: the source's messages are FINed only after Spark committed the batch.
    started = time.monotonic()
    query = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", nsqd)
        .option("topic", args.topic)
        .option("channel", args.channel)
        .option("max_messages_per_batch", "5000")
        .load()
        .selectExpr("CAST(body AS STRING) AS body", "timestamp", "attempts")
        .writeStream.format("parquet")
        .option("path", str(work / "from_nsq.parquet"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    bodies = [r.body for r in spark.read.parquet(str(work / "from_nsq.parquet")).collect()]
    total, distinct = len(bodies), len(set(bodies))
    print(
        f"NSQ -> Parquet: {total} rows ({distinct} distinct) in {time.monotonic() - started:.1f} s"
    )
    spark.stop()
    ok = total == distinct == args.rows
    print("every row came back exactly once" if ok else "MISMATCH")
    return 0 if ok else 1


def _create_channel(nsqd_tcp_address: str, topic: str, channel: str) -> None:
    """Create the channel through a short-lived subscription (only the TCP address is known)."""
    from nsq_sync import Consumer

    consumer = Consumer(
        topic, channel, lambda m: None, nsqd_tcp_addresses=[nsqd_tcp_address], max_in_flight=0
    )
    consumer.start()
    try:
        consumer.wait_connected(10.0)
    finally:
        consumer.stop()


if __name__ == "__main__":
    sys.exit(main())
