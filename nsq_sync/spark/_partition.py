"""The parallel source's executor side: read one partition of one batch, at least once.

- A partition with a MANIFEST (a task retry, a batch re-run, a second action) replays the
  chunks listed there and consumes nothing.
- Otherwise an attempt adopts the chunks a failed attempt staged (their messages were FINed:
  they exist only there), then consumes with a BatchConsumer of its own. Each batch of up to
  ``chunk_size`` messages is staged as one Arrow IPC chunk before it is FINed, on the
  connections that delivered it. After ``max_rows`` messages, ``drain_idle_timeout`` or
  ``partition_timeout``, the attempt seals the partition, yields the chunks other attempts
  staged meanwhile, and writes the MANIFEST. Spark keeps a task's rows only if it succeeds, so
  a successful attempt's rows are exactly its MANIFEST's chunks.
- An attempt that stages a chunk after the partition was sealed or its batch committed requeues
  it and fails (:class:`Superseded`); ``_staging`` says why nothing FINed is left out.

A message received but not staged when the worker dies is not FINed, so nsqd delivers it again;
a chunk staged just before a crash whose FINs never left the process is delivered twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from nsq_sync.message import Message
from nsq_sync.spark._executor import fewer_collections
from nsq_sync.spark._options import SourceOptions
from nsq_sync.spark._staging import PartitionStage, Staging

log = logging.getLogger(__name__)

__all__ = ["NsqPartition", "messages_to_arrow", "read_partition", "requeue_now"]

#: seconds a chunk stays open after its first message before it is staged anyway
_CHUNK_LINGER = 0.25
#: rows per Arrow batch handed to Spark: chunks are joined up to this many (the executor JVM
#: spends about 1.7 ms per batch it receives with the source's columns; PySpark's own
#: spark.sql.execution.arrow.maxRecordsPerBatch defaults to the same number)
YIELD_ROWS = 10_000


@dataclass(frozen=True)
class NsqPartition:
    """One partition of one micro-batch: a pure function of the batch's offsets. Picklable."""

    batch: int
    index: int
    max_rows: int


def messages_to_arrow(messages: list[Message], options: SourceOptions, names: list[str]) -> Any:
    """Messages as one Arrow RecordBatch of the columns ``names`` (the query's schema: a column
    nobody selected is never built). Per message, Python reads one attribute per column it
    builds; Arrow does the conversions; topic, channel and (from one nsqd) nsqd_address are
    one value repeated."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [_COLUMNS[name](messages, options) for name in names], names=names
    )


def _ids(messages: list[Message], options: SourceOptions) -> Any:
    import pyarrow as pa

    raw = pa.array([m.id for m in messages], pa.binary())
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:  # never from a real nsqd (its ids are hex): keep the row anyway
        return pa.array([m.id.decode("ascii", "replace") for m in messages], pa.string())


def _bodies(messages: list[Message], options: SourceOptions) -> Any:
    import pyarrow as pa

    return pa.array([m.body for m in messages], pa.binary())


def _timestamps(messages: list[Message], options: SourceOptions) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    nanos = pa.array([m.timestamp for m in messages], pa.int64())
    return pc.divide(nanos, 1000).cast(_timestamp_type())


def _attempts(messages: list[Message], options: SourceOptions) -> Any:
    import pyarrow as pa

    return pa.array([m.attempts for m in messages], pa.int32())


def _addresses(messages: list[Message], options: SourceOptions) -> Any:
    import pyarrow as pa

    addresses = {m.nsqd_address for m in messages}
    if len(addresses) == 1:
        return _repeat(addresses.pop(), len(messages))
    return pa.array([m.nsqd_address for m in messages], pa.string())


def _topics(messages: list[Message], options: SourceOptions) -> Any:
    return _repeat(options.topic, len(messages))


def _channels(messages: list[Message], options: SourceOptions) -> Any:
    return _repeat(options.channel, len(messages))


_COLUMNS: dict[str, Callable[[list[Message], SourceOptions], Any]] = {
    "id": _ids,
    "body": _bodies,
    "timestamp": _timestamps,
    "attempts": _attempts,
    "nsqd_address": _addresses,
    "topic": _topics,
    "channel": _channels,
}


def _timestamp_type() -> Any:
    import pyarrow as pa

    return pa.timestamp("us", tz="UTC")


def _repeat(value: str, n: int) -> Any:
    import pyarrow as pa

    return pa.repeat(pa.scalar(value, pa.string()), n)


def _task() -> tuple[str, dict[str, Any]]:
    """(a name unique to this task attempt, what the MANIFEST records about it)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is there on executors
        ctx = None
    if ctx is None:
        return f"x{uuid.uuid4().hex[:12]}", {}
    info = {
        "stage": ctx.stageId(),
        "partition_id": ctx.partitionId(),
        "attempt": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "speculation": ctx.getLocalProperty("spark.speculation"),
    }
    return f"a{ctx.taskAttemptId()}", info


