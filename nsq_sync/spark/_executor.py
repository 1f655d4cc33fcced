"""What the executor-side code does to the Python worker process it runs in.

PySpark reuses a Python worker from task to task and runs a full ``gc.collect()`` after every
task, which walks every tracked object: mostly the imported modules, alive for the process's
life anyway. :func:`freeze_worker_heap` moves what the worker holds at its first nsq_sync task
into the permanent generation (:func:`gc.freeze`), once per process and right after a
collection, so that no garbage is frozen: a bounded amount, never collected, that later
collections skip. It runs only in a Spark task, never at import time.

While a task moves rows (:func:`fewer_collections`), the collector runs less often: the rows'
objects are freed by reference counting as soon as they are staged or published, and every
young-generation collection would walk the messages in flight (a tenth of the source's CPU per
row, measured in bench/profile/spark_partition.py). PySpark's collection after the task
collects any cycle left meanwhile.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from nsq_sync import process

log = logging.getLogger(__name__)

_frozen_in: process.Stamp | None = None  # the process that froze (a forked child did not)

#: allocations (less deallocations) between young-generation collections while a task moves
#: rows (Python's default is 700: a collection every few hundred messages)
TASK_GC_THRESHOLD = 100_000


def freeze_worker_heap() -> None:
    """Freeze the worker's long-lived objects out of the collector's way, once per process.

    Executor-side code only, inside a task; not thread-safe (a worker runs one task at a time).
    """
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


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the young generation's threshold to :data:`TASK_GC_THRESHOLD` for the block, then
    restore what it was. Process-wide: executor-side code only, one task per worker process."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], TASK_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
