"""A reader's terminal for the docs' shell commands: run them as typed, with the documented
example addresses replaced by the test servers'.

One :class:`Shell` per page, like one terminal a reader keeps open: ``cd`` changes its folder for
the commands after it, on that page. Its folder starts as a temporary folder of its own and acts
as the clone: ``cd examples/flask_app`` copies that folder of the repository there first (so a
command that writes, ``manage.py migrate`` or the Flask example's ``archive.log``, writes into
the copy), and ``scripts/demo`` runs the repository's script.

What a command runs:

- ``nsq-sync ARGS``: ``python -m nsq_sync ARGS`` (this interpreter's nsq_sync);
- ``python``: this interpreter; ``gunicorn``, ``flask``, ``uwsgi``... from its environment's
  ``bin`` (first on PATH, as in an activated virtualenv: ``VIRTUAL_ENV`` is set too, which is
  how uWSGI finds the environment);
- ``nsqd``, ``nsqlookupd``: from ``$NSQ_BIN`` (or where the fixtures find them); without
  ``--tcp-address``/``--http-address`` they would listen on NSQ's default ports on every
  interface, so the shell adds the loopback addresses that stand for those defaults;
- ``curl URL``: a GET of the URL (only loopback URLs: the example addresses were replaced),
  with no proxy, whose answer must be a success;
- anything else: the program on PATH, in the shell's folder.

A command that runs until Ctrl-C (a server, a consumer with no end) is started in the
background with :meth:`Shell.start`; :meth:`Shell.stop` sends it SIGTERM (what a deployment
sends; Ctrl-C's SIGINT stops each of them the same way) and kills it after a deadline, and
:meth:`Shell.close` stops whatever is left, even when the test failed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from support.nsq import free_closed_port, wait_for

from nsq_sync.testing import find_nsq_binary

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NSQ_SYNC = [sys.executable, "-m", "nsq_sync"]
FOREGROUND_DEADLINE = 60.0  # seconds a command that ends by itself may take, then it is killed
SETUP_DEADLINE = 300.0  # the same for the clone's scripts (a first scripts/demo sets up .venv)
START_DEADLINE = 60.0  # seconds a server may take to listen (gunicorn loading Django on CI)
STOP_DEADLINE = 30.0  # seconds a SIGTERMed command may take to stop, then it is killed
WEB_EXAMPLE = "127.0.0.1:8000"  # the documented address of the example web servers
# what a copied example folder must not bring along from a developer's clone
_NOT_COPIED = shutil.ignore_patterns("__pycache__", "*.pyc", "db.sqlite3", "archive.log")


def commands(line: str) -> list[list[str]]:
    """The commands of one shell line (``a; b`` is two), each as its words, the comment
    dropped (``# ...`` outside quotes)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found: list[list[str]] = [[]]
    for word in lexer:
        if word == ";":
            found.append([])
        else:
            found[-1].append(word)
    return [words for words in found if words]


def comment(line: str) -> str:
    """The comment of a shell line (what follows a ``#`` outside quotes), or ''."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    lexer.commenters = ""
    words = list(lexer)
    return " ".join(words[words.index("#") + 1 :]) if "#" in words else ""


@dataclass(frozen=True)
class Server:
    """The addresses of one server the shell started, standing for a documented one."""

    tcp_address: str
    http_address: str

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    @staticmethod
    def on_free_ports() -> Server:
        return Server(f"127.0.0.1:{free_closed_port()}", f"127.0.0.1:{free_closed_port()}")


@dataclass(frozen=True)
class Servers:
    """An nsqlookupd and nsqds a page started itself; it has what the snippet checks and
    ``substitute`` read of a :class:`nsq_sync.testing.Cluster`."""

    lookupd: Server
    nsqds: tuple[Server, ...]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd.http_url]


class Exited(AssertionError):
    """A background command ended while it was waited for."""


class Background:
    """A command left running (a server, a consumer), its output in a log file."""

    def __init__(self, line: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path):
        self.line = line
        self.log = log
        with log.open("wb") as out:
            # a session of its own: the process group (gunicorn's or uWSGI's workers too) can
            # be killed at once if SIGTERM does not stop it
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        return f"$ {self.line}\n--- its output (last 6000 characters)\n{self.log_text()[-6000:]}"

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = START_DEADLINE) -> Any:
        """Poll ``condition`` until it holds; fail at once, with the output, when the command
        exits first (a server that refused its command line: uWSGI without a socket to serve
        on says "The -s/--socket option is missing" and exits), and after ``timeout``."""

        def holds() -> Any:
            if self.proc.poll() is not None:
                raise Exited(
                    f"exited ({self.proc.returncode}) while waiting for {what}:\n{self.describe()}"
                )
            return condition()

        try:
            return wait_for(holds, what, timeout=timeout, interval=0.05)
        except Exited:
            raise
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def stop(self) -> int:
        """SIGTERM, then its exit status; killed (with its process group) and failed if it
        does not exit within STOP_DEADLINE."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"did not stop within {STOP_DEADLINE} s of SIGTERM:\n{self.describe()}"
                ) from None
        self.kill()  # nothing of its process group outlives it (a worker a master left behind)
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@dataclass
class Done:
    """A command run to its end."""

    line: str
    returncode: int
    output: str  # stdout and stderr, as a terminal shows them

    def describe(self) -> str:
        return f"$ {self.line}: exit status {self.returncode}\n{self.output}"


