"""A one-line progress display on a terminal (``nsq-sync drain``), from the standard library.

A stream that is not a terminal gets nothing at all, so cron mail and log files stay clean.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

__all__ = ["Progress"]

#: seconds between two redraws
INTERVAL = 0.2


class Progress:
    """Counts ``unit`` (plural: "messages") and redraws the count, rate and elapsed time on
    ``stream`` a few times a second from its own thread; ``enabled=None`` draws only on a
    terminal. :meth:`add` is thread-safe.
    """

    def __init__(self, stream: TextIO, unit: str, enabled: bool | None = None) -> None:
        self.stream = stream
        self.unit = unit
        self.enabled = stream.isatty() if enabled is None else enabled
        self.count = 0
        self._last_at = 0.0
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def add(self, n: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += n
            self._last_at = now

    def rate(self) -> float:
        """Per second, from the start to the latest :meth:`add`."""
        with self._lock:
            count, last_at = self.count, self._last_at
        return count / max(1e-3, last_at - self._started) if count else 0.0

    def line(self) -> str:
        """The text of the progress line now."""
        elapsed = time.monotonic() - self._started
        with self._lock:
            count = self.count
        return f"{count} {self.unit}  {self.rate():.1f}/s  {elapsed:.1f} s"

    def start(self) -> None:
        self._started = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._draw_loop, name="nsq_sync-progress")
            self._thread.daemon = True
            self._thread.start()

    def close(self, final: str | None = None) -> None:
        """Stop redrawing; leave ``final`` (or the last progress line) on the terminal."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if self.enabled:
            self._draw(final if final is not None else self.line())
            self.stream.write("\n")
            self.stream.flush()

    def _draw_loop(self) -> None:
        while not self._done.wait(INTERVAL):
            self._draw(self.line())

    def _draw(self, text: str) -> None:
        padding = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + padding)
        self.stream.flush()
