"""Benchmark nsq_sync against its peers (pynsq, gnsq, nsq-py) and go-nsq's bench tools.

    scripts/bench                 # installs everything, then runs this with the project venv
    python -m bench.run --quick   # a few thousand messages per workload, well under a minute
    python -m bench.run --publish # also copy the report to docs/benchmarks.{md,png}

Every client runs in its own subprocess with its own virtualenv's python (one worker script per
client under bench/clients/), against one nsqd this script starts on 127.0.0.1. All workloads run
for every client in the same run, so the ratios in the report compare like with like. See
bench/README.md for what each workload measures and why it is set up the way it is.

Outputs: bench/results/latest.json, latest.md, latest.png (and docs/benchmarks.* with
--publish). Worker logs go to .bench/logs/.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from nsq_sync.testing import NsqdProcess, NsqlookupdProcess, find_nsq_binary

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file (python bench/run.py): make `bench` importable
    sys.path.insert(0, str(ROOT))
BENCH_DIR = ROOT / "bench"
CLIENTS_DIR = BENCH_DIR / "clients"
STATE_DIR = ROOT / ".bench"
VENVS_DIR = STATE_DIR / "venvs"
LOGS_DIR = STATE_DIR / "logs"
RESULTS_DIR = BENCH_DIR / "results"
DOCS_DIR = ROOT / "docs"

BODY_SIZE = 200
LATENCY_TAIL_S = 0.2
CONSUME_EXTRA = 5000  # messages pre-filled beyond the n a consume run counts
#: The stamp scripts/bench writes into a peer venv once its requirements installed and imported.
INSTALLED_STAMP = ".bench-installed"

#: IDENTIFY output buffering for the latency workload; every client sends the same values.
LATENCY_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"output_buffer_size": 16384, "output_buffer_timeout_ms": 250},
    "low": {"output_buffer_size": 64, "output_buffer_timeout_ms": 5},
}

MAIN_NSQD_ARGS = [
    "--mem-queue-size=10000000",  # nothing spills to disk
    "--min-output-buffer-timeout=1ms",  # nsqd 1.3.0 refuses output_buffer_timeout < 25ms otherwise
    "--log-level=info",
]
# Servers for the connection-count workloads: default queue sizes (--mem-queue-size=10000000 makes
# every topic and channel allocate an 80 MB Go channel, too much for 100 servers).
SMALL_NSQD_ARGS = ["--log-level=info"]


# ---------------------------------------------------------------------------------------------
# sizes


@dataclasses.dataclass(frozen=True)
class Sizes:
    consume_n: int
    pub_n: int
    pub_threads_n: int
    threads: int
    mpub_n: int
    batch: int
    latency_rate: int
    latency_s: float
    latency_warmup_s: float
    idle_nsqds: int
    idle_settle_s: float
    idle_window_s: float
    rss_nsqds: int
    rss_settle_s: float
    reader_runfor_s: float
    writer_runfor_s: float
    scaling_n: int
    scaling_nsqds: int
    scaling_idle_window_s: float


FULL = Sizes(
    consume_n=200_000,
    pub_n=50_000,
    pub_threads_n=80_000,
    threads=8,
    mpub_n=1_000_000,
    batch=200,
    latency_rate=5000,
    latency_s=5.0,
    latency_warmup_s=0.5,
    idle_nsqds=10,
    idle_settle_s=3.0,
    idle_window_s=20.0,
    rss_nsqds=100,
    rss_settle_s=2.0,
    reader_runfor_s=1.0,
    writer_runfor_s=2.0,
    scaling_n=100_000,
    scaling_nsqds=16,
    scaling_idle_window_s=10.0,
)

QUICK = Sizes(
    consume_n=3000,
    pub_n=1000,
    pub_threads_n=1600,
    threads=8,
    mpub_n=20_000,
    batch=200,
    latency_rate=5000,
    latency_s=1.0,
    latency_warmup_s=0.2,
    idle_nsqds=3,
    idle_settle_s=1.0,
    idle_window_s=2.0,
    rss_nsqds=5,
    rss_settle_s=0.5,
    reader_runfor_s=0.1,
    writer_runfor_s=0.3,
    scaling_n=3000,
    scaling_nsqds=4,
    scaling_idle_window_s=1.0,
)


# ---------------------------------------------------------------------------------------------
# clients


@dataclasses.dataclass(frozen=True)
class ClientSpec:
    name: str
    script: str
    venv: str | None = None  # None: the interpreter running this script (the project venv)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""

    @property
    def python(self) -> str:
        if self.venv is None:
            return sys.executable
        return str(VENVS_DIR / self.venv / "bin" / "python")

    def availability(self) -> str | None:
        """None when usable, else why not."""
        if self.venv is None:
            return None
        venv = VENVS_DIR / self.venv
        if not (venv / INSTALLED_STAMP).is_file() or not Path(self.python).exists():
            log = LOGS_DIR / f"install-{self.venv}.log"
            if log.is_file():
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                return f"not installed ({_shown(log)}: {' | '.join(tail)})"
            return f"not installed ({_shown(venv)} missing: run scripts/bench)"
        return None


CLIENTS: dict[str, ClientSpec] = {
    "nsq_sync": ClientSpec("nsq_sync", "nsq_sync_client.py", label="nsq_sync (threads)"),
    "nsq_sync-gevent": ClientSpec(
        "nsq_sync-gevent", "nsq_sync_client.py", extra={"gevent": True}, label="nsq_sync (gevent)"
    ),
    "pynsq": ClientSpec("pynsq", "pynsq_client.py", venv="pynsq", label="pynsq 0.9.1"),
    "gnsq": ClientSpec("gnsq", "gnsq_client.py", venv="gnsq", label="gnsq 1.0.2"),
    "nsq-py": ClientSpec("nsq-py", "nsqpy_client.py", venv="nsq-py", label="nsq-py 0.1.12"),
}
#: A/B in the same run: BENCH_BASELINE=<a source tree of nsq_sync> (e.g. `git archive main | tar
#: -x -C /tmp/base`) adds the client "nsq_sync-base", the same worker importing nsq_sync from
#: that tree, to the throughput workloads (see bench/README.md, "Before/after").
_BASELINE = os.environ.get("BENCH_BASELINE", "")
if _BASELINE:
    CLIENTS["nsq_sync-base"] = ClientSpec(
        "nsq_sync-base",
        "nsq_sync_client.py",
        extra={"import_path": str(Path(_BASELINE).resolve())},
        label=f"nsq_sync baseline ({_BASELINE})",
    )
GO = "go-nsq bench"
#: the single-thread PUB ceiling (bench/clients/raw_socket_client.py), shown in the GO column
RAW = ClientSpec("raw-socket", "raw_socket_client.py", label="raw Python socket")
PEERS = ("pynsq", "gnsq", "nsq-py")

#: Which clients take part in which workload (the gevent comparison is nsq_sync-gevent vs gnsq,
#: but every client runs every workload it can, for context).
WORKLOAD_CLIENTS: dict[str, tuple[str, ...]] = {
    "consume": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    "pub": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    "pub_threads": ("nsq_sync", "nsq_sync-gevent"),
    "mpub": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    "latency": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    "idle": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    "rss": ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py"),
    # nsq_sync only: how it scales with the number of nsqds (found through nsqlookupd)
    "scaling": ("nsq_sync", "nsq_sync-gevent"),
}
if _BASELINE:
    for _workload in ("consume", "pub", "pub_threads", "mpub", "latency", "scaling"):
        WORKLOAD_CLIENTS[_workload] += ("nsq_sync-base",)
WORKLOADS = ("consume", "pub", "pub_threads", "mpub", "latency", "scaling", "idle", "rss")


# ---------------------------------------------------------------------------------------------
# running a worker


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _log_path(tag: str) -> Path:
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    return LOGS_DIR / f"{safe}.log"


class Worker:
    """One client worker subprocess; its stdout/stderr go to files (never a pipe nobody reads)."""

    def __init__(self, spec: ClientSpec, job: dict[str, Any], tag: str) -> None:
        self.spec = spec
        self.job = {**job, **spec.extra}
        self.tag = tag
        self.log = _log_path(tag)
        self.out = self.log.with_suffix(".out")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # peers must not see the project's packages
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        with open(self.log, "wb") as err, open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [spec.python, str(CLIENTS_DIR / spec.script), json.dumps(self.job)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=str(ROOT),
                env=env,
                close_fds=True,
            )
        self.started = time.monotonic()

    def finish(self, timeout: float) -> dict[str, Any]:
        try:
            code = self.proc.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return self._failure(f"killed after {timeout:.0f} s (no result)")
        wall = time.monotonic() - self.started
        text = self.out.read_text(errors="replace").strip()
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            result: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, ValueError):
            return self._failure(f"exit status {code}, no JSON result")
        result["process_wall_s"] = wall
        result["log"] = _shown(self.log)
        if not result.get("ok") and "error" not in result:
            result["error"] = "worker reported ok=false"
        return result

    def _failure(self, why: str) -> dict[str, Any]:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:] if self.log else []
        return {
            "client": self.spec.name,
            "ok": False,
            "error": why,
            "stderr_tail": tail,
            "log": _shown(self.log),
        }


# ---------------------------------------------------------------------------------------------
# CPU accounting: how busy was the machine apart from this benchmark?


def _proc_stat_busy() -> float:
    with open("/proc/stat") as fh:
        fields = fh.readline().split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _pid_cpu(pid: int | None) -> float:
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _own_cpu() -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped workers and go bench tools
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


class CpuWindow:
    """Machine CPU over a run, split into ours (this script, its reaped children, our nsqds) and
    everything else (other people's processes on a shared machine: noise)."""

    def __init__(self, pids: list[int | None]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.busy0 = _proc_stat_busy()
        self.own0 = _own_cpu()
        self.pid0 = [_pid_cpu(p) for p in pids]

    def close(self) -> dict[str, float]:
        wall = max(1e-6, time.monotonic() - self.t0)
        busy = _proc_stat_busy() - self.busy0
        own = _own_cpu() - self.own0
        servers = sum(_pid_cpu(p) - c for p, c in zip(self.pids, self.pid0))
        other = max(0.0, busy - own - servers)
        return {
            "wall_s": round(wall, 3),
            "machine_busy_pct": round(100 * busy / wall, 1),
            "bench_pct": round(100 * (own + servers) / wall, 1),
            "nsqd_pct": round(100 * servers / wall, 1),
            "other_pct": round(100 * other / wall, 1),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


# ---------------------------------------------------------------------------------------------
# nsqd helpers


class Nsqd:
    """An NsqdProcess plus the HTTP calls the harness needs."""

    def __init__(self, extra_args: list[str], lookupds: list[Any] | None = None) -> None:
        self.proc = NsqdProcess(extra_args=extra_args, lookupd_tcp_addresses=lookupds or ())
        self.http = requests.Session()
        self.http.trust_env = False  # loopback only, never through a proxy

    def start(self) -> Nsqd:
        self.proc.start()
        return self

    @property
    def tcp(self) -> str:
        return self.proc.tcp_address

    @property
    def url(self) -> str:
        return self.proc.http_url

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def close(self) -> None:
        self.http.close()
        self.proc.close()

    def _post(self, path: str, **params: str) -> None:
        r = self.http.post(f"{self.url}{path}", params=params, timeout=10)
        r.raise_for_status()

    def create_topic(self, topic: str) -> None:
        self._post("/topic/create", topic=topic)

    def create_channel(self, topic: str, channel: str) -> None:
        self._post("/channel/create", topic=topic, channel=channel)

    def delete_topic(self, topic: str) -> None:
        try:
            self._post("/topic/delete", topic=topic)
        except requests.RequestException:
            pass

    def stats(self, topic: str | None = None) -> dict[str, Any]:
        params = {"format": "json"}
        if topic:
            params["topic"] = topic
        r = self.http.get(f"{self.url}/stats", params=params, timeout=10)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data.get("data", data)  # type: ignore[no-any-return]

    def topic_stats(self, topic: str) -> dict[str, Any]:
        for t in self.stats(topic).get("topics") or []:
            if t.get("topic_name") == topic:
                return t  # type: ignore[no-any-return]
        return {}

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any]:
        for c in self.topic_stats(topic).get("channels") or []:
            if c.get("channel_name") == channel:
                return c  # type: ignore[no-any-return]
        return {}

    def version(self) -> str:
        return str(self.stats().get("version", "?"))

    def fill(self, topic: str, n: int, size: int = BODY_SIZE, chunk: int = 5000) -> float:
        """Publish n bodies of ``size`` bytes via HTTP /mpub (binary), in chunks; returns seconds."""
        start = time.monotonic()
        body = b"x" * size
        item = struct.pack(">I", size) + body
        left = n
        while left > 0:
            k = min(chunk, left)
            payload = struct.pack(">I", k) + item * k
            r = self.http.post(
                f"{self.url}/mpub",
                params={"topic": topic, "binary": "true"},
                data=payload,
                timeout=30,
            )
            r.raise_for_status()
            left -= k
        return time.monotonic() - start

    def wait_channel_depth(self, topic: str, channel: str, n: int, timeout: float = 30.0) -> int:
        """Wait until the topic has handed all n messages to the channel."""
        deadline = time.monotonic() + timeout
        depth = 0
        while time.monotonic() < deadline:
            depth = int(self.channel_stats(topic, channel).get("depth", 0))
            if depth >= n:
                break
            time.sleep(0.02)
        return depth

    def wait_channel_empty(self, topic: str, channel: str, timeout: float = 3.0) -> int:
        """Messages still in the channel (queued, in flight or deferred) once it is empty or
        ``timeout`` passed. nsqd requeues a closed connection's in-flight messages, so anything
        a client did not FIN shows up here."""
        deadline = time.monotonic() + timeout
        while True:
            ch = self.channel_stats(topic, channel)
            left = sum(int(ch.get(k) or 0) for k in ("depth", "in_flight_count", "deferred_count"))
            # Settled: nothing left, or the client is gone and nsqd requeued what it held (a
            # consume run leaves the extra messages behind: no need to wait for the timeout).
            settled = not ch.get("clients") and not int(ch.get("in_flight_count") or 0)
            if left == 0 or settled or time.monotonic() >= deadline:
                return left
            time.sleep(0.02)

    def wait_ready(self, topic: str, channel: str, want: int, timeout: float) -> int:
        """Wait until the channel's clients hold RDY >= want in total (or timeout)."""
        deadline = time.monotonic() + timeout
        rdy = 0
        while time.monotonic() < deadline:
            clients = self.channel_stats(topic, channel).get("clients") or []
            rdy = sum(int(c.get("ready_count", 0)) for c in clients)
            if rdy >= want:
                break
            time.sleep(0.02)
        return rdy

    def clients_per_channel(self, topic: str) -> dict[str, int]:
        try:
            channels = self.topic_stats(topic).get("channels") or []
        except requests.RequestException:
            return {}
        return {c["channel_name"]: len(c.get("clients") or []) for c in channels}


def start_nsqds(count: int, extra_args: list[str], lookupds: list[Any] | None = None) -> list[Nsqd]:
    """Start ``count`` nsqds in parallel (each start waits for /ping)."""
    nsqds = [Nsqd(extra_args, lookupds) for _ in range(count)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: n.start(), nsqds))
    return nsqds


def consume_job(topic: str, channel: str, n: int, **source: str) -> dict[str, Any]:
    """A consume job: N messages, FIN each, max_in_flight 2500, from ``nsqd=`` or ``lookupd=``."""
    return {
        "workload": "consume",
        **source,
        "topic": topic,
        "channel": channel,
        "n": n,
        "max_in_flight": 2500,
        "body_size": BODY_SIZE,
        "timeout_s": 30 + n / 2000,
    }


def scaling_steps(most: int) -> list[int]:
    """The nsqd counts of the scaling workload: 1, 4 and ``most`` (16 in a full run)."""
    return sorted({1, min(4, most), most})


def close_nsqds(nsqds: list[Nsqd]) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: n.close(), nsqds))


