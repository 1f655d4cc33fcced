"""RSS and open file descriptors of every process of the deployment, sampled every few seconds.

A process counts as flat when, between the middle third of its life and the last third, the
median of its open file descriptors did not grow and the median of its RSS grew by less than
``RSS_GROWTH`` and ``RSS_SLACK_KB`` (the first third is the warm-up: imports, caches, connection pools)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

from .deployment import Deployment

RSS_GROWTH = 0.10  # fraction...
RSS_SLACK_KB = 2048  # ... plus this: a small process (nsqd: ~11 MB) grows that much at a restart
FD_SLACK = 4  # connections come and go: a drain's, a request's
MIN_SAMPLES = 6  # a process sampled fewer times (restarted, respawned) is not judged


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Probes:
    def __init__(self, deployment: Deployment, every: float = 3.0) -> None:
        self.deployment = deployment
        self.every = every
        #: "name pid" -> [(t, rss kB, fds)]
        self.samples: dict[str, list[tuple[float, int, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-probes")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every):
                return

    def sample(self) -> None:
        now = time.time()
        for name, pid in self.deployment.processes().items():
            rss, fds = rss_kb(pid), fd_count(pid)
            if rss is not None and fds is not None:
                key = name if str(pid) in name else f"{name} {pid}"
                self.samples.setdefault(key, []).append((now, rss, fds))

    def judge(self) -> list[dict[str, Any]]:
        """Per process sampled at least MIN_SAMPLES times: RSS and fds (medians of the middle
        and last thirds of its samples) and whether they stayed flat."""
        verdicts = []
        for key, series in sorted(self.samples.items()):
            if len(series) < MIN_SAMPLES:
                continue
            third = len(series) // 3
            middle, last = series[third : 2 * third], series[2 * third :]
            rss_mid = statistics.median(s[1] for s in middle)
            rss_end = statistics.median(s[1] for s in last)
            fds_mid = statistics.median(s[2] for s in middle)
            fds_end = statistics.median(s[2] for s in last)
            verdicts.append(
                {
                    "process": key,
                    "samples": len(series),
                    "rss_kb": [int(rss_mid), int(rss_end)],
                    "fds": [int(fds_mid), int(fds_end)],
                    "flat": rss_end <= rss_mid * (1 + RSS_GROWTH) + RSS_SLACK_KB
                    and fds_end <= fds_mid + FD_SLACK,
                }
            )
        return verdicts
