"""The parallel source's write-ahead stage: Arrow IPC chunks and MANIFESTs through ``pyarrow.fs``.

Layout under the staging location (one per query)::

    <location>/batch-<b>/OPEN                                         planned, not committed
    <location>/batch-<b>/part-<i>/chunk-<attempt id>-<pid>-<n>.arrow   a staged chunk
    <location>/batch-<b>/part-<i>/SEALED                              no more consuming here
    <location>/batch-<b>/part-<i>/MANIFEST                            the partition, complete

- Chunks, SEALED and the MANIFEST are written under a ``.tmp`` name and renamed: a file with
  its final name is complete.
- A chunk's messages are FINed only once it is complete, and only while OPEN is there and
  SEALED is not (:meth:`PartitionStage.may_fin`).
- The attempt that completes a partition writes SEALED, then lists the complete chunks, then
  writes the MANIFEST naming them; every later read replays exactly those.
- The driver writes OPEN when it plans a batch; the commit deletes OPEN first, then the folder.
  An attempt that runs on after the commit FINs nothing and deletes again what it wrote.

Nothing here imports pyspark; pyarrow is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nsq_sync.errors import ConfigError

__all__ = ["Manifest", "PartitionStage", "Staging"]

MANIFEST = "MANIFEST"
SEALED = "SEALED"
OPEN = "OPEN"
_CHUNK_SUFFIX = ".arrow"
_TMP = ".tmp"


@dataclass(frozen=True)
class Manifest:
    """What a completed partition holds: its chunk files (in order) and their row counts."""

    chunks: tuple[str, ...]
    rows: tuple[int, ...]
    adopted: int
    info: dict[str, Any]

    @property
    def total(self) -> int:
        return sum(self.rows)


class Staging:
    """A staging location: a pyarrow filesystem and the base path on it. Picklable (the
    filesystem is opened lazily, in the process that uses it). Thread-safe for distinct
    partitions."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._fs: Any = None
        self._base = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import pyarrow.fs as pafs

            if "://" in self.location:
                self._fs, self._base = pafs.FileSystem.from_uri(self.location)
            else:
                self._fs, self._base = pafs.LocalFileSystem(), self.location
            self._base = self._base.rstrip("/") or "/"
        return self._fs

    def path(self, *parts: str) -> str:
        self.fs  # noqa: B018  (sets _base)
        return "/".join([self._base.rstrip("/"), *parts])

    def check_writable(self) -> None:
        """Create the location if needed and write, read and delete a probe file in it.

        Raises:
            ConfigError: naming the location and what failed.
        """
        try:
            fs = self.fs
            fs.create_dir(self.path(), recursive=True)
            probe = self.path(f".probe-{uuid.uuid4().hex}")
            with fs.open_output_stream(probe) as out:
                out.write(b"nsq_sync")
            with fs.open_input_stream(probe) as inp:
                ok = inp.read() == b"nsq_sync"
            fs.delete_file(probe)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid...
            raise ConfigError(
                f"option staging_location {self.location!r} is not writable: {exc}"
            ) from None
        if not ok:
            raise ConfigError(f"option staging_location {self.location!r} did not read back")

    def batches(self) -> list[int]:
        """Batch numbers that have staging, ascending."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(), allow_not_found=True))
        except FileNotFoundError:
            return []
        found = set()  # a set: an object store may list a folder twice (its prefix, a marker)
        for info in infos:
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith("batch-"):
                try:
                    found.add(int(name[6:]))
                except ValueError:
                    continue
        return sorted(found)

    def open_batch(self, batch: int) -> None:
        """Mark ``batch`` planned (the driver, before its partitions run; idempotent): its
        partitions consume only while the mark is there, and :meth:`delete_through` removes it.

        Raises:
            OSError: the staging location cannot be written.
        """
        import pyarrow.fs as pafs

        fs = self.fs
        folder = self.path(f"batch-{batch}")
        mark = f"{folder}/{OPEN}"
        # Never replaced once there (a move onto it would remove it for a moment on HDFS, and
        # an attempt would take the batch for committed); a few bytes, so written in place
        # (not empty: some S3-compatible stores refuse an empty upload part).
        if fs.get_file_info(mark).type != pafs.FileType.NotFound:
            return
        fs.create_dir(folder, recursive=True)
        payload = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        with fs.open_output_stream(mark) as out:
            out.write(payload.encode("utf-8"))

    def only_open(self, batch: int) -> bool:
        """True when ``batch``'s folder holds its OPEN mark and nothing else (planned, never
        read: no rows staged)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path(f"batch-{batch}"), allow_not_found=True)
        return [i.base_name for i in self.fs.get_file_info(selector)] == [OPEN]

    def delete_through(self, batch: int) -> list[int]:
        """Delete the staging of every batch up to ``batch``; return the batch numbers deleted.
        Each batch's OPEN goes first: an attempt that still finds it (after finding no SEALED)
        knows the deletion had not begun (see :meth:`PartitionStage.may_fin`)."""
        done = [b for b in self.batches() if b <= batch]
        for b in done:
            try:
                self.fs.delete_file(self.path(f"batch-{b}", OPEN))
            except FileNotFoundError:
                pass
            self.delete_folder(b)
        return done

    def delete_folder(self, batch: int) -> None:
        """Delete ``batch``'s folder and what is in it; a folder already gone is fine."""
        folder = self.path(f"batch-{batch}")
        for again in (True, False):
            try:
                self.fs.delete_dir(folder)
                return
            except FileNotFoundError:  # deleted meanwhile (a late attempt's discard)
                return
            except OSError:  # a late attempt wrote into it meanwhile: once more
                if not again:
                    raise

    def partition(self, batch: int, index: int) -> PartitionStage:
        return PartitionStage(self, batch, index)