def count_connections(nsqds: list[Nsqd], topic: str) -> dict[str, int]:
    """Consumer connections per channel of ``topic``, added up over the nsqds."""
    total: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for per in pool.map(lambda n: n.clients_per_channel(topic), nsqds):
            for channel, k in per.items():
                total[channel] = total.get(channel, 0) + k
    return total


# ---------------------------------------------------------------------------------------------
# the paced publisher for the latency workload


class Pacer:
    """Publishes stamped bodies at a fixed rate over one raw TCP connection (PUB, pipelined: a
    reader thread counts the OKs). The same neutral publisher feeds every client."""

    def __init__(self, address: str, topic: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"  V2")
        self.prefix = b"PUB " + topic.encode() + b"\n" + struct.pack(">I", BODY_SIZE)
        self.ok = 0
        self.errors: list[str] = []
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="pacer-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        try:
            while not self._closed:
                try:
                    data = self.sock.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    return
                buf += data
                while len(buf) >= 8:
                    size, kind = struct.unpack(">Ii", buf[:8])
                    if len(buf) < 4 + size:
                        break
                    payload, buf = buf[8 : 4 + size], buf[4 + size :]
                    if kind == 0 and payload == b"OK":
                        self.ok += 1
                    elif kind == 0 and payload == b"_heartbeat_":
                        self.sock.sendall(b"NOP\n")
                    elif kind == 1:
                        self.errors.append(payload.decode(errors="replace"))
        except OSError as exc:
            if not self._closed:
                self.errors.append(repr(exc))

    def run(self, rate: float, total: int) -> dict[str, Any]:
        """Send ``total`` messages numbered 0.. at ``rate`` per second (bounded: gives up at
        twice the planned time plus 5 s)."""
        interval = 1.0 / rate
        filler = b"x" * (BODY_SIZE - 16)
        give_up = time.monotonic() + 2 * total / rate + 5
        lag_max = 0.0
        sent = 0
        t0 = time.monotonic()
        for i in range(total):
            target = t0 + i * interval
            now = time.monotonic()
            if now < target:
                time.sleep(target - now)
            else:
                lag_max = max(lag_max, now - target)
                if now > give_up:
                    break
            self.sock.sendall(self.prefix + struct.pack(">qq", time.monotonic_ns(), i) + filler)
            sent += 1
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 5
        while self.ok + len(self.errors) < sent and time.monotonic() < deadline:
            time.sleep(0.01)
        return {
            "sent": sent,
            "acked": self.ok,
            "errors": self.errors[:5],
            "achieved_rate": sent / elapsed if elapsed > 0 else None,
            "max_lag_ms": lag_max * 1000,
        }

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(2)


