"""RunSummary's exit status: the rule every command that runs a consumer shares (nsq-sync
tail/drain, manage.py nsq_consume, flask nsq consume)."""

from __future__ import annotations

import pytest

from nsq_sync import RunSummary


def summary(reason: str, failed: int = 0, gave_up: int = 0) -> RunSummary:
    return RunSummary(
        handled=10, finished=10 - failed, requeued=failed, failed=failed, gave_up=gave_up,
        elapsed=1.0, reason=reason,
    )  # fmt: skip


@pytest.mark.parametrize("reason", ["idle", "max_messages", "timeout", "signal", "stopped"])
def test_nothing_failed_exits_0(reason: str) -> None:
    assert summary(reason).ok
    assert summary(reason).exit_status == 0


@pytest.mark.parametrize("reason", ["idle", "max_messages", "timeout"])
@pytest.mark.parametrize(("failed", "gave_up"), [(1, 0), (0, 1)])
def test_a_run_that_ended_by_itself_after_failures_exits_1(
    reason: str, failed: int, gave_up: int
) -> None:
    assert summary(reason, failed, gave_up).exit_status == 1  # so cron can alert


@pytest.mark.parametrize("reason", ["signal", "stopped"])
def test_a_graceful_stop_exits_0_even_after_failures(reason: str) -> None:
    done = summary(reason, failed=3, gave_up=1)
    assert not done.ok
    assert done.exit_status == 0  # a deploy stopping a worker is not a failure


def test_a_run_that_reached_no_nsqd_is_not_ok_and_exits_1() -> None:
    """Issue 39: a cron run whose servers could not be reached must not pass for a healthy
    empty run."""
    done = summary("unreachable")
    assert not done.ok
    assert done.exit_status == 1
