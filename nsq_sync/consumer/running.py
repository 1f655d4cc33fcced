"""Running a consumer to an end: ``Consumer.run(timeout=, idle_timeout=, max_messages=)``.

:func:`run_to_end` starts a Consumer or BatchConsumer, waits for one of the ends listed in
:meth:`Consumer.run <nsq_sync.consumer.Consumer.run>`, stops it gracefully and returns a
:class:`RunSummary`. The state is polled every ``POLL`` seconds (or a tenth of
``idle_timeout``), so the idle and max_messages ends come at most that late.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nsq_sync.config import positive_int
from nsq_sync.durations import positive_seconds

if TYPE_CHECKING:  # pragma: no cover
    from nsq_sync.consumer.stats import ConsumerStats
    from nsq_sync.message import Message

__all__ = ["RunControl", "RunSummary", "Runnable", "run_to_end"]

#: longest gap between two looks at the consumer's state while an end needs watching, in seconds
POLL = 0.05


@dataclass(frozen=True)
class RunSummary:
    """What one :meth:`~nsq_sync.consumer.Consumer.run` did.

    Attributes:
        handled: handler calls started, and messages given up without one (a BatchConsumer:
            messages put in batches).
        finished: messages finished (FIN) during the run.
        requeued: REQs sent during the run (after failures, by ``message.requeue()``, at the end).
        failed: handler calls that raised (:class:`~nsq_sync.errors.RequeueMessage` aside; a
            BatchConsumer counts every message of a batch whose handler raised).
        gave_up: messages given up (``max_attempts`` used up, or
            :class:`~nsq_sync.errors.DeadLetter` raised).
        elapsed: seconds the run took, the graceful stop included.
        reason: why it ended: ``"stopped"``, ``"signal"``, ``"timeout"``, ``"idle"``,
            ``"max_messages"`` or ``"unreachable"`` (``idle_timeout`` came while no nsqd was
            connected; see :meth:`Consumer.run <nsq_sync.consumer.Consumer.run>`).
        dead_lettered: messages published to the dead-letter topic (also in ``gave_up``).
    """

    handled: int
    finished: int
    requeued: int
    failed: int
    gave_up: int
    elapsed: float
    reason: str
    dead_lettered: int = 0

    @property
    def ok(self) -> bool:
        """True when no handler call failed, no message was given up, and the run did not end
        ``"unreachable"`` (a run that never reached an nsqd is no healthy empty run)."""
        return self.failed == 0 and self.gave_up == 0 and self.reason != "unreachable"

    @property
    def exit_status(self) -> int:
        """The exit status of a command that ran this consumer (``nsq-sync tail``/``drain``,
        ``manage.py nsq_consume``, ``flask nsq consume``): 0 after a graceful stop (SIGTERM, SIGINT
        or ``stop()``: a deploy stopping a worker is success) or when :attr:`ok`, else 1 (handlers
        failed or gave up, or no nsqd could be reached: cron can alert)."""
        return 0 if self.reason in ("signal", "stopped") or self.ok else 1


class Runnable(Protocol):
    """The public face of what :func:`run_to_end` runs: a Consumer or a BatchConsumer."""

    @property
    def log(self) -> logging.LoggerAdapter[Any]:
        """The logger the run reports to."""

    def start(self) -> None:
        """Start consuming; returns at once."""

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully (the end of every run)."""

    def stats(self) -> ConsumerStats:
        """The counters the summary is the difference of."""


