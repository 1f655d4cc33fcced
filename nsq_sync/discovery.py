"""The connection manager task: lookupd polling with jitter, and (re)connecting nsqds.

One task per consumer decides which nsqds the consumer should be connected to (the direct
``nsqd_tcp_addresses`` plus whatever the lookupds list for the topic) and keeps it so:

* every lookupd is queried at once, in parallel, each with ``lookupd_http_timeout``, so one dead
  or hanging lookupd never holds up the others; results merge by ``broadcast_address:tcp_port``;
* the next poll comes ``lookupd_poll_interval`` later, with random jitter of up to
  ``lookupd_poll_jitter`` of the interval (either way) on *every* poll, so a fleet of consumers
  does not hit the lookupds in lockstep;
* an nsqd that is not connected is dialled as soon as its reconnect backoff allows (exponential
  with jitter, capped at ``reconnect_backoff_max``); a dropped connection makes the next lookupd
  query come soon (at most once a second);
* an nsqd that vanished from every lookupd (and is not a direct address) is retired: its credit
  goes elsewhere, it drains, then closes.

The task sleeps on an event between deadlines: an idle consumer does not poll anything.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from nsq_sync.lookupd import LookupdClient

log = logging.getLogger(__name__)

_REQUERY_MIN_INTERVAL = 1.0


class ConnectionManager:
    """Keeps a consumer connected. Its public methods are thread-safe (flags + an event)."""

    def __init__(
        self,
        *,
        topic: str,
        direct: Sequence[str],
        lookupds: Sequence[str],
        poll_interval: float,
        poll_jitter: float,
        http_timeout: float,
        reconnect_max: float,
        runtime: Any,
        connected: Callable[[], set[str]],
        connect: Callable[[str], None],
        retire: Callable[[str], None],
        log: logging.Logger | logging.LoggerAdapter[Any] = log,
        rng: random.Random | None = None,
    ) -> None:
        self.topic = topic
        self.direct = list(direct)
        self.lookupds = list(lookupds)
        self.poll_interval = poll_interval
        self.poll_jitter = poll_jitter
        self.http_timeout = http_timeout
        self.reconnect_max = reconnect_max
        self.runtime = runtime
        self.connected = connected
        self.connect = connect
        self.retire = retire
        self.log = log
        self.rng = rng or random.Random()
        self.discovered: set[str] = set()
        self.failures: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        self.connecting: set[str] = set()
        self.next_poll = 0.0
        self.last_poll = -1e9
        self.polls = 0
        self._wakeup = runtime.event()
        self._stopped = False
        self._task: Any = None

    # ------------------------------------------------------------------ called by the consumer

    def start(self, name: str) -> None:
        self._task = self.runtime.spawn(self._run, name=f"nsq_sync-discovery-{name}")

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped = True
        self._wakeup.set()
        if self._task is not None and not self.runtime.is_current(self._task):
            self._task.join(timeout)

    def connect_succeeded(self, address: str) -> None:
        self.connecting.discard(address)
        self.failures[address] = 0
        self.retry_at.pop(address, None)

    def connect_failed(self, address: str, permanent: bool = False) -> None:
        """A dial or handshake failed. ``permanent`` (a configuration error that a retry would
        repeat: TLS, AUTH, an option nsqd rejects, an HTTP port) waits ``reconnect_max``."""
        self.connecting.discard(address)
        if permanent:
            self.failures[address] = self.failures.get(address, 0) + 1
            self.retry_at[address] = time.monotonic() + self.reconnect_max
        else:
            self._schedule_retry(address)
        self._wakeup.set()

    def connection_lost(self, address: str) -> None:
        """A live connection dropped: reconnect after a short backoff, re-query lookupd soon."""
        self._schedule_retry(address)
        if self.lookupds:
            self.next_poll = min(self.next_poll, self.last_poll + _REQUERY_MIN_INTERVAL)
        self._wakeup.set()

    def poll_now(self) -> None:
        self.next_poll = 0.0
        self._wakeup.set()

    # ------------------------------------------------------------------ the task

    def _schedule_retry(self, address: str) -> None:
        n = self.failures.get(address, 0) + 1
        self.failures[address] = n
        delay = min(self.reconnect_max, 0.1 * 2 ** min(n - 1, 16)) * (0.5 + self.rng.random() / 2)
        self.retry_at[address] = time.monotonic() + delay

    def _jittered_interval(self) -> float:
        return self.poll_interval * (1.0 + self.poll_jitter * (2.0 * self.rng.random() - 1.0))

    def _run(self) -> None:
        while not self._stopped:
            try:
                timeout = self._step()
            except Exception:
                self.log.exception("discovery step failed")
                timeout = 1.0
            if self._stopped:
                return
            self._wakeup.wait(timeout)
            self._wakeup.clear()

    def _step(self) -> float | None:
        now = time.monotonic()
        if self.lookupds and now >= self.next_poll:
            found = self._query_lookupds()
            if found is not None:
                self.discovered = found
            self.polls += 1
            self.last_poll = time.monotonic()
            self.next_poll = self.last_poll + self._jittered_interval()
        desired = set(self.direct) | self.discovered
        connected = self.connected()
        for address in connected - desired:
            self.retire(address)
        now = time.monotonic()
        deadlines = [self.next_poll] if self.lookupds else []
        for address in sorted(desired - connected - self.connecting):
            at = self.retry_at.get(address, 0.0)
            if at <= now:
                self.connecting.add(address)
                self.connect(address)
            else:
                deadlines.append(at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _query_lookupds(self) -> set[str] | None:
        """Query every lookupd in parallel; None when none answered (keep what we know)."""
        results: Any = self.runtime.queue()

        def query(url: str) -> None:
            try:
                with LookupdClient(url, timeout=self.http_timeout) as client:
                    results.put((url, {p.tcp_address for p in client.lookup(self.topic)}, None))
            except Exception as exc:
                results.put((url, None, exc))

        for url in self.lookupds:
            self.runtime.spawn(query, url, name=f"nsq_sync-lookupd-query-{url}")
        found: set[str] = set()
        answered = 0
        deadline = time.monotonic() + self.http_timeout * 2 + 1.0
        for _ in self.lookupds:
            try:
                url, addresses, error = results.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                self.log.warning("lookupd queries did not all answer in time")
                break
            if error is not None:
                self.log.warning("lookupd %s query failed: %s", url, error)
                continue
            answered += 1
            found |= addresses
        return found if answered else None
