"""Issue 39: a cron run (``run(idle_timeout=)``) ends when it cannot reach its servers, with the
reason ``"unreachable"`` and ``ok`` False, and a WARNING names them at once. Before, such a run
waited for ever: time without a connected nsqd did not count as idle.

Each run is started on a thread of its own and given a bounded time to end, so the old
behaviour fails the test instead of hanging it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.nsq import bounded, free_closed_port, wait_for

from nsq_sync import BatchConsumer, Consumer, Message, Producer, RunSummary

pytestmark = pytest.mark.integration

CHANNEL = "ch"
IDLE = 2.0
#: how much later than idle_timeout a run may end (connect timeouts, the graceful stop, a busy CI)
MARGIN = 15.0


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(120.0)


class Run:
    """``runnable.run(**kwargs)`` on a thread of its own."""

    def __init__(self, runnable: Any, **kwargs: Any) -> None:
        self.runnable = runnable
        self.result: list[RunSummary] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(runnable.run(**kwargs)), daemon=True
        )
        self.started = time.monotonic()
        self.thread.start()

    def summary(self, within: float) -> RunSummary:
        """The summary, once the run ended within ``within`` seconds (else stop it and fail)."""
        self.thread.join(within)
        if self.thread.is_alive():
            self.runnable.stop(5.0)
            self.thread.join(10.0)
            pytest.fail(f"the run had not ended {within} s later: {self.result}")
        return self.result[0]


def warnings_naming(caplog: pytest.LogCaptureFixture, server: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and server in r.getMessage()
    ]


def handle(message: Message) -> None:
    pass


def handle_batch(messages: list[Message]) -> None:
    pass


MAKERS: dict[str, Callable[..., Any]] = {
    "Consumer": lambda topic, **kw: Consumer(topic, CHANNEL, handle, **kw),
    "BatchConsumer": lambda topic, **kw: BatchConsumer(topic, CHANNEL, handle_batch, 10, **kw),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_an_unreachable_nsqd_ends_the_run_unreachable_and_warns_at_once(
    kind: str, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_sync")
    address = f"127.0.0.1:{free_closed_port()}"
    consumer = MAKERS[kind](nsq_topic, nsqd_tcp_addresses=[address])
    run = Run(consumer, idle_timeout=IDLE)
    # the WARNING comes at the first failed attempt, while the run still waits
    wait_for(lambda: warnings_naming(caplog, f"cannot connect to nsqd {address}"), "the warning")
    assert run.thread.is_alive() or time.monotonic() - run.started < IDLE
    summary = run.summary(IDLE + MARGIN)
    assert summary.reason == "unreachable"
    assert not summary.ok
    assert summary.exit_status == 1
    assert summary.handled == 0
    # one warning for the outage however many attempts failed (the rest are DEBUG), and the
    # run's last word names the server too
    attempts = [r for r in caplog.records if f"cannot connect to nsqd {address}" in r.getMessage()]
    assert len(attempts) >= 3, [r.getMessage() for r in attempts]
    assert len(warnings_naming(caplog, f"cannot connect to nsqd {address}")) == 1
    assert any("unreachable" in w for w in warnings_naming(caplog, address))


def test_an_unreachable_lookupd_ends_the_run_unreachable_and_warns_at_once(
    nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_sync")
    url = f"http://127.0.0.1:{free_closed_port()}"
    consumer = Consumer(nsq_topic, CHANNEL, handle, lookupd_http_addresses=[url])
    run = Run(consumer, idle_timeout=IDLE)
    wait_for(lambda: warnings_naming(caplog, f"lookupd {url} query failed"), "the warning")
    assert run.thread.is_alive() or time.monotonic() - run.started < IDLE
    summary = run.summary(IDLE + MARGIN)
    assert summary.reason == "unreachable"
    assert not summary.ok
    assert len(warnings_naming(caplog, f"lookupd {url} query failed")) == 1


def test_an_nsqd_killed_mid_run_ends_it_unreachable(
    nsqd_factory: Any, nsq_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Measured on main: ``run(idle_timeout=3)`` was still running 40 s after nsqd was killed."""
    caplog.set_level(logging.DEBUG, logger="nsq_sync")
    nsqd = nsqd_factory()
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(nsq_topic, [b"a", b"b", b"c"])
    seen: list[bytes] = []
    consumer = Consumer(
        nsq_topic, CHANNEL, lambda m: seen.append(m.body), nsqd_tcp_addresses=[nsqd.tcp_address]
    )
    run = Run(consumer, idle_timeout=IDLE)
    wait_for(lambda: len(seen) == 3 and consumer.stats().finished == 3, "3 messages handled")
    nsqd.kill()
    killed = time.monotonic()
    summary = run.summary(IDLE + MARGIN)
    assert summary.reason == "unreachable"
    assert not summary.ok
    assert (summary.handled, summary.finished) == (3, 3)
    assert time.monotonic() - killed < IDLE + MARGIN
    assert len(warnings_naming(caplog, f"cannot connect to nsqd {nsqd.tcp_address}")) == 1


def test_a_reachable_nsqd_with_nothing_to_send_still_ends_idle_and_ok(
    nsqd: Any, nsq_topic: str
) -> None:
    """The healthy empty run is unchanged: connected, nothing arrives, ``"idle"``, ok."""
    consumer = Consumer(nsq_topic, CHANNEL, handle, nsqd_tcp_addresses=[nsqd.tcp_address])
    summary = Run(consumer, idle_timeout=0.5).summary(0.5 + MARGIN)
    assert summary.reason == "idle"
    assert summary.ok
