"""Django for the tests: the example shop project (examples/django_project), set up once per
pytest process with a real sqlite test database in a temporary file."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from support.nsq import wait_for, waitpid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"


def setup_django(test_db: Path) -> None:
    """Import the example's settings and create its test database (idempotent)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop_site.settings"
    os.environ["SHOP_TEST_DB"] = str(test_db)
    django.setup()
    from django.test.utils import setup_databases, setup_test_environment

    setup_test_environment()
    setup_databases(verbosity=0, interactive=False, aliases={"default"})


def migrated_shop(tmp_path: Path, **extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh sqlite database for the Django example, migrated; the database and the
    environment (``extra`` added) to run the example's manage.py or gunicorn with.

    ``manage.py migrate`` runs once per session (a Django start-up of a second or more on a
    busy machine), into a template next to the session's temporary folders; each caller gets
    a copy of it.
    """
    template = tmp_path.parent / "django-shop-template" / "shop.sqlite3"
    if not template.exists():
        template.parent.mkdir(exist_ok=True)
        building = template.with_suffix(".partial")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"],
            cwd=EXAMPLE,
            env=example_env(SHOP_DB=str(building)),
            check=True,
            timeout=120,
        )
        building.replace(template)  # only a complete migration becomes the template
    db = tmp_path / "shop.sqlite3"
    shutil.copyfile(template, db)
    return db, example_env(SHOP_DB=str(db), **extra)


def start_command(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``python ARGS...`` in ``cwd``, with its output captured."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    """Wait for ``proc`` to exit; its exit status and stderr (killed and failed after
    ``timeout`` seconds)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not exit within {timeout} s:\n{err}") from None
    return proc.returncode, err


def sigterm_when(
    proc: subprocess.Popen[str], done: Callable[[], bool], what: str, timeout: float = 60.0
) -> tuple[int, str]:
    """Once ``done()`` holds, SIGTERM ``proc``; its exit status and stderr. Kills it if the
    condition never holds or it does not exit."""
    try:
        wait_for(done, what, timeout=timeout)
        proc.send_signal(signal.SIGTERM)
        return finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def assert_left_clean(read_channel: Callable[[], dict[str, Any]]) -> None:
    """No client connected to the channel ``read_channel()`` reads (waited for: nsqd drops a
    consumer that exited only once it has read its last FINs and the close), then nothing
    queued, in flight or requeued in it."""

    def without_clients() -> dict[str, Any] | None:
        channel = read_channel()
        return channel if channel.get("clients") == [] else None

    channel = wait_for(without_clients, "the consumer's connection to leave nsqd", timeout=10.0)
    left = (channel["depth"], channel["in_flight_count"], channel["requeue_count"])
    assert left == (0, 0, 0), channel


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any]:
    """nsqd's /stats of one channel ({} when it does not exist)."""
    from nsq_sync.http import NsqdHTTPClient

    with NsqdHTTPClient(http_address) as http:
        return http.channel_stats(topic, channel) or {}


def all_answered(channel: dict[str, Any]) -> bool:
    """Everything delivered and answered: nothing queued, nothing in flight."""
    return (channel.get("depth"), channel.get("in_flight_count")) == (0, 0)


def example_env(**extra: str) -> dict[str, str]:
    """Environment for running the example's manage.py in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    return env


FLASK_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"


def in_forked_child(fn: Callable[[], dict[str, Any]], timeout: float = 30.0) -> dict[str, Any]:
    """Run ``fn`` in a forked child and return what it returned (a JSON-able dict); fail if the
    child raised or did not answer within ``timeout`` seconds."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a threaded process may deadlock: what the code under
        # test has to cope with (gunicorn, celery workers).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 2
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(fn()).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout)
        data = os.read(read_end, 65536) if ready else b""
    finally:
        os.close(read_end)
        status = waitpid(pid, timeout)  # kills it if it hangs
    assert status == 0, f"the forked child failed (exit status {status})"
    assert data, "the forked child did not answer"
    result: dict[str, Any] = json.loads(data)
    return result


def topic_publishers(http_address: str, topic: str) -> dict[str, int]:
    """nsqd's producer connections that published to ``topic``: remote address -> PUB count."""
    from support.nsq import producer_clients

    found: dict[str, int] = {}
    for client in producer_clients(http_address):
        count = sum(
            int(pc["count"]) for pc in client.get("pub_counts") or [] if pc.get("topic") == topic
        )
        if count:
            found[client["remote_address"]] = count
    return found


