"""One real Spark standalone cluster (master + worker on 127.0.0.1) and one SparkSession for the
whole test session: starting Spark costs tens of seconds on a 2-core machine.

Without pyspark or java these tests are skipped locally and fail in CI (``CI=true``): the
py311-spark tox env must not go green by skipping them. The other tox envs do not collect this
folder at all (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from nsq_sync.testing.spark_cluster import SparkClusterError, SparkStandaloneCluster, find_java


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _need(condition: bool, why: str) -> None:
    if not condition:
        if _in_ci():
            pytest.fail(f"CI run of the Spark tests without {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    """A Spark master and one 3-core worker on loopback (the session's app takes two cores, as
    two 1-core executors, so that a spark-submit run can take the third)."""
    _need(importlib.util.find_spec("pyspark") is not None, "pyspark (pip install nsq_sync[spark])")
    try:
        find_java()
    except SparkClusterError as exc:
        _need(False, str(exc))
    cluster = SparkStandaloneCluster(tmp_path_factory.mktemp("spark"), cores=3, memory="3g")
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
    from nsq_sync.spark import NsqDataSource

    session = spark_cluster.session(
        "nsq_sync-tests",
        **{
            # two executors: the parallel source reads in two executor processes at once
            "spark.cores.max": "2",
            "spark.executor.cores": "1",
            "spark.executor.memory": "768m",
            "spark.driver.memory": "768m",
            "spark.sql.shuffle.partitions": "2",
            "spark.speculation": "false",
            "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
        },
    )
    session.dataSource.register(NsqDataSource)
    try:
        yield session
    finally:
        session.stop()
