"""The data source's pieces without a SparkSession: options, schema checks, pickling (no socket
or thread in any constructor or unpickled copy), MPUB batching against a real nsqd."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from nsq_sync.errors import ConfigError, InvalidBody
from nsq_sync.message import Message
from nsq_sync.spark import NsqDataSource
from nsq_sync.spark._datasource import source_struct
from nsq_sync.spark._options import sink_options, source_options
from nsq_sync.spark._partition import messages_to_arrow
from nsq_sync.spark._sink import NsqCommitMessage, NsqWriter, PartitionPublisher, summarize
from nsq_sync.spark._source import NsqStreamReader

SOURCE = {"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "t", "channel": "c"}


class _NoSockets:
    """Fails the test if anything opens a socket or starts a thread meanwhile."""

    def __enter__(self) -> _NoSockets:
        self._threads = threading.active_count()
        self._socket = socket.socket.connect
        socket.socket.connect = self._refuse  # type: ignore[method-assign]
        return self

    @staticmethod
    def _refuse(*args: Any) -> None:
        raise AssertionError(f"connect{args[1:]} from a constructor")

    def __exit__(self, *exc: object) -> None:
        socket.socket.connect = self._socket  # type: ignore[method-assign]
        assert threading.active_count() == self._threads


def test_the_source_is_built_and_pickled_without_connecting() -> None:
    with _NoSockets():
        source = NsqDataSource(dict(SOURCE))
        reader = source.simpleStreamReader(source_struct())
        copy = cloudpickle.loads(cloudpickle.dumps(reader))
        assert copy._consumer is None
        assert copy.options == reader.options
        assert reader.initialOffset() == {"seq": 0}
        # a replay on an executor: empty, and still no connection
        assert list(copy.readBetweenOffsets({"seq": 0}, {"seq": 1})) == []
        copy.commit({"seq": 5})  # unknown offsets are ignored
        cloudpickle.loads(cloudpickle.dumps(source))


def test_the_sink_writer_is_built_and_pickled_without_connecting() -> None:
    with _NoSockets():
        source = NsqDataSource({"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "t"})
        writer = source.writer(StructType([StructField("body", StringType())]), False)
        copy = cloudpickle.loads(cloudpickle.dumps(writer))
        assert isinstance(copy, NsqWriter)
        assert copy.columns == {"body": "body", "topic": None, "text": True}


def test_a_started_reader_pickles_without_its_consumer() -> None:
    reader = NsqStreamReader(source_options(SOURCE), source_struct())
    reader._consumer = object()  # type: ignore[assignment]  # as in the driver's runner
    copy = cloudpickle.loads(cloudpickle.dumps(reader))
    assert copy._consumer is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"channel": None}, "option channel is required"),
        ({"topic": "bad topic"}, "option topic"),
        ({"nsqd_tcp_addresses": "nohost"}, "nsqd_tcp_addresses"),
        ({"nsqd_tcp_addresses": None}, "nsqd_tcp_addresses or lookupd_http_addresses"),
        ({"lookupd_http_addresses": "ftp://x:1"}, "lookupd_http_addresses"),
        ({"max_messages_per_batch": "0"}, "max_messages_per_batch"),
        ({"max_messages_per_batch": "many"}, "max_messages_per_batch"),
        ({"max_messages_per_batch": "600", "max_in_flight": "1000"}, "at most half"),
        ({"commit_flush_after": "-1"}, "commit_flush_after"),
        ({"drain_idle_timeout": "soon"}, "drain_idle_timeout"),
        ({"chanel": "x"}, "chanel"),
        ({"snappy": "maybe"}, "snappy"),
    ],
)
def test_bad_source_options_are_named(options: dict[str, Any], named: str) -> None:
    given = {**SOURCE, **options}
    with pytest.raises(ConfigError, match=named):
        source_options({k: v for k, v in given.items() if v is not None})


def test_source_defaults() -> None:
    opts = source_options({**SOURCE, "checkpointLocation": "/tmp/x"})
    assert opts.max_messages_per_batch == 1000
    assert opts.config.max_in_flight == 2000
    assert opts.config.msg_timeout == 60.0
    assert opts.config.max_attempts == 0  # never give up on a row
    assert source_options({**SOURCE, "MSG_TIMEOUT": "5s"}).config.msg_timeout == 5.0


def test_a_schema_selects_the_columns_the_source_builds() -> None:
    """``spark.readStream.schema("id string, body binary")``: both readers build only those
    columns, in that order (a column nobody selects is never built)."""
    source = NsqDataSource(dict(SOURCE))
    chosen = StructType([StructField("body", BinaryType()), StructField("id", StringType())])
    reader = source.simpleStreamReader(chosen)
    assert reader.schema.fieldNames() == ["body", "id"]
    assert source.simpleStreamReader(None).schema == source_struct()  # type: ignore[arg-type]
    message = Message(b"0123456789abcdef", b"hello", 1_700_000_000_123_456_789, 2)
    message.nsqd_address = "127.0.0.1:4150"
    batch = messages_to_arrow([message], reader.options, reader.schema.fieldNames())
    assert batch.schema.names == ["body", "id"]
    assert batch.to_pylist() == [{"body": b"hello", "id": "0123456789abcdef"}]
    every = messages_to_arrow([message], reader.options, source_struct().fieldNames())
    assert every.to_pylist()[0]["attempts"] == 2 and every.num_columns == 7


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            [StructField("body", IntegerType())],
            "column 'body' of the nsq source is binary, not int",
        ),
        ([StructField("key", StringType())], "has no column 'key'"),
        ([StructField("id", StringType())] * 2, "names column 'id' twice"),
    ],
)
def test_a_schema_naming_another_column_or_type_is_refused(
    fields: list[StructField], named: str
) -> None:
    source = NsqDataSource(dict(SOURCE))
    with pytest.raises(ConfigError, match=named):
        source.simpleStreamReader(StructType(fields))


def test_sink_defaults_and_errors() -> None:
    opts = sink_options({"nsqd_tcp_addresses": "127.0.0.1:4150, 127.0.0.1:4250", "topic": "t"})
    assert opts.nsqd_tcp_addresses == ("127.0.0.1:4150", "127.0.0.1:4250")
    assert opts.batch_size == 500
    assert opts.config.publish_timeout == 60.0
    with pytest.raises(ConfigError, match="nsqd_tcp_addresses is required"):
        sink_options({"topic": "t"})


def test_partitions_publish_in_mpubs_within_max_body_size(nsqd: Any, nsq_topic: str) -> None:
    from support.nsq import message_count

    opts = sink_options(
        {
            "nsqd_tcp_addresses": nsqd.tcp_address,
            "topic": nsq_topic,
            "batch_size": "100",
            "max_body_size": "1000",
            "max_msg_size": "200",
        }
    )
    publisher = PartitionPublisher(opts, partition_id=3)
    try:
        # 100 bytes each in the MPUB's body, after its 4-byte count: 9 per MPUB
        publisher.add_many([b"x" * 96] * 25, None)
        publisher.flush()
        publisher.add_many(["y"] * 150, [None] * 150)  # str bodies, default topic; 100 per MPUB
        publisher.flush()
        with pytest.raises(InvalidBody, match="row 175 of partition 3.*max_msg_size 200"):
            publisher.add(b"z" * 201, nsq_topic)
    finally:
        publisher.close()
    result = publisher.result
    assert result.messages == 175
    assert result.mpubs == 3 + 2  # 25 big ones: 9 + 9 + 7; then 150 small: 100 + 50
    assert message_count(nsqd.http_address, nsq_topic) == 175
    total = summarize([result, None])
    assert total["messages"] == 175
    assert total["failed_partitions"] == 1
    assert total["topics"] == {nsq_topic: 175}
    assert cloudpickle.loads(cloudpickle.dumps(result)) == result
    assert isinstance(result, NsqCommitMessage)


def test_a_batch_of_bodies_is_cut_into_mpubs_in_order(nsqd: Any, nsq_topic: str) -> None:
    """The sink's bulk path (no topic column): Spark's Arrow batches become MPUBs of
    ``batch_size`` across batch boundaries, each row once, as row-by-row adding does."""
    from collections import Counter

    from support.nsq import read_bodies

    opts = sink_options(
        {"nsqd_tcp_addresses": nsqd.tcp_address, "topic": nsq_topic, "batch_size": "100"}
    )
    publisher = PartitionPublisher(opts, partition_id=1)
    bodies = [b"%04d" % i for i in range(330)]
    try:
        publisher.add(bodies[0], nsq_topic)
        publisher.add_many(bodies[1:230], None)  # an open batch of 1 grows to 100, then 2 more
        publisher.add_many(bodies[230:], None)
        publisher.flush()
    finally:
        publisher.close()
    assert publisher.result.messages == 330
    assert publisher.result.mpubs == 4  # 100, 100, 100, 30
    assert read_bodies(nsqd.tcp_address, nsqd.http_address, nsq_topic) == Counter(bodies)


def test_empty_and_untopiced_rows_are_refused_naming_the_row() -> None:
    opts = sink_options({"nsqd_tcp_addresses": "127.0.0.1:1"})
    publisher = PartitionPublisher(opts, partition_id=0)
    with pytest.raises(ConfigError, match="row 0 of partition 0 has a null topic"):
        publisher.add(b"x", None)
    with pytest.raises(InvalidBody, match="row 1 of partition 0 has a null body"):
        publisher.add(None, "t")
    with pytest.raises(InvalidBody, match="row 2 of partition 0 has an empty body"):
        publisher.add(b"", "t")


_FREEZE_PROBE = """
import gc, os, sys
from nsq_sync.spark._executor import freeze_worker_heap