class Superseded(RuntimeError):
    """Another attempt of the partition completed it while this one was consuming (speculative
    execution), or the batch was committed before or while this attempt ran: its rows must not
    be used, so the task fails; Spark keeps the other attempt's."""


def read_partition(
    partition: NsqPartition,
    options: SourceOptions,
    staging: Staging,
    names: list[str],
    yield_rows: int = YIELD_ROWS,
) -> Iterator[Any]:
    """Yield the partition's rows as Arrow RecordBatches: staged chunks joined until they
    reach ``yield_rows`` rows. Closing it early stops the consuming at once.

    Raises:
        Superseded: another attempt of the partition completed it first, or the batch is not
            open (committed before or while this attempt ran, or the staging location is not
            one this executor shares with the driver).
        Exception: staging failed (the chunk's messages were requeued; Spark retries the task).
    """
    rows = _read_partition(partition, options, staging, names)
    try:
        with fewer_collections():
            yield from _joined(rows, yield_rows)
    finally:
        rows.close()


def _joined(batches: Iterator[Any], limit: int) -> Iterator[Any]:
    """``batches`` joined, in order, until each has ``limit`` rows or more (or the schema
    changes). Spark keeps a task's rows only at its end, so holding them delays nothing."""
    held: list[Any] = []
    count = 0
    for batch in batches:
        if held and batch.schema != held[0].schema:
            yield _concat(held)
            held, count = [], 0
        held.append(batch)
        count += batch.num_rows
        if count >= limit:
            yield _concat(held)
            held, count = [], 0
    if held:
        yield _concat(held)


def _concat(batches: list[Any]) -> Any:
    """One RecordBatch of ``batches`` (same schema), in order."""
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _read_partition(
    partition: NsqPartition, options: SourceOptions, staging: Staging, names: list[str]
) -> Generator[Any, None, None]:
    if partition.max_rows <= 0:
        return  # the empty batch that lets Spark commit the previous one
    attempt, info = _task()
    stage = staging.partition(partition.batch, partition.index)
    manifest = stage.manifest()
    if manifest is not None:
        log.info(
            "nsq source: batch %d partition %d: replaying %d staged row(s) in %d chunk(s)",
            partition.batch,
            partition.index,
            manifest.total,
            len(manifest.chunks),
        )
        for name in manifest.chunks:
            yield from stage.read_chunk(name, names)
        return
    if not stage.batch_open():
        raise Superseded(
            f"nsq source: batch {partition.batch} is not open in the staging location "
            f"{staging.location!r}: it was committed before this attempt of partition "
            f"{partition.index} started (a late speculative attempt: it consumes nothing), or "
            f"this executor does not see the staging the driver writes (staging_location must "
            f"be storage the driver and every executor share)"
        )
    started = time.monotonic()
    rows: dict[str, int] = {}  # chunk name -> rows, in the order they went to Spark
    adopted = stage.complete_chunks()
    for name in adopted:
        rows[name] = yield from _replay(stage, name, names)
    remaining = partition.max_rows - sum(rows.values())
    summary: list[Any] = []
    if remaining > 0 and not stage.sealed():
        # The rows go to Spark while the partition consumes: if the task fails, Spark drops
        # its output and the next attempt adopts the chunks; if it succeeds, its output is
        # exactly the chunks the MANIFEST lists.
        yield from _consume(stage, attempt, remaining, options, names, rows, summary)
    if not stage.batch_open():
        raise _committed_meanwhile(stage)  # a late attempt: write nothing more
    # No attempt FINs a chunk from here on; every chunk FINed so far is complete, so listed.
    stage.seal(attempt)
    late = [name for name in stage.complete_chunks() if name not in rows]
    for name in late:  # a concurrent attempt's (speculation) or a dead sealer's
        rows[name] = yield from _replay(stage, name, names)
    consumed = sum(rows.values()) - sum(rows[name] for name in adopted + late)
    if stage.manifest() is None:
        stage.write_manifest(
            list(rows),
            list(rows.values()),
            len(adopted) + len(late),
            {**info, "consumed": consumed, "seconds": round(time.monotonic() - started, 3)},
        )
    if stage.discard_if_committed():  # committed while it sealed: what it wrote is gone again
        raise _committed_meanwhile(stage)
    log.info(
        "nsq source: batch %d partition %d: staged %d row(s), adopted %d row(s) staged by "
        "other attempts, in %.2f s (%s)",
        partition.batch,
        partition.index,
        consumed,
        sum(rows.values()) - consumed,
        time.monotonic() - started,
        summary[0].reason if summary else "nothing to consume",
    )


