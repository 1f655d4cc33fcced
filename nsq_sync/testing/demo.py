"""Run a script against a throwaway nsqlookupd and nsqd on loopback ports.

``python -m nsq_sync.testing.demo SCRIPT [ARGS...]`` sets ``NSQD_TCP_ADDRESS``,
``NSQD_HTTP_ADDRESS``, ``NSQLOOKUPD_TCP_ADDRESS`` and ``NSQLOOKUPD_HTTP_ADDRESS`` for the script
and prints both servers' log tails if it fails; the servers are always stopped. The exit status
is the script's (128 + N for signal N, 124 past ``--timeout``, 130 on Ctrl-C); SIGTERM is
passed on to it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from nsq_sync.testing.process import (
    NsqBinaryNotFound,
    NsqdProcess,
    NsqlookupdProcess,
    NsqProcess,
    NsqProcessError,
)

_TIMEOUT_STATUS = 124
_INTERRUPTED_STATUS = 130
_LOG_LINES = 40


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nsq_sync.testing.demo",
        description="Run a Python script against a throwaway nsqlookupd and nsqd on loopback ports.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds the script may run before it is killed (default: %(default)s)",
    )
    parser.add_argument("script", help="path of the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script against fresh servers; return its exit status, or 2 if they can't run."""
    parser = _parser()
    options = parser.parse_args(argv)
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    started = time.monotonic()
    try:
        with (
            NsqlookupdProcess() as lookupd,
            NsqdProcess(lookupd_tcp_addresses=[lookupd.tcp_address]) as nsqd,
        ):
            lookupd.wait_for_nodes([nsqd])
            env = dict(os.environ)
            env.update(
                NSQD_TCP_ADDRESS=nsqd.tcp_address,
                NSQD_HTTP_ADDRESS=nsqd.http_address,
                NSQLOOKUPD_HTTP_ADDRESS=lookupd.http_address,
                NSQLOOKUPD_TCP_ADDRESS=lookupd.tcp_address,
            )
            status = _run_script(options.script, options.args, env, options.timeout)
            if status != 0:
                _report_failure(options.script, status, [lookupd, nsqd])
    except (NsqBinaryNotFound, NsqProcessError) as exc:
        _log(f"error: {exc}")
        return 2
    if status == 0:
        _log(f"OK in {time.monotonic() - started:.1f} s (nsqlookupd and nsqd started and stopped)")
    return status


def _report_failure(script: str, status: int, servers: Sequence[NsqProcess]) -> None:
    _log(f"FAILED: {script} exited with status {status}")
    for server in servers:
        _log(
            f"{server.name} tcp={server.tcp_address} http={server.http_address}; "
            f"last {_LOG_LINES} lines of {server.log_path}:"
        )
        print(server.log_tail(_LOG_LINES) or "(empty log)", file=sys.stderr, flush=True)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _run_script(script: str, args: Sequence[str], env: dict[str, str], timeout: float) -> int:
    proc = subprocess.Popen([sys.executable, script, *args], env=env)

    def forward_sigterm(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    try:
        return _exit_status(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        _log(f"error: {script} still running after {timeout} s; killing it")
        proc.kill()
        proc.wait(timeout=10.0)
        return _TIMEOUT_STATUS
    except KeyboardInterrupt:
        # The script got the same SIGINT (same process group); give it a moment to finish.
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10.0)
        return _INTERRUPTED_STATUS
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
