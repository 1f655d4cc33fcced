"""Keep the benchmark harness (bench/) from rotting: run its nsq_sync worker on every workload.

A few hundred messages per workload, nsq_sync only (no peer virtualenvs, no go bench tools), no
thresholds and no timing assertions: only that every workload runs, is verified against nsqd's
own counters, and renders into the report.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A plain import, not importorskip: a harness that no longer imports must fail this test.
import bench.report as bench_report  # noqa: E402
import bench.run as bench_run  # noqa: E402

# slow: every bench workload end to end (~11 s); the harness does not depend on the interpreter
# the suite runs on (each client runs in a process of its own), so once per CI run is enough
pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = dataclasses.replace(
    bench_run.QUICK,
    consume_n=300,
    pub_n=200,
    pub_threads_n=160,
    threads=4,
    mpub_n=400,
    latency_rate=2000,
    latency_s=0.3,
    latency_warmup_s=0.05,
    idle_nsqds=2,
    idle_settle_s=0.5,
    idle_window_s=0.3,
    rss_nsqds=2,
    rss_settle_s=0.1,
    scaling_n=300,
    scaling_nsqds=2,
    scaling_idle_window_s=0.3,
)

EXPECTED = (
    "consume",
    "pub",
    "pub_threads",
    "mpub",
    "latency_default",
    "latency_low",
    "idle_multi",
    "idle_1",
    "rss",
    "scaling_1",
    "scaling_2",
    "scaling_idle_1",
    "scaling_idle_2",
)


def test_nsq_sync_worker_runs_every_workload(
    nsq_bin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_run, "LOGS_DIR", tmp_path / "logs")
    harness = bench_run.Harness(
        TINY, ["nsq_sync"], list(bench_run.WORKLOADS), go_tools=False, verbose=False
    )
    data = harness.run()

    results = data["results"]
    assert sorted(results) == sorted(EXPECTED)
    for workload in EXPECTED:
        r = results[workload]["nsq_sync"]
        assert r["ok"], f"{workload}: {r.get('error')}\n{r.get('traceback', '')}"
    assert results["consume"]["nsq_sync"]["verified"]
    assert results["pub"]["nsq_sync"]["verified"]
    assert results["latency_low"]["nsq_sync"]["samples"] > 0
    assert results["idle_multi"]["nsq_sync"]["connections_seen_by_nsqd"] == TINY.idle_nsqds
    assert results["rss"]["nsq_sync"]["connections"] == TINY.rss_nsqds
    # the nsqds of the scaling workload are found through nsqlookupd
    assert results["scaling_2"]["nsq_sync"]["verified"]
    assert results["scaling_idle_2"]["nsq_sync"]["connections"] == 2
    assert results["consume"]["nsq_sync"]["cpu_us_per_msg"] > 0

    text = bench_report.render_markdown(data, None)
    assert "| workload |" in text
    assert "failed [" not in text
    assert "CPU per consumed message" in text
    assert {t["id"] for t in data["targets"]} >= {
        "consume_vs_nsqpy",
        "consume_cpu_vs_nsqpy",
        "idle",
        "latency_low",
        "scaling_idle_nsq_sync",
    }
