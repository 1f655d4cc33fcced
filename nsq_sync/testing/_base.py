"""The base of the server processes: launch, readiness, logs, stop and restart.

Ports are the kernel's choice (``127.0.0.1:0``), read back from the server's INFO log lines, so
parallel runs never collide. Output goes to a log file, never a pipe (a full pipe nobody reads
would block the server). Every wait is bounded. Only the standard library and ``requests`` are
used, nothing else from ``nsq_sync``, so the harness works while the library under test is broken.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Union

import requests

from nsq_sync.testing._binaries import find_nsq_binary

if TYPE_CHECKING:
    from collections.abc import Sequence

    from typing_extensions import Self

StrPath = Union[str, "os.PathLike[str]"]

#: How long ``start()`` and ``restart()`` wait for a server to answer ``/ping`` by default.
DEFAULT_START_TIMEOUT = 15.0
#: How long ``stop()`` waits after SIGTERM before it sends SIGKILL, by default.
DEFAULT_STOP_TIMEOUT = 10.0

_LISTEN_RE = re.compile(r"\b(TCP|HTTP|HTTPS): listening on (\S+)")
_ADDR_IN_USE = "address already in use"
_KILL_WAIT = 10.0  # a SIGKILLed process is reaped well within this


class NsqProcessError(RuntimeError):
    """A server process failed to start, to become ready, or to stop (with its log's tail)."""


# Every process object ever started, with the serial of its latest start, so that the pytest
# plugin can find the ones a test started (processes_started_after), and the running ones, so
# that servers still running when the interpreter exits are not left behind.
_registry_lock = threading.Lock()
_start_serials: weakref.WeakKeyDictionary[NsqProcess, int] = weakref.WeakKeyDictionary()
_running: set[NsqProcess] = set()
_start_counter = itertools.count(1)
_atexit_registered = False


def _register_start(proc: NsqProcess) -> None:
    global _atexit_registered
    with _registry_lock:
        _start_serials[proc] = next(_start_counter)
        _running.add(proc)
        if not _atexit_registered:
            atexit.register(_stop_all_at_exit)
            _atexit_registered = True


def _register_stop(proc: NsqProcess) -> None:
    with _registry_lock:
        _running.discard(proc)


def current_start_serial() -> int:
    """A serial below every later start's, for :func:`processes_started_after`. Thread-safe."""
    with _registry_lock:
        # itertools.count cannot be peeked; consuming one value keeps the ordering intact.
        return next(_start_counter)


def processes_started_after(serial: int) -> list[NsqProcess]:
    """The live process objects whose latest start came after ``serial``, in order. Thread-safe."""
    with _registry_lock:
        started = [(n, proc) for proc, n in _start_serials.items() if n > serial]
    return [proc for _, proc in sorted(started, key=lambda item: item[0])]


def stop_all_running(timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
    """Stop every server started through this module that still runs, each with ``timeout``
    seconds between SIGTERM and SIGKILL; one that won't stop is skipped."""
    with _registry_lock:
        procs = list(_running)
    for proc in procs:
        try:
            proc.stop(timeout=timeout)
        except NsqProcessError:
            pass


def _stop_all_at_exit() -> None:
    stop_all_running(timeout=2.0)


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


class NsqProcess:
    """Base class for a server process that listens on TCP and HTTP loopback ports.

    Not thread-safe. The address properties raise :class:`NsqProcessError` until the first
    :meth:`start`, and keep their value after a stop.

    Args:
        extra_args: Further flags, appended last so that they override the defaults. Keep
            ``--log-level`` at ``info`` or below: the ports are read from INFO log lines.
        binary: Path of the executable; found with :func:`find_nsq_binary` when omitted.
        work_dir: Folder for the log file (and nsqd's default data path); when omitted, a
            temporary folder that :meth:`close` removes.
    """

    #: Executable name, also used in log file names and messages.
    name: ClassVar[str] = "nsq"

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        binary: StrPath | None = None,
        work_dir: StrPath | None = None,
    ) -> None:
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of strings, not a string")
        self._extra_args = tuple(extra_args)
        self._binary = os.fspath(binary) if binary is not None else None
        if work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix=f"nsq_sync-{self.name}-"))
            self._owns_work_dir = True
        else:
            self._work_dir = Path(work_dir)
            self._work_dir.mkdir(parents=True, exist_ok=True)
            self._owns_work_dir = False
        self._log_path = self._work_dir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._addresses: dict[str, str] = {}
        self._closed = False
        self._final_log: str | None = None
        self._last_command = ""
        self._log_offset = 0

    # -- subclass hooks -------------------------------------------------------------------------

    def _command(self, ports: dict[str, int]) -> list[str]:
        """Return the full command line; ``ports`` maps TCP/HTTP/HTTPS to a port (0 = any)."""
        raise NotImplementedError

    def _expected_listeners(self) -> tuple[str, ...]:
        return ("TCP", "HTTP")

    # -- properties -----------------------------------------------------------------------------

    @property
    def binary(self) -> str:
        """Path of the executable, looked up on first use.

        Raises:
            NsqBinaryNotFound: None was given and none can be found.
        """
        if self._binary is None:
            self._binary = find_nsq_binary(self.name)
        return self._binary

    @property
    def extra_args(self) -> tuple[str, ...]:
        """The extra command-line flags given at construction."""
        return self._extra_args

    @property
    def work_dir(self) -> Path:
        """Folder that holds the log file."""
        return self._work_dir

    @property
    def log_path(self) -> Path:
        """Path of the log file; every start appends to it."""
        return self._log_path

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:port"`` of the TCP listener (kept after a stop, for restarts)."""
        return self._address("TCP")

    @property
    def http_address(self) -> str:
        """``"127.0.0.1:port"`` of the HTTP listener."""
        return self._address("HTTP")

    @property
    def http_url(self) -> str:
        """``"http://127.0.0.1:port"``, the base URL of the HTTP API."""
        return f"http://{self.http_address}"

    @property
    def tcp_port(self) -> int:
        """Port of the TCP listener."""
        return _port_of(self.tcp_address)

    @property
    def http_port(self) -> int:
        """Port of the HTTP listener."""
        return _port_of(self.http_address)

    @property
    def pid(self) -> int | None:
        """Process id of the current (or last) run; ``None`` before the first start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last run; ``None`` while running or before the first start."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """Whether the process has been started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def _address(self, kind: str) -> str:
        try:
            return self._addresses[kind]
        except KeyError:
            raise NsqProcessError(
                f"{self.name}: no {kind} address yet; call start() first"
            ) from None

    # -- logs -----------------------------------------------------------------------------------

    def log_text(self) -> str:
        """Return the whole log of every run so far (undecodable bytes are replaced)."""
        try:
            return self._log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return self._final_log or ""

    def log_tail(self, lines: int = 100) -> str:
        """Return the last ``lines`` lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _read_log_from(self, offset: int) -> str:
        try:
            with open(self._log_path, "rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _describe_failure(self, what: str) -> str:
        tail = self.log_tail(40) or "(empty log)"
        return f"{self.name} {what}\ncommand: {self._last_command}\nlog {self._log_path} (tail):\n{tail}"

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        """Launch the server on free loopback ports; return ``self`` once ``/ping`` answers ``OK``.

        Raises:
            NsqBinaryNotFound: The executable cannot be found.
            NsqProcessError: It is running or closed, exited early, or wasn't ready in ``timeout``.
        """
        self._launch_and_wait({"TCP": 0, "HTTP": 0, "HTTPS": 0}, timeout, retry_in_use=False)
        return self

    def restart(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        """Stop the server gracefully and start it again on the same ports and data; return self.

        Raises:
            NsqProcessError: It was never started, or did not come back within ``timeout``.
        """
        if not self._addresses:
            raise NsqProcessError(f"{self.name}: restart() before start()")
        deadline = time.monotonic() + timeout
        self.stop(timeout=min(DEFAULT_STOP_TIMEOUT, timeout))
        ports = {kind: _port_of(addr) for kind, addr in self._addresses.items()}
        remaining = max(deadline - time.monotonic(), 1.0)
        self._launch_and_wait(ports, remaining, retry_in_use=True)
        return self

    def _launch_and_wait(
        self, ports: dict[str, int], timeout: float, *, retry_in_use: bool
    ) -> None:
        if self._closed:
            raise NsqProcessError(f"{self.name}: start() after close()")
        if self.is_running:
            raise NsqProcessError(f"{self.name}: already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                self._launch(ports)
                self._wait_ready(deadline)
                return
            except _AddressInUse:
                if not retry_in_use or time.monotonic() + delay >= deadline:
                    raise NsqProcessError(
                        self._describe_failure("could not bind its ports")
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _launch(self, ports: dict[str, int]) -> None:
        command = self._command(ports)
        self._last_command = " ".join(command)
        self._work_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_path, "ab") as log:
            self._log_offset = log.tell()
            # The child gets its own copy of the descriptor; ours is closed right away.
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._work_dir,
                close_fds=True,
            )
        _register_start(self)

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        expected = self._expected_listeners()
        found: dict[str, str] = {}
        delay = 0.01
        with requests.Session() as http:
            http.trust_env = False  # never route loopback requests through a proxy
            while True:
                code = proc.poll()
                if code is not None:
                    text = self._read_log_from(self._log_offset)
                    self._reap()
                    if _ADDR_IN_USE in text:
                        raise _AddressInUse()
                    raise NsqProcessError(
                        self._describe_failure(f"exited with status {code} before it was ready")
                    )
                if len(found) < len(expected):
                    for kind, address in _LISTEN_RE.findall(self._read_log_from(self._log_offset)):
                        if kind in expected:
                            found[kind] = address
                if len(found) == len(expected) and self._ping(http, found["HTTP"], deadline):
                    self._addresses = found
                    return
                now = time.monotonic()
                if now >= deadline:
                    self.kill()
                    what = "did not answer /ping in time"
                    if len(found) < len(expected):
                        what = (
                            f"did not log 'listening on' for {sorted(set(expected) - set(found))} "
                            "in time (is --log-level above info?)"
                        )
                    raise NsqProcessError(self._describe_failure(what))
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.1)

    @staticmethod
    def _ping(http: requests.Session, address: str, deadline: float) -> bool:
        timeout = max(min(1.0, deadline - time.monotonic()), 0.05)
        try:
            response = http.get(f"http://{address}/ping", timeout=timeout)
        except requests.RequestException:
            return False
        return response.status_code == 200 and response.text.strip() == "OK"

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` seconds. Idempotent.

        Raises:
            NsqProcessError: The process did not die even after SIGKILL.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()

    def kill(self) -> None:
        """Kill the server at once with SIGKILL (nothing is flushed). Idempotent.

        Raises:
            NsqProcessError: The process did not die.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        self._reap()

    def _reap(self) -> None:
        proc = self._proc
        assert proc is not None
        try:
            proc.wait(timeout=_KILL_WAIT)
        except subprocess.TimeoutExpired:
            raise NsqProcessError(
                f"{self.name} (pid {proc.pid}) did not exit after SIGKILL"
            ) from None
        _register_stop(self)

    def close(self) -> None:
        """Stop the server and remove a work folder it made (:meth:`log_text` still works).

        Raises:
            NsqProcessError: As :meth:`stop`.
        """
        try:
            self.stop()
        finally:
            if self._owns_work_dir and not self._closed:
                self._final_log = self.log_text()
                shutil.rmtree(self._work_dir, ignore_errors=True)
            self._closed = True

    def __enter__(self) -> Self:
        if not self.is_running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        addresses = " ".join(f"{k.lower()}={v}" for k, v in self._addresses.items())
        return f"<{type(self).__name__} pid={self.pid} {addresses} {state}>"


class _AddressInUse(Exception):
    pass
