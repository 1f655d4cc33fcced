"""Speculative execution on a real cluster: Spark runs a copy of a stalled partition's task on
another host, and the parallel source loses nothing.

Spark launches a speculative copy of a task only on a host the task is not running on, so this
test starts a cluster of its own: a master and two 1-core workers named ``127.0.0.1`` and
``localhost`` (both loopback; Spark takes them for two hosts). A driver program
(speculation_app.py, spark-submit) runs an ``availableNow`` query of the parallel source with
``spark.speculation`` on, and the test stops (SIGSTOP) the Python worker of one partition once
it staged a chunk, as a long pause of its machine would.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import channel, kill_driver, preload, spark_submit, staging_worker
from support.nsq import free_closed_port, wait_for

APP = Path(__file__).with_name("speculation_app.py")
CHUNK = 100  # the app's chunk_size


@pytest.fixture(scope="module")
def two_host_cluster(spark_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A master and two 1-core workers that Spark takes for two hosts (``spark_cluster`` is
    requested for its checks: pyspark and java present, or the test fails in CI)."""
    from nsq_sync.testing.spark_cluster import SparkStandaloneCluster

    cluster = SparkStandaloneCluster(
        tmp_path_factory.mktemp("spark-two-hosts"),
        cores=1,
        memory="1g",
        worker_hosts=("127.0.0.1", "localhost"),
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _bodies(path: Path) -> collections.Counter[bytes]:
    import pyarrow.parquet as pq

    return collections.Counter(pq.read_table(path, columns=["body"]).column("body").to_pylist())


def test_a_stalled_partition_is_speculated_on_another_host_and_nothing_is_lost(
    two_host_cluster: Any, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """One partition's Python worker stops after staging a chunk. Spark runs a speculative copy
    of its task on the other host; the copy adopts what the stalled attempt staged, consumes the
    rest (what the stalled one held comes back after msg_timeout), and completes the partition;
    Spark kills the stalled attempt. Every body arrives; duplicates stay within one chunk; the
    channel is drained and the staging location empty."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 2000)
    work = tmp_path / "work"
    work.mkdir()
    staging = work / "staging"
    stopped: list[int] = []
    done = threading.Event()

    def stall() -> None:
        # Stop a worker that staged a chunk, before its partition's MANIFEST (the partitions
        # idle 4 s at the end).
        while not done.wait(0.01) and not stopped:
            pid = staging_worker(staging)
            if pid is not None:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    ui_port = free_closed_port()
    conf = {
        "spark.cores.max": "2",
        "spark.executor.cores": "1",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",  # both executors, then the query
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.quantile": "0.5",  # one of the two partitions done
        "spark.speculation.multiplier": "1.0",
        "spark.speculation.minTaskRuntime": "1s",
        "spark.speculation.efficiency.enabled": "false",
        "spark.ui.enabled": "true",  # the app lists its tasks through the UI's REST API
        "spark.ui.port": str(ui_port),
        "spark.ui.showConsoleProgress": "false",
    }
    args = [nsqd.tcp_address, nsqd.http_address, nsq_topic, str(work), str(ui_port)]
    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    log_path = tmp_path / "driver.log"
    with log_path.open("w") as log:
        driver = spark_submit(
            two_host_cluster, APP, args, tmp_path / "local", conf=conf, stdout=log, stderr=log
        )
        try:
            driver.wait(timeout=300)
        finally:
            done.set()
            thread.join()
            for pid in stopped:  # if Spark has not killed it, let it go on: it must FIN nothing
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            kill_driver(driver)
    output = log_path.read_text()
    assert driver.returncode == 0 and "speculation: done" in output, output[-4000:]
    assert stopped, "no Python worker was stopped"

    tasks = json.loads((work / "tasks.json").read_text())
    assert {t["host"] for t in tasks} == {"127.0.0.1", "localhost"}, tasks
    copies = [t for t in tasks if t["speculative"] and t["status"] == "SUCCESS"]
    assert copies, f"no speculative task succeeded: {tasks}"
    for copy in copies:
        others = [
            t
            for t in tasks
            if (t["stage"], t["index"]) == (copy["stage"], copy["index"]) and t is not copy
        ]
        assert others and all(t["host"] != copy["host"] for t in others), tasks
        assert all(t["status"] != "SUCCESS" for t in others), tasks  # Spark stopped the original
    manifests = json.loads((work / "manifests.json").read_text())
    assert manifests and all(m["info"]["pid"] not in stopped for m in manifests), manifests
    assert any(m["adopted"] for m in manifests), "the copy did not take the stalled one's chunks"

    seen = _bodies(work / "out")
    assert set(seen) == set(bodies)  # nothing lost
    duplicates = sum(seen.values()) - len(seen)
    assert duplicates <= CHUNK, f"{duplicates} duplicates: more than the one chunk not FINed"
    wait_for(
        lambda: (
            (s := channel(nsqd.http_address, nsq_topic, "spark"))["depth"] == 0
            and s["in_flight_count"] == 0
        ),
        "the channel drained, nothing in flight",
        timeout=30,
    )
    assert list(staging.iterdir()) == []
