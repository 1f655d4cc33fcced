"""The parallel source's pieces without a SparkSession: staging on a local filesystem (and, where
an object store behaves otherwise, on an S3 server: gofakes3 on loopback), a partition's read
against a real nsqd (stage, FIN, MANIFEST, replay, adopt), the driver's planning from nsqd's
/stats, and its options."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from spark_helpers import channel, drain, preload, staged_files, topic_stats
from support.nsq import wait_for

from nsq_sync.errors import ConfigError
from nsq_sync.spark import NsqDataSource
from nsq_sync.spark._datasource import source_struct
from nsq_sync.spark._options import source_options
from nsq_sync.spark._parallel import NsqParallelStreamReader
from nsq_sync.spark._partition import (
    NsqPartition,
    Superseded,
    messages_to_arrow,
    read_partition,
)
from nsq_sync.spark._staging import PartitionStage, Staging

CHANNEL = "par"
NAMES = source_struct().fieldNames()


def _options(nsqd: Any, topic: str, staging: Path, **extra: Any) -> Any:
    opts = {
        "nsqd_tcp_addresses": nsqd.tcp_address,
        "nsqd_http_addresses": nsqd.http_address,
        "topic": topic,
        "channel": CHANNEL,
        "parallelism": "4",
        "staging_location": str(staging),
        "drain_idle_timeout": "0.3",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return source_options(opts)


def _bodies(batches: Any) -> list[bytes]:
    return [b for batch in batches for b in batch.column("body").to_pylist()]


def _staging(location: Path | str, *batches: int) -> Staging:
    """The staging location with ``batches`` open, as the driver leaves them when it plans them
    (``partitions()``)."""
    staging = Staging(str(location))
    for batch in batches:
        staging.open_batch(batch)
    return staging


def _location(storage: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh staging location: a local folder, or a prefix on the S3 server."""
    if storage == "s3":
        return str(request.getfixturevalue("s3_server").location())
    return str(tmp_path / "staging")


def _settled(nsqd: Any, topic: str) -> dict[str, Any]:
    stats: dict[str, Any] = wait_for(
        lambda: (s := channel(nsqd.http_address, topic, CHANNEL))["in_flight_count"] == 0 and s,
        "nothing in flight",
        timeout=20,
    )
    return stats


STORAGES = pytest.mark.parametrize("storage", ["local", "s3"])


@STORAGES
def test_a_partition_stages_fins_and_replays_without_consuming(
    storage: str, request: pytest.FixtureRequest, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 300)
    location = _location(storage, request, tmp_path)
    options = _options(nsqd, nsq_topic, location, chunk_size=64)
    staging = _staging(location, 1, 2, 2)  # batch 2 planned twice (a driver restart)
    assert staging.batches() == [1, 2]  # each once (an object store lists prefix and marker)
    part = NsqPartition(batch=1, index=0, max_rows=200)
    batches = list(read_partition(part, options, staging, NAMES))
    # Spark gets the staged chunks (64 rows or fewer) joined into batches of up to 10,000 rows.
    assert [batch.num_rows for batch in batches] == [200]
    first = _bodies(batches)
    assert len(first) == 200 and len(set(first)) == 200 and set(first) <= set(bodies)
    stats = _settled(nsqd, nsq_topic)
    assert stats["depth"] == 100  # the 200 staged messages were FINed, nothing else taken
    assert stats["requeue_count"] == 0
    stage = staging.partition(1, 0)
    manifest = stage.manifest()
    assert manifest is not None and manifest.total == 200 and len(manifest.chunks) >= 4
    assert manifest.info["pid"] == os.getpid()
    staged = staged_files(staging.location)
    assert {"batch-1/part-0/MANIFEST", "batch-1/part-0/SEALED"} <= set(staged)
    assert not any(name.endswith(".tmp") for name in staged), staged  # every move completed
    # Read again (a task retry, a re-run batch): the same rows, nothing consumed.
    again = list(read_partition(part, options, staging, NAMES, yield_rows=100))
    assert _bodies(again) == first
    sizes = [batch.num_rows for batch in again]  # chunks joined until they reach 100 rows
    assert all(100 <= n < 164 for n in sizes[:-1]) and 0 < sizes[-1] < 164
    assert channel(nsqd.http_address, nsq_topic, CHANNEL)["depth"] == 100
    # The commit deletes the batch's staging, and only batches up to it.
    read_partition(NsqPartition(batch=2, index=0, max_rows=10), options, staging, NAMES)
    assert list(read_partition(NsqPartition(2, 0, 10), options, staging, NAMES))
    assert staging.batches() == [1, 2]
    assert staging.delete_through(1) == [1]
    assert staging.batches() == [2]
    assert all(name.startswith("batch-2/") for name in staged_files(staging.location))
    assert staging.delete_through(2) == [2]
    assert staged_files(staging.location) == []  # every object of the committed batches is gone
    assert staging.delete_through(2) == []  # nothing to delete is not an error