# ---------------------------------------------------------------------------------------------
# the go-nsq bench tools


_OPS_RE = re.compile(r"([0-9.]+)ops/s")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu_per_message(r: dict[str, Any]) -> None:
    """Process CPU (user + system, every thread) per message, in µs, from a consume run's
    ``consume_cpu_s`` (CPU from constructing the consumer to the N-th message) and ``count``."""
    cpu, count = r.get("consume_cpu_s"), r.get("count")
    if r.get("ok") and cpu is not None and count:
        r["cpu_us_per_msg"] = 1e6 * float(cpu) / int(count)


def run_go_tool(tool: str, nsqd: Nsqd, args: list[str], timeout: float) -> dict[str, Any]:
    """Run a go-nsq bench tool against ``nsqd`` (its address and the body size are passed
    here); the result carries its rate, its CPU and the machine's CPU window."""
    window = CpuWindow([nsqd.pid])
    args = [f"--nsqd-tcp-address={nsqd.tcp}", f"--size={BODY_SIZE}", *args]
    result = _run_go_tool(tool, args, timeout)
    result["cpu_window"] = window.close()
    return result


def _run_go_tool(tool: str, args: list[str], timeout: float) -> dict[str, Any]:
    try:
        binary = find_nsq_binary(tool)
    except FileNotFoundError as exc:
        return {"client": GO, "ok": False, "error": f"{tool} not built: {exc}"}
    log = _log_path(f"{tool}")
    cpu0 = _children_cpu()  # the tool is the only child reaped meanwhile (run() waits for it)
    proc = subprocess.run(
        [binary, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )
    text = proc.stdout + proc.stderr
    log.write_text(text)
    matches = _OPS_RE.findall(text)
    match = matches[-1] if matches else None
    if proc.returncode != 0 or match is None:
        return {
            "client": GO,
            "tool": tool,
            "ok": False,
            "error": f"exit {proc.returncode}, no ops/s in output",
            "stderr_tail": text.strip().splitlines()[-5:],
        }
    line = next((ln for ln in text.splitlines() if "ops/s" in ln), "")
    return {
        "client": GO,
        "tool": tool,
        "ok": True,
        "child_cpu_s": _children_cpu() - cpu0,
        "rate": float(match),
        "output": line.strip(),
        "log": _shown(log),
    }


# ---------------------------------------------------------------------------------------------
# the harness


class Harness:
    def __init__(
        self,
        sizes: Sizes,
        clients: list[str],
        workloads: list[str],
        repeat: int = 1,
        go_tools: bool = True,
        verbose: bool = True,
    ) -> None:
        self.sizes = sizes
        self.workloads = workloads
        self.repeat = max(1, repeat)
        self.go_tools = go_tools
        self.verbose = verbose
        self.unavailable: dict[str, str] = {}
        self.clients: list[str] = []
        for name in clients:
            why = CLIENTS[name].availability()
            if why:
                self.unavailable[name] = why
            else:
                self.clients.append(name)
        self.run_id = uuid.uuid4().hex[:6]
        self.nsqd: Nsqd | None = None
        self.results: dict[str, dict[str, Any]] = {}

    # -- plumbing ---------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        if self.verbose:
            print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def topic(self, workload: str, client: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", f"b_{workload}_{client}_{self.run_id}")
        return name[:64]

    def clients_for(self, workload: str) -> list[str]:
        return [c for c in WORKLOAD_CLIENTS[workload] if c in self.clients]

    def run_worker(
        self, client: str, job: dict[str, Any], tag: str, timeout: float
    ) -> dict[str, Any]:
        assert self.nsqd is not None
        window = CpuWindow([self.nsqd.pid])
        worker = Worker(RAW if client == GO else CLIENTS[client], job, tag)
        result = worker.finish(timeout)
        result["cpu_window"] = window.close()
        return result

    def record(self, workload: str, client: str, result: dict[str, Any]) -> None:
        self.results.setdefault(workload, {})[client] = result
        if result.get("ok"):
            summary = describe(workload, result)
        else:
            summary = f"FAILED: {result.get('error')}"
        self.say(f"  {workload:<16} {client:<16} {summary}")

    @staticmethod
    def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
        """The run with the median ``key`` among the successful ones, carrying every round's
        value (``rounds``, aligned by round: None where a round failed) and their range."""
        good = [r for r in runs if r.get("ok") and r.get(key) is not None]
        if not good:
            return runs[-1]
        good.sort(key=lambda r: r[key])
        chosen = dict(good[(len(good) - 1) // 2])
        chosen["rounds"] = [r.get(key) if r.get("ok") else None for r in runs]
        chosen["range"] = [good[0][key], good[-1][key]]
        if len(runs) > 1:
            chosen["runs"] = [r.get(key) for r in runs]
        for extra in ("cpu_us_per_msg",):
            chosen[f"rounds_{extra}"] = [r.get(extra) if r.get("ok") else None for r in runs]
        return chosen

    @staticmethod
    def in_order(items: list[Any], rep: int) -> list[Any]:
        """Round ``rep``'s order: as given in even rounds, reversed in odd ones, so no client
        always goes first (or last) on a machine whose load drifts."""
        return list(items) if rep % 2 == 0 else list(reversed(items))

    # -- workloads --------------------------------------------------------------------------------

    def consume(self) -> None:
        runs: dict[str, list[dict[str, Any]]] = {}
        participants = self.clients_for("consume") + ([GO] if self.go_tools else [])
        for rep in range(self.repeat):
            for client in self.in_order(participants, rep):
                if client == GO:
                    r = self.bench_reader(rep)
                else:
                    r = self.consume_once(client, rep)
                runs.setdefault(client, []).append(r)
        for client in participants:
            self.record("consume", client, self.median_run(runs[client], "rate"))

    def consume_once(self, client: str, rep: int) -> dict[str, Any]:
        s, nsqd = self.sizes, self.nsqd
        assert nsqd is not None
        n = s.consume_n
        channel = "bench"
        topic = self.topic(f"consume{rep}", client)
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        # More than n: the clock stops at the n-th message while nsqd still has traffic
        # to send, so nobody waits for nsqd's output-buffer flush timer at the very end.
        fill = n + CONSUME_EXTRA
        fill_s = nsqd.fill(topic, fill)
        depth = nsqd.wait_channel_depth(topic, channel, fill)
        job = consume_job(topic, channel, n, nsqd=nsqd.tcp)
        r = self.run_worker(client, job, f"consume-{client}-{rep}", job["timeout_s"] + 30)
        left = nsqd.wait_channel_empty(topic, channel)
        r["fill_s"] = round(fill_s, 3)
        r["prefilled"] = depth
        r["left_in_channel"] = left
        _cpu_per_message(r)
        # Whatever the client received but did not FIN is requeued when it disconnects.
        r["verified"] = depth == fill and fill - left >= n
        if r.get("ok") and not r["verified"]:
            r["ok"] = False
            r["error"] = (
                f"channel held {depth} of {fill} messages before the run and {left} "
                f"after: fewer than {n} were FINished"
            )
        nsqd.delete_topic(topic)
        return r

    def bench_reader(self, rep: int) -> dict[str, Any]:
        """go-nsq's bench_reader on a pre-filled topic for --runfor; its rate only means
        something if the topic did not run dry, so a run that (nearly) drained it is redone
        with twice the fill (bounded), and flagged as a lower bound if it still drains."""
        s, nsqd = self.sizes, self.nsqd
        assert nsqd is not None
        fill = max(4 * s.consume_n, 20_000)
        for attempt in range(3):
            topic = self.topic(f"reader{rep}_{attempt}", "go")
            channel = "bench"
            nsqd.create_topic(topic)
            nsqd.create_channel(topic, channel)
            nsqd.fill(topic, fill)
            nsqd.wait_channel_depth(topic, channel, fill)
            r = run_go_tool(
                "bench_reader",
                nsqd,
                [
                    f"--topic={topic}",
                    f"--channel={channel}",
                    f"--runfor={s.reader_runfor_s}s",
                    "--rdy=2500",
                ],
                timeout=s.reader_runfor_s + 60,
            )
            left = nsqd.wait_channel_empty(topic, channel, timeout=0.3)
            nsqd.delete_topic(topic)
            r["prefilled"] = fill
            r["left_in_channel"] = left
            if r.get("ok") and r.get("child_cpu_s") is not None:
                # CPU of the whole tool (connection set-up included) over what it consumed
                r["consume_cpu_s"] = r["child_cpu_s"]
                r["count"] = int(r["rate"] * s.reader_runfor_s)
                _cpu_per_message(r)
            # in flight when it stops: up to RDY 2500 on each of its connections
            r["drained"] = left < max(10_000, fill // 20)
            if not r["drained"] or not r.get("ok") or fill >= 4_000_000:
                break
            fill *= 2
        if r["drained"]:
            r["note"] = "the topic ran dry before --runfor ended: the rate is a lower bound"
        return r

    def publish_once(
        self, workload: str, client: str, n: int, extra: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        nsqd = self.nsqd
        assert nsqd is not None
        topic = self.topic(f"{workload}{rep}", client)
        nsqd.create_topic(topic)
        job: dict[str, Any] = {
            "workload": workload,
            "nsqd": nsqd.tcp,
            "topic": topic,
            "n": n,
            "body_size": BODY_SIZE,
            "timeout_s": 30 + n / (1000 if workload == "pub" else 20_000),
            **extra,
        }
        r = self.run_worker(client, job, f"{workload}-{client}-{rep}", job["timeout_s"] + 30)
        count = int(nsqd.topic_stats(topic).get("message_count") or 0)
        expected = (r.get("count") or 0) + int(r.get("warmup_messages") or 0)
        r["nsqd_message_count"] = count
        r["verified"] = r.get("ok") is True and count == expected
        if r.get("ok") and not r["verified"]:
            r["ok"] = False
            r["error"] = f"nsqd counted {count} messages, expected {expected}"
        nsqd.delete_topic(topic)
        return r

    def publish_rounds(self, entries: list[tuple[str, str, int, dict[str, Any]]]) -> None:
        """Rounds over ``(workload, client, n, extra)`` entries, in alternating order; each
        (workload, client) is recorded with its median run and every round's value."""
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rep in range(self.repeat):
            for workload, client, n, extra in self.in_order(entries, rep):
                if client == "bench_writer":
                    r = self.bench_writer(rep)
                    client = GO
                else:
                    r = self.publish_once(workload, client, n, extra, rep)
                runs.setdefault((workload, client), []).append(r)
        for (workload, client), rs in runs.items():
            self.record(workload, client, self.median_run(rs, "rate"))

    def pub(self) -> None:
        """PUB one at a time (every client and the raw-socket ceiling) and 8 threads through one
        Producer, in the same rounds: the ratios compare runs made next to each other."""
        s = self.sizes
        entries = [("pub", c, s.pub_n, {}) for c in self.clients_for("pub")]
        if self.go_tools:  # the ceiling: a bare socket loop, in the GO column
            entries.append(("pub", GO, s.pub_n, {}))
        if "pub_threads" in self.workloads:
            n = s.pub_threads_n - s.pub_threads_n % s.threads
            entries += [
                ("pub_threads", c, n, {"threads": s.threads})
                for c in self.clients_for("pub_threads")
            ]
        self.publish_rounds(entries)

    def pub_threads(self) -> None:
        if "pub" in self.workloads:
            return  # measured in pub()'s rounds
        s = self.sizes
        n = s.pub_threads_n - s.pub_threads_n % s.threads
        entries = [
            ("pub_threads", c, n, {"threads": s.threads}) for c in self.clients_for("pub_threads")
        ]
        self.publish_rounds(entries)

    def mpub(self) -> None:
        s = self.sizes
        n = s.mpub_n - s.mpub_n % s.batch
        entries = [("mpub", c, n, {"batch": s.batch}) for c in self.clients_for("mpub")]
        if self.go_tools:
            entries.append(("mpub", "bench_writer", n, {}))
        self.publish_rounds(entries)

    def bench_writer(self, rep: int) -> dict[str, Any]:
        s, nsqd = self.sizes, self.nsqd
        assert nsqd is not None
        topic = self.topic(f"writer{rep}", "go")
        r = run_go_tool(
            "bench_writer",
            nsqd,
            [f"--topic={topic}", f"--batch-size={s.batch}", f"--runfor={s.writer_runfor_s}s"],
            timeout=s.writer_runfor_s + 60,
        )
        nsqd.delete_topic(topic)
        return r

    def latency(self) -> None:
        s = self.sizes
        max_in_flight = 100
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rep in range(self.repeat):
            for setting, identify in LATENCY_SETTINGS.items():
                for client in self.in_order(self.clients_for("latency"), rep):
                    r = self.latency_once(client, setting, identify, max_in_flight, rep)
                    runs.setdefault((setting, client), []).append(r)
        del s
        for (setting, client), rs in runs.items():
            self.record(f"latency_{setting}", client, self.median_run(rs, "p99_ms"))

    def latency_once(
        self, client: str, setting: str, identify: dict[str, Any], max_in_flight: int, rep: int
    ) -> dict[str, Any]:
        s, nsqd = self.sizes, self.nsqd
        assert nsqd is not None
        channel = "bench"
        expect = int(s.latency_rate * s.latency_s)
        warmup = int(s.latency_rate * s.latency_warmup_s)
        # Extra messages after the measured ones keep traffic flowing until the last measured
        # message has left nsqd's output buffer (see LatencyRecorder in clients/_common.py).
        tail = int(s.latency_rate * LATENCY_TAIL_S)
        workload = f"latency_{setting}"
        topic = self.topic(f"lat_{setting}{rep}", client)
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        job: dict[str, Any] = {
            "workload": "latency",
            "nsqd": nsqd.tcp,
            "topic": topic,
            "channel": channel,
            "expect": expect,
            "warmup": warmup,
            "max_in_flight": max_in_flight,
            "identify": identify,
            "body_size": BODY_SIZE,
            "timeout_s": s.latency_s + 25,
        }
        window = CpuWindow([nsqd.pid])
        worker = Worker(CLIENTS[client], job, f"{workload}-{client}-{rep}")
        # Every client starts at RDY 1 and raises it as messages flow; wait for the first.
        rdy = nsqd.wait_ready(topic, channel, 1, timeout=10.0)
        time.sleep(0.2)
        pacer_result: dict[str, Any] = {}
        if worker.proc.poll() is None:
            pacer = Pacer(nsqd.tcp, topic)
            try:
                pacer_result = pacer.run(s.latency_rate, expect + tail)
            finally:
                pacer.close()
        r = worker.finish(job["timeout_s"] + 10)
        r["cpu_window"] = window.close()
        r["rdy_at_start"] = rdy
        r["pacer"] = pacer_result
        r["identify"] = identify
        nsqd.delete_topic(topic)
        return r

    def scaling(self) -> None:
        """1, 4 and 16 nsqds behind one nsqlookupd: consume throughput (the topic spread evenly
        over the first k nsqds, found through lookupd) and idle CPU per connection."""
        s = self.sizes
        steps = scaling_steps(s.scaling_nsqds)
        per_max = s.scaling_n + CONSUME_EXTRA + 1000
        self.say(f"starting 1 nsqlookupd and {s.scaling_nsqds} nsqds for the scaling workload")
        lookupd = NsqlookupdProcess().start()
        nsqds: list[Nsqd] = []
        try:
            # enough memory queue for a whole fill on one nsqd, nothing like the main nsqd's 80 MB
            nsqds = start_nsqds(
                s.scaling_nsqds, [f"--mem-queue-size={per_max}", "--log-level=info"], [lookupd]
            )
            lookupd_url = lookupd.http_url
            clients = self.clients_for("scaling")
            runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
            for rep in range(self.repeat):
                for k in self.in_order(steps, rep):
                    for client in self.in_order(clients, rep):
                        r = self.scaling_consume(client, nsqds[:k], lookupd_url, rep)
                        runs.setdefault((k, client), []).append(r)
            for (k, client), rs in sorted(runs.items()):
                self.record(f"scaling_{k}", client, self.median_run(rs, "rate"))
            self.scaling_idle(clients, nsqds, steps, lookupd_url)
        finally:
            close_nsqds(nsqds)
            lookupd.close()

    def wait_lookupd(self, url: str, topic: str, want: int, timeout: float = 30.0) -> int:
        """Wait until nsqlookupd lists ``want`` nsqds for ``topic`` (bounded)."""
        deadline = time.monotonic() + timeout
        found = 0
        with requests.Session() as http:
            http.trust_env = False
            while time.monotonic() < deadline:
                try:
                    r = http.get(f"{url}/lookup", params={"topic": topic}, timeout=5)
                    if r.status_code == 200:
                        data = r.json()
                        found = len(
                            data.get("producers") or data.get("data", {}).get("producers") or []
                        )
                except (requests.RequestException, ValueError):
                    pass
                if found >= want:
                    break
                time.sleep(0.05)
        return found

    def scaling_consume(
        self, client: str, nsqds: list[Nsqd], lookupd_url: str, rep: int
    ) -> dict[str, Any]:
        s = self.sizes
        k = len(nsqds)
        n = s.scaling_n
        channel = "bench"
        topic = self.topic(f"scale{k}_{rep}", client)
        per = -(-n // k) + max(200, CONSUME_EXTRA // k)  # every nsqd has traffic at the end
        for nsqd in nsqds:
            nsqd.create_topic(topic)
            nsqd.create_channel(topic, channel)
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda x: x.fill(topic, per), nsqds))
        depth = sum(x.wait_channel_depth(topic, channel, per) for x in nsqds)
        listed = self.wait_lookupd(lookupd_url, topic, k)
        job = consume_job(topic, channel, n, lookupd=lookupd_url)
        window = CpuWindow([x.pid for x in nsqds])
        worker = Worker(CLIENTS[client], job, f"scaling{k}-{client}-{rep}")
        r = worker.finish(job["timeout_s"] + 30)
        r["cpu_window"] = window.close()
        left = sum(x.wait_channel_empty(topic, channel) for x in nsqds)
        r.update(nsqds=k, prefilled=depth, left_in_channel=left, lookupd_listed=listed)
        _cpu_per_message(r)
        r["verified"] = depth == per * k and depth - left >= n
        if r.get("ok") and not r["verified"]:
            r["ok"] = False
            r["error"] = (
                f"{k} nsqds held {depth} of {per * k} messages before the run and {left} "
                f"after: fewer than {n} were FINished"
            )
        for x in nsqds:
            x.delete_topic(topic)
        return r

    def scaling_idle(
        self, clients: list[str], nsqds: list[Nsqd], steps: list[int], lookupd_url: str
    ) -> None:
        """Idle consumers found through lookupd, one per (client, k), all at once; CPU per
        connection = CPU over the window / k."""
        s = self.sizes
        workers: dict[tuple[str, int], Worker] = {}
        for k in steps:
            topic = f"idle_scale{k}_{self.run_id}"
            for nsqd in nsqds[:k]:
                nsqd.create_topic(topic)
            self.wait_lookupd(lookupd_url, topic, k)
        window = CpuWindow([n.pid for n in nsqds])
        for client in clients:
            for k in steps:
                job: dict[str, Any] = {
                    "workload": "idle",
                    "lookupd": lookupd_url,
                    "nsqds": [n.tcp for n in nsqds[:k]],  # how many connections to wait for
                    "topic": f"idle_scale{k}_{self.run_id}",
                    "channel": f"idle_{client.replace('-', '_')}",
                    "max_in_flight": 100,
                    "settle_s": s.idle_settle_s,
                    "window_s": s.scaling_idle_window_s,
                }
                workers[(client, k)] = Worker(CLIENTS[client], job, f"scaling-idle{k}-{client}")
        batch: dict[str, float] | None = None
        for (client, k), worker in workers.items():
            timeout = (
                s.idle_settle_s + s.scaling_idle_window_s + 40 - (time.monotonic() - worker.started)
            )
            r = worker.finish(timeout)
            if batch is None and all(w.proc.poll() is not None for w in workers.values()):
                batch = window.close()
            r["cpu_window"] = batch or window.close()
            r["nsqds"] = k
            if r.get("ok") and r.get("cpu_s") is not None:
                r["cpu_ms_per_connection"] = 1000 * float(r["cpu_s"]) / k
            self.record(f"scaling_idle_{k}", client, r)

    def idle_and_rss(self) -> None:
        s = self.sizes
        want_idle = "idle" in self.workloads
        want_rss = "rss" in self.workloads
        count = max(s.idle_nsqds if want_idle else 0, s.rss_nsqds if want_rss else 0)
        self.say(f"starting {count} extra nsqds for the connection-count workloads")
        started = time.monotonic()
        nsqds = start_nsqds(count, SMALL_NSQD_ARGS)
        self.say(f"  {count} nsqds up in {time.monotonic() - started:.1f} s")
        try:
            if want_idle:
                self.idle(nsqds[: s.idle_nsqds])
            if want_rss:
                self.rss(nsqds[: s.rss_nsqds])
        finally:
            close_nsqds(nsqds)

    def idle(self, nsqds: list[Nsqd]) -> None:
        """All idle consumers run at once (an idle process does not disturb another's CPU
        count); each measures its own CPU with getrusage over the same window."""
        s = self.sizes
        topic = f"idle_{self.run_id}"
        workers: dict[tuple[str, int], Worker] = {}
        window = CpuWindow([n.pid for n in nsqds])
        for client in self.clients_for("idle"):
            for conns in sorted({len(nsqds), 1}, reverse=True):
                job: dict[str, Any] = {
                    "workload": "idle",
                    "nsqds": [n.tcp for n in nsqds[:conns]],
                    "topic": topic,
                    "channel": f"idle_{client.replace('-', '_')}_{conns}",
                    "max_in_flight": 100,
                    "settle_s": s.idle_settle_s,
                    "window_s": s.idle_window_s,
                }
                workers[(client, conns)] = Worker(CLIENTS[client], job, f"idle{conns}-{client}")
        # Count the connections nsqd sees while the workers hold them: poll until every worker's
        # channel shows its count (or the worker ended, or a deadline). A fixed settle time read
        # 0 connections on a busy machine, where a worker takes longer to start and connect.
        seen: dict[str, int] = {}
        deadline = time.monotonic() + s.idle_settle_s + s.idle_window_s + 30

        def all_seen() -> bool:
            return all(seen.get(w.job["channel"], 0) >= c for (_, c), w in workers.items())

        while time.monotonic() < deadline and not all_seen():
            if all(w.proc.poll() is not None for w in workers.values()):
                break
            for channel, k in count_connections(nsqds, topic).items():
                seen[channel] = max(seen.get(channel, 0), k)
            if not all_seen():
                time.sleep(0.05)
        results = {}
        for (client, conns), worker in workers.items():
            timeout = s.idle_settle_s + s.idle_window_s + 30 - (time.monotonic() - worker.started)
            r = worker.finish(timeout)
            r["connections_seen_by_nsqd"] = seen.get(worker.job["channel"], 0)
            if r.get("ok") and r["connections_seen_by_nsqd"] != conns:
                r["ok"] = False
                r["error"] = f"nsqd saw {r['connections_seen_by_nsqd']} connections, not {conns}"
            results[(client, conns)] = r
        batch = window.close()
        for (client, conns), r in results.items():
            r["cpu_window"] = batch
            self.record("idle_1" if conns == 1 else "idle_multi", client, r)

    def rss(self, nsqds: list[Nsqd]) -> None:
        s = self.sizes
        topic = f"rss_{self.run_id}"
        n = len(nsqds)
        workers: dict[str, Worker] = {}
        window = CpuWindow([])
        timeout = 30.0
        for client in self.clients_for("rss"):
            job = {
                "workload": "rss",
                "nsqds": [x.tcp for x in nsqds],
                "topic": topic,
                "channel": f"rss_{client.replace('-', '_')}",
                "max_in_flight": max(100, n),
                "settle_s": s.rss_settle_s,
                "hold_s": 2.0,
                "timeout_s": timeout,
            }
            workers[client] = Worker(CLIENTS[client], job, f"rss-{client}")
        # Count the connections nsqd sees while the workers hold them (bounded polling).
        seen: dict[str, int] = {}
        deadline = time.monotonic() + timeout + s.rss_settle_s + 2
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in workers.values()):
            for channel, k in count_connections(nsqds, topic).items():
                seen[channel] = max(seen.get(channel, 0), k)
            if all(seen.get(w.job["channel"], 0) >= n for w in workers.values()):
                break
            time.sleep(0.5)
        batch = window.close()
        for client, worker in workers.items():
            r = worker.finish(timeout + s.rss_settle_s + 30 - (time.monotonic() - worker.started))
            r["connections_seen_by_nsqd"] = seen.get(worker.job["channel"], 0)
            r["cpu_window"] = batch
            self.record("rss", client, r)

    # -- the whole run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        began = datetime.datetime.now(datetime.timezone.utc)
        for name, why in self.unavailable.items():
            self.say(f"{name}: {why}")
        self.say(f"clients: {', '.join(self.clients)}; workloads: {', '.join(self.workloads)}")
        self.nsqd = Nsqd(MAIN_NSQD_ARGS).start()
        self.say(f"nsqd {self.nsqd.version()} on {self.nsqd.tcp} (http {self.nsqd.url})")
        timings: dict[str, float] = {}
        try:
            steps = [
                ("consume", self.consume),
                ("pub", self.pub),
                ("pub_threads", self.pub_threads),
                ("mpub", self.mpub),
                ("latency", self.latency),
                ("scaling", self.scaling),
            ]
            for name, step in steps:
                if name in self.workloads:
                    t = time.monotonic()
                    step()
                    timings[name] = round(time.monotonic() - t, 1)
            if "idle" in self.workloads or "rss" in self.workloads:
                t = time.monotonic()
                self.idle_and_rss()
                timings["idle+rss"] = round(time.monotonic() - t, 1)
            nsqd_version = self.nsqd.version()
        finally:
            self.nsqd.close()
        total = time.monotonic() - started
        data: dict[str, Any] = {
            "meta": self.meta(began, total, nsqd_version, timings),
            "results": self.results,
        }
        from bench import report

        data["targets"] = report.evaluate_targets(data)
        return data

    def meta(
        self, began: datetime.datetime, total: float, nsqd_version: str, timings: dict[str, float]
    ) -> dict[str, Any]:
        versions: dict[str, dict[str, str]] = {}
        for per_client in self.results.values():
            for client, r in per_client.items():
                if client in CLIENTS and r.get("version"):
                    versions[client] = {
                        "version": r.get("version"),
                        "python": r.get("python"),
                        **{k: r[k] for k in ("tornado", "gevent") if k in r},
                    }
        return {
            "date": began.isoformat(timespec="seconds"),
            "total_s": round(total, 1),
            "step_s": timings,
            "sizes": dataclasses.asdict(self.sizes),
            "repeat": self.repeat,
            "body_size": BODY_SIZE,
            "nsqd_version": nsqd_version,
            "nsqd_args": MAIN_NSQD_ARGS,
            "latency_settings": LATENCY_SETTINGS,
            "clients": {
                name: {
                    "label": CLIENTS[name].label,
                    "python": CLIENTS[name].python,
                    "available": name not in self.unavailable,
                    "selected": name in self.clients or name in self.unavailable,
                    "why_not": self.unavailable.get(name),
                    **versions.get(name, {}),
                }
                for name in CLIENTS
            },
            "machine": machine_info(),
            "git": git_info(),
        }


def describe(workload: str, r: dict[str, Any]) -> str:
    if "rate" in r and r.get("rate") is not None:
        text = f"{r['rate']:,.0f} msg/s"
        low_high = r.get("range")
        if low_high and len([v for v in r.get("rounds") or [] if v is not None]) > 1:
            text += f" (rounds {low_high[0]:,.0f}–{low_high[1]:,.0f})"
        if r.get("cpu_us_per_msg") is not None:
            text += f", {r['cpu_us_per_msg']:.1f} µs CPU/msg"
        return text
    if "p99_ms" in r:
        return f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms ({r.get('samples')} samples)"
    if "cpu_percent" in r:
        return f"{r['cpu_percent']:.3f} % CPU, {r.get('connections')} connections"
    if "rss_kb" in r:
        return f"{r['rss_kb'] / 1024:.1f} MiB RSS, {r.get('connections')} connections"
    return "ok"


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain")),
    }


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("BENCH_QUICK", "") not in ("", "0"),
        help="a few thousand messages per workload (also BENCH_QUICK=1)",
    )
    p.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated subset of {', '.join(CLIENTS)}",
    )
    p.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {', '.join(WORKLOADS)}",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs of each throughput measurement, interleaved across clients; the median is "
        "kept (default: 3, or 1 with --quick)",
    )
    p.add_argument("--no-go", action="store_true", help="skip go-nsq's bench_reader/bench_writer")
    p.add_argument(
        "--publish", action="store_true", help="copy the report to docs/benchmarks.{md,png}"
    )
    p.add_argument("--no-png", action="store_true", help="skip the chart (no matplotlib needed)")
    p.add_argument("--out", default=str(RESULTS_DIR), help="results folder (default bench/results)")
    for field in dataclasses.fields(Sizes):
        p.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(getattr(FULL, field.name)),
            default=None,
            help=argparse.SUPPRESS,
        )
    args = p.parse_args(argv)
    for name in args.clients.split(","):
        if name and name not in CLIENTS:
            p.error(f"unknown client {name!r}")
    for name in args.workloads.split(","):
        if name and name not in WORKLOADS:
            p.error(f"unknown workload {name!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Sizes)
        if getattr(args, f.name) is not None
    }
    sizes = dataclasses.replace(sizes, **overrides)
    clients = [c for c in args.clients.split(",") if c]
    if _BASELINE and "nsq_sync-base" not in clients:  # the A/B is what BENCH_BASELINE asks for
        clients.append("nsq_sync-base")
    harness = Harness(
        sizes,
        clients,
        [w for w in args.workloads.split(",") if w],
        repeat=args.repeat if args.repeat is not None else (1 if args.quick else 3),
        go_tools=not args.no_go,
    )
    data = harness.run()
    data["meta"]["mode"] = "quick" if args.quick else "full"

    from bench import report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    png = None
    if not args.no_png:
        try:
            png = report.write_chart(data, out / "latest.png")
        except ImportError as exc:
            harness.say(f"no chart: {exc} (pip install matplotlib, or run scripts/bench)")
    (out / "latest.md").write_text(report.render_markdown(data, png.name if png else None))
    harness.say(f"wrote {out / 'latest.md'}, latest.json{', latest.png' if png else ''}")
    if args.publish:
        DOCS_DIR.mkdir(exist_ok=True)
        (DOCS_DIR / "benchmarks.md").write_text(
            report.render_markdown(data, "benchmarks.png" if png else None)
        )
        if png:
            shutil.copyfile(png, DOCS_DIR / "benchmarks.png")
        harness.say("published docs/benchmarks.md" + (" and docs/benchmarks.png" if png else ""))
        if report.update_table(data, DOCS_DIR / "performance.md"):
            harness.say("updated the table in docs/performance.md")
        if report.update_readme_rows(data, DOCS_DIR.parent / "README.md"):
            harness.say("updated the measured rows of README.md's comparison table")
    print(report.render_markdown(data, None))
    harness.say(f"total {data['meta']['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
