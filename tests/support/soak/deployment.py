"""The soak's deployment on loopback: two nsqds and an nsqlookupd, a fault proxy in front of each
nsqd, the Flask example under uWSGI, the Django example under uWSGI and under gunicorn, and the
long-running consumer process. Every process is stopped by :meth:`Deployment.close`, whatever
failed before.

Publishers (the web apps, the cron drains) reach the nsqds through the proxies, so that cutting
every proxied connection hits them; the consumer process finds the nsqds through nsqlookupd and
reaches them directly. The Flask app prefers the first nsqd, Django the second (a Producer sticks
to the first nsqd that works), so that both nsqds take publishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nsq_sync
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess
from support.fault_proxy import FaultProxy
from support.nsq import wait_for
from support.web import EXAMPLE, FLASK_EXAMPLE, Gunicorn, Uwsgi, WebServer, migrated_shop

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests"
HERE = Path(__file__).resolve().parent

TOPIC = "soak"
DEAD_LETTER_TOPIC = "soak.dead"
WORKER_CHANNEL = "worker"  # the long-running consumer's
CRON_CHANNEL = "cron"  # the cron drains'
CHANNELS = (WORKER_CHANNEL, CRON_CHANNEL)
#: nsqd acknowledges a PUB once the message is written to its disk queue (no memory queue) and
#: syncs after every write; see docs/reliability.md for what each setting means
NSQD_ARGS = ("--mem-queue-size=0", "--sync-every=1", "--msg-timeout=30s")
CONSUMER_MAX_IN_FLIGHT = 20
THREADS_PER_WORKER = "4"


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def server_env(runtime: str, **extra: str) -> dict[str, str]:
    """The environment of a process of the deployment: this one's, with the tests' support (and
    this checkout, when nsq_sync is imported from it) on the path, without the test suite's
    runtime switch."""
    env = {k: v for k, v in os.environ.items() if k != "NSQ_SYNC_TEST_RUNTIME"}
    paths = [str(TESTS), env.get("PYTHONPATH", "")]
    if Path(nsq_sync.__file__).resolve().parents[1] == ROOT:  # this checkout's, not installed
        paths.insert(0, str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Web:
    """One web server of the deployment and the URL paths its load generator requests."""

    name: str
    server: WebServer
    paths: tuple[str, ...]  # "/publish?body={id}"-style templates, taken in turn

    @property
    def master_pid(self) -> int:
        return self.server.proc.pid

    def workers(self) -> list[int]:
        return children(self.master_pid)


@dataclass
class ConsumerProcess:
    """The long-running consumer (``support.soak.consumer_app``), restartable."""

    command: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        self.pids.append(self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM (the consumers stop gracefully), SIGKILL after ``timeout``; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


class Deployment:
    """The whole stack, in ``workdir``. ``runtime`` "threads" or "gevent": the consumer
    process's runtime and gunicorn's worker class (gthread with 4 threads, or gevent with the
    example's gunicorn_gevent.py)."""

    def __init__(self, workdir: Path, runtime: str = "threads") -> None:
        self.workdir = workdir
        self.runtime = runtime
        self.lookupd: NsqlookupdProcess | None = None
        self.nsqds: list[NsqdProcess] = []
        self.proxies: list[FaultProxy] = []
        self.webs: list[Web] = []
        self.consumer: ConsumerProcess | None = None
        self.record = workdir / "consumed.jsonl"

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lookupd = NsqlookupdProcess(work_dir=self.workdir / "nsqlookupd").start()
        for i in range(2):
            nsqd = NsqdProcess(
                lookupd_tcp_addresses=[self.lookupd],
                extra_args=NSQD_ARGS,
                work_dir=self.workdir / f"nsqd{i}",
            )
            self.nsqds.append(nsqd.start())
        self.lookupd.wait_for_nodes(self.nsqds)
        for nsqd in self.nsqds:
            with NsqdHTTPClient(nsqd.http_url) as http:
                http.create_topic(TOPIC)
                for channel in CHANNELS:  # durable from the start: each keeps every id
                    http.create_channel(TOPIC, channel)
            self.proxies.append(FaultProxy(nsqd.tcp_address))
        self._start_webs()
        self.consumer = ConsumerProcess(
            [
                sys.executable, "-m", "support.soak.consumer_app",
                f"--lookupd={self.lookupd.http_url}", f"--topic={TOPIC}",
                f"--channel={WORKER_CHANNEL}", f"--dead-letter-topic={DEAD_LETTER_TOPIC}",
                f"--record={self.record}", f"--max-in-flight={CONSUMER_MAX_IN_FLIGHT}",
                f"--runtime={self.runtime}",
            ],
            server_env(self.runtime),
            self.workdir / "consumer.log",
        )  # fmt: skip
        self.consumer.start()

    def proxied(self, order: tuple[int, ...]) -> str:
        return ",".join(self.proxies[i].address for i in order)

    def _start_webs(self) -> None:
        flask_env = server_env(
            self.runtime, NSQD_TCP_ADDRESSES=self.proxied((0, 1)), EVENTS_TOPIC=TOPIC
        )
        flask = Uwsgi(
            "flask_soak:app", [FLASK_EXAMPLE, HERE], flask_env, self.workdir / "flask-uwsgi.log",
            ("--threads", THREADS_PER_WORKER),
        )  # fmt: skip
        self.webs.append(Web("flask-uwsgi", flask, ("/publish?body={id}",)))
        django_paths = ("/soak/publish?item={id}", "/orders?item={id}")  # at once, on_commit
        for name in ("django-uwsgi", "django-gunicorn"):
            folder = self.workdir / name
            folder.mkdir(exist_ok=True)
            _, env = migrated_shop(folder, ORDERS_TOPIC=TOPIC)
            env = server_env(self.runtime, **env)
            env["NSQD_TCP_ADDRESSES"] = self.proxied((1, 0))
            env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
            log = self.workdir / f"{name}.log"
            server: WebServer
            if name == "django-uwsgi":
                server = Uwsgi(
                    "django_soak:application", [EXAMPLE, HERE], env, log,
                    ("--threads", THREADS_PER_WORKER),
                )  # fmt: skip
            else:
                if self.runtime == "gevent":
                    # the example's config: it patches the master before --preload loads Django,
                    # whose thread-locals greenlets would otherwise share (docs/django.md)
                    worker_class, options = "gevent", ("-c", "gunicorn_gevent.py")
                else:
                    worker_class, options = "gthread", ("--threads", THREADS_PER_WORKER)
                server = Gunicorn(
                    "django_soak:application", EXAMPLE, env, log, worker_class,
                    (*options, "--worker-connections", "100"),
                )  # fmt: skip
            self.webs.append(Web(name, server, django_paths))
        for web in self.webs:
            web.server.wait_ready(timeout=120.0)

    # ------------------------------------------------------------------ processes

    def processes(self) -> dict[str, int]:
        """Every live process of the deployment: a name -> pid."""
        found: dict[str, int] = {}
        if self.lookupd is not None and self.lookupd.pid is not None:
            found["nsqlookupd"] = self.lookupd.pid
        for i, nsqd in enumerate(self.nsqds):
            if nsqd.is_running and nsqd.pid is not None:
                found[f"nsqd{i}"] = nsqd.pid
        for web in self.webs:
            if web.server.proc.poll() is None:
                found[f"{web.name}-master"] = web.master_pid
                for pid in web.workers():
                    found[f"{web.name}-worker-{pid}"] = pid
        if self.consumer is not None and self.consumer.pid is not None:
            found["consumer"] = self.consumer.pid
        return found

    def wait_web_workers(self, web: Web, timeout: float = 60.0) -> list[int]:
        """Wait until ``web``'s master has its two workers again (after one was killed)."""
        return wait_for(
            lambda: w if len(w := web.workers()) >= 2 else None,
            f"{web.name}'s two workers",
            timeout=timeout,
            interval=0.05,
        )

    # ------------------------------------------------------------------ stop

    def close(self) -> list[str]:
        """Stop everything (each step even if one before failed); what went wrong."""
        problems: list[str] = []

        def attempt(what: str, fn: object) -> None:
            try:
                fn()  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 - every process must be stopped
                problems.append(f"{what}: {exc!r}")

        for nsqd in self.nsqds:  # a stalled nsqd must not keep everything waiting
            if nsqd.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(nsqd.pid, signal.SIGCONT)
        for web in self.webs:
            attempt(f"stop {web.name}", lambda web=web: self._stop_web(web, problems))
        if self.consumer is not None:
            attempt("stop the consumer", self.consumer.stop)
        for proxy in self.proxies:
            attempt("close a proxy", proxy.close)
        for nsqd in self.nsqds:
            attempt(f"close {nsqd!r}", nsqd.close)
        if self.lookupd is not None:
            attempt("close nsqlookupd", self.lookupd.close)
        return problems

    @staticmethod
    def _stop_web(web: Web, problems: list[str]) -> None:
        status = web.server.stop()
        if status != 0:
            problems.append(f"{web.name} exited with status {status}")
