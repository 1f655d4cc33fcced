"""The parallel source's executor side: read one partition of one batch, at least once.

``read_partition`` runs in an executor's Python worker. If the partition's MANIFEST exists (a
task retry after the rows were produced, a batch re-run after a driver restart, a second action
on the same micro-batch), it replays the chunks listed there and consumes nothing. Otherwise it
adopts the chunks a failed attempt staged (their messages were FINed: they exist only there),
then consumes with a :class:`~nsq_sync.batch.BatchConsumer` of its own: each batch of up to
``chunk_size`` messages is written to the staging location as one Arrow IPC chunk, and only
when the chunk is complete does the batch consumer FIN its messages, on the connections that
delivered them; each staged chunk goes to Spark at once (the consumer runs on a thread of its
own). It stops after ``max_rows`` messages, ``drain_idle_timeout`` seconds without one, or
``partition_timeout``; then it writes the MANIFEST. Spark keeps a task's rows only if the task
succeeds, that is after the MANIFEST: a successful attempt's rows are exactly the chunks listed
there, and a failed attempt's chunks are adopted by the next one.

A message received but not yet staged when the worker dies is not FINed: nsqd delivers it again
(at once if the consumer could requeue it, after ``msg_timeout`` if the process was killed).
That is the only source of duplicates, besides a chunk staged just before a crash whose FINs
never left the process.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nsq_sync.batch import BatchConsumer
from nsq_sync.errors import ConfigError
from nsq_sync.message import Message
from nsq_sync.spark._options import SourceOptions
from nsq_sync.spark._staging import PartitionStage, Staging

log = logging.getLogger(__name__)

__all__ = ["NsqPartition", "messages_to_arrow", "read_partition"]

#: seconds a chunk stays open after its first message before it is staged anyway
_CHUNK_LINGER = 0.25


@dataclass(frozen=True)
class NsqPartition:
    """One partition of one micro-batch: a pure function of the batch's offsets.

    Spark pickles it to the executors (``InputPartition`` only needs to be picklable)."""

    batch: int
    index: int
    max_rows: int


def messages_to_arrow(messages: list[Message], options: SourceOptions, names: list[str]) -> Any:
    """Messages as one Arrow RecordBatch with the source's columns."""
    import pyarrow as pa

    n = len(messages)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.id.decode("ascii", "replace") for m in messages], pa.string()),
            pa.array([m.body for m in messages], pa.binary()),
            pa.array([m.timestamp // 1000 for m in messages], pa.timestamp("us", tz="UTC")),
            pa.array([m.attempts for m in messages], pa.int32()),
            pa.array([m.nsqd_address for m in messages], pa.string()),
            pa.array([options.topic] * n, pa.string()),
            pa.array([options.channel] * n, pa.string()),
        ],
        names=names,
    )


def _task() -> tuple[str, dict[str, Any]]:
    """(a name unique to this task attempt, what the MANIFEST records about it)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is there on executors
        ctx = None
    if ctx is None:
        return f"x{uuid.uuid4().hex[:12]}", {}
    speculation = ctx.getLocalProperty("spark.speculation")
    if (speculation or "").strip().lower() == "true":
        raise ConfigError(
            "the parallel nsq source does not support spark.speculation=true: two attempts of "
            "one partition would both consume; set spark.speculation=false"
        )
    info = {
        "stage": ctx.stageId(),
        "partition_id": ctx.partitionId(),
        "attempt": ctx.attemptNumber(),
        "task_attempt_id": ctx.taskAttemptId(),
        "speculation": speculation,
    }
    return f"a{ctx.taskAttemptId()}", info


def read_partition(
    partition: NsqPartition, options: SourceOptions, staging: Staging, names: list[str]
) -> Iterator[Any]:
    """Yield the partition's rows as Arrow RecordBatches (see the module docs).

    Raises:
        ConfigError: spark.speculation is on (before anything is consumed).
        Exception: staging failed (the chunk's messages were requeued; Spark retries the task).
    """
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
            yield from stage.read_chunk(name)
        return
    started = time.monotonic()
    adopted = stage.complete_chunks()
    adopted_batches = [list(stage.read_chunk(name)) for name in adopted]
    adopted_rows = [sum(b.num_rows for b in batches) for batches in adopted_batches]
    remaining = partition.max_rows - sum(adopted_rows)
    for adopted_batch in adopted_batches:
        yield from adopted_batch
    chunks: list[str] = []
    rows: list[int] = []
    summary: list[Any] = []
    if remaining > 0:
        # The rows go to Spark while the partition consumes: if the task fails, Spark drops
        # its output and the next attempt adopts the chunks; if it succeeds, its output is
        # exactly the chunks the MANIFEST lists.
        yield from _consume(stage, attempt, remaining, options, names, chunks, rows, summary)
    stage.write_manifest(
        adopted + chunks,
        adopted_rows + rows,
        len(adopted),
        {**info, "consumed": sum(rows), "seconds": round(time.monotonic() - started, 3)},
    )
    log.info(
        "nsq source: batch %d partition %d: staged %d row(s) in %d chunk(s), adopted %d "
        "row(s) of a failed attempt, in %.2f s (%s)",
        partition.batch,
        partition.index,
        sum(rows),
        len(chunks),
        sum(adopted_rows),
        time.monotonic() - started,
        summary[0].reason if summary else "nothing to consume",
    )


def _consume(
    stage: PartitionStage,
    attempt: str,
    limit: int,
    options: SourceOptions,
    names: list[str],
    chunks: list[str],
    rows: list[int],
    summary: list[Any],
) -> Iterator[Any]:
    """Consume up to ``limit`` messages, staging each chunk before its messages are FINed, and
    yield each chunk once it is staged. The consumer runs on a thread of its own; closing the
    generator early (Spark stopped reading) stops it: what it staged is adopted by the next
    read of the partition, what it did not stage is requeued."""
    failed: list[BaseException] = []
    crashed: list[BaseException] = []
    staged: queue.SimpleQueue[Any] = queue.SimpleQueue()
    end = object()

    def stage_chunk(messages: list[Message]) -> None:
        try:
            if failed:
                raise RuntimeError("staging failed earlier in this task")
            batch = messages_to_arrow(messages, options, names)
            name = stage.write_chunk(batch, attempt)
        except BaseException as exc:
            failed.append(exc)
            # Not the messages' fault: back to the channel at once, not FINed.
            for message in messages:
                message.requeue(0.0, backoff=False)
            consumer.stop()  # from the handler: the stop completes on its own task
            raise
        chunks.append(name)
        rows.append(batch.num_rows)
        staged.put(batch)

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
