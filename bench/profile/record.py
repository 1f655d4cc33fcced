"""Record the profiles kept in bench/profiles/: py-spy flame graphs (SVG) and text summaries.

    .venv/bin/pip install py-spy          # has wheels; not a dependency of nsq_sync
    .venv/bin/python bench/profile/record.py [--only consume,pub1,pub8] [--out bench/profiles]

For every target (bench/profile/consume.py and publish.py, each with its own nsqd) it runs
``py-spy record`` twice: all samples of running threads (``--threads``; a thread blocked in a
system call is idle and not sampled) and only the samples of the thread holding the GIL
(``--gil``: where the interpreter's one core goes). Each run gives a text summary (the top
functions by own and by inclusive samples, imports left out) headed by the target's rate, the
CPU of the run and the load average; the GIL run also gives an SVG flame graph (a third run,
at a lower sampling rate). Bounded: fixed message counts, 180 s per run at most.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

TARGETS: dict[str, list[str]] = {
    # consume 300k pre-filled messages, FIN each, max_in_flight 2500 (as the consume workload)
    "consume": ["bench/profile/consume.py", "300000"],
    # one thread, PUB waiting for each OK
    "pub1": ["bench/profile/publish.py", "40000"],
    # 8 threads through one Producer
    "pub8": ["bench/profile/publish.py", "80000", "--threads", "8"],
}

#: frames that are start-up, not the workload
_SKIP = ("<frozen importlib", "_find_and_load", "<module>")


def summarize(raw: Path, top: int = 25) -> str:
    """Top functions by own samples and by inclusive samples of a py-spy ``-f raw`` file (one
    ``frame;frame;... count`` line per stack), leaving out stacks that are imports."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if any(f.startswith(_SKIP) for f in frames):
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        threads[frames[0].split(":")[0]] += n
        for frame in set(frames[1:]):
            incl[frame] += n
    out = [f"{total} samples (imports left out)", "", "by own samples:"]
    out += [f"  {100 * c / max(1, total):5.1f} %  {f}" for f, c in own.most_common(top)]
    out += ["", "by inclusive samples:"]
    out += [f"  {100 * c / max(1, total):5.1f} %  {f}" for f, c in incl.most_common(top)]
    return "\n".join(out) + "\n"


def _py_spy(
    py_spy: str, rate: int, flags: list[str], fmt: str, out: Path, args: list[str]
) -> subprocess.CompletedProcess[str]:
    """``py-spy record`` of ``python args`` (bounded: 180 s)."""
    command = [py_spy, "record", "-r", str(rate), *flags, "-f", fmt, "-o", str(out)]
    return subprocess.run(
        [*command, "--", PYTHON, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def run_target(name: str, args: list[str], out: Path, py_spy: str) -> None:
    for mode in ("threads", "gil"):
        # threads: every running thread (a thread blocked in recv() is idle, not sampled);
        # gil: only the thread holding the GIL
        flags = ["--threads"] if mode == "threads" else ["--threads", "--gil"]
        base = out / f"{name}-{mode}"
        raw = base.with_suffix(".raw")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = _py_spy(py_spy, 500, flags, "raw", raw, args)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rate = next((ln for ln in proc.stdout.splitlines() if "msg/s" in ln), "no rate printed")
        header = (
            f"# {name} ({mode}): py-spy record {' '.join(flags)} -- python {' '.join(args)}\n"
            f"# {rate}; wall {wall:.1f} s (nsqd start and fill included); children CPU "
            f"{after.ru_utime - before.ru_utime:.1f} s user, "
            f"{after.ru_stime - before.ru_stime:.1f} s system; load {os.getloadavg()[0]:.2f}\n"
        )
        if proc.returncode != 0 or not raw.exists():
            (base.with_suffix(".txt")).write_text(header + proc.stderr[-2000:])
            continue
        (base.with_suffix(".txt")).write_text(header + summarize(raw))
        if mode == "gil":  # one flame graph per target (~200 KB each): where the GIL goes
            flame = _py_spy(py_spy, 200, flags, "flamegraph", base.with_suffix(".svg"), args)
            if flame.returncode != 0:
                print(f"{name}: no flame graph: {flame.stderr[-300:]}", file=sys.stderr)
        raw.unlink()
        print(f"{name} ({mode}): {rate}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--out", default=str(ROOT / "bench" / "profiles"))
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(PYTHON).parent)) or shutil.which("py-spy")
    if py_spy is None:
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        run_target(name, TARGETS[name], out, py_spy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
