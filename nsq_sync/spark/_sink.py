"""The sink: each partition publishes its rows with MPUB and waits for nsqd's acks.

Spark 4 runs ``writer()`` in a driver-side planner process, ``write()`` in executors' Python
workers (reused across tasks) and ``commit()`` in another driver-side process. So the writer
carries only options, the Producer lives inside one ``write()`` call, and ``commit()`` only adds
up counts.

At least once: ``write()`` returns only after nsqd acknowledged every MPUB; a failing publish is
retried until ``publish_timeout``, then the task fails and Spark retries it. Duplicates come
from an MPUB whose OK was lost (the Producer sends it again), and from Spark running a task, a
stage or a micro-batch again (a retry, a lost executor, speculation, a driver failure).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from nsq_sync.errors import ConfigError, InvalidBody, PublishError
from nsq_sync.spark._executor import fewer_collections, freeze_worker_heap
from nsq_sync.spark._options import SinkOptions

if TYPE_CHECKING:
    from nsq_sync.producer import Producer

try:  # pyspark >= 4.1: the streaming writer gets Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pragma: no cover - pyspark 4.0
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _STREAM_ARROW = False

log = logging.getLogger(__name__)

__all__ = ["NsqCommitMessage", "NsqStreamWriter", "NsqWriter", "PartitionPublisher"]

_MPUB_PER_MESSAGE = 4  # size prefix
#: seconds between two tries of an MPUB no nsqd accepted (within publish_timeout)
_RETRY_PAUSE = 0.25


# What nsqd (and the Producer) hold to max_body_size is the MPUB's body: the message count,
# then each message's size prefix and bytes.
_MPUB_COUNT = 4


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    """What one partition published (acknowledged by nsqd), for the driver to add up;
    ``partition_id`` is -1 outside a task, ``seconds`` the time spent in ``write()``."""

    partition_id: int = -1
    attempt: int = 0
    messages: int = 0
    bytes: int = 0
    mpubs: int = 0
    topics: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class PartitionPublisher:
    """Cuts rows into MPUB batches per topic and publishes each, waiting for its OK.

    A batch closes at ``batch_size`` messages or before the MPUB would exceed ``max_body_size``.
    Not thread-safe (one per task).

    Raises (from :meth:`add` and :meth:`flush`):
        InvalidBody: a null or empty body, or one over ``max_msg_size`` (naming the row).
        PublishError: nsqd could not be reached, or kept failing, until ``publish_timeout``.
        ServerError: nsqd rejected a batch (a bad topic name...).
    """

    def __init__(self, options: SinkOptions, partition_id: int = -1, attempt: int = 0) -> None:
        self.options = options
        self.result = NsqCommitMessage(partition_id=partition_id, attempt=attempt)
        self._producer: Producer | None = None
        self._batches: dict[str, tuple[list[bytes], int]] = {}
        self._rows = 0
        cfg = options.config
        self._max_msg = cfg.max_msg_size or 2**31 - 1
        self._max_body = cfg.max_body_size or 2**31 - 1

    def add_many(self, bodies: Iterable[Any], topics: Iterable[str | None] | None) -> None:
        """Add rows (bodies as bytes or str; ``topics`` None or one topic per body)."""
        default = self.options.topic
        if topics is None and default is not None and type(bodies) is list:
            self._add_all(bodies, default)
        elif topics is None:
            for body in bodies:
                self.add(body, default)
        else:
            for body, topic in zip(bodies, topics):
                self.add(body, topic or default)

    def add(self, body: Any, topic: str | None) -> None:
        row = self._rows
        self._rows += 1
        if topic is None:
            raise ConfigError(
                f"row {row} of partition {self.result.partition_id} has a null topic and the "
                "nsq sink has no 'topic' option"
            )
        if isinstance(body, str):
            body = body.encode("utf-8")
        if not body:
            raise InvalidBody(
                f"row {row} of partition {self.result.partition_id} has "
                f"{'a null' if body is None else 'an empty'} body; nsqd accepts no empty message"
            )
        size = len(body)
        if size > self._max_msg:
            raise InvalidBody(
                f"row {row} of partition {self.result.partition_id}: body of {size} bytes "
                f"exceeds max_msg_size {self._max_msg} (nsqd --max-msg-size)"
            )
        bodies, total = self._batches.get(topic) or ([], _MPUB_COUNT)
        if bodies and (
            len(bodies) >= self.options.batch_size
            or total + _MPUB_PER_MESSAGE + size > self._max_body
        ):
            self._publish(topic, bodies)
            bodies, total = [], _MPUB_COUNT
        bodies.append(body)
        self._batches[topic] = (bodies, total + _MPUB_PER_MESSAGE + size)

    def _add_all(self, bodies: list[Any], topic: str) -> None:
        """:meth:`add` of each body to ``topic``, checked and cut at C speed when all are
        non-empty bytes within ``max_msg_size`` (otherwise row by row, naming a bad row)."""
        if not bodies:
            return
        sizes = list(map(len, bodies))
        if set(map(type, bodies)) != {bytes} or min(sizes) == 0 or max(sizes) > self._max_msg:
            for body in bodies:
                self.add(body, topic)
            return
        batch_size, i, n = self.options.batch_size, 0, len(bodies)
        while i < n:
            batch, total = self._batches.get(topic) or ([], _MPUB_COUNT)
            take = min(n - i, batch_size - len(batch))
            if take <= 0:  # a full batch left open by add(): publish it first
                self._publish(topic, batch)
                continue
            size = sum(sizes[i : i + take]) + _MPUB_PER_MESSAGE * take
            if total + size > self._max_body:  # cut by size: row by row, as add() does
                for body in bodies[i : i + take]:
                    self.add(body, topic)
            else:
                batch.extend(bodies[i : i + take])
                self._batches[topic] = (batch, total + size)
                self._rows += take
                if len(batch) >= batch_size:
                    self._publish(topic, batch)
            i += take

    def flush(self) -> None:
        """Publish every open batch."""
        for topic, (bodies, _) in list(self._batches.items()):
            if bodies:
                self._publish(topic, bodies)
        self._batches.clear()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def _publish_until_deadline(self, topic: str, bodies: list[bytes]) -> None:
        """MPUB, trying again until ``publish_timeout``: a Producer whose nsqds all back off
        fails at once, and an nsqd restarting must not fail the task."""
        producer = self._producer
        assert producer is not None
        deadline = time.monotonic() + (self.options.config.publish_timeout or 60.0)
        while True:
            left = deadline - time.monotonic()
            try:
                producer.multi_publish(topic, bodies, timeout=max(0.1, left))
                return
            except PublishError:
                if time.monotonic() + _RETRY_PAUSE >= deadline:
                    raise
            time.sleep(_RETRY_PAUSE)

    def _publish(self, topic: str, bodies: list[bytes]) -> None:
        if self._producer is None:
            from nsq_sync.producer import Producer  # on the executor (the planner needs none)

            # An MPUB whose answer was lost is sent again (at least once), rather than failing
            # the task: a task retry would resend the whole partition.
            self._producer = Producer(
                list(self.options.nsqd_tcp_addresses), self.options.config, retry_unknown=True
            )
        try:
            self._publish_until_deadline(topic, bodies)
        except PublishError as exc:
            result = self.result
            raise PublishError(
                f"nsq sink: could not deliver {len(bodies)} message(s) to topic {topic!r} on "
                f"nsqd {', '.join(self.options.nsqd_tcp_addresses)} within publish_timeout "
                f"{self.options.config.publish_timeout:g} s (partition {result.partition_id}, "
                f"{result.messages} message(s) delivered before); {exc.args[0]}",
                exc.reason,
            ) from exc
        result = self.result
        result.messages += len(bodies)
        result.bytes += sum(map(len, bodies))
        result.mpubs += 1
        result.topics[topic] = result.topics.get(topic, 0) + len(bodies)
        self._batches[topic] = ([], _MPUB_COUNT)


def _task_identity() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return -1, 0
    return ctx.partitionId(), ctx.attemptNumber()


def _publish_arrow(
    options: SinkOptions, columns: dict[str, Any], batches: Iterator[Any]
) -> NsqCommitMessage:
    import pyarrow as pa

    started = time.monotonic()
    publisher = PartitionPublisher(options, *_task_identity())
    try:
        with fewer_collections():
            for batch in batches:
                body = batch.column(columns["body"])
                if columns["text"]:
                    body = body.cast(pa.binary())  # UTF-8 already: no copy
                topic = None if columns["topic"] is None else batch.column(columns["topic"])
                publisher.add_many(body.to_pylist(), None if topic is None else topic.to_pylist())
            publisher.flush()
    finally:
        publisher.close()
    publisher.result.seconds = time.monotonic() - started
    return publisher.result


def _publish_rows(
    options: SinkOptions, columns: dict[str, Any], rows: Iterator[Any]
) -> NsqCommitMessage:
    started = time.monotonic()
    publisher = PartitionPublisher(options, *_task_identity())
    body, topic = columns["body"], columns["topic"]
    try:
        for row in rows:
            publisher.add(row[body], (row[topic] if topic else None) or options.topic)
        publisher.flush()
    finally:
        publisher.close()
    publisher.result.seconds = time.monotonic() - started
    return publisher.result


def summarize(messages: Iterable[WriterCommitMessage | None]) -> dict[str, Any]:
    """Add up the partitions' commit messages (``None`` for a partition that failed)."""
    total: dict[str, Any] = {"partitions": 0, "messages": 0, "bytes": 0, "mpubs": 0}
    topics: dict[str, int] = {}
    missing = 0
    for message in messages:
        if not isinstance(message, NsqCommitMessage):
            missing += 1
            continue
        total["partitions"] += 1
        total["messages"] += message.messages
        total["bytes"] += message.bytes
        total["mpubs"] += message.mpubs
        for topic, n in message.topics.items():
            topics[topic] = topics.get(topic, 0) + n
    total["topics"] = topics
    total["failed_partitions"] = missing
    return total


