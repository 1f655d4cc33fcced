"""A real Spark standalone cluster (a master, one worker or more) on loopback, and a Spark
Connect server on it, for tests, demos.

Each daemon has its own process group and dies with the process that started it (Linux
``PR_SET_PDEATHSIG``; the Connect server, whose JVM is a grandchild of pyspark's start script,
through a watchdog process that kills its group when the starter's pipe closes), so a killed
test run leaves no JVM behind. Needs pyspark and Java 17+; nothing is imported or started at
import time.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from nsq_sync._version import install_hint

__all__ = [
    "SparkClusterError",
    "SparkConnectServer",
    "SparkStandaloneCluster",
    "find_java",
    "spark_home",
]

_PR_SET_PDEATHSIG = 1


class SparkClusterError(RuntimeError):
    """The cluster could not start (no pyspark, no java, a daemon died or never came up)."""


def spark_home() -> Path:
    """The pyspark installation folder; raises :class:`SparkClusterError` without pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError(f"pyspark is not installed: {install_hint('spark')}")
    return Path(spec.origin).resolve().parent


def find_java() -> str:
    """Path of ``java`` (``$JAVA_HOME``'s first); raises :class:`SparkClusterError` if none."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    java = shutil.which("java")
    if java is None:
        raise SparkClusterError(
            "java not found (Spark needs Java 17+; on Debian: apt-get install "
            "openjdk-17-jre-headless)"
        )
    return java


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _spawn_group(
    argv: list[str], env: dict[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own that dies with this process (Linux), its
    output appended to ``log_path``."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: stop() still cleans up


class SparkStandaloneCluster:
    """A Spark master and one worker per ``worker_hosts`` name, on loopback. Not thread-safe.

    Args:
        work_dir: Logs and the workers' ``--work-dir`` go here.
        cores: Cores each worker offers; ``memory`` likewise, e.g. ``"2g"``.
        python: Interpreter for the Python workers (must have nsq_sync and pyarrow).
        worker_hosts: Loopback names (``127.0.0.1``, ``localhost``) make workers Spark takes
            for different hosts, where speculative copies of a task can run.
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        cores: int = 2,
        memory: str = "2g",
        python: str = sys.executable,
        worker_hosts: tuple[str, ...] = ("127.0.0.1",),
    ) -> None:
        if not worker_hosts:
            raise ValueError("worker_hosts: name at least one host")
        self.work_dir = Path(work_dir)
        self.worker_hosts = worker_hosts
        self.cores = cores
        self.memory = memory
        self.python = python
        self.master_url = ""
        self.master_web_url = ""
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def env(self) -> dict[str, str]:
        """The environment the daemons (and a driver talking to them) need."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",  # else Spark binds to the machine's external address
            PYSPARK_PYTHON=self.python,
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            # the REST submission server takes the fixed port 6066
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        java = find_java()
        env.setdefault("JAVA_HOME", str(Path(java).resolve().parent.parent))
        return env

    def start(self, timeout: float = 240.0) -> SparkStandaloneCluster:
        """Start the master, then the workers; return once the master lists them ALIVE.

        Raises:
            SparkClusterError: no pyspark or java, or a daemon exited or did not come up.
        """
        deadline = time.monotonic() + timeout
        env = self.env()
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port, web = _free_port(), _free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.master_web_url = f"http://127.0.0.1:{web}"
        try:
            self._spawn(
                "master",
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
                + ["--port", str(port), "--webui-port", str(web)],
                env,
            )
            self._wait(lambda s: s.get("status") == "ALIVE", "the master", deadline)
            for i, host in enumerate(self.worker_hosts):
                name = "worker" if i == 0 else f"worker{i + 1}"
                (self.work_dir / name).mkdir(exist_ok=True)
                self._spawn(
                    name,
                    [spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url]
                    + ["--host", host, "--port", str(_free_port())]
                    + ["--webui-port", str(_free_port()), "--cores", str(self.cores)]
                    + ["--memory", self.memory, "--work-dir", str(self.work_dir / name)],
                    env,
                )
            workers = len(self.worker_hosts)
            self._wait(
                lambda s: sum(w.get("state") == "ALIVE" for w in s.get("workers", [])) >= workers,
                "the workers" if workers > 1 else "the worker",
                deadline,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log_path = self.work_dir / f"{name}.log"
        self._logs.append(log_path)
        # its own process group: stop() kills its executors too
        self._procs.append(_spawn_group(argv, env, self.work_dir, log_path))

    def _wait(self, ready: Any, what: str, deadline: float) -> None:
        while True:
            for proc, log_path in zip(self._procs, self._logs):
                if proc.poll() is not None:
                    raise SparkClusterError(
                        f"{log_path.stem} exited with {proc.returncode}:\n{_tail(log_path)}"
                    )
            try:
                state = requests.get(self.master_web_url + "/json/", timeout=2.0).json()
                if ready(state):
                    return
            except (requests.RequestException, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SparkClusterError(f"timed out waiting for {what}:\n{_tail(self._logs[-1])}")
            time.sleep(0.25)

    @property
    def is_running(self) -> bool:
        """Whether the cluster was started and its master and every worker still run."""
        return bool(self._procs) and all(proc.poll() is None for proc in self._procs)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the workers (and their executors), then the master. Idempotent."""
        for proc in reversed(self._procs):
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # leftover executors in the group
            proc.wait()
        self._procs.clear()

    def session(self, app_name: str, **conf: str) -> Any:
        """A SparkSession on this cluster, bound to loopback, with ``conf``; sets the Spark and
        Java variables in this process's environment, where the driver JVM reads them."""
        env = self.env()
        for key in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "SPARK_HOME", "JAVA_HOME"):
            os.environ[key] = env[key]
        from pyspark.sql import SparkSession

        builder = (
            SparkSession.builder.master(self.master_url)
            .appName(app_name)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executorEnv.PYSPARK_PYTHON", self.python)
            .config("spark.ui.enabled", "false")
        )
        for key, value in conf.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(f"--- {p.name}\n{_tail(p, lines)}" for p in self._logs)


