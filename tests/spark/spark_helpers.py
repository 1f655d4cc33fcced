"""Helpers for the Spark tests: counting at nsqd, draining a channel, preloading a topic."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from support.nsq import wait_for

from nsq_sync import Consumer, Message, NsqdHTTPClient, Producer


def preload(tcp_address: str, topic: str, n: int, prefix: str = "m") -> list[bytes]:
    """Publish ``n`` bodies ``<prefix><i>`` (MPUB) and return them."""
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    with Producer(tcp_address) as producer:
        for i in range(0, n, 1000):
            producer.multi_publish(topic, bodies[i : i + 1000])
    return bodies


def staging_worker(staging: Any) -> int | None:
    """The pid of a Python worker that staged a chunk of a partition with no MANIFEST yet
    (chunk files are named ``chunk-<attempt>-<pid>-<n>.arrow``), or None."""
    for chunk in staging.glob("batch-*/part-*/chunk-*.arrow"):
        if not (chunk.parent / "MANIFEST").exists():
            return int(chunk.name.split("-")[2])
    return None


def staged_files(location: str) -> list[str]:
    """Every file (object, on S3) under a staging location, a local path or a URI, relative to
    it: what the source left there."""
    import pyarrow.fs as pafs

    from nsq_sync.spark._staging import Staging

    staging = Staging(location)
    base = staging.path()
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    infos = staging.fs.get_file_info(selector)
    return sorted(i.path[len(base) + 1 :] for i in infos if i.type == pafs.FileType.File)


def channel(http_address: str, topic: str, name: str) -> dict[str, Any]:
    """The channel's /stats entry (an empty dict when it does not exist yet)."""
    with NsqdHTTPClient(http_address) as client:
        return client.channel_stats(topic, name, include_clients=False) or {}


def nsq_stream(spark: Any, nsqd: Any, topic: str, channel: str, **options: Any) -> Any:
    """``spark.readStream.format("nsq")`` on ``nsqd``'s ``topic``/``channel`` with ``options``."""
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("topic", topic)
        .option("channel", channel)
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def parquet_bodies(spark: Any, path: Any) -> collections.Counter[bytes]:
    """The ``body`` column of the Parquet files at ``path``, counted."""
    rows = spark.read.parquet(str(path)).select("body").collect()
    return collections.Counter(bytes(r.body) for r in rows)


def drained(nsqd: Any, topic: str, name: str) -> dict[str, Any]:
    """The channel's stats once nothing is in flight on it; asserts nothing waits either."""
    stats: dict[str, Any] = wait_for(
        lambda: (s := channel(nsqd.http_address, topic, name))["in_flight_count"] == 0 and s,
        "nothing in flight",
        timeout=30,
    )
    assert stats["depth"] == 0
    return stats


def topic_stats(http_address: str, topic: str) -> dict[str, Any]:
    with NsqdHTTPClient(http_address) as client:
        return client.topic_stats(topic, include_clients=False) or {}


def drain(
    tcp_address: str, topic: str, channel_name: str, expect: int, timeout: float = 60.0
) -> collections.Counter[bytes]:
    """Consume ``topic/channel_name`` until ``expect`` messages arrived; count every body."""
    seen: collections.Counter[bytes] = collections.Counter()
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            seen[message.body] += 1

    consumer = Consumer(
        topic,
        channel_name,
        handle,
        nsqd_tcp_addresses=[tcp_address],
        max_in_flight=2500,
        runtime="threads",
    )
    consumer.start()
    try:
        wait_for(lambda: sum(seen.values()) >= expect, f"{expect} messages", timeout)
    finally:
        consumer.stop()
    return seen


def spark_submit(
    cluster: Any,
    script: Any,
    args: list[str],
    local_dir: Any,
    env_extra: dict[str, str] | None = None,
    conf: dict[str, str] | None = None,
    **popen: Any,
) -> Any:
    """Start ``spark-submit script args`` on ``cluster`` as an application of its own, taking
    the worker's third core (the test session's application holds the other two) unless
    ``conf`` (Spark settings over these) says otherwise, in a new process session (so that a
    test can kill the whole driver). Returns the Popen."""
    from nsq_sync.testing.spark_cluster import spark_home

    confs = {
        "spark.cores.max": "1",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "512m",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.local.dir": str(local_dir),
        **(conf or {}),
    }
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
    for key, value in confs.items():
        argv += ["--conf", f"{key}={value}"]
    return subprocess.Popen(
        [*argv, str(script), *args],
        env={**cluster.env(), **(env_extra or {})},
        start_new_session=True,
        text=True,
        **popen,
    )


def kill_driver(driver: Any) -> None:
    """SIGKILL a driver started by :func:`spark_submit`: spark-submit's JVM and the Python
    program (one process session), and reap it."""
    if driver.poll() is None:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    driver.wait(timeout=30)
