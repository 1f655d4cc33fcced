"""The parallel streaming source: the driver plans batches, the executors read NSQ.

Spark calls ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` on the driver, on
one thread, and ``read`` on unpickled copies in executors (``_partition``). The driver opens no
NSQ connection: nsqd's HTTP ``/stats`` says how many messages wait for the channel.

- Offsets are ``{"batch": b, "rows": r}``, ``r`` the most rows batch ``b`` reads; an idle
  channel makes no batches.
- ``partitions`` depends on the offsets only, so a batch Spark runs again gets the same
  partitions, whose reads replay the staged chunks. It marks the batch OPEN in the staging
  location: partitions consume only while OPEN is there.
- ``commit(end)`` deletes the staging of every batch up to ``end``. Spark commits batch N only
  while it builds N+1, so after a batch with rows, when nothing waits, ``latestOffset`` returns
  one empty batch (``rows`` 0) that lets Spark commit the last one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from nsq_sync.errors import ConfigError, NSQError
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.http.lookupd import LookupdClient
from nsq_sync.spark._executor import freeze_worker_heap
from nsq_sync.spark._options import SourceOptions
from nsq_sync.spark._partition import NsqPartition, read_partition
from nsq_sync.spark._staging import Staging

try:  # pyspark >= 4.2: admission control
    from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow
except ImportError:  # pragma: no cover - checked by require_admission_control
    ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]

    class _AvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger(__name__)

__all__ = ["NsqParallelStreamReader", "require_admission_control"]

#: a streaming query with no data asks again after this many seconds (Spark would otherwise
#: poll nsqd's /stats in a tight loop)
_IDLE_POLL = 0.5
#: seconds between looks at /stats while availableNow waits for in-flight messages to return
_IN_FLIGHT_POLL = 0.5
_HTTP_TIMEOUT = 5.0
#: seconds availableNow keeps asking an nsqd that does not answer /stats
_STATS_RETRY = 30.0


def require_admission_control() -> None:
    """Raises ConfigError unless pyspark has ReadMaxRows (>= 4.2)."""
    if ReadMaxRows is None:
        import pyspark

        raise ConfigError(
            f"option parallelism needs pyspark >= 4.2 (admission control); this is "
            f"{pyspark.__version__}"
        )


class NsqParallelStreamReader(DataSourceStreamReader, _AvailableNow):  # type: ignore[misc]
    """Plans micro-batches from nsqd's /stats and reads them on the executors; see the module
    docs. Picklable; holds no connection. Spark calls it from one thread at a time."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.staging = Staging(options.staging_location or "")
        self._available_now = False
        self._checked_leftovers = False

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"], state["schema"])  # type: ignore[misc]

    # ------------------------------------------------------------------ driver: planning

    def initialOffset(self) -> dict[str, int]:
        """The first offset of a new query (no checkpoint yet).

        Raises:
            ConfigError: the staging location holds batches other than the first (another
                query's, whose FINed messages exist only there).
        """
        if not self._checked_leftovers:
            self._checked_leftovers = True
            # Spark also starts from here when it restarts a query that never committed a
            # batch: then batch 1 is staged and replays. Anything else is another query's.
            leftovers = [
                b for b in self.staging.batches() if b != 1 and not self.staging.only_open(b)
            ]
            if leftovers:
                raise ConfigError(
                    f"option staging_location {self.options.staging_location!r} holds staged "
                    f"batches {leftovers[:5]} of another query (a new checkpoint needs an "
                    "empty staging location; those rows were taken from NSQ and exist only "
                    "there)"
                )
        return {"batch": 0, "rows": 0}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, int]:
        """The next batch when messages wait for the channel, the empty batch that commits the
        previous one, or ``start`` (no new batch)."""
        if start is None:  # pragma: no cover - pyspark < 4.2 is refused at planning
            raise ConfigError("option parallelism needs pyspark >= 4.2")
        batch, prev_rows = int(start["batch"]), int(start["rows"])
        max_rows = self.options.max_messages_per_batch
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(max_rows, int(limit.max_rows)))
        depth, in_flight = self._stats()
        if depth == 0 and in_flight and self._available_now:
            depth = self._wait_for_in_flight()
        if depth > 0:
            return {"batch": batch + 1, "rows": min(depth, max_rows)}
        if prev_rows > 0:
            return {"batch": batch + 1, "rows": 0}
        if not self._available_now:
            time.sleep(_IDLE_POLL)
        return {"batch": batch, "rows": prev_rows}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """``parallelism`` partitions sharing the batch's rows (one for the empty batch), a
        function of ``end``; marks the batch open in the staging location."""
        batch, rows = int(end["batch"]), int(end["rows"])
        if rows <= 0 or batch <= int(start["batch"]):
            return [InputPartition(NsqPartition(batch, 0, 0))]
        self.staging.open_batch(batch)
        n = self.options.parallelism
        per = math.ceil(rows / n)
        return [InputPartition(NsqPartition(batch, i, per)) for i in range(n)]

    def commit(self, end: dict[str, Any]) -> None:
        """Delete the staging of every batch up to ``end`` (unknown offsets are fine)."""
        deleted = self.staging.delete_through(int(end["batch"]))
        if deleted:
            log.debug("nsq source: committed batch %s, deleted staging %s", end["batch"], deleted)

    def stop(self) -> None:
        """Nothing to close: the driver holds no NSQ connection."""

    # ------------------------------------------------------------------ executors

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Runs on an executor: replay the partition's staging, or consume and stage it."""
        freeze_worker_heap()
        return read_partition(partition.value, self.options, self.staging, self.schema.fieldNames())

    # ------------------------------------------------------------------ /stats

    def _nsqd_http_addresses(self) -> list[str]:
        opts = self.options
        found = list(opts.nsqd_http_addresses)
        for lookupd in opts.lookupd_http_addresses:
            try:
                with LookupdClient(lookupd, timeout=_HTTP_TIMEOUT) as client:
                    found.extend(p.http_address for p in client.lookup(opts.topic))
            except NSQError as exc:
                log.warning("nsq source: lookupd %s: %s", lookupd, exc)
        return sorted(set(found))

    def _stats(self) -> tuple[int, int]:
        """:meth:`_channel_depth`; with availableNow, an nsqd that does not answer within
        ``_STATS_RETRY`` seconds fails the query (ending it would leave its messages unread)."""
        deadline = time.monotonic() + _STATS_RETRY
        while True:
            depth, in_flight, failed = self._channel_depth()
            if not failed or not self._available_now:
                return depth, in_flight
            if time.monotonic() >= deadline:
                raise NSQError(
                    f"nsq source: no /stats from nsqd {', '.join(failed)} for "
                    f"{_STATS_RETRY:g} s; availableNow cannot tell whether "
                    f"{self.options.topic}/{self.options.channel} is drained"
                )
            time.sleep(_IN_FLIGHT_POLL)

    def _channel_depth(self) -> tuple[int, int, list[str]]:
        """(messages waiting for the channel, in flight on it, nsqds that did not answer); a
        missing channel counts its topic's depth (nsqd hands those to the first channel)."""
        opts = self.options
        depth = in_flight = 0
        failed: list[str] = []
        for address in self._nsqd_http_addresses():
            try:
                with NsqdHTTPClient(address, timeout=_HTTP_TIMEOUT) as client:
                    chan = client.channel_stats(opts.topic, opts.channel, include_clients=False)
                    if chan is None:
                        topic = client.topic_stats(opts.topic, include_clients=False) or {}
                        if not topic.get("channels"):
                            depth += int(topic.get("depth", 0))
                        continue
            except NSQError as exc:
                log.warning("nsq source: nsqd %s /stats: %s", address, exc)
                failed.append(address)
                continue
            depth += int(chan.get("depth", 0))
            in_flight += int(chan.get("in_flight_count", 0)) + int(chan.get("deferred_count", 0))
        return depth, in_flight, failed

    def _wait_for_in_flight(self) -> int:
        """availableNow: wait, at most ``msg_timeout``, for messages in flight (a dead task's)."""
        timeout = (self.options.config.msg_timeout or 60.0) + 5.0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(_IN_FLIGHT_POLL)
            depth, in_flight = self._stats()
            if depth or not in_flight:
                return depth
        log.warning(
            "nsq source: messages still in flight on %s/%s after %.0f s; availableNow ends "
            "without them (a later run reads them)",
            self.options.topic,
            self.options.channel,
            timeout,
        )
        return 0
