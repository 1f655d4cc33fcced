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

from bench.spark_bench import _cpu, _cpu_since

_COLUMNS = (
    "id string, body binary, timestamp timestamp, attempts int, nsqd_address string, "
    "topic string, channel string"
)


def _data_source() -> Any:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):  # type: ignore[misc]
        def __init__(self, options: dict[str, str]) -> None:
            self.options = options

        def partitions(self) -> list[Any]:
            n = int(self.options["partitions"])
            return [InputPartition(i) for i in range(n)]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa
            import pyarrow.compute as pc

            rows = int(self.options["rows"]) // int(self.options["partitions"])
            size = int(self.options["batch"])
            body = pa.array([b"x" * 100] * size, pa.binary())
            if self.options["columns"] == "body":
                batch = pa.RecordBatch.from_arrays([body], names=["body"])
            else:

                def repeat(value: str) -> Any:
                    return pa.DictionaryArray.from_arrays(
                        pa.array([0] * size, pa.int32()), pa.array([value])
                    ).cast(pa.string())

                ids = pa.array([b"%016x" % i for i in range(size)], pa.binary()).cast(pa.string())
                now = pa.array([time.time_ns()] * size, pa.int64())
                batch = pa.RecordBatch.from_arrays(
                    [
                        ids,
                        body,
                        pc.divide(now, 1000).cast(pa.timestamp("us", tz="UTC")),
                        pa.array([1] * size, pa.int32()),
                        repeat("127.0.0.1:4150"),
                        repeat("topic"),
                        repeat("spark"),
                    ],
                    names=[c.split()[0] for c in _COLUMNS.split(", ")],
                )
            for _ in range(rows // size):
                yield batch

    class PassThrough(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "passthrough"

        def schema(self) -> str:
            return "body binary" if self.options.get("columns") == "body" else _COLUMNS

        def reader(self, schema: Any) -> Any:
            return Reader(self.options)

    return PassThrough


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
        spark.dataSource.register(_data_source())

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

        for columns in ("source", "body"):  # warm the JVMs and Python workers
            run(columns, 1000, 200_000)
        print(f"{'columns':8}{'batch':>8}{'rows/s':>12}  CPU us/row: total (per group)")
        for columns in ("source", "body"):
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