class PartitionStage:
    """One partition's staging folder: its chunks and its MANIFEST. Not thread-safe."""

    def __init__(self, staging: Staging, batch: int, index: int) -> None:
        self.staging = staging
        self.dir = staging.path(f"batch-{batch}", f"part-{index}")
        self._open = staging.path(f"batch-{batch}", OPEN)
        self.batch = batch
        self.index = index
        self._made = False
        self._count = 0

    @property
    def fs(self) -> Any:
        return self.staging.fs

    def manifest(self) -> Manifest | None:
        """The MANIFEST, or None when no attempt completed this partition yet."""
        try:
            with self.fs.open_input_stream(f"{self.dir}/{MANIFEST}") as inp:
                data = json.loads(inp.read().decode("utf-8"))
        except FileNotFoundError:
            return None
        return Manifest(
            chunks=tuple(data["chunks"]),
            rows=tuple(data["rows"]),
            adopted=int(data.get("adopted", 0)),
            info=dict(data.get("info", {})),
        )

    def sealed(self) -> bool:
        """True once an attempt started completing the partition (SEALED exists; it is always
        written before the MANIFEST): from then on no attempt may FIN what it stages here (see
        :meth:`may_fin`). One metadata lookup."""
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(f"{self.dir}/{SEALED}").type != pafs.FileType.NotFound)

    def batch_open(self) -> bool:
        """True while the batch is planned and not committed (its OPEN exists)."""
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(self._open).type != pafs.FileType.NotFound)

    def discard_if_committed(self) -> bool:
        """If the batch is no longer open, delete its folder again, with what a late attempt
        wrote into it after the commit, and return True. OPEN is never replaced once written
        (:meth:`Staging.open_batch`) and the commit deletes it first, so its absence means the
        commit began: nothing in the folder is needed."""
        if self.batch_open():
            return False
        self.staging.delete_folder(self.batch)
        return True

    def may_fin(self) -> bool:
        """True while what is staged here may be FINed: the partition is not sealed and the
        batch is open (not committed). Two metadata lookups per staged chunk, in this order:
        the commit deletes OPEN before anything else, so OPEN found after SEALED was not means
        that SEALED was not there, rather than deleted by the commit."""
        import pyarrow.fs as pafs

        if self.fs.get_file_info(f"{self.dir}/{SEALED}").type != pafs.FileType.NotFound:
            return False
        return self.batch_open()

    def seal(self, attempt: str) -> None:
        """Forbid FINs of chunks staged here from now on (see the module docs)."""
        payload = json.dumps({"attempt": attempt, "pid": os.getpid()}).encode("utf-8")
        self._put(SEALED, lambda out: out.write(payload))

    def complete_chunks(self) -> list[str]:
        """Chunk files completely staged here (by any attempt), in name order."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except FileNotFoundError:
            return []
        return sorted(
            i.base_name
            for i in infos
            if i.type == pafs.FileType.File and i.base_name.endswith(_CHUNK_SUFFIX)
        )

    def _mkdir(self) -> None:
        if not self._made:
            self.fs.create_dir(self.dir, recursive=True)
            self._made = True

    def _put(self, name: str, write: Any) -> None:
        """Write ``name`` completely or not at all: a temporary file, then a rename."""
        self._mkdir()
        tmp = f"{self.dir}/{name}.{uuid.uuid4().hex}{_TMP}"
        with self.fs.open_output_stream(tmp) as out:
            write(out)
        self.fs.move(tmp, f"{self.dir}/{name}")

    def write_chunk(self, batch: Any, attempt: str) -> str:
        """Stage one Arrow RecordBatch durably; return the chunk's file name."""
        import pyarrow as pa

        self._count += 1
        name = f"chunk-{attempt}-{os.getpid()}-{self._count:06d}{_CHUNK_SUFFIX}"

        def write(out: Any) -> None:
            with pa.ipc.new_stream(out, batch.schema) as writer:
                writer.write_batch(batch)

        self._put(name, write)
        return name

    def read_chunk(self, name: str, columns: list[str] | None = None) -> Iterator[Any]:
        """The record batches of one staged chunk; with ``columns``, those columns, in order.

        Raises:
            ConfigError: the chunk lacks one of ``columns`` (it was staged by a query whose
                schema selected fewer columns, and is replayed with a wider one).
        """
        import pyarrow as pa

        with self.fs.open_input_stream(f"{self.dir}/{name}") as inp:
            table = pa.ipc.open_stream(inp).read_all()
        if columns is not None and table.column_names != columns:
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise ConfigError(
                    f"staged chunk {self.dir}/{name} has no column(s) {missing}: it was staged "
                    f"with the schema {table.column_names}; a query replaying it must select "
                    "no column its staged batches lack (restore the schema, or start a new "
                    "checkpoint and staging location)"
                )
            table = table.select(columns)
        yield from table.to_batches()

    def chunk_rows(self, name: str) -> int:
        return sum(b.num_rows for b in self.read_chunk(name, None))

    def write_manifest(
        self, chunks: list[str], rows: list[int], adopted: int, info: dict[str, Any]
    ) -> Manifest:
        """Complete the partition: from now on, reads replay exactly ``chunks``."""
        info = {"host": socket.gethostname(), "pid": os.getpid(), **info}
        data = {"chunks": chunks, "rows": rows, "adopted": adopted, "info": info}
        payload = json.dumps(data).encode("utf-8")
        self._put(MANIFEST, lambda out: out.write(payload))
        return Manifest(tuple(chunks), tuple(rows), adopted, info)
