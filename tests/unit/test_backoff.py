"""Backoff strategies: pure functions of the level (and of a seeded RNG for full jitter)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_sync.backoff import ExponentialBackoff, FullJitterBackoff, make_backoff, reconnect_delay


@pytest.mark.parametrize(
    ("multiplier", "max_duration", "level", "expected"),
    [
        (1.0, 120.0, 0, 0.0),
        (1.0, 120.0, -3, 0.0),
        (1.0, 120.0, 1, 2.0),
        (1.0, 120.0, 2, 4.0),
        (1.0, 120.0, 6, 64.0),
        (1.0, 120.0, 7, 120.0),  # 128 capped
        (1.0, 120.0, 10_000, 120.0),  # no overflow at silly levels
        (0.5, 10.0, 1, 1.0),
        (0.5, 10.0, 4, 8.0),
        (0.5, 10.0, 5, 10.0),
        (0.1, 1.0, 3, 0.8),
        (2.0, 3.0, 1, 3.0),  # the cap applies at level 1 too
    ],
)
def test_exponential_is_multiplier_times_two_to_the_level_capped(
    multiplier: float, max_duration: float, level: int, expected: float
) -> None:
    assert ExponentialBackoff(multiplier, max_duration).compute(level) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("multiplier", "max_duration", "max_level"),
    [
        (1.0, 120.0, 7),
        (1.0, 128.0, 7),
        (1.0, 129.0, 8),
        (0.5, 10.0, 5),
        (2.0, 3.0, 1),
        (1.0, 2.0, 1),
    ],
)
def test_max_level_is_the_first_level_that_reaches_the_cap(
    multiplier: float, max_duration: float, max_level: int
) -> None:
    strategy = ExponentialBackoff(multiplier, max_duration)
    assert strategy.max_level() == max_level
    assert strategy.compute(max_level) == max_duration
    if max_level > 1:
        assert strategy.compute(max_level - 1) < max_duration


@given(
    multiplier=st.floats(0.001, 100.0),
    max_duration=st.floats(0.001, 3600.0),
    level=st.integers(0, 200),
    seed=st.integers(0, 2**32),
)
def test_full_jitter_draws_within_zero_and_the_exponential_value(
    multiplier: float, max_duration: float, level: int, seed: int
) -> None:
    bound = ExponentialBackoff(multiplier, max_duration).compute(level)
    strategy = FullJitterBackoff(multiplier, max_duration, random.Random(seed))
    for _ in range(20):
        assert 0.0 <= strategy.compute(level) <= bound


def test_full_jitter_spreads_over_the_whole_range_and_is_reproducible() -> None:
    draws = [FullJitterBackoff(1.0, 60.0, random.Random(42)).compute(3) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    strategy = FullJitterBackoff(1.0, 60.0, random.Random(7))
    values = [strategy.compute(3) for _ in range(2000)]
    assert min(values) >= 0.0 and max(values) <= 8.0
    assert min(values) < 0.5 and max(values) > 7.5
    assert 3.5 < sum(values) / len(values) < 4.5  # uniform: mean near 4


def test_full_jitter_level_zero_is_zero() -> None:
    assert FullJitterBackoff(1.0, 60.0, random.Random(1)).compute(0) == 0.0


def test_make_backoff_by_name() -> None:
    exponential = make_backoff("exponential", 0.5, 30.0)
    assert type(exponential) is ExponentialBackoff
    assert (exponential.multiplier, exponential.max_duration) == (0.5, 30.0)
    rng = random.Random(3)
    jitter = make_backoff("full_jitter", 0.5, 30.0, rng=rng)
    assert isinstance(jitter, FullJitterBackoff)
    assert jitter.rng is rng
    assert jitter.max_level() == exponential.max_level()


def test_reconnect_delay_doubles_from_first_up_to_the_cap_with_equal_jitter() -> None:
    """The wait before dialling an nsqd again (discovery and the producer's slots): between half
    and all of ``first * 2**(failures - 1)``, never above ``cap``."""
    rng = random.Random(7)
    for failures in range(1, 40):
        full = min(30.0, 0.1 * 2 ** (failures - 1))
        delays = [reconnect_delay(failures, 0.1, 30.0, rng) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays), failures
        assert max(delays) - min(delays) > full / 4  # spread, not one value
