"""The cron-style drains: every ``every`` seconds (once the previous run ended), ``nsq-sync
drain`` empties the ``cron`` channel of the soak's topic through the fault proxies, writing each
message as a JSON line to a file of its own, and exits once idle. Each run's start, end, exit
status and the tail of its stderr are kept."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .deployment import CRON_CHANNEL, ROOT, TOPIC, Deployment, server_env

MAX_IN_FLIGHT = 20
RUN_LIMIT = 3.0  # seconds: a run's --timeout


@dataclass
class DrainRun:
    n: int
    t0: float
    t1: float
    status: int
    output: str
    stderr_tail: str


class Drains:
    def __init__(self, deployment: Deployment, every: float = 5.0) -> None:
        self.deployment = deployment
        self.every = every
        self.runs: list[DrainRun] = []
        self.folder = deployment.workdir / "drains"
        self.folder.mkdir(exist_ok=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-cron")
        self._current: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def run_once(self, idle_timeout: float = 1.0, timeout: float = RUN_LIMIT) -> DrainRun:
        """One ``nsq-sync drain`` run to its end: idle for ``idle_timeout`` seconds, or
        ``timeout`` seconds after it started (a cron job's time limit: under a steady load the
        channel is never idle)."""
        n = len(self.runs)
        output = self.folder / f"drain-{n:05d}.jsonl"
        command = [
            sys.executable, "-m", "nsq_sync", "drain", TOPIC, CRON_CHANNEL,
            *(a for p in self.deployment.proxies for a in ("--nsqd-tcp-address", p.address)),
            "--format", "json", "-o", str(output), "--idle-timeout", str(idle_timeout),
            "--timeout", str(timeout), "--max-in-flight", str(MAX_IN_FLIGHT),
        ]  # fmt: skip
        t0 = time.time()
        proc = subprocess.Popen(
            command,
            env=server_env("threads"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _, err = proc.communicate(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        run = DrainRun(
            n, t0, time.time(), proc.returncode, str(output), err.decode(errors="replace")[-2000:]
        )
        self.runs.append(run)
        return run

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            self._stop.wait(max(0.0, self.every - (time.monotonic() - started)))

    def records(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.runs]

    def consumed(self) -> list[dict[str, Any]]:
        """Every message any run wrote: ``{"id": soak id, "msg": nsqd id, "attempts", "run"}``."""
        found = []
        for run in self.runs:
            path = Path(run.output)
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                message = json.loads(line)
                body = message["body"]
                ident = json.loads(body)["item"] if body.startswith("{") else body
                found.append(
                    {
                        "id": ident,
                        "msg": message["id"],
                        "attempts": message["attempts"],
                        "run": run.n,
                        "t": run.t1,
                    }
                )
        return found
