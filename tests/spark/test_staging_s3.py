"""The parallel source staging to an S3 server (gofakes3 on loopback, through pyarrow's S3
filesystem) instead of a local folder: an object store has no folders to delete or to lose,
lists a folder as a prefix, and moves by copying. Partitions read against a real nsqd in this
process; the cluster test in test_parallel.py runs a whole query on it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import channel, drain, preload
from support.nsq import wait_for
from support.s3 import S3Server

from nsq_sync.errors import ConfigError
from nsq_sync.spark import NsqDataSource
from nsq_sync.spark._datasource import source_struct
from nsq_sync.spark._options import source_options
from nsq_sync.spark._parallel import NsqParallelStreamReader
from nsq_sync.spark._partition import NsqPartition, Superseded, read_partition
from nsq_sync.spark._staging import Staging

CHANNEL = "s3"
NAMES = source_struct().fieldNames()


def _options(nsqd: Any, topic: str, location: str, **extra: Any) -> Any:
    opts = {
        "nsqd_tcp_addresses": nsqd.tcp_address,
        "nsqd_http_addresses": nsqd.http_address,
        "topic": topic,
        "channel": CHANNEL,
        "parallelism": "2",
        "staging_location": location,
        "drain_idle_timeout": "0.3",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return source_options(opts)


def _bodies(batches: Any) -> list[bytes]:
    return [b for batch in batches for b in batch.column("body").to_pylist()]


def _settled(nsqd: Any, topic: str) -> dict[str, Any]:
    stats: dict[str, Any] = wait_for(
        lambda: (s := channel(nsqd.http_address, topic, CHANNEL))["in_flight_count"] == 0 and s,
        "nothing in flight",
        timeout=20,
    )
    return stats


def test_a_partition_stages_fins_replays_and_is_deleted_on_s3(
    s3_server: S3Server, nsqd: Any, nsq_topic: str
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 300)
    location = s3_server.location()
    options = _options(nsqd, nsq_topic, location, chunk_size=64)
    staging = Staging(location)
    staging.check_writable()
    staging.open_batch(1)
    staging.open_batch(2)
    staging.open_batch(2)  # planned again (a driver restart): the mark stays as it is
    assert staging.batches() == [1, 2]  # each once, though the store lists prefix and marker
    part = NsqPartition(batch=1, index=0, max_rows=200)
    first = _bodies(read_partition(part, options, staging, NAMES))
    assert len(first) == 200 and len(set(first)) == 200 and set(first) <= set(bodies)
    stats = _settled(nsqd, nsq_topic)
    assert stats["depth"] == 100 and stats["requeue_count"] == 0  # the staged 200 were FINed
    manifest = staging.partition(1, 0).manifest()
    assert manifest is not None and manifest.total == 200 and len(manifest.chunks) >= 4
    staged = s3_server.files(location)
    assert "batch-1/part-0/MANIFEST" in staged and "batch-1/part-0/SEALED" in staged
    assert not any(name.endswith(".tmp") for name in staged), staged  # every move completed
    # Read again (a task retry): the same rows from S3, nothing consumed.
    assert _bodies(read_partition(part, options, staging, NAMES)) == first
    assert channel(nsqd.http_address, nsq_topic, CHANNEL)["depth"] == 100
    # The commits delete every object of their batches: the location is left empty.
    assert staging.delete_through(1) == [1]
    assert all(name.startswith("batch-2/") for name in s3_server.files(location))
    assert staging.delete_through(2) == [2]
    assert s3_server.files(location) == []
    assert staging.delete_through(2) == []  # nothing to delete is not an error


def test_an_attempt_that_outlives_its_batch_commit_on_s3_fins_nothing(
    s3_server: S3Server, nsqd: Any, nsq_topic: str
) -> None:
    """A losing attempt runs on after the partition was completed and the batch committed.
    On S3 its next chunk's write succeeds (there is no folder to have lost): that chunk is
    requeued, not FINed, the attempt fails at once, and what it wrote is deleted again."""
    first = preload(nsqd.tcp_address, nsq_topic, 100, prefix="a")
    location = s3_server.location()
    options = _options(
        nsqd,
        nsq_topic,
        location,
        chunk_size=50,
        max_in_flight=50,
        drain_idle_timeout=20,
        partition_timeout=120,
    )
    staging = Staging(location)
    staging.open_batch(1)
    reader = read_partition(NsqPartition(1, 0, 1000), options, staging, NAMES, yield_rows=1)
    read = 0
    while read < len(first):
        read += next(reader).num_rows
    stage = staging.partition(1, 0)
    stage.seal("other")  # the other attempt completes the partition with what is staged
    listed = stage.complete_chunks()
    committed = {b for name in listed for b in _bodies(stage.read_chunk(name))}
    stage.write_manifest(listed, [stage.chunk_rows(name) for name in listed], len(listed), {})
    assert committed == set(first)
    assert staging.delete_through(1) == [1]  # the batch is committed
    assert s3_server.files(location) == []
    second = preload(nsqd.tcp_address, nsq_topic, 100, prefix="b")
    started = time.monotonic()
    with pytest.raises(Superseded, match="batch committed"):
        for _ in reader:
            pass
    assert time.monotonic() - started < 60, "it waited for the MANIFEST of a committed batch"
    stats = _settled(nsqd, nsq_topic)
    assert stats["requeue_count"] >= 1
    left = drain(nsqd.tcp_address, nsq_topic, CHANNEL, expect=stats["depth"], timeout=30)
    assert committed | set(left) == set(first + second)  # nothing FINed after the commit
    assert s3_server.files(location) == []  # its late chunk is gone again


def test_a_missing_bucket_fails_when_the_query_is_planned_naming_it(
    s3_server: S3Server,
) -> None:
    good = s3_server.location()
    wrong = good.replace("s3://staging/", "s3://no-such-bucket/")
    options = {
        "nsqd_tcp_addresses": "127.0.0.1:4150",
        "nsqd_http_addresses": "127.0.0.1:4151",
        "topic": "t",
        "channel": "c",
        "parallelism": "2",
    }
    source = NsqDataSource({**options, "staging_location": wrong})
    with pytest.raises(ConfigError, match=r"staging_location 's3://no-such-bucket/.*not writable"):
        source.streamReader(source_struct())
    ok = NsqDataSource({**options, "staging_location": good})
    assert isinstance(ok.streamReader(source_struct()), NsqParallelStreamReader)
    assert s3_server.files(good) == []  # the probe is gone


def test_the_s3_helper_sees_what_pyarrow_writes(s3_server: S3Server, tmp_path: Path) -> None:
    """The other tests' "nothing left" checks mean something: the listing finds objects."""
    location = s3_server.location()
    Staging(location).open_batch(7)
    assert s3_server.files(location) == ["batch-7/OPEN"]
