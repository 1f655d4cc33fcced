"""Instructions per operation in the client process, counted by callgrind: load-independent.

    .venv/bin/python bench/profile/instructions.py [--only nsq_sync] [--out bench/profiles/instructions.txt]

Timings on a shared 2-core machine drift with everyone else's load; instruction counts do not.
For each client and operation (one PUB waiting for its OK; consuming a message, FIN included) it
runs the worker (bench/profile/_ir_worker.py) under ``valgrind --tool=callgrind`` twice, with N1
and N2 operations, against its own nsqd (not under valgrind), and reports
``(Ir(N2) - Ir(N1)) / (N2 - N1)``: the user-space instructions one more operation costs the client,
start-up and set-up cancelled out. The kernel's side (system calls, scheduling) is not counted:
what a syscall costs shows in the benchmark's CPU figures instead. Peers run from their
benchmark virtualenvs (`.bench/venvs/<peer>`, made by scripts/bench); a missing one is skipped.
Topics for consumption are filled through nsqd's HTTP /mpub by this process, outside valgrind.

``--metrics`` measures the cost of nsq_sync.metrics instead, in the same run: nsq_sync with
metrics off, with Prometheus on and with OpenTelemetry on (the SDK, in memory), and with
``--baseline DIR`` (a tree holding another version's ``nsq_sync/``, e.g. from ``git archive``)
that version with metrics off, so "off" can be compared with before.

The breakdown by C function (``--functions``) shows where the interpreter spends them (the
evaluation loop, allocation, attribute lookups, the garbage collector...).
Bounded: each valgrind run has 900 s at most.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from nsq_sync.testing import NsqdProcess

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "_ir_worker.py"
BODY = b"x" * 200
CHUNK = 5000

#: (client, operation, N1, N2): small enough for valgrind's ~50x slow-down
TARGETS = [
    ("raw", "pub", 1000, 3000),
    ("nsq_sync", "pub", 1000, 3000),
    ("nsq-py", "pub", 1000, 3000),
    ("nsq_sync", "consume", 10_000, 30_000),
    ("nsq-py", "consume", 10_000, 30_000),
]


#: --metrics: nsq_sync with metrics off (and the --baseline tree's), Prometheus on, OTel on
METRICS_TARGETS = [
    (client, op, n1, n2)
    # (consume: fewer messages than TARGETS, as the OpenTelemetry SDK's ~0.5M instructions
    # per message under valgrind's slow-down would take an hour for 30k; multiples of CHUNK)
    for op, n1, n2 in (("pub", 1000, 3000), ("consume", 5000, 10_000))
    for client in ("nsq_sync-base", "nsq_sync", "nsq_sync+prometheus", "nsq_sync+otel")
]

#: --baseline DIR: what nsq_sync-base imports
BASELINE: Path | None = None


def interpreter(client: str) -> str | None:
    if client == "nsq_sync-base" and BASELINE is None:
        return None
    if client in ("nsq_sync", "raw") or client.startswith("nsq_sync"):
        return sys.executable
    venv = ROOT / ".bench" / "venvs" / client / "bin" / "python"
    return str(venv) if venv.exists() else None


def fill(http_address: str, topic: str, n: int) -> None:
    """Create ``topic`` with channel "ch" and exactly ``n`` messages (n a multiple of CHUNK)."""
    base = f"http://{http_address}"
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=ch"):
        urllib.request.urlopen(urllib.request.Request(base + path, method="POST"), timeout=30)
    payload = struct.pack(">l", CHUNK) + (struct.pack(">l", len(BODY)) + BODY) * CHUNK
    for _ in range(n // CHUNK):
        request = urllib.request.Request(
            f"{base}/mpub?topic={topic}&binary=true", data=payload, method="POST"
        )
        urllib.request.urlopen(request, timeout=30).read()


def callgrind(python: str, args: list[str], out: Path) -> None:
    root = BASELINE if args[0] == "nsq_sync-base" and BASELINE is not None else ROOT
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, str(WORKER), *args],
        check=True,
        capture_output=True,
        timeout=900,
        env=env,
    )


def by_function(path: Path) -> collections.Counter[str]:
    """Instructions per C function of one callgrind output."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S+?:(\S+)", line)
        if match:
            counts[match.group(2)] += int(match.group(1).replace(",", ""))
    return counts


def measure(
    nsqd: NsqdProcess, client: str, op: str, n1: int, n2: int, work: Path
) -> collections.Counter[str] | None:
    python = interpreter(client)
    if python is None:
        return None
    runs = []
    for n in (n1, n2):
        topic = f"ir_{uuid.uuid4().hex[:10]}"
        if op == "consume":
            fill(nsqd.http_address, topic, n)
        out = work / f"{client}-{op}-{n}.out"
        callgrind(python, [client, op, str(n), nsqd.tcp_address, topic], out)
        runs.append(by_function(out))
    per_op: collections.Counter[str] = collections.Counter()
    for name in runs[0].keys() | runs[1].keys():
        per_op[name] = round((runs[1][name] - runs[0][name]) / (n2 - n1))
    return per_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated clients (raw, nsq_sync, nsq-py)")
    parser.add_argument("--functions", type=int, default=12, help="C functions listed per row")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--metrics", action="store_true", help="the cost of nsq_sync.metrics")
    parser.add_argument("--baseline", type=Path, help="with --metrics: another tree to compare")
    args = parser.parse_args()
    global BASELINE
    BASELINE = args.baseline
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        sys.exit("valgrind (with callgrind_annotate) is needed: apt-get install valgrind")
    only = set(args.only.split(",")) if args.only else None
    lines = [
        f"# python bench/profile/instructions.py   ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())},"
        f" Python {sys.version.split()[0]}; callgrind, user-space instructions in the client"
        " process per operation)",
    ]
    totals: dict[tuple[str, str], int] = {}
    with (
        NsqdProcess(extra_args=["--mem-queue-size=10000000"]) as nsqd,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for client, op, n1, n2 in METRICS_TARGETS if args.metrics else TARGETS:
            if only is not None and client not in only:
                continue
            per_op = measure(nsqd, client, op, n1, n2, Path(tmp))
            if per_op is None:
                lines.append(
                    f"{op:8} {client:9} (not installed: scripts/bench makes .bench/venvs/{client})"
                )
                continue
            total = sum(per_op.values())
            totals[client, op] = total
            lines.append(f"{op:8} {client:9} {total:8,} instructions per operation")
            for name, count in per_op.most_common(args.functions):
                lines.append(f"    {count:7,}  {name}")
    for op in ("pub", "consume"):
        ours, peer = totals.get(("nsq_sync", op)), totals.get(("nsq-py", op))
        if ours and peer:
            lines.append(f"{op}: nsq_sync / nsq-py = {ours / peer:.2f}")
        for other in ("nsq_sync-base", "nsq_sync+prometheus", "nsq_sync+otel"):
            theirs = totals.get((other, op))
            if ours and theirs:
                lines.append(f"{op}: {other} / nsq_sync (metrics off) = {theirs / ours:.3f}")
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