def test_the_next_attempt_adopts_what_a_failed_attempt_staged(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 100)
    options = _options(nsqd, nsq_topic, tmp_path, chunk_size=50)
    staging = _staging(tmp_path, 3)
    stage = staging.partition(3, 1)

    # A failed attempt: it consumed and staged one chunk (FINed), then died before its MANIFEST.
    # Its half-written chunk (a .tmp file) must be ignored.
    class Dead:
        def __init__(self, body: bytes) -> None:
            self.id, self.body, self.timestamp = b"0" * 16, body, 0
            self.attempts, self.nsqd_address = 1, nsqd.tcp_address

    staged_before = [b"earlier-1", b"earlier-2", b"earlier-3"]
    batch = messages_to_arrow([Dead(b) for b in staged_before], options, NAMES)  # type: ignore[misc]
    stage.write_chunk(batch, "a1")
    Path(stage.dir, "chunk-a1-1-000002.arrow.0123.tmp").write_bytes(b"half")
    assert stage.manifest() is None

    rows = _bodies(read_partition(NsqPartition(3, 1, 40), options, staging, NAMES))
    assert rows[:3] == staged_before  # adopted first, counted against max_rows
    assert len(rows) == 40 and set(rows[3:]) <= set(bodies)
    manifest = stage.manifest()
    assert manifest is not None and manifest.adopted == 1 and manifest.total == 40
    assert _settled(nsqd, nsq_topic)["depth"] == 63


def test_a_staging_failure_requeues_the_chunk_and_the_retry_adopts_the_rest(
    nsqd: Any, nsq_topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 50)
    options = _options(nsqd, nsq_topic, tmp_path, chunk_size=25)
    staging = _staging(tmp_path, 1)
    write_chunk = PartitionStage.write_chunk
    calls = []

    def failing_second(self: PartitionStage, batch: Any, attempt: str) -> str:
        calls.append(batch.num_rows)
        if len(calls) == 2:
            raise OSError("disk full")
        return write_chunk(self, batch, attempt)

    monkeypatch.setattr(PartitionStage, "write_chunk", failing_second)
    with pytest.raises(RuntimeError, match="staging a chunk of batch 1 partition 0 .*disk full"):
        list(read_partition(NsqPartition(1, 0, 50), options, staging, NAMES))
    stats = _settled(nsqd, nsq_topic)
    assert stats["depth"] == 25  # the chunk that failed to stage was requeued: nothing lost
    assert staging.partition(1, 0).manifest() is None
    monkeypatch.setattr(PartitionStage, "write_chunk", write_chunk)
    # The retry adopts the staged (and FINed) chunk and consumes the rest: each body once.
    rows = _bodies(read_partition(NsqPartition(1, 0, 50), options, staging, NAMES))
    assert sorted(rows) == sorted(bodies)
    assert _settled(nsqd, nsq_topic)["depth"] == 0


