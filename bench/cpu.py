"""CPU accounting for the Spark benchmarks: CPU seconds of every process taking part, by group
(nsqd, the Spark JVMs and their JIT compilers, the Python workers, the plain clients), read from
Linux's /proc. Used by bench/spark_bench.py and bench/spark_passthrough.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["cpu_since", "cpu_totals"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _group(cmdline: str, under_executor: bool) -> str | None:
    """Which part of the run a process is, from its command line and whether an executor JVM
    is among its ancestors (None: not ours)."""
    if "nsqd" in cmdline.split(" ", 1)[0]:
        return "nsqd"
    if "CoarseGrainedExecutorBackend" in cmdline:
        return "executor JVMs"
    if "deploy.master.Master" in cmdline or "deploy.worker.Worker" in cmdline:
        return "master and worker JVMs"
    if "org.apache.spark" in cmdline:
        return "driver JVM"
    if "pyspark" in cmdline:  # Python started by a JVM: an executor's, or the driver's
        return "executor Python workers" if under_executor else "driver Python runners"
    return None


_JIT = "JIT compilers (of all JVMs)"


def _jit_cpu(pid: int) -> float:
    """CPU seconds of a JVM's live C1/C2 compiler threads (its JIT: most of it happens while
    the JVM is new, so it is a start-up cost that a long-running application pays once)."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if "Compiler" in name:  # "C2 CompilerThre", "C1 CompilerThre" (15 characters)
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def cpu_totals() -> dict[str, float]:
    """CPU seconds used so far by each group of this process's live descendants (Linux /proc:
    nsqd, the Spark cluster, the driver JVM and their Python workers), plus this process
    ("bench and driver Python") and its waited-for children ("plain client")."""
    me = os.getpid()
    procs: dict[int, tuple[int, str, float]] = {}  # pid -> (ppid, command line, cpu seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        procs[int(entry)] = (int(fields[1]), cmdline, cpu)
    totals: dict[str, float] = {}
    for pid, (_, cmdline, cpu) in procs.items():
        ancestor, hops, under_executor = procs[pid][0], 0, False
        while ancestor not in (me, 0, 1) and ancestor in procs and hops < 64:
            under_executor = under_executor or "CoarseGrainedExecutorBackend" in procs[ancestor][1]
            ancestor, hops = procs[ancestor][0], hops + 1
        group = _group(cmdline, under_executor)
        if ancestor == me and pid != me and group is not None:
            if "JVM" in group:  # what its JIT compilers spent: a start-up cost, told apart
                jit = _jit_cpu(pid)
                totals[_JIT] = totals.get(_JIT, 0.0) + jit
                cpu -= jit
            totals[group] = totals.get(group, 0.0) + cpu
    own = os.times()
    totals["bench and driver Python"] = own.user + own.system
    totals["plain client"] = own.children_user + own.children_system
    return totals


def cpu_since(before: dict[str, float], rows: int) -> dict[str, Any]:
    """CPU used since ``before``, per group, in microseconds per row (and the total)."""
    after = cpu_totals()
    used = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    per_row = {k: round(v / rows * 1e6, 2) for k, v in sorted(used.items()) if v > 0.005}
    return {"us_per_row": per_row, "total_us_per_row": round(sum(used.values()) / rows * 1e6, 2)}
