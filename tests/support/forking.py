"""Forked children for the fork-safety tests (tests/integration/test_fork*.py, tests/contrib).

A :class:`Child` runs ``work()`` in a forked process (``os.fork()`` by default, or any other fork
function, such as libc's ``fork()`` that runs no Python hook), reports the result as JSON and
waits for the parent's go before it cleans up and exits, so the parent can look at nsqd's
/stats while every child is alive. The checks count by message body against a real nsqd.

Python 3.12+ warns (DeprecationWarning) when a process with threads forks, because locks held by
other threads are copied locked into the child. The Producer never uses such a lock in the child
(nsq_sync.process builds the child's state under a lock made in the child), so the helpers silence
that warning around their own forks, deliberately and nowhere else.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

from nsq_sync import NsqdHTTPClient, Producer
from nsq_sync.errors import NSQError
from nsq_sync.testing import NsqdProcess
from support.nsq import read_bodies, wait_for, waitpid

__all__ = [
    "CHILD_TIMEOUT",
    "PER_THREAD",
    "THREADS",
    "Child",
    "check_bodies",
    "check_results",
    "os_fork",
    "producer_connections",
    "publish_from_threads",
    "publishing_child",
    "wait_for_connections",
]

THREADS = 8
PER_THREAD = 5
CHILD_TIMEOUT = 60.0


def os_fork() -> int:
    with warnings.catch_warnings():
        # 3.12+: "This process is multi-threaded, use of fork() may lead to deadlocks in the
        # child" -- the situation under test (see the module docstring).
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _read_report(fd: int, timeout: float) -> bytes:
    """Read one ``<length>\n<data>`` report (b"" when the child closed without one)."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        head, newline, rest = data.partition(b"\n")
        if newline and len(rest) >= int(head):
            return rest
        left = deadline - time.monotonic()
        readable, _, _ = select.select([fd], [], [], max(0.0, left))
        if not readable:
            raise AssertionError(f"no report from a child within {timeout} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            return b""
        data += chunk


class Child:
    """A forked child running ``work()``; it reports the result (JSON) and then waits for the
    parent's go before it closes and exits, so the parent can look at /stats meanwhile."""

    #: the parent's ends of every live child's pipes: a child closes its copies at once, or a
    #: sibling's go pipe would never see EOF while this child lives
    _parent_fds: set[int] = set()

    def __init__(
        self,
        work: Callable[[], dict[str, Any]],
        finish: Callable[[], None],
        fork: Callable[[], int] | None = None,
    ) -> None:
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = (fork or os_fork)()
        if pid == 0:  # pragma: no cover - the child reports through the pipe and exit status
            code = 2
            try:
                # A child stuck before it can report (its whole process blocked) prints where
                # before the parent gives up on it: the test's captured stderr shows it.
                faulthandler.dump_traceback_later(CHILD_TIMEOUT - 15)
                for fd in Child._parent_fds | {report_r, go_w}:
                    os.close(fd)
                data = json.dumps(work()).encode()
                data = b"%d\n" % len(data) + data  # (under gevent, EOF may come only at exit)
                while data:
                    data = data[os.write(report_w, data) :]
                os.close(report_w)
                faulthandler.cancel_dump_traceback_later()
                # gevent: its fork watchers run at the child's first sleeps (gevent.hub.reinit's
                # documented advice); a select() before them never sees the pipe's EOF
                time.sleep(0.001)
                time.sleep(0.001)
                select.select([go_r], [], [], CHILD_TIMEOUT)
                finish()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(report_w)
        os.close(go_r)
        Child._parent_fds |= {report_r, go_w}
        self.pid = pid
        self._report = report_r
        self._go = go_w

    def result(self) -> dict[str, Any]:
        """The child's report; a child that reports nothing (it failed or hung) is killed and
        reaped first, so that no test leaves it running."""
        try:
            data = _read_report(self._report, CHILD_TIMEOUT)
        except BaseException:
            self._kill()
            raise
        finally:
            os.close(self._report)
            Child._parent_fds.discard(self._report)
        if not data:
            self._kill()
        assert data, f"child {self.pid} reported nothing (it failed: see its stderr)"
        return json.loads(data)  # type: ignore[no-any-return]

    def _kill(self) -> None:
        os.close(self._go)
        Child._parent_fds.discard(self._go)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        waitpid(self.pid, CHILD_TIMEOUT)

    def finish(self) -> int:
        os.close(self._go)
        Child._parent_fds.discard(self._go)
        return waitpid(self.pid, CHILD_TIMEOUT)


def publish_from_threads(
    publish: Callable[[bytes], None] | Producer,
    topic: str,
    prefix: str,
    threads: int = THREADS,
    per_thread: int = PER_THREAD,
) -> dict[str, Any]:
    """``threads`` threads start at once (a barrier) and publish ``per_thread`` bodies each,
    through a Producer or a ``publish(body)`` function. Returns the acknowledged bodies and
    every error (flagging any that is not an NSQError)."""
    if isinstance(publish, Producer):
        producer = publish

        def publish(body: bytes) -> None:
            producer.publish(topic, body)

    ok: list[str] = []
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(t: int) -> None:
        barrier.wait(CHILD_TIMEOUT)
        for i in range(per_thread):
            body = f"{prefix}-t{t}-{i}"
            try:
                publish(body.encode())  # type: ignore[operator]
            except NSQError as exc:
                errors.append(repr(exc))
            except BaseException as exc:
                errors.append(f"NOT AN NSQError: {exc!r}")
            else:
                ok.append(body)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    # Half the parent's wait in all, so that a child with a hung thread still reports where
    # the thread hangs before the parent gives up on it.
    deadline = time.monotonic() + CHILD_TIMEOUT / 2
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    hung = sum(w.is_alive() for w in workers)
    result = {"pid": os.getpid(), "ok": ok, "errors": errors, "hung": hung}
    if hung:
        result["stacks"] = _stacks([w for w in workers if w.is_alive()])
    return result


def _stacks(threads: list[threading.Thread]) -> str:
    """Where ``threads`` are now: every greenlet's stack under gevent (its threads are
    greenlets), else each thread's frames."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        from gevent.util import format_run_info

        return "\n".join(format_run_info())
    frames = sys._current_frames()
    return "\n".join(
        f"{t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
        for t in threads
        if t.ident in frames
    )


def publishing_child(
    producer: Producer,
    topic: str,
    prefix: str,
    attempted: set[str],
    fork: Callable[[], int] | None = None,
    report: Callable[[], dict[str, Any]] | None = None,
) -> Child:
    """Fork a child whose 8 threads publish through ``producer`` (bodies added to
    ``attempted``); it closes the producer when told to finish. ``report()``'s items are added
    to the child's result."""
    attempted.update(f"{prefix}-t{t}-{i}" for t in range(THREADS) for i in range(PER_THREAD))

    def work() -> dict[str, Any]:
        result = publish_from_threads(producer, topic, prefix)
        if report is not None:
            result.update(report())
        return result

    return Child(work, producer.close, fork)


def producer_connections(http_address: str, topic: str) -> list[int]:
    """The publish count of every live connection that published to ``topic``."""
    with NsqdHTTPClient(http_address) as client:
        producers = client.stats(include_clients=True).get("producers") or []
    counts = []
    for p in producers:
        for stat in p.get("pub_counts") or []:
            if stat.get("topic") == topic:
                counts.append(int(stat["count"]))
    return counts


def wait_for_connections(server: NsqdProcess, topic: str, expected: int) -> int:
    """Wait until nsqd's /stats lists ``expected`` live connections that published to
    ``topic`` (closed ones take a moment to leave); fails naming the last count."""
    seen: list[list[int]] = [[]]

    def match() -> bool:
        seen[0] = producer_connections(server.http_address, topic)
        return len(seen[0]) == expected

    try:
        wait_for(match, f"{expected} producer connections", timeout=15.0)
    except AssertionError:
        raise AssertionError(
            f"nsqd lists {len(seen[0])} producer connections for the topic, not {expected}: "
            f"{seen[0]}"
        ) from None
    return expected


def check_results(results: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    acked: list[str] = []
    errors: list[str] = []
    for result in results:
        assert result["hung"] == 0, f"{result.pop('stacks', '')[-6000:]}\n{result}"
        bad = [e for e in result["errors"] if e.startswith("NOT AN NSQError")]
        assert not bad, bad
        acked += result["ok"]
        errors += result["errors"]
    return acked, errors


def check_bodies(server: NsqdProcess, topic: str, acked: list[str], attempted: set[str]) -> Counter:
    bodies = read_bodies(server.tcp_address, server.http_address, topic, timeout=60.0)
    held = Counter({body.decode(): n for body, n in bodies.items()})
    not_once = [b for b in acked if held[b] != 1]
    assert not not_once, f"acknowledged bodies not held exactly once: {not_once[:5]}"
    extra = set(held) - attempted
    assert not extra, f"bodies nobody published: {sorted(extra)[:5]}"
    assert max(held.values()) == 1, [b for b, n in held.items() if n > 1][:5]
    return held