def test_the_driver_plans_batches_from_nsqd_stats(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    options = _options(nsqd, nsq_topic, tmp_path, max_messages_per_batch=1000)
    reader = NsqParallelStreamReader(options, source_struct())
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert start == {"batch": 0, "rows": 0}
    assert reader.latestOffset(start, ReadMaxRows(1000)) == start  # nothing waits: no batch
    preload(nsqd.tcp_address, nsq_topic, 2500)  # no channel yet: the topic's depth counts
    end = reader.latestOffset(start, ReadMaxRows(1000))
    assert end == {"batch": 1, "rows": 1000}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"batch": 1, "rows": 1000}
    assert reader.latestOffset(start, ReadMaxRows(300)) == {"batch": 1, "rows": 300}
    parts = reader.partitions(start, end)
    assert [p.value for p in parts] == [NsqPartition(1, i, 250) for i in range(4)]
    assert Staging(str(tmp_path)).partition(1, 0).batch_open()  # planned: its reads may consume
    # The partitions are a pure function of the offsets, also in another copy of the reader.
    copy = cloudpickle.loads(cloudpickle.dumps(reader))
    assert [p.value for p in copy.partitions(start, end)] == [p.value for p in parts]
    # After a batch with rows and nothing waiting: one empty batch, so that Spark commits it.
    drained = {"batch": 7, "rows": 40}
    drain(nsqd.tcp_address, nsq_topic, CHANNEL, 2500)
    _settled(nsqd, nsq_topic)
    tick = reader.latestOffset(drained, ReadMaxRows(1000))
    assert tick == {"batch": 8, "rows": 0}
    assert [p.value for p in reader.partitions(drained, tick)] == [NsqPartition(8, 0, 0)]
    assert list(read_partition(NsqPartition(8, 0, 0), options, Staging(str(tmp_path)), NAMES)) == []
    assert reader.latestOffset(tick, ReadMaxRows(1000)) == tick  # availableNow ends here
    reader.commit({"batch": 100, "rows": 0})
    assert Staging(str(tmp_path)).batches() == []


def test_an_attempt_whose_batch_is_committed_while_it_waits_leaves_nothing(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """A losing attempt that consumed nothing is still waiting (drain_idle_timeout) when its
    batch is committed: it ends in Superseded and does not seal or write a MANIFEST into the
    deleted batch (the real-cluster speculation test found such a late attempt's files left
    in the staging after the query)."""
    options = _options(nsqd, nsq_topic, tmp_path, drain_idle_timeout=3.0)
    staging = _staging(tmp_path, 1)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            list(read_partition(NsqPartition(1, 0, 50), options, staging, NAMES))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            outcome.append(exc)

    thread = threading.Thread(target=attempt)
    thread.start()
    wait_for(
        lambda: channel(nsqd.http_address, nsq_topic, CHANNEL).get("client_count") == 1,
        "the attempt subscribed",
    )
    assert staging.delete_through(1) == [1]  # the batch is committed
    thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], Superseded), outcome
    assert "committed while this attempt" in str(outcome[0])
    assert staging.batches() == []


