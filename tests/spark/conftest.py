"""One real Spark standalone cluster (master + worker on 127.0.0.1) and one SparkSession for the
whole test session: starting Spark costs tens of seconds on a 2-core machine.

Without pyspark or java these tests are skipped locally and fail in CI (``CI=true``): the
py311-spark tox env must not go green by skipping them. The other tox envs do not collect this
folder at all (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from nsq_sync.testing.spark_cluster import SparkClusterError, SparkStandaloneCluster, find_java

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _need(condition: bool, why: str) -> None:
    if not condition:
        if _in_ci():
            pytest.fail(f"CI run of the Spark tests without {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    """A Spark master and one 2-core worker on loopback (the session's app takes one core, so
    that a spark-submit run can take the other)."""
    _need(importlib.util.find_spec("pyspark") is not None, "pyspark (pip install nsq_sync[spark])")
    try:
        find_java()
    except SparkClusterError as exc:
        _need(False, str(exc))
    cluster = SparkStandaloneCluster(tmp_path_factory.mktemp("spark"), cores=2, memory="2g")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark(
    spark_cluster: SparkStandaloneCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The session's one SparkSession on ``spark_cluster``, with the nsq data source registered."""
    env = spark_cluster.env()
    saved = {
        k: os.environ.get(k)
        for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "SPARK_HOME", "JAVA_HOME")
    }
    for key in saved:
        os.environ[key] = env[key]
    from pyspark.sql import SparkSession

    from nsq_sync.spark import NsqDataSource

    session = (
        SparkSession.builder.master(spark_cluster.master_url)
        .appName("nsq_sync-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.cores.max", "1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "768m")
        .config("spark.driver.memory", "768m")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.speculation", "false")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .getOrCreate()
    )
    session.dataSource.register(NsqDataSource)
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