def _committed_meanwhile(stage: PartitionStage) -> Superseded:
    return Superseded(
        f"nsq source: batch {stage.batch} was committed while this attempt of partition "
        f"{stage.index} ran (a losing speculative attempt): what it staged is not kept"
    )


def _replay(stage: PartitionStage, name: str, names: list[str]) -> Generator[Any, None, int]:
    """Yield one staged chunk's record batches (the columns ``names``); return its row count."""
    count = 0
    for batch in stage.read_chunk(name, names):
        count += batch.num_rows
        yield batch
    return count


def _consume(
    stage: PartitionStage,
    attempt: str,
    limit: int,
    options: SourceOptions,
    names: list[str],
    rows: dict[str, int],
    summary: list[Any],
) -> Iterator[Any]:
    """Consume up to ``limit`` messages on a thread of its own, yielding each chunk once staged
    (then its messages are FINed). Closing the generator stops it: what was staged is adopted
    by the next read, the rest requeued. A chunk staged too late (sealed or committed) is
    requeued and the attempt ends in :class:`Superseded`, after the winner's MANIFEST exists."""
    failed: list[BaseException] = []
    superseded: list[str] = []
    crashed: list[BaseException] = []
    staged: queue.SimpleQueue[Any] = queue.SimpleQueue()
    end = object()

    def stage_chunk(messages: list[Message]) -> None:
        if superseded:  # a batch handed over before the stop took effect
            requeue_now(messages)
            return
        try:
            if failed:
                raise RuntimeError("staging failed earlier in this task")
            batch = messages_to_arrow(messages, options, names)
            name = stage.write_chunk(batch, attempt)
            if not stage.may_fin():
                superseded.append(name)
        except BaseException as exc:
            failed.append(exc)
            requeue_now(messages)  # not the messages' fault
            consumer.stop()  # from the handler: the stop completes on its own task
            raise
        if superseded:  # whoever sealed may have listed it or not: requeue, never FIN
            requeue_now(messages)
            consumer.stop()  # from the handler: the stop completes on its own task
            try:
                stage.discard_if_committed()  # a chunk written after the commit: not left
            except Exception:  # noqa: BLE001 - only tidying: the chunk is never listed
                log.warning(
                    "nsq source: could not delete batch %d's staging", stage.batch, exc_info=True
                )
            return
        rows[name] = batch.num_rows
        staged.put(batch)

    from nsq_sync.consumer.batch import BatchConsumer  # not in the driver's planner process

    consumer = BatchConsumer(
        options.topic,
        options.channel,
        stage_chunk,
        batch_size=min(options.chunk_size, limit),
        batch_timeout=_CHUNK_LINGER,
        nsqd_tcp_addresses=list(options.nsqd_tcp_addresses),
        lookupd_http_addresses=list(options.lookupd_http_addresses),
        config=options.config,
        runtime="threads",
    )

    def run() -> None:
        try:
            summary.append(
                consumer.run(
                    timeout=options.partition_timeout,
                    idle_timeout=options.drain_idle_timeout,
                    max_messages=limit,
                )
            )
        except BaseException as exc:  # re-raised on the reading thread
            crashed.append(exc)
        finally:
            staged.put(end)

    thread = threading.Thread(target=run, name="nsq_sync-spark-partition", daemon=True)
    thread.start()
    try:
        while (batch := staged.get()) is not end:
            yield batch
    finally:
        if thread.is_alive():  # the generator was closed early
            consumer.stop()
        thread.join()
    if failed:
        raise RuntimeError(
            f"nsq source: staging a chunk of batch {stage.batch} partition {stage.index} in "
            f"{stage.staging.location!r} failed: {failed[0]!r} (its messages were requeued)"
        ) from failed[0]
    if crashed:
        raise crashed[0]
    if superseded:
        # Fail only once the sealer's MANIFEST is there, so that Spark sees it succeed first
        # (no wait when the batch's staging is gone: it was committed).
        deadline = time.monotonic() + options.partition_timeout
        while stage.manifest() is None and stage.sealed() and time.monotonic() < deadline:
            time.sleep(0.2)
        raise Superseded(
            f"nsq source: batch {stage.batch} partition {stage.index} was completed by another "
            f"attempt (or its batch committed) while this one ran; its last chunk "
            f"({superseded[0]}) was requeued"
        )


def requeue_now(messages: list[Message]) -> None:
    """Back to the channel at once, not FINed, and no backoff (not the messages' fault)."""
    for message in messages:
        message.requeue(0.0, backoff=False)
