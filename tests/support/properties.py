"""How many examples the property tests (Hypothesis) try, by kind of run.

``NSQ_SYNC_HYPOTHESIS_PROFILE`` names the profile:

- ``quick`` (the default): a developer's ``pytest tests/unit``, which stays under 5 s (the
  dev/CI split Hypothesis's docs recommend);
- ``ci``: every tox env (tox.ini sets it), the counts CI has always run;
- ``thorough``: the CPython 3.11 envs, which search wider once per CI run.

Tests that take Hypothesis's settings get 10, 25 or 300 examples (:func:`load_profile`, called
by tests/conftest.py); tests that size their own search (the RDY simulations, the fuzz tests)
ask :func:`examples`. No deadline: the machine is shared and timing varies.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("NSQ_SYNC_HYPOTHESIS_PROFILE", "").strip() or "quick"
if PROFILE not in ("quick", "ci", "thorough"):
    raise ValueError(f"NSQ_SYNC_HYPOTHESIS_PROFILE={PROFILE!r}: use quick, ci or thorough")


def examples(ci: int, quick: int, thorough: int | None = None, override: str = "") -> int:
    """The example count for this run's profile (``thorough`` defaults to ``ci``); the
    environment variable named by ``override``, when set, wins."""
    if override and os.environ.get(override):
        return int(os.environ[override])
    if PROFILE == "quick":
        return quick
    if PROFILE == "thorough" and thorough is not None:
        return thorough
    return ci


def load_profile() -> None:
    """Register the three profiles with Hypothesis and load this run's."""
    settings.register_profile(
        "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile("quick", settings.get_profile("ci"), max_examples=10)
    settings.register_profile("thorough", settings.get_profile("ci"), max_examples=300)
    settings.load_profile(PROFILE)