class RunControl(Protocol):
    """What :func:`run_to_end` needs of a consumer besides its public face (its Lifecycle)."""

    def check_process(self) -> None:
        """Raise Stopped in a forked child of the process that started it (takes no lock)."""

    def set_admit(self, admit: Callable[[Message], bool] | None) -> None:
        """Call ``admit(message)`` before each message is handled; False requeues it at once."""

    def set_budget(self, deliveries: int) -> None:
        """Let nsqd deliver at most ``deliveries`` more messages."""

    def pause(self) -> None:
        """Receive nothing more (RDY 0 everywhere)."""

    def credit(self) -> tuple[int, int, int]:
        """(messages nsqds may still send, messages in flight, messages received so far)."""
        ...

    def nothing_to_consume(self) -> bool:
        """True when there is no nsqd to consume from (waiting then is idle)."""
        ...

    def connected(self) -> bool:
        """True while some nsqd connection is subscribed (time without one is idle)."""
        ...

    def unreached(self) -> list[str]:
        """The servers wanted and not reached, each with why (for the run's last word)."""
        ...

    def end_run(self) -> None:
        """Make the run end now (it then stops gracefully); safe in a signal handler."""

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for stop() or end_run(); True if so."""
        ...

    def fatal_error(self) -> BaseException | None:
        """The SystemExit or KeyboardInterrupt a handler raised (run() re-raises it), or None."""
        ...


class _Admission:
    """Admits the first ``limit`` messages (lock-free: ``next()`` on a count is atomic). Taking
    the last place pauses the consumer, else nsqd hands each refused message straight back."""

    def __init__(self, limit: int | None, on_reached: Callable[[], object]) -> None:
        self.limit = limit
        self.on_reached = on_reached
        self._calls = itertools.count()
        self.reached = False

    def __call__(self, message: Message) -> bool:
        n = next(self._calls)
        if self.limit is None:
            return True
        if n + 1 == self.limit:
            self.reached = True
            self.on_reached()
        return n < self.limit

    def admitted(self) -> int:
        """Calls admitted so far (call once, at the end: it counts itself)."""
        calls = next(self._calls)
        return calls if self.limit is None else min(calls, self.limit)


def run_to_end(
    runnable: Runnable,
    control: RunControl,
    *,
    timeout: Any = None,
    idle_timeout: Any = None,
    max_messages: Any = None,
    stop: Callable[[], object] | None = None,
) -> RunSummary:
    """Start ``runnable``, block until an end, stop it gracefully (``stop``, default
    ``runnable.stop``) and return the summary. Takes and raises what :meth:`Consumer.run
    <nsq_sync.consumer.Consumer.run>` does; ``control``: ``ConsumerParts.control``."""
    control.check_process()  # first: a lock a parent's thread held at the fork stays held
    run_for = positive_seconds("timeout", timeout)
    idle_for = positive_seconds("idle_timeout", idle_timeout)
    limit = positive_int("max_messages", max_messages)
    stop = stop or runnable.stop

    began = time.monotonic()
    before = runnable.stats()
    admission = _Admission(limit, on_reached=control.pause)
    control.set_admit(admission)
    if limit is not None:
        control.set_budget(limit)
    signalled: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        runnable.log.info("signal %d received; stopping", signum)
        signalled.append(signum)
        control.end_run()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    reason = "stopped"
    try:
        runnable.start()
        poll = None
        if idle_for is not None or limit is not None:
            poll = POLL if idle_for is None else min(POLL, idle_for / 10)
        deadline = None if run_for is None else began + run_for
        idle_since: float | None = None
        received = -1
        while True:
            now = time.monotonic()
            wait = poll
            if deadline is not None:
                if now >= deadline:
                    reason = "timeout"
                    break
                wait = deadline - now if wait is None else min(wait, deadline - now)
            # signals interrupt the wait on POSIX; a signal or stop() ends it
            if control.wait_stopping(wait):
                reason = "signal" if signalled else "stopped"
                break
            if admission.reached:
                reason = "max_messages"
                break
            if idle_for is not None:
                credit, _, count = control.credit()
                nothing = control.nothing_to_consume()
                # no nsqd connected (never reached, or lost) while there is one to wait for
                cut_off = not nothing and not control.connected()
                credit_open = credit > 0 or nothing or cut_off
                now = time.monotonic()
                if count != received or not credit_open:
                    received = count
                    idle_since = now if credit_open else None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= idle_for:
                    reason = "unreachable" if cut_off else "idle"
                    break
        if reason == "unreachable":
            runnable.log.warning(
                "no nsqd connected for %.1f s (idle_timeout): ending the run as unreachable; "
                "not reached: %s",
                idle_for,
                "; ".join(control.unreached()) or "no nsqd",
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop()
    fatal = control.fatal_error()
    if fatal is not None:
        raise fatal
    after = runnable.stats()
    summary = RunSummary(
        handled=admission.admitted(),
        finished=after.finished - before.finished,
        requeued=after.requeued - before.requeued,
        failed=after.failed - before.failed,
        gave_up=after.gave_up - before.gave_up,
        elapsed=time.monotonic() - began,
        reason=reason,
        dead_lettered=after.dead_lettered - before.dead_lettered,
    )
    runnable.log.info("run ended (%s): %s", reason, summary)
    return summary
