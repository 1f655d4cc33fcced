"""examples/spark_pipeline.py, submitted to the standalone cluster with spark-submit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nsq_sync.testing.spark_cluster import spark_home

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_the_pipeline_example_runs_through_spark_submit(
    spark_cluster: Any, nsqd: Any, tmp_path: Path
) -> None:
    env = spark_cluster.env()
    env["NSQD_TCP_ADDRESS"] = nsqd.tcp_address
    # The test session's own application holds two of the worker's three cores: take the third.
    confs = {
        "spark.cores.max": "1",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "512m",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.local.dir": str(tmp_path / "local"),
    }
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url]
    for key, value in confs.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [str(EXAMPLE), "--rows", "3000", "--work-dir", str(tmp_path / "work")]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"master {spark_cluster.master_url}" in result.stdout
    assert "NSQ -> Parquet: 3000 rows (3000 distinct)" in result.stdout
    assert "every row came back exactly once" in result.stdout
