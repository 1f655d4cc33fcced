"""Code that runs on the executors (shipped by value: executors cannot import the tests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any


def trickle(batches: Iterator[Any], rows: int = 500, pause: float = 0.05) -> Iterator[Any]:
    """``mapInArrow`` function: pass the rows through in slices of ``rows``, pausing between
    slices, so that a write lasts long enough to restart nsqd in the middle of it."""
    for batch in batches:
        for offset in range(0, batch.num_rows, rows):
            time.sleep(pause)
            yield batch.slice(offset, rows)
