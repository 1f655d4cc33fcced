"""examples/spark_pipeline.py, submitted to the standalone cluster with spark-submit."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import kill_driver, spark_submit

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_the_pipeline_example_runs_through_spark_submit(
    spark_cluster: Any, nsqd: Any, tmp_path: Path
) -> None:
    env_extra = {"NSQD_TCP_ADDRESS": nsqd.tcp_address}
    args = ["--rows", "3000", "--work-dir", str(tmp_path / "work")]
    driver = spark_submit(
        spark_cluster,
        EXAMPLE,
        args,
        tmp_path / "local",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env_extra=env_extra,
    )
    try:
        stdout, stderr = driver.communicate(timeout=300)
    finally:
        kill_driver(driver)
    result = subprocess.CompletedProcess(driver.args, driver.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"master {spark_cluster.master_url}" in result.stdout
    assert "NSQ -> Parquet: 3000 rows (3000 distinct)" in result.stdout
    assert "every row came back exactly once" in result.stdout
