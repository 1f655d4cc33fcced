"""Suite-wide checks and fixtures.

The nsqd/nsqlookupd fixtures come from the nsq_sync pytest plugin, which the installed package
registers through its ``pytest11`` entry point (tox installs it into every test env).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.properties import PROFILE as _hypothesis_profile
from support.properties import load_profile

from nsq_sync import Consumer

_RUNTIME_ENV = "NSQ_SYNC_TEST_RUNTIME"
_TESTS = Path(__file__).resolve().parent

# Property tests (Hypothesis): how deep they search is this run's profile
# (tests/support/properties.py).
load_profile()

# tests/spark needs pyspark (the `spark` extra, installed only in the py311-spark tox env, which
# sets NSQ_SYNC_TEST_SPARK=1). Elsewhere the folder is not collected at all, rather than skipped
# test by test; in the spark env a missing pyspark or java fails in CI (tests/spark/conftest.py).
collect_ignore = []
if os.environ.get("NSQ_SYNC_TEST_SPARK") != "1" and (
    importlib.util.find_spec("pyspark") is None
    or os.environ.get(_RUNTIME_ENV, "").strip().lower() == "gevent"
):
    collect_ignore.append("spark")

# Every case of test_runtime_auto.py runs in a fresh interpreter (`python -c`) that decides for
# itself whether to patch: what the test process runs on changes nothing, so a gevent run would
# repeat the threads run of the same Python exactly (~13 s per env in CI).
if os.environ.get(_RUNTIME_ENV, "").strip().lower() == "gevent":
    collect_ignore.append("integration/test_runtime_auto.py")


def _runtime() -> str:
    return "gevent" if os.environ.get(_RUNTIME_ENV, "").strip().lower() == "gevent" else "threads"


def pytest_configure(config: pytest.Config) -> None:
    # A gevent run that forgot to monkey-patch would silently test the threads runtime again.
    if _runtime() == "gevent":
        from gevent import monkey

        if not monkey.is_module_patched("socket"):
            raise pytest.UsageError(
                f"{_RUNTIME_ENV}=gevent but socket is not monkey-patched: "
                "run the suite through `python tests/run_gevent.py`"
            )


def pytest_report_header(config: pytest.Config) -> str:
    return f"nsq_sync runtime: {_runtime()}; hypothesis profile: {_hypothesis_profile}"


@pytest.fixture(scope="session")
def runtime_mode() -> str:
    """The runtime this run exercises: ``"gevent"`` (monkey-patched) or ``"threads"``."""
    return _runtime()


@pytest.fixture
def consumers() -> Iterator[Callable[..., Consumer]]:
    """Build consumers that are stopped when the test ends, whatever happened."""
    made: list[Consumer] = []

    def make(*args: Any, **kwargs: Any) -> Consumer:
        consumer = Consumer(*args, **kwargs)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.stop(timeout=5.0)


if platform.python_implementation() == "PyPy":

    @pytest.hookimpl(hookwrapper=True, trylast=True)  # (innermost: before pytest's check)
    def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
        """PyPy frees objects at its GC's leisure, not when the last reference goes: collect
        right after each test's body (while pytest still watches for unraisable warnings), so
        a socket left unclosed is reported by the test that left it, not by a later one.
        (Not for tests/unit, which opens no sockets: a full collection costs PyPy ~0.1 s.)"""
        yield
        if "unit" not in item.path.relative_to(_TESTS).parts[:1]:
            gc.collect()