class Cycle:
    pass

freeze_worker_heap()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # the interpreter's, pyarrow's and nsq_sync's objects
assert "pyarrow.compute" in sys.modules and "pyarrow.ipc" in sys.modules
kept = [Cycle() for _ in range(1000)]  # a later task's objects, still alive
freeze_worker_heap()  # that task's start, in the same worker: nothing more is frozen
assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
# what a task makes afterwards is still collected (a cycle: only the collector frees it)
gc.disable()
for _ in range(1000):
    a, b = Cycle(), Cycle()
    a.other, b.other = b, a
del a, b
assert gc.collect() >= 2000
gc.enable()
child = os.fork()
if child == 0:  # a worker forked after a freeze freezes its own heap at its first task
    gc.unfreeze()
    freeze_worker_heap()
    os._exit(0 if gc.get_freeze_count() > 10_000 else 1)
assert os.waitpid(child, 0)[1] == 0
print("ok")
"""


def test_an_executor_worker_freezes_its_long_lived_objects_once() -> None:
    """PySpark runs a full gc.collect() after every task in a reused Python worker; the first
    nsq_sync task freezes what the worker holds (once per process), so those collections walk
    only what later tasks make, and still free it. In a process of its own: freezing the
    test's would keep its garbage."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_task_moving_rows_collects_less_often_and_restores_the_threshold() -> None:
    """While a partition reads (or a sink task publishes), the young generation's threshold is
    raised, so the collector does not walk the messages in flight every few hundred of them;
    after it, even when the block fails, the worker's threshold is what it was."""
    import gc

    from nsq_sync.spark._executor import TASK_GC_THRESHOLD, fewer_collections

    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    with pytest.raises(RuntimeError), fewer_collections():
        seen.append(gc.get_threshold())
        raise RuntimeError("the task failed")
    assert seen == [(max(before[0], TASK_GC_THRESHOLD), *before[1:])]
    assert gc.get_threshold() == before


def test_planning_imports_neither_the_consumer_nor_the_producer() -> None:
    """Spark starts a fresh Python process to plan each query (the schema, the options, the
    stream reader's offsets): it imports only what that needs. The consumer and the producer
    are imported where rows move, on the executors."""
    import json
    import subprocess
    import sys

    probe = """
import json, sys
from nsq_sync.spark import NsqDataSource
from nsq_sync.spark._datasource import source_struct
source = NsqDataSource({"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "t", "channel": "c",
                        "parallelism": "2", "staging_location": sys.argv[1],
                        "nsqd_http_addresses": "127.0.0.1:4151"})
source.schema()
planner = sorted(m for m in sys.modules if m.startswith(("nsq_sync.consumer", "nsq_sync.producer")))
source.streamReader(source_struct())
reader = sorted(m for m in sys.modules if m.startswith(("nsq_sync.consumer", "nsq_sync.producer")))
print(json.dumps({"planner": planner, "reader": reader}))
"""
    import tempfile

    with tempfile.TemporaryDirectory() as staging:
        result = subprocess.run(
            [sys.executable, "-c", probe, staging],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"planner": [], "reader": []}
