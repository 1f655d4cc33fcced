"""One real Spark standalone cluster (master + worker on 127.0.0.1) and one SparkSession for the
whole test session: starting Spark costs tens of seconds on a 2-core machine. A Spark Connect
server on that cluster serves the module that asks for it (test_connect.py), and only that one.

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
from support.nsq import in_ci
from support.s3 import S3_ENV, S3Server, find_gofakes3

from nsq_sync.testing.spark_cluster import (
    SparkClusterError,
    SparkConnectServer,
    SparkStandaloneCluster,
    find_java,
)


def _need(condition: bool, why: str) -> None:
    if not condition:
        if in_ci():
            pytest.fail(f"CI run of the Spark tests without {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def _s3_environment() -> Iterator[None]:
    """pyarrow's S3 settings for the staging tests (support.s3.S3_ENV), set before anything
    starts Spark, so that the driver and the executors inherit them."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in S3_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3 server on loopback (gofakes3, in memory) for ``s3://`` staging locations."""
    binary = find_gofakes3()
    _need(binary is not None, "gofakes3 (scripts/build-nsq --s3 builds it into .nsq/bin)")
    assert binary is not None
    with S3Server(binary, tmp_path_factory.mktemp("s3") / "gofakes3.log") as server:
        yield server


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    """A Spark master and one 3-core worker on loopback (the session's app takes two cores, as
    two 1-core executors, so that a spark-submit run, or while its module runs the Spark
    Connect server's app, can take the third)."""
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


@pytest.fixture(scope="module")
def spark_connect_server(
    spark_cluster: SparkStandaloneCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkConnectServer]:
    """A Spark Connect server (pyspark's ``sbin/start-connect-server.sh``) on ``spark_cluster``,
    for one module, stopped after it: its application's one 1-core executor holds the worker's
    third core, which the spark-submit tests (test_example.py, test_parallel.py) need later."""
    try:
        import pyspark.sql.connect.session  # noqa: F401  (checks grpcio, zstandard...)
    except ImportError as exc:
        _need(False, f"pyspark's Spark Connect client (pip install nsq_sync[spark-connect]): {exc}")
    server = SparkConnectServer(spark_cluster.master_url, tmp_path_factory.mktemp("connect"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def spark_connect(spark_connect_server: SparkConnectServer) -> Iterator[Any]:
    """A Spark Connect session (``SparkSession.builder.remote(url)``) on the module's server,
    with the nsq data source registered."""
    from nsq_sync.spark import NsqDataSource

    # Building a remote session marks this process as a Connect client for good
    # (SPARK_CONNECT_MODE_ENABLED: pyspark.sql.functions then build Connect columns); the
    # classic session's tests that follow need it gone.
    marked = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    try:
        session = spark_connect_server.session()
        try:
            session.dataSource.register(NsqDataSource)
            yield session
        finally:
            session.stop()
    finally:
        if marked is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = marked
