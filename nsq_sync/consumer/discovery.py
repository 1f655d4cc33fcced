"""Discovery: the task that finds nsqds (lookupd polling with jitter) and (re)connects them.

One discovery task per consumer (``nsq_sync-discovery-<topic>/<channel>``) decides which nsqds
the consumer should be connected to (the direct ``nsqd_tcp_addresses`` plus whatever the
lookupds list for the topic) and keeps it so:

* every lookupd is queried at once, in parallel, each on its own task
  (``nsq_sync-discovery-query-<url>``, through :class:`~nsq_sync.http.lookupd.LookupdClient`) with
  ``lookupd_http_timeout``; discovery never waits for them (a query's answer wakes it), so a
  dead or hanging lookupd never holds up the others, the direct nsqds, reconnects or ``stop()``;
  results merge by ``broadcast_address:tcp_port``;
* the next poll comes ``lookupd_poll_interval`` later, with random jitter of up to
  ``lookupd_poll_jitter`` of the interval (either way) on *every* poll, so a fleet of consumers
  does not hit the lookupds in lockstep;
* an nsqd that is not connected is dialled as soon as its reconnect backoff allows (exponential
  with jitter, capped at ``reconnect_backoff_max``); a dropped connection makes the next lookupd
  query come soon (at most once a second);
* lookupd only ever *adds* nsqds (as go-nsq): an error, a 404 ``TOPIC_NOT_FOUND`` or an empty
  answer never closes a live connection (a restarted nsqlookupd answers 404 until every nsqd
  re-registered, up to nsqd's 15 s ping later). An nsqd goes away when its connection closes;
  it is then reconnected if it is a direct address or the latest lookupd answer lists it.

The task sleeps on an event between deadlines: an idle consumer does not poll anything. Time
comes from an injected clock and the lookupd query from an injected function, so the rules are
unit-tested without servers or sleeps (tests/unit/test_discovery.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from nsq_sync.backoff import reconnect_delay
from nsq_sync.http.lookupd import LookupdClient

log = logging.getLogger(__name__)

_REQUERY_MIN_INTERVAL = 1.0

#: ``lookup(url, topic, timeout)``: the tcp addresses of the nsqds lookupd lists for ``topic``
Lookup = Callable[[str, str, float], set[str]]


def lookup_topic(url: str, topic: str, timeout: float) -> set[str]:
    """Ask the lookupd at ``url`` which nsqds carry ``topic`` (``host:tcp_port`` each)."""
    with LookupdClient(url, timeout=timeout) as client:
        return {p.tcp_address for p in client.lookup(topic)}


class Discovery:
    """Keeps a consumer connected to the nsqds it should consume from. Its public methods are
    thread-safe (flags + an event).

    Args:
        topic: what to look up.
        direct: nsqd TCP addresses to stay connected to whatever lookupd says.
        lookupds: lookupd HTTP addresses to poll.
        poll_interval, poll_jitter, http_timeout: ``lookupd_poll_interval``,
            ``lookupd_poll_jitter``, ``lookupd_http_timeout``.
        reconnect_max: the longest reconnect backoff, seconds.
        runtime: spawns the task and the queries; its events put the task to sleep.
        connected: the addresses connected now.
        connect: starts dialling an address (returns at once; the result comes back through
            :meth:`connect_succeeded` / :meth:`connect_failed`).
        log: the consumer's logger.
        rng: jitter.
        clock: monotonic seconds.
        lookup: the lookupd query (default :func:`lookup_topic`).
    """

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
        log: logging.Logger | logging.LoggerAdapter[Any] = log,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        lookup: Lookup = lookup_topic,
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
        self.log = log
        self.rng = rng or random.Random()
        self.clock = clock
        self.lookup = lookup
        #: nsqds the latest lookupd answer listed (kept when no lookupd answered)
        self.discovered: set[str] = set()
        self.answered = False  # some lookupd answered at least once (discovered is its word)
        self.failures: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        self.connecting: set[str] = set()
        self.next_poll = 0.0
        self.last_poll = -1e9
        self.polls = 0
        # the lookupd query round in progress: its number, deadline, answers so far
        self._round = 0
        self._round_deadline: float | None = None
        self._round_found: set[str] = set()
        self._round_answers = 0
        self._round_ok = 0
        # (round, url, addresses or None, error): appended by query tasks (deque: atomic)
        self._answers: deque[tuple[int, str, set[str] | None, BaseException | None]] = deque()
        self._wakeup = runtime.event()
        self._stopped = False
        self._task: Any = None

    # ------------------------------------------------------------------ called by the consumer

    def start(self, name: str) -> None:
        self._task = self.runtime.spawn(self._run, name=f"nsq_sync-discovery-{name}")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the task. It never waits on a lookupd query (those end on their own within
        ``lookupd_http_timeout``), so this returns as soon as the task saw the flag."""
        self._stopped = True
        self._wakeup.set()
        if self._task is not None and not self.runtime.is_current(self._task):
            self._task.join(timeout)

    def abandon(self) -> None:
        """In a forked child (the consumer's fork hook; takes no lock): never reconnect."""
        self._stopped = True

    def knows_no_nsqd(self) -> bool:
        """True when there is no direct address and lookupd answered that no nsqd carries the
        topic."""
        return not self.direct and self.answered and not self.discovered

    def connect_succeeded(self, address: str) -> None:
        """Subscribed. The failure count stays until the connection proves useful (see
        :meth:`connection_lost`): an nsqd that accepts and closes right after SUB would
        otherwise be redialled at the shortest backoff, ~10 times a second, forever."""
        self.connecting.discard(address)
        self.retry_at.pop(address, None)

    def connect_failed(self, address: str, permanent: bool = False) -> None:
        """A dial or handshake failed. ``permanent`` (a configuration error that a retry would
        repeat: TLS, AUTH, an option nsqd rejects, an HTTP port) waits ``reconnect_max``."""
        self.connecting.discard(address)
        if permanent:
            self.failures[address] = self.failures.get(address, 0) + 1
            self.retry_at[address] = self.clock() + self.reconnect_max
        else:
            self._schedule_retry(address)
        self._wakeup.set()

    def connection_lost(self, address: str, useful: bool = True) -> None:
        """A live connection dropped: reconnect after a short backoff (a direct address, or one
        the latest lookupd answer lists), re-query lookupd soon. ``useful`` (it delivered a
        message or lived past a heartbeat interval) starts the backoff afresh; otherwise the
        backoff keeps growing from the earlier failures."""
        if useful:
            self.failures[address] = 0
        self._schedule_retry(address)
        if self.lookupds:
            self.next_poll = min(self.next_poll, self.last_poll + _REQUERY_MIN_INTERVAL)
        self._wakeup.set()

    # ------------------------------------------------------------------ the task

    def _schedule_retry(self, address: str) -> None:
        n = self.failures.get(address, 0) + 1
        self.failures[address] = n
        self.retry_at[address] = self.clock() + reconnect_delay(
            n, 0.1, self.reconnect_max, self.rng
        )

    def _jittered_interval(self) -> float:
        return self.poll_interval * (1.0 + self.poll_jitter * (2.0 * self.rng.random() - 1.0))

    def _run(self) -> None:
        while not self._stopped:
            try:
                timeout = self.step()
            except Exception:
                self.log.exception("discovery step failed")
                timeout = 1.0
            if self._stopped:
                return
            self._wakeup.wait(timeout)
            self._wakeup.clear()

    def step(self) -> float | None:
        """One pass of the task: merge the lookupd answers that arrived, start a query round
        when one is due, dial every wanted nsqd whose backoff allows. Returns the seconds until
        the next thing to do (None: nothing until woken)."""
        self._collect_answers()
        now = self.clock()
        if self.lookupds and self._round_deadline is None and now >= self.next_poll:
            self._start_round()
        desired = set(self.direct) | self.discovered
        # `connecting` before `connected`: a connect registers its connection, then leaves
        # `connecting` (connect_succeeded), so in this order no address is seen in neither and
        # dialled a second time while it is connected
        connecting = set(self.connecting)
        connected = self.connected()
        now = self.clock()
        deadlines = []
        if self._round_deadline is not None:
            deadlines.append(self._round_deadline)
        elif self.lookupds:
            deadlines.append(self.next_poll)
        for address in sorted(desired - connected - connecting):
            at = self.retry_at.get(address, 0.0)
            if at <= now:
                self.connecting.add(address)
                self.connect(address)
            else:
                deadlines.append(at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - self.clock())

    def _start_round(self) -> None:
        """Query every lookupd in parallel, each on its own task; answers wake the task."""
        self._round += 1
        self._round_deadline = self.clock() + self.http_timeout * 2 + 1.0
        self._round_found = set()
        self._round_answers = 0
        self._round_ok = 0
        for url in self.lookupds:
            self.runtime.spawn(
                self._query, self._round, url, name=f"nsq_sync-discovery-query-{url}"
            )

    def _query(self, round_: int, url: str) -> None:
        try:
            found = self.lookup(url, self.topic, self.http_timeout)
            self._answers.append((round_, url, found, None))
        except Exception as exc:
            self._answers.append((round_, url, None, exc))
        self._wakeup.set()

    def _collect_answers(self) -> None:
        """Merge the answers that arrived; end the round when all did or its deadline passed.

        A round in which no lookupd answered keeps what we knew. Whatever the answer, nothing
        connected is closed: lookupd only adds nsqds."""
        while self._answers:
            round_, url, addresses, error = self._answers.popleft()
            if round_ != self._round or self._round_deadline is None:
                continue  # a late answer from a round given up on
            self._round_answers += 1
            if addresses is None:
                self.log.warning("lookupd %s query failed: %s", url, error)
            else:
                self._round_ok += 1
                self._round_found |= addresses
        if self._round_deadline is None:
            return
        now = self.clock()
        complete = self._round_answers >= len(self.lookupds)
        if not complete and now < self._round_deadline:
            return
        if not complete:
            self.log.warning("lookupd queries did not all answer in time")
        if self._round_ok:
            self.discovered = self._round_found
            self.answered = True
        self._round_deadline = None
        self.polls += 1
        self.last_poll = now
        self.next_poll = now + self._jittered_interval()