def test_an_attempt_of_a_batch_that_is_not_open_consumes_nothing(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """A task attempt that starts after its batch was committed (a late speculative copy), or
    on an executor that does not see the driver's staging location: it fails naming both
    causes, and takes no message from nsqd."""
    preload(nsqd.tcp_address, nsq_topic, 100)
    options = _options(nsqd, nsq_topic, tmp_path)
    staging = _staging(tmp_path, 1)
    assert staging.delete_through(1) == [1]  # the batch is committed
    with pytest.raises(Superseded, match="committed before this attempt.*share"):
        list(read_partition(NsqPartition(1, 0, 50), options, staging, NAMES))
    assert channel(nsqd.http_address, nsq_topic, CHANNEL) == {}  # it never subscribed
    assert topic_stats(nsqd.http_address, nsq_topic)["depth"] == 100
    assert staging.batches() == []  # and wrote nothing


def test_the_open_mark_is_written_once_and_deleted_first(tmp_path: Path) -> None:
    """Planning a batch again (a driver restart) leaves its OPEN mark as it is: replacing it
    would remove it for a moment on HDFS, and an attempt would take the batch for committed.
    A batch planned and never read holds only the mark: a new query does not take it for
    another query's rows. The commit deletes the mark before the rest."""
    staging = _staging(tmp_path, 1, 2)
    mark = Path(staging.partition(2, 0)._open)
    before = mark.stat()
    staging.open_batch(2)
    assert (mark.stat().st_ino, mark.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert staging.only_open(2)
    Path(staging.partition(1, 0).dir).mkdir()
    assert not staging.only_open(1)
    deleted: list[str] = []
    fs = staging.fs
    real_delete_file, real_delete_dir = fs.delete_file, fs.delete_dir

    class Recording:  # pyarrow's filesystem, with the order of the deletions written down
        def __getattr__(self, name: str) -> Any:
            return getattr(fs, name)

        def delete_file(self, path: str) -> None:
            deleted.append(path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1])
            real_delete_file(path)

        def delete_dir(self, path: str) -> None:
            deleted.append(path.rsplit("/", 1)[-1] + "/")
            real_delete_dir(path)

    staging._fs = Recording()
    assert staging.delete_through(2) == [1, 2]
    assert deleted == ["batch-1/OPEN", "batch-1/", "batch-2/OPEN", "batch-2/"]
    assert staging.batches() == []


def test_a_new_query_refuses_a_staging_location_with_batches_in_it(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    options = _options(nsqd, nsq_topic, tmp_path)
    (tmp_path / "batch-1" / "part-0").mkdir(parents=True)
    # A query restarted before its first commit starts from the initial offset again and
    # replays its staged first batch:
    assert NsqParallelStreamReader(options, source_struct()).initialOffset()["batch"] == 0
    (tmp_path / "batch-4" / "part-0").mkdir(parents=True)
    reader = NsqParallelStreamReader(options, source_struct())
    with pytest.raises(ConfigError, match=r"staging_location .* holds staged batches \[4\]"):
        reader.initialOffset()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"staging_location": None}, "option staging_location is required"),
        ({"staging_location": "relative/dir"}, "must be an absolute path or a URI"),
        ({"nsqd_http_addresses": None}, "lookupd_http_addresses, or nsqd_http_addresses"),
        ({"parallelism": "0"}, "option parallelism must be between 1"),
        ({"chunk_size": "5000", "max_in_flight": "2500"}, "chunk_size"),
    ],
)
def test_parallel_options_are_checked(
    nsqd: Any, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    opts = {
        "nsqd_tcp_addresses": nsqd.tcp_address,
        "nsqd_http_addresses": nsqd.http_address,
        "topic": "t",
        "channel": "c",
        "parallelism": "2",
        "staging_location": str(tmp_path),
    }
    opts.update(change)
    with pytest.raises(ConfigError, match=named):
        source_options({k: v for k, v in opts.items() if v is not None})


def test_parallel_only_options_need_parallelism() -> None:
    with pytest.raises(ConfigError, match="option staging_location needs option parallelism"):
        source_options(
            {"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "t", "channel": "c"}
            | {"staging_location": "/tmp/x"}
        )


def test_an_unwritable_staging_location_fails_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    location = str(blocker / "staging")
    source = NsqDataSource(
        {
            "nsqd_tcp_addresses": "127.0.0.1:4150",
            "nsqd_http_addresses": "127.0.0.1:4151",
            "topic": "t",
            "channel": "c",
            "parallelism": "2",
            "staging_location": location,
        }
    )
    with pytest.raises(ConfigError, match=f"staging_location '{location}' is not writable"):
        source.streamReader(source_struct())
    ok = NsqDataSource({**source.options, "staging_location": str(tmp_path / "ok")})
    assert isinstance(ok.streamReader(source_struct()), NsqParallelStreamReader)
    assert not any((tmp_path / "ok").iterdir())  # the probe file is gone


def test_a_missing_s3_bucket_fails_naming_the_location(s3_server: Any) -> None:
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
    assert staged_files(good) == []  # the probe is gone
    Staging(good).open_batch(7)  # and the listing the tests rely on sees what is written
    assert staged_files(good) == ["batch-7/OPEN"]


def _attempt(part: NsqPartition, options: Any, staging: Staging) -> tuple[str, list[bytes]]:
    """One attempt of a partition, as a task runs it: ("ok", rows) or ("superseded", rows)."""
    rows: list[bytes] = []
    try:
        for batch in read_partition(part, options, staging, NAMES):
            rows.extend(batch.column("body").to_pylist())
    except Superseded:
        return "superseded", rows
    return "ok", rows


def test_speculative_attempts_of_one_partition_lose_nothing(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """spark.speculation=true: two attempts of a partition consume at once. Whichever attempt
    Spark keeps (any that succeeded), its rows and what is left in the channel hold every body;
    the MANIFEST (what a replay yields) does too; duplicates stay within a chunk per attempt."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 3000)
    options = _options(nsqd, nsq_topic, tmp_path, chunk_size=50, max_in_flight=50)
    staging = _staging(tmp_path, 1)
    part = NsqPartition(batch=1, index=0, max_rows=2000)
    results: list[tuple[str, list[bytes]]] = []
    threads = [
        threading.Thread(target=lambda: results.append(_attempt(part, options, staging)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2 and any(outcome == "ok" for outcome, _ in results)
    depth = _settled(nsqd, nsq_topic)["depth"]
    left = drain(nsqd.tcp_address, nsq_topic, CHANNEL, expect=depth, timeout=30)
    left_over = set(left)
    manifest = staging.partition(1, 0).manifest()
    assert manifest is not None
    replayed = _bodies(read_partition(part, options, staging, NAMES))
    assert set(replayed) | left_over == set(bodies)
    for outcome, rows in results:
        if outcome == "ok":
            assert set(rows) | left_over == set(bodies)
    assert len(replayed) + sum(left.values()) - len(bodies) <= 2 * 50


def test_an_attempt_that_stages_after_the_seal_requeues_and_fails(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """Another attempt sealed the partition (and wrote its MANIFEST) while this one consumed:
    this one's next chunk is requeued, not FINed, and the attempt fails so Spark cannot keep
    its rows."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 400)
    options = _options(nsqd, nsq_topic, tmp_path, chunk_size=50, max_in_flight=50)
    staging = _staging(tmp_path, 1)
    reader = read_partition(NsqPartition(1, 0, 400), options, staging, NAMES, yield_rows=1)
    first = next(reader)  # one chunk
    stage = staging.partition(1, 0)
    stage.seal("other")
    listed = stage.complete_chunks()
    listed_rows = [stage.chunk_rows(name) for name in listed]
    stage.write_manifest(listed, listed_rows, len(listed), {})
    with pytest.raises(Superseded, match="completed by another attempt"):
        for _ in reader:
            pass
    stats = _settled(nsqd, nsq_topic)
    assert stats["requeue_count"] >= 1
    # Nothing lost: what the MANIFEST holds plus what is back in the channel is every body.
    kept = set(_bodies(read_partition(NsqPartition(1, 0, 400), options, staging, NAMES)))
    assert first.num_rows and set(first.column("body").to_pylist()) <= kept
    left = drain(nsqd.tcp_address, nsq_topic, CHANNEL, expect=stats["depth"], timeout=30)
    assert kept | set(left) == set(bodies)


@STORAGES
def test_an_attempt_that_outlives_its_batch_commit_fins_nothing(
    storage: str, request: pytest.FixtureRequest, nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """An attempt runs on after another one completed the partition and the batch was
    committed (its staging deleted, SEALED with it), as a losing speculative attempt may until
    Spark stops it. On an object store its next chunk's write succeeds (there is no folder to
    have lost; locally the test makes the folder again). That chunk is requeued, not FINed, and
    the attempt fails without waiting for a MANIFEST: nothing is FINed outside the committed
    batch, and what it wrote is deleted again."""
    first = preload(nsqd.tcp_address, nsq_topic, 100, prefix="a")
    location = _location(storage, request, tmp_path)
    options = _options(
        nsqd,
        nsq_topic,
        location,
        chunk_size=50,
        max_in_flight=50,
        drain_idle_timeout=20,
        partition_timeout=120,
    )
    staging = _staging(location, 1)
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
    assert staged_files(staging.location) == []
    if storage == "local":
        Path(stage.dir).mkdir(parents=True)
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
    assert staged_files(staging.location) == []  # what it wrote after the commit is gone again


def _read_one_chunk_and_close(
    nsqd: Any, topic: str, tmp_path: Path, published: int, max_rows: int
) -> tuple[list[bytes], Any, Staging, Any]:
    """Publish ``published`` bodies, read one chunk (50 rows) of partition 1/0, then stop
    reading: (the bodies, the options, the staging, the chunk)."""
    bodies = preload(nsqd.tcp_address, topic, published)
    options = _options(nsqd, topic, tmp_path, chunk_size=50)
    staging = _staging(tmp_path, 1)
    reader = read_partition(NsqPartition(1, 0, max_rows), options, staging, NAMES, yield_rows=1)
    first = next(reader)  # one chunk
    reader.close()
    return bodies, options, staging, first


def test_a_sealed_partition_without_manifest_is_completed_without_consuming(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """The attempt that sealed died before its MANIFEST: the next one consumes nothing more and
    completes the partition with every chunk staged there."""
    _, options, staging, first = _read_one_chunk_and_close(nsqd, nsq_topic, tmp_path, 300, 200)
    stage = staging.partition(1, 0)
    stage.seal("died")
    staged = sum(stage.chunk_rows(name) for name in stage.complete_chunks())
    depth = _settled(nsqd, nsq_topic)["depth"]
    rows = _bodies(read_partition(NsqPartition(1, 0, 200), options, staging, NAMES))
    assert len(rows) == staged and rows[: first.num_rows] == first.column("body").to_pylist()
    assert _settled(nsqd, nsq_topic)["depth"] == depth  # consumed nothing
    manifest = stage.manifest()
    assert manifest is not None and manifest.total == staged


def test_a_commit_stopped_mid_deletion_leaves_nothing_to_fin_and_is_finished_later(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """The driver died in the commit after deleting a batch's OPEN and before its folder (or
    the store deletes a folder file by file): an unsealed partition with a chunk staged in it
    is not taken for open. No attempt consumes or FINs there, and the next commit deletes
    what is left."""
    _, options, staging, first = _read_one_chunk_and_close(nsqd, nsq_topic, tmp_path, 300, 200)
    stage = staging.partition(1, 0)
    assert stage.complete_chunks() and not stage.sealed() and stage.may_fin()
    staging.fs.delete_file(staging.path("batch-1", "OPEN"))  # the commit's first step only
    assert not stage.may_fin()
    depth = _settled(nsqd, nsq_topic)["depth"]
    for index in (0, 1):  # the partition with a chunk in it, and one never read
        with pytest.raises(Superseded, match="batch 1 is not open"):
            list(read_partition(NsqPartition(1, index, 200), options, staging, NAMES))
    assert _settled(nsqd, nsq_topic)["depth"] == depth  # consumed nothing
    assert channel(nsqd.http_address, nsq_topic, CHANNEL)["in_flight_count"] == 0
    staging.open_batch(2)
    assert staging.delete_through(2) == [1, 2]  # the next batch's commit
    assert staging.batches() == []


def test_a_read_closed_early_leaves_its_chunks_to_the_next_read(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """Spark may stop reading a partition (a limit): the consumer stops, what was staged is
    adopted by the next read of the partition, nothing else is taken from the channel."""
    bodies, options, staging, first = _read_one_chunk_and_close(nsqd, nsq_topic, tmp_path, 400, 300)
    stage = staging.partition(1, 0)
    assert stage.manifest() is None and stage.complete_chunks()
    staged = sum(stage.chunk_rows(name) for name in stage.complete_chunks())
    assert _settled(nsqd, nsq_topic)["depth"] == 400 - staged  # the rest was requeued
    rows = _bodies(read_partition(NsqPartition(1, 0, 300), options, staging, NAMES))
    assert rows[: first.num_rows] == first.column("body").to_pylist()
    assert len(rows) == 300 and len(set(rows)) == 300 and set(rows) <= set(bodies)
    assert _settled(nsqd, nsq_topic)["depth"] == 100


def test_a_partition_staged_with_selected_columns_replays_them_and_names_what_is_missing(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    """A query's schema selects the columns staged; its replay (a task retry, a driver restart)
    yields the same columns, a narrower schema gets its subset, and a wider one is refused
    naming the missing columns instead of handing Spark batches of the wrong shape."""
    bodies = preload(nsqd.tcp_address, nsq_topic, 50)
    options = _options(nsqd, nsq_topic, tmp_path / "staging", chunk_size=20)
    staging = _staging(tmp_path / "staging", 1)
    part = NsqPartition(batch=1, index=0, max_rows=50)
    first = list(read_partition(part, options, staging, ["id", "body"]))
    assert [b.schema.names for b in first] == [["id", "body"]]
    assert sorted(_bodies(first)) == sorted(bodies)
    again = list(read_partition(part, options, staging, ["id", "body"]))
    assert [b.to_pylist() for b in again] == [b.to_pylist() for b in first]
    narrower = list(read_partition(part, options, staging, ["body"]))
    assert _bodies(narrower) == _bodies(first) and narrower[0].schema.names == ["body"]
    with pytest.raises(ConfigError, match=r"no column\(s\) \['timestamp'\]"):
        list(read_partition(part, options, staging, ["id", "body", "timestamp"]))


def test_a_partition_read_collects_less_often_until_it_ends(
    nsqd: Any, nsq_topic: str, tmp_path: Path
) -> None:
    import gc

    from nsq_sync.spark._executor import TASK_GC_THRESHOLD

    preload(nsqd.tcp_address, nsq_topic, 30)
    options = _options(nsqd, nsq_topic, tmp_path / "staging", chunk_size=10)
    staging = _staging(tmp_path / "staging", 1)
    before = gc.get_threshold()
    during = [
        gc.get_threshold()[0]
        for _ in read_partition(NsqPartition(1, 0, 30), options, staging, NAMES)
    ]
    assert during and min(during) >= TASK_GC_THRESHOLD
    assert gc.get_threshold() == before