@dataclass
class Shell:
    """One page's terminal. ``substitute`` replaces the documented example addresses in a
    command line; what ``env()`` returns is added to the environment of every command."""

    folder: Path
    substitute: Callable[[str], str]
    env: Callable[[], dict[str, str]] = dict
    running: list[Background] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd = self.folder
        self.web_address = f"127.0.0.1:{free_closed_port()}"
        self._logs = 0

    # ------------------------------------------------------------------ what a line runs

    def expand(self, line: str) -> str:
        """The line with the test's addresses in place of the documented ones."""
        held = line.replace(WEB_EXAMPLE, "\0web\0")  # not one of substitute's addresses
        return self.substitute(held).replace("\0web\0", self.web_address)

    def environment(self) -> dict[str, str]:
        # the suite's own NSQ_SYNC_* settings are not the reader's (Config.from_env reads them)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NSQ_SYNC_")}
        path = [str(BIN)]
        if os.environ.get("NSQ_BIN"):
            path.append(os.environ["NSQ_BIN"])
        env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
        env["VIRTUAL_ENV"] = sys.prefix  # an activated virtualenv (uWSGI's Python home)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env())
        return env

    def argv(self, words: list[str]) -> list[str]:
        program, args = words[0], words[1:]
        if program == "nsq-sync":
            return [*NSQ_SYNC, *args]
        if program == "python":
            return [sys.executable, *args]
        if "/" in program and not (self.cwd / program).exists() and (ROOT / program).exists():
            return [str(ROOT / program), *args]  # scripts/demo: the clone's script
        if program in ("nsqd", "nsqlookupd"):  # where the fixtures find them: $NSQ_BIN first
            return [find_nsq_binary(program), *args]
        found = shutil.which(program, path=self.environment()["PATH"])
        assert found, f"{program} is not installed (tox -e docs installs what the docs run)"
        return [found, *args]

    def _cd(self, words: list[str]) -> None:
        assert len(words) == 2, f"cd takes one folder: {words}"
        target = self.cwd / words[1]
        if not target.exists():
            source = ROOT / target.resolve().relative_to(self.folder.resolve())
            assert source.is_dir(), f"cd {words[1]}: no such folder here or in the repository"
            shutil.copytree(source, target, ignore=_NOT_COPIED)
        self.cwd = target.resolve()

    @staticmethod
    def _curl(words: list[str]) -> str:
        urls = [w for w in words[1:] if not w.startswith("-")]
        assert len(urls) == len(words) - 1 == 1, f"curl URL is all the docs use: {words}"
        assert urls[0].startswith("http://127.0.0.1:"), urls[0]
        with requests.Session() as http:
            http.trust_env = False  # no proxy: loopback only
            response = http.get(urls[0], timeout=30)
        assert response.ok, f"curl {urls[0]}: {response.status_code}\n{response.text[:2000]}"
        return response.text

    # ------------------------------------------------------------------ running

    def run(self, line: str) -> list[Done]:
        """Run each command of ``line`` to its end, in order; what each did."""
        done: list[Done] = []
        for words in commands(self.expand(line)):
            text = shlex.join(words)
            stdin = None
            if "|" in words:  # seq N | nsq-sync pub ...: the only pipe the docs type
                bar = words.index("|")
                assert words[:1] == ["seq"] and bar == 2, f"unsupported pipe: {text}"
                stdin = "".join(f"{i}\n" for i in range(1, int(words[1]) + 1)).encode()
                words = words[bar + 1 :]
            if words[0] == "cd":
                self._cd(words)
                done.append(Done(text, 0, ""))
            elif words[0] == "curl":
                done.append(Done(text, 0, self._curl(words)))
            else:
                argv = self.argv(words)
                setup = Path(argv[0]).is_relative_to(ROOT / "scripts")
                timeout = SETUP_DEADLINE if setup else FOREGROUND_DEADLINE
                try:
                    proc = subprocess.run(
                        argv,
                        cwd=self.cwd,
                        env=self.environment(),
                        input=stdin if stdin is not None else b"",
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        timeout=timeout,
                        check=False,
                    )
                except subprocess.TimeoutExpired as exc:
                    output = (exc.output or b"").decode(errors="replace")
                    raise AssertionError(
                        f"$ {text}: still running after {timeout} s\n{output}"
                    ) from None
                output = proc.stdout.decode(errors="replace")
                done.append(Done(text, proc.returncode, output))
        return done

    def start(self, line: str) -> Background:
        """Start the one command of ``line`` in the background."""
        found = commands(self.expand(line))
        assert len(found) == 1, f"one long-running command per line: {line}"
        argv = self.argv(found[0])
        program = found[0][0]
        if program in ("nsqd", "nsqlookupd"):
            argv += self._loopback_flags(program, found[0][1:])
        self._logs += 1
        log = self.folder / f"background-{self._logs}-{Path(program).name}.log"
        started = Background(shlex.join(found[0]), argv, self.cwd, self.environment(), log)
        self.running.append(started)
        return started

    def _loopback_flags(self, program: str, args: list[str]) -> list[str]:
        """nsqd's and nsqlookupd's listening addresses when the line leaves them at NSQ's
        defaults (every interface): the loopback addresses that stand for those defaults."""
        documented = ("127.0.0.1:4150", "127.0.0.1:4151")
        if program == "nsqlookupd":
            documented = ("127.0.0.1:4160", "127.0.0.1:4161")
        flags = []
        for flag, address in zip(("--tcp-address", "--http-address"), documented):
            if not any(a.split("=")[0] == flag for a in args):
                flags.append(f"{flag}={self.substitute(address)}")
        return flags

    def stop(self, background: Background) -> int:
        """Stop one command started here (SIGTERM); its exit status."""
        try:
            return background.stop()
        finally:
            if background in self.running:
                self.running.remove(background)

    def close(self) -> None:
        """Stop every command still running, the newest first; kill what does not stop."""
        while self.running:
            background = self.running.pop()
            try:
                background.stop()
            except AssertionError:
                pass  # killed: the test has failed already, or stop() reports it


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 (a server's /ping)."""
    try:
        with requests.Session() as http:
            http.trust_env = False
            return http.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def same_shape(shown: str, actual: str) -> bool:
    """Whether an output line has the shape of the line a page shows for a command whose
    output varies from run to run (``scripts/demo``: ports, topic names, times, rates; log
    lines: their time, message IDs): the same words, any address, message ID, number or hex
    suffix in place of the shown ones."""

    def shape(line: str) -> list[str]:
        line = re.sub(r"127\.0\.0\.1:\d+", "ADDRESS", line)
        line = re.sub(r"\b[0-9a-f]{16}\b", "ID", line)  # a message ID
        line = re.sub(r"_[0-9a-f]{8}\b", "_HEX", line)
        return re.sub(r"\d[\d,]*(\.\d+)?", "N", line).split()

    return shape(shown) == shape(actual)
