"""The load generators: each web server gets requests at a steady rate, each with one unique
id, from a few client threads. A request that is not answered 2xx (an error page, a reset
connection, a timeout) leaves its publish's outcome unknown to the caller, which sends the same
id again (up to ``ATTEMPTS`` times): the resends are counted, so that the duplicates they make
are explained. Every attempt is kept: id, server, attempt number, start and end (wall clock),
HTTP status or the client's exception.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import requests

from .deployment import Web

ATTEMPTS = 4  # sends of one id at most
RESEND_AFTER = 0.5  # seconds before an id is sent again
TIMEOUT = 30.0  # seconds a client waits for an answer


@dataclass
class Attempt:
    id: str
    server: str
    path: str
    attempt: int
    t0: float
    t1: float
    status: int | None  # None: no answer
    error: str | None  # the client's exception when there was no answer

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class LoadGenerator:
    """Requests ``rate`` ids per second to ``web`` until :meth:`stop`."""

    def __init__(self, web: Web, prefix: str, rate: float, clients: int = 6) -> None:
        self.web = web
        self.prefix = prefix
        self.rate = rate
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(clients, thread_name_prefix=f"soak-load-{web.name}")
        self._thread = threading.Thread(target=self._pace, name=f"soak-pace-{web.name}")
        self.started = 0
        self.in_flight = 0  # requests under way (read without the lock: a snapshot)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sending new ids; wait for those under way (their resends included)."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)

    def _ids(self) -> Iterator[tuple[str, str]]:
        paths = itertools.cycle(self.web.paths)
        for seq in itertools.count():
            path = next(paths)
            kind = "c" if "orders" in path else ""
            yield f"{self.prefix}{kind}-{seq}", path

    def _pace(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        for ident, path in self._ids():
            if self._stop.is_set():
                return
            self._pool.submit(self._send, ident, path)
            self.started += 1
            next_at += interval
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return

    def _send(self, ident: str, template: str) -> None:
        url = self.web.server.url + template.format(id=ident)
        for attempt in range(1, ATTEMPTS + 1):
            t0 = time.time()
            status: int | None = None
            error: str | None = None
            with self._lock:
                self.in_flight += 1
            try:
                response = requests.get(url, headers={"Connection": "close"}, timeout=TIMEOUT)
                status = response.status_code
            except requests.RequestException as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                with self._lock:
                    self.in_flight -= 1
            done = Attempt(ident, self.web.name, template, attempt, t0, time.time(), status, error)
            with self._lock:
                self.attempts.append(done)
            if done.ok:
                return
            time.sleep(RESEND_AFTER)

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(a) for a in self.attempts]