class WebServer:
    """A real WSGI server in a subprocess, on a free loopback port, with two workers; subclasses
    start it and say when it is ready."""

    proc: subprocess.Popen[bytes]

    def __init__(self, log: Path) -> None:
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.url = ""
        self.worker_pids: set[int] = set()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def _ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server listens and both workers booted."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.proc.args[:3]} exited ({self.proc.returncode}):\n"
                                     f"{self.log_text()}")  # fmt: skip
            return self._ready()

        try:
            wait_for(ready, "the server and its two workers", timeout=timeout, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_text()}") from None

    def get(self, path: str, **params: str) -> dict[str, Any]:
        """GET on a new connection (so the kernel may hand it to either worker)."""
        response = requests.get(
            self.url + path, params=params, headers={"Connection": "close"}, timeout=30
        )
        if response.status_code != 200:  # the server's log holds the traceback, not the page
            raise AssertionError(
                f"{response.status_code}: {response.text[:300]}\n"
                f"server log (last 6000 characters):\n{self.log_text()[-6000:]}"
            )
        result: dict[str, Any] = response.json()
        return result

    def spread(
        self,
        path: str,
        params: Callable[[int], dict[str, str]],
        n: int,
        rounds: int = 10,
        clients: int = 4,
    ) -> list[dict[str, Any]]:
        """At least ``n`` requests, ``clients`` at a time, and more (``n`` per round, at most
        ``rounds`` rounds) until both workers answered some; the answers (each with its
        ``pid``)."""
        answers: list[dict[str, Any]] = []
        with ThreadPoolExecutor(clients) as pool:
            for _ in range(rounds):
                start = len(answers)
                answers += pool.map(lambda i: self.get(path, **params(i)), range(start, start + n))
                if {a["pid"] for a in answers} >= self.worker_pids:
                    break
        return answers

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful stop), then the exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise AssertionError(f"the server did not stop:\n{self.log_text()}") from None
            return self.proc.returncode
        finally:
            self._log_file.close()


class Gunicorn(WebServer):
    """A real gunicorn serving ``app`` (``module:variable``) from ``cwd`` on a free loopback
    port, with ``--preload`` and two workers; ``worker_class`` "sync" or "gevent"."""

    def __init__(
        self,
        app: str,
        cwd: Path,
        env: dict[str, str],
        log: Path,
        worker_class: str = "sync",
        options: tuple[str, ...] = (),
    ) -> None:
        super().__init__(log)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "--preload", "-w", "2", "-k", worker_class,
                "-b", "127.0.0.1:0", "--graceful-timeout", "10",
                # a gevent worker takes every connection it can accept: two at a time leaves
                # some for the other worker
                "--worker-connections", "2",
                *options, app,
            ],
            cwd=cwd,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def _ready(self) -> bool:
        text = self.log_text()
        port = re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", text)
        pids = {int(p) for p in re.findall(r"Booting worker with pid: (\d+)", text)}
        if port and len(pids) >= 2:
            self.url = f"http://127.0.0.1:{port.group(1)}"
            self.worker_pids = pids
            return True
        return False


def uwsgi_binary() -> str | None:
    """The ``uwsgi`` of this interpreter's environment (``pip install uwsgi``), or None."""
    return shutil.which("uwsgi", path=os.path.dirname(sys.executable))


class Uwsgi(WebServer):
    """A real uWSGI with its defaults where users keep them: ``--master --processes 2``, the app
    loaded once in the master (no ``--lazy-apps``, no ``--py-call-osafterfork``), workers forked
    from C; ``--die-on-term`` so that SIGTERM stops it (gracefully: workers finish their
    requests and run ``uwsgi.atexit``). ``module`` is uWSGI's ``--module`` (``module:callable``),
    ``pythonpath`` the folders it is imported from."""

    def __init__(
        self,
        module: str,
        pythonpath: list[Path],
        env: dict[str, str],
        log: Path,
        options: tuple[str, ...] = (),
    ) -> None:
        super().__init__(log)
        binary = uwsgi_binary()
        assert binary is not None, "uwsgi is not installed"
        from support.nsq import free_closed_port

        self.url = f"http://127.0.0.1:{free_closed_port()}"
        paths = [a for p in pythonpath for a in ("--pythonpath", str(p))]
        self.proc = subprocess.Popen(
            [
                binary, "--master", "--processes", "2", "--http-socket", self.url[7:],
                "--home", sys.prefix, "--need-app", "--die-on-term", "--strict",
                "--worker-reload-mercy", "15", *paths, "--module", module, *options,
            ],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def _ready(self) -> bool:
        text = self.log_text()
        pids = {int(p) for p in re.findall(r"spawned uWSGI worker \d+ \(pid: (\d+)", text)}
        if len(pids) >= 2 and "WSGI app 0 (mountpoint='') ready" in text:
            self.worker_pids = pids
            return True
        return False
