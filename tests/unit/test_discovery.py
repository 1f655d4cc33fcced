"""Discovery without servers or sleeps: a fake clock, a seeded RNG, a lookupd query function that
answers what the test says, and a runtime whose tasks run when the test says (``FakeRuntime``).

Each test drives ``Discovery.step()`` (one pass of the task) by hand and checks what a user
relies on: which nsqds get dialled and when, how often lookupd is polled, and that lookupd only
ever adds nsqds.
"""

from __future__ import annotations

import itertools
import logging
import random
from typing import Any

import pytest
from support.fakes import FakeClock, FakeRuntime

from nsq_sync.consumer.discovery import Discovery


class Lookupds:
    """What each lookupd answers: a set of nsqd addresses, or an exception to raise."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.queries: list[str] = []

    def __call__(self, url: str, topic: str, timeout: float) -> set[str]:
        self.queries.append(url)
        answer = self.answers.get(url, set())
        if isinstance(answer, BaseException):
            raise answer
        return set(answer)


class Harness:
    def __init__(
        self,
        direct: tuple[str, ...] = (),
        lookupds: tuple[str, ...] = (),
        poll_interval: float = 60.0,
        poll_jitter: float = 0.3,
        http_timeout: float = 2.0,
        reconnect_max: float = 30.0,
        seed: int = 7,
    ) -> None:
        self.clock = FakeClock()
        self.runtime = FakeRuntime()
        self.lookupd = Lookupds()
        self.connected: set[str] = set()
        self.dialled: list[str] = []
        self.d = Discovery(
            topic="t",
            direct=direct,
            lookupds=lookupds,
            poll_interval=poll_interval,
            poll_jitter=poll_jitter,
            http_timeout=http_timeout,
            reconnect_max=reconnect_max,
            runtime=self.runtime,  # type: ignore[arg-type]
            connected=lambda: set(self.connected),
            connect=self.dialled.append,
            rng=random.Random(seed),
            clock=self.clock,
            lookup=self.lookupd,
        )

    def step(self) -> float | None:
        return self.d.step()

    def poll(self) -> float | None:
        """A whole lookupd round: start it, let every query answer, merge the answers."""
        self.step()
        self.runtime.run_spawned("nsq_sync-discovery-query-")
        return self.step()

    def connect_ok(self, *addresses: str) -> None:
        for address in addresses:
            self.connected.add(address)
            self.d.connect_succeeded(address)

    def lose(self, address: str, useful: bool = True) -> None:
        self.connected.discard(address)
        self.d.connection_lost(address, useful)


def test_direct_nsqds_are_dialled_at_once_and_nothing_is_polled() -> None:
    h = Harness(direct=("a:4150", "b:4150"))
    assert h.step() is None  # nothing to do until woken: no polling at all
    assert h.dialled == ["a:4150", "b:4150"]
    assert h.runtime.spawned == []
    h.connect_ok("a:4150", "b:4150")
    assert h.step() is None
    assert h.dialled == ["a:4150", "b:4150"]  # not dialled twice


def test_every_lookupd_is_queried_in_parallel_and_answers_merge() -> None:
    h = Harness(lookupds=("http://l1:4161", "http://l2:4161"))
    h.lookupd.answers = {"http://l1:4161": {"a:4150"}, "http://l2:4161": {"a:4150", "b:4150"}}
    h.step()
    started = h.runtime.run_spawned()
    assert started == [
        "nsq_sync-discovery-query-http://l1:4161",
        "nsq_sync-discovery-query-http://l2:4161",
    ]
    h.step()
    assert sorted(h.dialled) == ["a:4150", "b:4150"]
    assert h.d.answered and h.d.polls == 1


def test_the_next_poll_comes_after_the_interval_with_jitter_on_every_poll() -> None:
    h = Harness(lookupds=("http://l1:4161",), poll_interval=60.0, poll_jitter=0.3)
    h.lookupd.answers = {"http://l1:4161": {"a:4150"}}
    waits = []
    for _ in range(20):
        wait = h.poll()
        assert wait is not None
        waits.append(wait)
        h.clock.now += wait
    assert all(42.0 <= w <= 78.0 for w in waits), waits  # 60 s +- 30 %
    assert len(set(waits)) == len(waits)  # jitter on every poll, not only the first
    assert len(h.lookupd.queries) == 20


def test_while_lookupd_lists_no_nsqd_it_is_polled_from_1_s_doubling_up_to_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 39: a topic created after the consumer started was found only at the next poll,
    60 s later. Now the polls come 1, 2, 4... s apart (jittered) while no nsqd is listed, and
    the interval's length again once one is; the wait is logged at INFO once."""
    caplog.set_level(logging.DEBUG)
    h = Harness(lookupds=("http://l1:4161",), poll_interval=60.0, poll_jitter=0.3)
    waits = []
    for _ in range(9):
        wait = h.poll()
        assert wait is not None
        waits.append(wait)
        h.clock.now += wait
    for n, wait in enumerate(waits):
        full = min(60.0, 2.0**n)
        assert full * 0.7 <= wait <= full * 1.3, (n, waits)
    # the extra load is bounded: at most 7 queries in the first minute of a wait (not 1)
    assert sum(1 for t in itertools.accumulate([0.0, *waits]) if t < 60.0) <= 7
    waiting = [r for r in caplog.records if "waiting for it to appear" in r.getMessage()]
    assert len(waiting) == 1 and waiting[0].levelno == logging.INFO
    assert "topic t" in waiting[0].getMessage() and "http://l1:4161" in waiting[0].getMessage()
    # the topic appears: back to the interval; when it goes again, a new wait starts
    h.lookupd.answers = {"http://l1:4161": {"a:4150"}}
    wait = h.poll()
    assert wait is not None and 42.0 <= wait <= 78.0
    h.clock.now += wait
    h.lookupd.answers = {"http://l1:4161": set()}
    wait = h.poll()
    assert wait is not None and 0.7 <= wait <= 1.3
    waiting = [r for r in caplog.records if "waiting for it to appear" in r.getMessage()]
    assert len(waiting) == 2