#: Run beside a Connect server (``python -c``, argument: the server's process group): waits for
#: its stdin to close, which happens when the process that started the server ends however it
#: ends, then stops the group (SIGTERM, SIGKILL after 15 s). The server's JVM is a grandchild
#: of pyspark's start script, out of reach of ``PR_SET_PDEATHSIG``.
_WATCHDOG = """
import os, signal, sys, time
group = int(sys.argv[1])
sys.stdin.buffer.read()
for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        break
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.2)
"""


class SparkConnectServer:
    """A Spark Connect server (pyspark's ``sbin/start-connect-server.sh``) on loopback, its
    application on a standalone master. Not thread-safe.

    The server runs the ``nsq`` data source's Python (planning, the driver-side source) in
    ``python``, and its executors run the same interpreter: both must have nsq_sync.

    Args:
        master_url: The ``spark://`` URL of the cluster its application runs on.
        work_dir: Its log (``connect-server.log``), ``SPARK_LOG_DIR``, ``SPARK_PID_DIR`` and
            ``spark.local.dir`` go here.
        python: Interpreter of the server's and the executors' Python workers.
        conf: Spark settings over the defaults (one 1-core executor of 512 MB, the UI off).
    """

    def __init__(
        self,
        master_url: str,
        work_dir: str | os.PathLike[str],
        *,
        python: str = sys.executable,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.master_url = master_url
        self.work_dir = Path(work_dir)
        self.python = python
        self.conf = dict(conf or {})
        self.port = 0
        self.url = ""
        self.log_path = self.work_dir / "connect-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """The environment of the server (its Python workers inherit it)."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=self.python,
            # the start script's own files, away from /tmp, where another server's would clash
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            SPARK_PID_DIR=str(self.work_dir / "pids"),
        )
        env.pop("SPARK_REMOTE", None)  # the server's own session must be a classic one
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        java = find_java()
        env.setdefault("JAVA_HOME", str(Path(java).resolve().parent.parent))
        return env

    def start(self, timeout: float = 180.0) -> SparkConnectServer:
        """Start the server; return once it accepts connections on :attr:`url`.

        Raises:
            SparkClusterError: no pyspark, java or Connect jar, or the server exited or did
                not come up within ``timeout`` (the message ends with its log's tail).
        """
        if self._proc is not None:
            raise SparkClusterError("the Spark Connect server is already started")
        deadline = time.monotonic() + timeout
        env = self.env()
        script = spark_home() / "sbin" / "start-connect-server.sh"
        if not script.exists() or not list((spark_home() / "jars").glob("spark-connect_*.jar")):
            raise SparkClusterError(f"this pyspark has no Spark Connect server ({script})")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "local").mkdir(exist_ok=True)
        self.port = int(self.conf.get("spark.connect.grpc.binding.port") or _free_port())
        self.url = f"sc://127.0.0.1:{self.port}"
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "768m",
            "spark.cores.max": "1",
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.executorEnv.PYSPARK_PYTHON": self.python,
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.local.dir": str(self.work_dir / "local"),
            **self.conf,
        }
        argv = [str(script), "--wait", "--master", self.master_url]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        # its own process group: stop() kills it whole
        self._proc = _spawn_group(argv, env, self.work_dir, self.log_path)
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self._proc.pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of the server's group, and of a terminal's Ctrl-C
        )
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise SparkClusterError(
                    f"the Spark Connect server exited with {proc.returncode}:\n"
                    f"{self._failure_report()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"timed out waiting for the Spark Connect server on {self.url}:\n"
                    f"{self._failure_report()}"
                )
            time.sleep(0.25)

    @property
    def is_running(self) -> bool:
        """Whether the server was started and still runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (its application ends and frees its executors' cores) and whatever
        is left in its process group, then its watchdog. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            # SIGTERM: the JVM's shutdown hook ends the application, which frees its cores
            _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                proc.poll()  # reap the script, the group's leader
                time.sleep(0.1)
            _signal_group(proc, signal.SIGKILL)  # whatever outlived the grace period
            proc.wait()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            assert watchdog.stdin is not None
            watchdog.stdin.close()  # the group is gone: it has nothing left to kill
            try:
                watchdog.wait(timeout)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()

    def session(self) -> Any:
        """A new Spark Connect session (``SparkSession.builder.remote(url).create()``) on this
        server; needs pyspark's ``connect`` dependencies (grpcio...) in this process. pyspark
        then marks the process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``) for good:
        remove it before a classic session is used again."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).create()

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def _failure_report(self) -> str:
        """The log's last ERROR lines (a stack trace's tail hides them), then its tail."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        errors = [line for line in text if " ERROR " in line][-5:]
        head = "errors logged:\n" + "\n".join(errors) + "\n" if errors else ""
        return f"{head}log ({self.log_path}), last lines:\n{self.log_tail(40)}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs (zombies, which an init that does not reap
    may leave behind, do not count; Linux's /proc, else any member at all)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-cluster",
        description="Run a Spark standalone master and worker on 127.0.0.1 until interrupted.",
    )
    parser.add_argument("--work-dir", help="logs and worker files (default: a temporary folder)")
    parser.add_argument("--cores", type=int, default=2, help="cores the worker offers")
    parser.add_argument("--memory", default="2g", help="memory the worker offers")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="spark-cluster-")
    cluster = SparkStandaloneCluster(work_dir, cores=args.cores, memory=args.memory)
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start()
    except SparkClusterError as exc:
        print(f"spark-cluster: {exc}", file=sys.stderr)
        return 1
    print(cluster.master_url, flush=True)
    print(
        f"spark-cluster: master {cluster.master_url} (web UI {cluster.master_web_url}), "
        f"logs in {work_dir}; Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    try:
        while not stop and cluster.is_running:
            time.sleep(0.5)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
