"""Suite-wide checks and fixtures.

The nsqd/nsqlookupd fixtures come from the nsq_sync pytest plugin, which the installed package
registers through its ``pytest11`` entry point (tox installs it into every test env).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsq_sync import Consumer

_RUNTIME_ENV = "NSQ_SYNC_TEST_RUNTIME"


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
    return f"nsq_sync runtime: {_runtime()}"


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
