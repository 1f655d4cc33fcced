"""What Spark itself costs per row on the parallel source's read path, without NSQ: a Python
data source whose partitions yield ready-made Arrow batches of the source's seven columns (or of
``body`` alone) into Spark's ``noop`` sink, for several batch sizes.

    .venv/bin/python -m bench.spark_passthrough                 # ~2 minutes on 2 cores
    .venv/bin/python -m bench.spark_passthrough --rows 2000000 --batches 1000,5000,10000

Same cluster as bench/spark_bench.py (a master and one 2-core worker on 127.0.0.1, two 1-core
executors) and the same CPU accounting (microseconds of CPU per row, per group of processes).
It is the floor under the parallel source: the executor JVM's share does not depend on where
the batches come from. Not part of CI.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu import cpu_since as _cpu_since
from bench.cpu import cpu_totals as _cpu

#: the nsq source's columns
ALL = (
    "id string, body binary, timestamp timestamp, attempts int, nsqd_address string, "
    "topic string, channel string"
)


def _column(name: str, size: int) -> Any:
    """``size`` values of one of the source's columns, as the source builds them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if name == "id":
        return pa.array([b"%016x" % i for i in range(size)], pa.binary()).cast(pa.string())
    if name == "body":
        return pa.array([b"x" * 100] * size, pa.binary())
    if name == "timestamp":
        now = pa.array([time.time_ns()] * size, pa.int64())
        return pc.divide(now, 1000).cast(pa.timestamp("us", tz="UTC"))
    if name == "attempts":
        return pa.array([1] * size, pa.int32())
    value = {"nsqd_address": "127.0.0.1:4150", "topic": "topic", "channel": "spark"}[name]
    return pa.repeat(pa.scalar(value, pa.string()), size)


def _schema(options: dict[str, str]) -> str:
    columns = options.get("columns", "all")
    return ALL if columns == "all" else columns


def _batches(options: dict[str, str], names: list[str]) -> Any:
    """A partition's ``rows`` / ``partitions`` rows as ready-made batches of ``batch`` rows."""
    import pyarrow as pa

    rows = int(options["rows"]) // int(options["partitions"])
    size = int(options["batch"])
    batch = pa.RecordBatch.from_arrays([_column(name, size) for name in names], names=names)
    for _ in range(rows // size):
        yield batch


def passthrough_source() -> Any:
    """Data source ``passthrough``: option ``columns`` ("all" or a DDL subset of the source's
    columns), ``rows``, ``partitions``, ``batch`` (rows per Arrow batch)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):  # type: ignore[misc]
        def __init__(self, options: dict[str, str], names: list[str]) -> None:
            self.options = options
            self.names = names

        def partitions(self) -> list[Any]:
            n = int(self.options["partitions"])
            return [InputPartition(i) for i in range(n)]

        def read(self, partition: Any) -> Any:
            return _batches(self.options, self.names)

    class PassThrough(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "passthrough"

        def schema(self) -> str:
            return _schema(self.options)

        def reader(self, schema: Any) -> Any:
            return Reader(self.options, schema.fieldNames())

    return PassThrough


def streaming_passthrough_source() -> Any:
    """Data source ``passthrough_stream``: a streaming source whose one micro-batch is ``rows``
    rows, in ``partitions`` partitions yielding ready-made Arrow batches of ``batch`` rows of
    ``columns`` (as :func:`passthrough_source`): Spark's floor for the nsq parallel source run
    the same way (availableNow into ``noop``), its query start and closing batch included."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
        def __init__(self, options: dict[str, str], names: list[str]) -> None:
            self.options = options
            self.names = names

        def initialOffset(self) -> dict[str, int]:
            return {"batch": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
            # one batch with the rows, then the empty batch that commits it (as the nsq source)
            return {"batch": min(2, int((start or {"batch": 0})["batch"]) + 1)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            n = int(self.options["partitions"]) if end["batch"] == 1 else 0
            return [InputPartition(i) for i in range(n)] or [InputPartition(-1)]

        def read(self, partition: Any) -> Any:
            if partition.value >= 0:
                yield from _batches(self.options, self.names)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class PassThroughStream(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "passthrough_stream"

        def schema(self) -> str:
            return _schema(self.options)

        def streamReader(self, schema: Any) -> Any:
            return StreamReader(self.options, schema.fieldNames())

    return PassThroughStream


def drop_sink() -> Any:
    """Data source ``drop``: a Python Arrow writer that drops every batch (Spark's floor for a
    Python sink)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Writer(DataSourceArrowWriter):  # type: ignore[misc]
        def write(self, iterator: Any) -> Any:
            rows = 0
            for batch in iterator:
                rows += batch.num_rows
            return WriterCommitMessage()

    class Drop(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "drop"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return Writer()

    return Drop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", default="1000,10000", help="rows per Arrow batch")
    args = parser.parse_args(argv)

    from nsq_sync.testing.spark_cluster import SparkStandaloneCluster

    work = Path(tempfile.mkdtemp(prefix="spark_passthrough_"))
    with SparkStandaloneCluster(work / "spark", cores=2, memory="2g") as cluster:
        spark = cluster.session(
            "nsq_sync spark passthrough",
            **{
                "spark.cores.max": "2",
                "spark.executor.cores": "1",
                "spark.executor.memory": "900m",
            },
        )
        spark.sparkContext.setLogLevel("WARN")
        spark.dataSource.register(passthrough_source())

        def run(columns: str, batch: int, rows: int) -> tuple[float, dict[str, Any]]:
            df = (
                spark.read.format("passthrough")
                .option("rows", rows)
                .option("partitions", 2)
                .option("batch", batch)
                .option("columns", columns)
                .load()
            )
            cpu = _cpu()
            start = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - start, _cpu_since(cpu, rows)

        for columns in ("all", "body binary"):  # warm the JVMs and Python workers
            run(columns, 1000, 200_000)
        print(f"{'columns':8}{'batch':>8}{'rows/s':>12}  CPU us/row: total (per group)")
        for columns in ("all", "body binary"):
            for batch in (int(b) for b in args.batches.split(",")):
                seconds, cpu = run(columns, batch, args.rows)
                print(
                    f"{columns:8}{batch:>8}{args.rows / seconds:>12,.0f}  "
                    f"{cpu['total_us_per_row']} ({cpu['us_per_row']})",
                    flush=True,
                )
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
