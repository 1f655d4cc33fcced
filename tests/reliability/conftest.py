"""Fixtures for the reliability suite, and its summary.

Every test records its figures with ``record_property`` under these names (any subset):

    messages       messages published (each with a unique body)
    handled        handler calls
    faults         faults injected (connections cut, restarts, kills, stalls...)
    lost           published messages never handled (must be 0 where the test says so)
    duplicates     handler calls beyond the first for a body (at-least-once redeliveries)
    recovery_max_s longest time from a fault to the first message handled on a new connection

At the end of the session this conftest writes ``.reliability/summary.json`` (and
``.reliability/summary-<runtime>.json``) at the repository root, and prints one line per test in
the terminal summary.
"""

from __future__ import annotations

import faulthandler
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import SCALE, gevent_patched, soak_seconds

WATCHDOG = 240.0  # a whole test, setup and teardown included (the soak adds its duration)
#: one entry per test that ran in this session (conftest hooks get no shared object to hang
#: it on: pytest_runtest_logreport sees only the report)
_RESULTS: list[dict[str, Any]] = []
_FIGURES = ("messages", "handled", "faults", "lost", "duplicates", "recovery_max_s")


@pytest.fixture(autouse=True)
def watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """Bound every test: dump every stack and exit if one runs past the watchdog."""
    limit = WATCHDOG + (soak_seconds() if request.node.get_closest_marker("slow") else 0.0)
    faulthandler.dump_traceback_later(limit, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


# --------------------------------------------------------------------------- summary


def _runtime() -> str:
    return "gevent" if gevent_patched() else "threads"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    _RESULTS.append(
        {
            "test": report.nodeid,
            "outcome": report.outcome,
            "duration_s": round(report.duration, 2),
            **{name: value for name, value in report.user_properties},
        }
    )


def _totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    for name in ("messages", "handled", "faults", "lost", "duplicates"):
        values = [r[name] for r in results if isinstance(r.get(name), (int, float))]
        totals[name] = sum(values) if values else None
    recoveries = [
        r["recovery_max_s"] for r in results if isinstance(r.get("recovery_max_s"), float)
    ]
    totals["recovery_max_s"] = max(recoveries) if recoveries else None
    return totals


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    results = _RESULTS
    if not results:
        return
    summary = {
        "runtime": _runtime(),
        "scale": SCALE,
        "soak_seconds": soak_seconds(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "totals": _totals(results),
        "tests": results,
    }
    folder = Path(session.config.rootpath) / ".reliability"
    folder.mkdir(exist_ok=True)
    text = json.dumps(summary, indent=2, sort_keys=False, default=str) + "\n"
    (folder / "summary.json").write_text(text)
    (folder / f"summary-{_runtime()}.json").write_text(text)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = _RESULTS
    if not results:
        return
    terminalreporter.section(f"reliability summary ({_runtime()}, scale {SCALE:g})")
    quiet = [r for r in results if not set(r) - {"test", "outcome", "duration_s"}]
    for r in results:
        if r in quiet:
            continue
        figures = " ".join(
            f"{name}={r[name]}" for name in _FIGURES if name in r and r[name] is not None
        )
        extra = " ".join(
            f"{k}={v}"
            for k, v in r.items()
            if k not in _FIGURES and k not in ("test", "outcome", "duration_s")
        )
        name = r["test"].split("::", 1)[-1]
        terminalreporter.write_line(
            f"{r['outcome']:7} {r['duration_s']:7.1f}s  {name}  {figures}"
            + (f"  [{extra}]" if extra else "")
        )
    if quiet:
        outcomes: dict[str, int] = {}
        for r in quiet:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        terminalreporter.write_line(
            f"{len(quiet)} test(s) without figures ("
            + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            + f", {sum(r['duration_s'] for r in quiet):.1f}s)"
        )
    totals = " ".join(f"{k}={v}" for k, v in _totals(results).items() if v is not None)
    if totals:
        terminalreporter.write_line(f"totals: {totals}")
    terminalreporter.write_line(
        f"written to {Path(config.rootpath) / '.reliability' / 'summary.json'}"
    )
