"""Profile target: one partition of the Spark parallel source, read in this process (no Spark).

    .venv/bin/python bench/profile/spark_partition.py [N]
    PYTHONPATH=/tmp/base .venv/bin/python bench/profile/spark_partition.py   # another version
    .venv/bin/py-spy record --gil --threads -r 400 -f raw -o partition.txt -- \\
        .venv/bin/python bench/profile/spark_partition.py 600000

Starts its own nsqd on 127.0.0.1 (nsq_sync.testing, ``--mem-queue-size`` large enough that
nothing spills to disk), publishes N 100-byte messages, stages to a temporary folder, and prints
the rate and this process's CPU per row for ``read_partition`` (consuming, staging each chunk
before its FINs, the Arrow batches handed on), after one small untimed read that pays the
imports (an executor's Python worker is reused across tasks). It is the executor Python
worker's share of the source without PySpark's. Needs the spark extra (pyarrow). Bounded: nsqd
and the read stop within 120 s.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from nsq_sync import Producer
from nsq_sync.spark._datasource import source_struct
from nsq_sync.spark._options import source_options
from nsq_sync.spark._partition import NsqPartition, read_partition
from nsq_sync.spark._staging import Staging
from nsq_sync.testing import NsqdProcess


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=300_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spark_partition_"))
    with NsqdProcess(work_dir=work / "nsqd", extra_args=["--mem-queue-size=10000000"]) as nsqd:
        warm = 100
        with Producer(nsqd.tcp_address) as producer:
            for _ in range(0, args.n + warm, 500):
                producer.multi_publish("t", [b"x" * 100] * 500)
        options = source_options(
            {
                "nsqd_tcp_addresses": nsqd.tcp_address,
                "nsqd_http_addresses": nsqd.http_address,
                "topic": "t",
                "channel": "c",
                "parallelism": "1",
                "staging_location": str(work / "staging"),
                "partition_timeout": "120",
            }
        )
        staging = Staging(str(work / "staging"))
        names = source_struct().fieldNames()

        def read(batch: int, rows: int) -> tuple[int, float, float]:
            staging.open_batch(batch)  # what the driver does when it plans the batch
            start, cpu = time.perf_counter(), _cpu()
            got = sum(
                b.num_rows
                for b in read_partition(NsqPartition(batch, 0, rows), options, staging, names)
            )
            return got, time.perf_counter() - start, _cpu() - cpu

        read(1, warm)  # the imports (pyarrow, the consumer's modules), as a reused worker has
        rows, seconds, cpu = read(2, args.n)
        print(
            f"{rows:,} rows in {seconds:.2f} s: {rows / seconds:,.0f} rows/s, {cpu / rows * 1e6:.2f} us of CPU per row"
        )


if __name__ == "__main__":
    main()