def _report(what: str, summary: dict[str, Any], level: int = logging.INFO) -> None:
    text = (
        f"nsq sink {what}: {summary['messages']} message(s), {summary['bytes']} bytes in "
        f"{summary['mpubs']} MPUB(s) from {summary['partitions']} partition(s) to "
        f"{summary['topics']}"
    )
    if summary["failed_partitions"]:
        text += f"; {summary['failed_partitions']} partition(s) reported nothing"
    log.log(level, "%s", text)
    if not logging.getLogger().hasHandlers() and not log.hasHandlers():
        # Spark runs commit() in a process of its own whose logging nobody configured; its
        # stderr ends up in the driver's log.
        print(text, file=sys.stderr, flush=True)


class NsqWriter(DataSourceArrowWriter):
    """Batch sink writer (``df.write.format("nsq")``); picklable, holds only options."""

    def __init__(self, options: SinkOptions, columns: dict[str, Any]) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        freeze_worker_heap()
        return _publish_arrow(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("committed", summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What was published stays published: NSQ has no transactions to roll back.
        _report("aborted after publishing", summarize(messages), logging.WARNING)


class NsqStreamWriter(_StreamWriterBase):  # type: ignore[misc,valid-type]
    """Streaming sink writer (``df.writeStream.format("nsq")``); picklable."""

    def __init__(self, options: SinkOptions, columns: dict[str, Any]) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        freeze_worker_heap()
        if _STREAM_ARROW:
            return _publish_arrow(self.options, self.columns, iterator)
        return _publish_rows(self.options, self.columns, iterator)  # pragma: no cover

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(f"batch {batchId} committed", summarize(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(f"batch {batchId} aborted after publishing", summarize(messages), logging.WARNING)
