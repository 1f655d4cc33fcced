"""Instructions per row of one Spark source partition's read, counted by callgrind.

    .venv/bin/python bench/profile/spark_partition_ir.py [--rows 20000 60000] [--tree DIR]
        [--columns id,body]

Load-independent where bench/profile/spark_partition.py's timings drift with the machine's
load: it starts its own nsqd on 127.0.0.1 (not under valgrind, ``--mem-queue-size`` large
enough that nothing spills to disk), fills two topics with N1 and N2 100-byte messages, and
reads each with ``read_partition`` (consuming, Arrow, staging, FINs) in a Python process run
under ``valgrind --tool=callgrind``, after one 100-row read that pays the imports; it reports
``(Ir(N2) - Ir(N1)) / (N2 - N1)``. ``--tree`` reads another version's ``nsq_sync/`` (e.g. from
``git archive``) to compare. Threads run one at a time under valgrind, so batch sizes differ
from a real run's: differences of a few percent between runs of the same code are noise.
Bounded: each valgrind run has 1800 s at most.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def read(tcp: str, http: str, topic: str, rows: int, columns: str | None) -> None:
    """The process under valgrind: a warm-up read, then one partition of ``rows`` rows."""
    from nsq_sync.spark._datasource import source_struct
    from nsq_sync.spark._options import source_options
    from nsq_sync.spark._partition import NsqPartition, read_partition
    from nsq_sync.spark._staging import Staging

    work = Path(tempfile.mkdtemp(prefix="partition_ir_"))
    options = source_options(
        {
            "nsqd_tcp_addresses": tcp,
            "nsqd_http_addresses": http,
            "topic": topic,
            "channel": "c",
            "parallelism": "1",
            "staging_location": str(work / "staging"),
            "partition_timeout": "600",
            "drain_idle_timeout": "30",
        }
    )
    staging = Staging(str(work / "staging"))
    names = columns.split(",") if columns else source_struct().fieldNames()
    for batch, count in ((1, 100), (2, rows)):
        staging.open_batch(batch)
        partition = NsqPartition(batch, 0, count)
        got = sum(b.num_rows for b in read_partition(partition, options, staging, names))
        if got != count:
            raise SystemExit(f"read {got} rows, expected {count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs=2, default=(20_000, 60_000))
    parser.add_argument("--tree", default=str(ROOT), help="the folder holding nsq_sync/")
    parser.add_argument("--columns", default=None, help="comma-separated (default: all seven)")
    parser.add_argument("--read", nargs=4, help=argparse.SUPPRESS)  # the process under valgrind
    args = parser.parse_args()
    if args.read:
        tcp, http, topic, rows = args.read
        read(tcp, http, topic, int(rows), args.columns)
        return

    from nsq_sync import Producer
    from nsq_sync.testing import NsqdProcess

    work = Path(tempfile.mkdtemp(prefix="partition_ir_"))
    n1, n2 = args.rows
    env = dict(os.environ, PYTHONPATH=args.tree)
    extra = ["--columns", args.columns] if args.columns else []

    def instructions(nsqd: NsqdProcess, topic: str, rows: int) -> int:
        out = work / f"callgrind.{topic}"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                *extra,
                "--read",
                nsqd.tcp_address,
                nsqd.http_address,
                topic,
                str(rows),
            ],
            check=True,
            env=env,
            stderr=subprocess.DEVNULL,
            timeout=1800,
        )
        found = re.search(r"^summary:\s*(\d+)", out.read_text(errors="replace"), re.M)
        assert found is not None, f"no summary line in {out}"
        return int(found.group(1))

    with NsqdProcess(work_dir=work / "nsqd", extra_args=["--mem-queue-size=10000000"]) as nsqd:
        with Producer(nsqd.tcp_address) as producer:
            for topic, count in (("a", n1 + 100), ("b", n2 + 100)):
                for i in range(0, count, 500):
                    producer.multi_publish(topic, [b"x" * 100] * min(500, count - i))
        a, b = instructions(nsqd, "a", n1), instructions(nsqd, "b", n2)
    print(f"{args.tree}: {(b - a) / (n2 - n1):,.0f} instructions per row (Ir {a:,} / {b:,})")


if __name__ == "__main__":
    main()
