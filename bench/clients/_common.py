"""Helpers shared by the per-client worker scripts.

Standard library only, and plain Python 3.7+ syntax: the same file is imported by workers that run
in every peer's own virtualenv (see scripts/bench), so it must not import nsq_sync or anything
installed.

A worker reads one JSON job (argv[1], or stdin when argv[1] is absent or "-"), runs it and prints
one JSON object as the LAST line of stdout. Anything else goes to stderr.
"""

import json
import math
import os
import resource
import struct
import sys
import time
import traceback

BODY_SIZE = 200
_STAMP = struct.Struct(">qq")  # monotonic_ns, sequence number


def read_job():
    if len(sys.argv) > 1 and sys.argv[1] != "-":
        text = sys.argv[1]
    else:
        text = sys.stdin.read()
    return json.loads(text)


def emit(result):
    sys.stdout.write("\n" + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def body(size=BODY_SIZE):
    return b"x" * size


def stamped_body(seq, size=BODY_SIZE):
    """A body that starts with time.monotonic_ns() and a sequence number (CLOCK_MONOTONIC is
    system-wide on Linux, so a stamp made in another process on this machine can be compared)."""
    return _STAMP.pack(time.monotonic_ns(), seq) + b"x" * (size - _STAMP.size)


def percentile(sorted_values, q):
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(math.ceil(q / 100.0 * len(sorted_values))) - 1))
    return sorted_values[k]


class LatencyRecorder:
    """Latency of stamped messages with sequence numbers in [warmup, expect).

    The paced publisher sends ``expect`` measured messages and then a tail of extra ones, so
    that the last measured messages are pushed out of nsqd's output buffer by traffic (as in
    steady state) rather than by the buffer's flush timer when the publisher stops. Messages
    before ``warmup`` (RDY ramp-up, connection set-up) are received but not counted.
    """

    def __init__(self, expect, warmup):
        self.expect = expect
        self.warmup = warmup
        self.latencies = []
        self.received = 0
        self.measured_seen = 0

    def add(self, message_body):
        """Record one message; True once every message below ``expect`` has been seen."""
        now = time.monotonic_ns()
        sent, seq = _STAMP.unpack_from(message_body)
        self.received += 1
        if seq < self.expect:
            self.measured_seen += 1
            if seq >= self.warmup:
                self.latencies.append(now - sent)
        return self.measured_seen >= self.expect

    @property
    def done(self):
        return self.measured_seen >= self.expect

    def summary(self):
        """p50/p90/p99/max in milliseconds."""
        samples = sorted(self.latencies)
        out = {
            "samples": len(samples),
            "received": self.received,
            "warmup_discarded": self.warmup,
            "expected": self.expect,
        }
        if samples:
            for name, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("p999_ms", 99.9)):
                out[name] = percentile(samples, q) / 1e6
            out["max_ms"] = samples[-1] / 1e6
            out["mean_ms"] = sum(samples) / len(samples) / 1e6
        return out


def cpu_seconds():
    """User + system CPU of this process (all threads), from getrusage."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_kb():
    """Current resident set size in KiB (VmRSS from /proc/self/status)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def thread_count():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def base_result(job, client, version):
    return {
        "client": client,
        "version": version,
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
        "workload": job.get("workload"),
        "pid": os.getpid(),
        "ok": False,
    }


def rate_result(result, count, elapsed):
    result["count"] = count
    result["elapsed_s"] = elapsed
    result["rate"] = count / elapsed if elapsed > 0 else None
    return result


def main(run, client, version_fn, job=None):
    """Run ``run(job, result)``; report a traceback as ``error`` instead of crashing."""
    if job is None:
        job = read_job()
    try:
        version = version_fn()
    except Exception:  # pragma: no cover - only when the package is broken
        version = "?"
    result = base_result(job, client, version)
    try:
        run(job, result)
    except BaseException as exc:  # noqa: BLE001 - reported to the orchestrator, never silent
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    emit(result)
    sys.stdout.flush()
    sys.stderr.flush()
    # Peer libraries may leave non-daemon threads or loops behind; the result is out, so leave.
    os._exit(0)


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def remaining(self):
        return max(0.0, self.end - time.monotonic())

    def expired(self):
        return time.monotonic() >= self.end
