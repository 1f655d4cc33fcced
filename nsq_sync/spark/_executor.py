"""What the executor-side code does to the Python worker process it runs in.

PySpark reuses an executor's Python worker from task to task (``spark.python.worker.reuse``,
on by default) and runs a full ``gc.collect()`` after every task (``pyspark/daemon.py``). A full
collection walks every object the garbage collector tracks: with pyspark, pyarrow and nsq_sync
imported, 86,000 objects and 72-80 ms per task on this machine's benchmark cluster. A partition
of the parallel source reads 25,000 rows at 100,000 rows per batch over four partitions: ~3 µs per row, more than a third of what the rest of the worker spends on a row
(6.6-7.2 µs, ``bench/profile/spark_partition.py``).

:func:`freeze_worker_heap` moves what the worker holds when its first nsq_sync task calls it
into the collector's permanent generation with :func:`gc.freeze`, once per process, after one
collection so that no garbage is frozen: mostly the imported modules and their objects, alive
for the process's life anyway, plus that first task's own objects (its reader, options and
iterators). Those are never collected even once garbage: a bounded amount, once per worker,
that does not grow with the tasks that follow. Later collections walk only what was made after
the freeze, and collect it as before. It runs only in a Spark task, never at import time.
"""

from __future__ import annotations

import gc
import logging

from nsq_sync import process

log = logging.getLogger(__name__)

_frozen_in: process.Stamp | None = None  # the process that froze (a forked child did not)


def freeze_worker_heap() -> None:
    """Freeze the worker's long-lived objects out of the collector's way, once per process
    (see the module docs), after importing what the executor-side code uses. Call it from
    executor-side code only, inside a task. Not thread-safe (a Python worker runs one task at a
    time)."""
    global _frozen_in
    if _frozen_in is not None and _frozen_in.is_current():
        return
    _frozen_in = process.Stamp()
    # what the source's and the sink's tasks use, imported first so that it is frozen too
    import pyarrow.compute  # noqa: F401
    import pyarrow.fs  # noqa: F401
    import pyarrow.ipc  # noqa: F401

    gc.collect()
    gc.freeze()
    log.debug(
        "nsq_sync: froze %d objects of Python worker %d", gc.get_freeze_count(), _frozen_in.pid
    )