def test_an_unreachable_server_is_one_warning_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 39: a WARNING names a server at its first failure, the retries are DEBUG, and a
    new outage after it answered again warns again."""
    caplog.set_level(logging.DEBUG)
    h = Harness(direct=("a:4150",), lookupds=("http://l1:4161",), poll_interval=10.0)
    h.lookupd.answers = {"http://l1:4161": OSError("Connection refused")}
    h.step()
    for _ in range(5):
        h.d.connect_failed("a:4150", error=OSError("Connection refused"))
        h.clock.now = max(h.d.retry_at["a:4150"], h.d.next_poll)
        h.poll()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert any("cannot connect to nsqd a:4150: Connection refused" in w for w in warnings)
    assert any("lookupd http://l1:4161 query failed: Connection refused" in w for w in warnings)
    assert all("no nsqd is connected for topic t" in w for w in warnings)
    assert h.d.unreached() == [
        "nsqd a:4150 (Connection refused)",
        "lookupd http://l1:4161 (Connection refused)",
    ]
    h.connect_ok("a:4150")
    h.lose("a:4150")
    h.d.connect_failed("a:4150", error=OSError("Connection refused"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3


def test_a_hanging_lookupd_holds_up_neither_the_others_nor_direct_nsqds() -> None:
    h = Harness(direct=("d:4150",), lookupds=("http://slow:4161", "http://ok:4161"))
    h.lookupd.answers = {"http://ok:4161": {"a:4150"}}
    wait = h.step()
    assert h.dialled == ["d:4150"]  # dialled while the queries are out
    assert wait is not None and wait <= 2.0 * 2 + 1.0  # the round's deadline
    h.runtime.run_spawned("nsq_sync-discovery-query-http://ok")  # the slow one never answers
    h.step()
    assert h.dialled == ["d:4150"]  # the round is not over yet
    h.clock.now += 5.0  # the round's deadline (2 * http_timeout + 1) passed
    h.step()
    assert h.dialled == ["d:4150", "a:4150"]
    h.runtime.run_spawned()  # the slow answer, late: ignored
    h.step()
    assert h.d.discovered == {"a:4150"}


def test_lookupd_only_adds_nsqds() -> None:
    h = Harness(lookupds=("http://l1:4161",), poll_interval=10.0, poll_jitter=0.0)
    h.lookupd.answers = {"http://l1:4161": {"a:4150"}}
    h.poll()
    h.connect_ok("a:4150")
    # a lookupd error keeps what was known
    h.lookupd.answers = {"http://l1:4161": OSError("refused")}
    h.clock.now += 10.0
    h.poll()
    assert h.d.discovered == {"a:4150"}
    # an empty answer (a restarted lookupd) closes nothing: discovery has no way to close
    h.lookupd.answers = {"http://l1:4161": set()}
    h.clock.now += 10.0
    h.poll()
    assert h.connected == {"a:4150"}
    # but an nsqd lookupd no longer lists is not redialled once its connection closes
    h.lose("a:4150")
    h.clock.now += 60.0
    h.step()
    assert h.dialled == ["a:4150"]


def test_a_lost_connection_is_redialled_with_backoff_and_lookupd_asked_again_soon() -> None:
    h = Harness(direct=("a:4150",), lookupds=("http://l1:4161",), poll_interval=60.0)
    h.poll()
    h.connect_ok("a:4150")
    h.clock.now += 30.0
    h.lose("a:4150", useful=True)
    wait = h.step()
    assert h.dialled == ["a:4150"]  # not yet: a short backoff first
    assert wait is not None and wait <= 0.1
    h.clock.now += 0.1
    h.step()
    assert h.dialled == ["a:4150", "a:4150"]
    # the lookupd poll is due soon after a drop (at most once a second), not 60 s later
    assert h.d.next_poll <= h.d.last_poll + 1.0


def test_failed_dials_back_off_exponentially_up_to_reconnect_max() -> None:
    h = Harness(direct=("a:4150",), reconnect_max=5.0)
    h.step()
    delays = []
    for _ in range(10):
        h.d.connect_failed("a:4150")
        delays.append(h.d.retry_at["a:4150"] - h.clock.now)
        h.clock.now = h.d.retry_at["a:4150"]
        h.step()
    for n, delay in enumerate(delays):
        full = min(5.0, 0.1 * 2**n)
        assert full / 2 <= delay <= full, (n, delay)
    assert len(h.dialled) == 11


def test_a_configuration_error_waits_reconnect_max() -> None:
    h = Harness(direct=("a:4150",), reconnect_max=30.0)
    h.step()
    h.d.connect_failed("a:4150", permanent=True)
    assert h.step() == pytest.approx(30.0)
    h.clock.now += 29.0
    h.step()
    assert h.dialled == ["a:4150"]


def test_a_connection_closed_right_after_sub_keeps_its_backoff_growing() -> None:
    h = Harness(direct=("a:4150",), reconnect_max=60.0)
    h.step()
    for _ in range(6):  # subscribes, then nsqd closes it at once: not useful
        h.connect_ok("a:4150")
        h.lose("a:4150", useful=False)
        h.clock.now = h.d.retry_at["a:4150"]
        h.step()
    assert h.d.failures["a:4150"] == 6
    h.connect_ok("a:4150")
    h.lose("a:4150", useful=True)  # it delivered: the backoff starts afresh
    assert h.d.failures["a:4150"] == 1


def test_stop_ends_the_task_and_abandon_stops_reconnects() -> None:
    h = Harness(direct=("a:4150",))
    h.d.abandon()
    h.d._run()  # returns at once: the task has nothing more to do
    assert h.dialled == []


def test_a_connect_finishing_while_a_step_looks_is_not_dialled_again() -> None:
    """A connect completes (registers its connection, then leaves `connecting`) just after
    step() took its snapshot of the connected nsqds: the address must not look neither
    connected nor connecting. Before, it was dialled a second time; the consumer then held two
    connections to one nsqd and counted their credit wrongly (RDY stuck at 0 with
    max_in_flight 1)."""
    h = Harness(direct=("a:4150",))
    h.step()
    assert h.dialled == ["a:4150"]

    def connected_then_the_connect_finishes() -> set[str]:
        snapshot = set(h.connected)  # taken before the connect registers
        h.connect_ok("a:4150")  # ... which then completes on its own task
        return snapshot

    h.d.connected = connected_then_the_connect_finishes
    h.d._wakeup.set()
    h.step()
    assert h.dialled == ["a:4150"]  # not a second time
