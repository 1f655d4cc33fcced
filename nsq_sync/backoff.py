"""Backoff strategies (pure: an RNG is injected, no clock). :func:`reconnect_delay` is the wait
before dialling an nsqd again, for the consumer's discovery and the producer's slots alike."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class ExponentialBackoff:
    """``multiplier * 2**level`` seconds, at most ``max_duration``."""

    multiplier: float = 1.0
    max_duration: float = 120.0

    def compute(self, level: int) -> float:
        if level <= 0:
            return 0.0
        # cap the exponent before computing to avoid overflow at silly levels
        return float(min(self.max_duration, self.multiplier * (2.0 ** min(level, 62))))

    def max_level(self) -> int:
        """The first level whose duration reaches ``max_duration``."""
        level = 1
        while self.multiplier * 2.0**level < self.max_duration and level < 62:
            level += 1
        return level


@dataclass
class FullJitterBackoff(ExponentialBackoff):
    """A uniform draw in ``[0, exponential(level)]`` (the AWS "full jitter" strategy)."""

    rng: random.Random = field(default_factory=random.Random)

    def compute(self, level: int) -> float:
        return self.rng.uniform(0.0, super().compute(level))


def make_backoff(
    strategy: str, multiplier: float, max_duration: float, rng: random.Random | None = None
) -> ExponentialBackoff:
    """Build the strategy named in the config (``"exponential"`` or ``"full_jitter"``)."""
    if strategy == "full_jitter":
        return FullJitterBackoff(multiplier, max_duration, rng or random.Random())
    return ExponentialBackoff(multiplier, max_duration)


def reconnect_delay(failures: int, first: float, cap: float, rng: random.Random) -> float:
    """Seconds before dialling an nsqd again after ``failures`` (>= 1) failed attempts in a row:
    ``first * 2**(failures - 1)``, at most ``cap``, times a uniform draw in [0.5, 1] (never
    immediate, and spread so that clients that lost the same nsqd do not come back at once)."""
    return float(min(cap, first * 2 ** min(failures - 1, 16))) * (0.5 + rng.random() / 2)
