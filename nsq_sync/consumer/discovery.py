"""Discovery: the task that finds nsqds (lookupd polling with jitter) and (re)connects them.

* Lookupds are queried in parallel, each on its own task, and never waited for (an answer wakes
  the task): a hanging lookupd never holds up the others, reconnects or ``stop()``.
* lookupd only ever *adds* nsqds: an error, a 404 or an empty answer never closes a live
  connection (a restarted nsqlookupd answers 404 until every nsqd re-registered). A closed
  connection is redialled (with backoff) if it is direct or the latest lookupd answer lists it.
* While lookupd lists no nsqd for the topic, it is polled sooner: ``FIRST_EMPTY_POLL`` seconds,
  doubling up to ``poll_interval`` (jittered alike), so a topic created after the consumer
  started is found within seconds. The doubling bounds the extra load: about
  ``log2(poll_interval)`` more queries per lookupd per wait (docs/consumer.md).
* A server that cannot be reached is logged at WARNING once per outage (its first failure),
  the retries at DEBUG until it answers again; :meth:`Discovery.unreached` names them all.
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

#: seconds to the first poll after a lookupd answer that lists no nsqd (then doubling)
FIRST_EMPTY_POLL = 1.0

#: ``lookup(url, topic, timeout)``: the tcp addresses of the nsqds lookupd lists for ``topic``
Lookup = Callable[[str, str, float], set[str]]


def lookup_topic(url: str, topic: str, timeout: float) -> set[str]:
    """Ask the lookupd at ``url`` which nsqds carry ``topic`` (``host:tcp_port`` each)."""
    with LookupdClient(url, timeout=timeout) as client:
        return {p.tcp_address for p in client.lookup(topic)}


class Discovery:
    """Keeps a consumer connected to the nsqds it should consume from; its public methods are
    thread-safe (flags + an event). ``direct``: nsqds to stay connected to whatever lookupd says;
    ``connect(address)`` starts a dial, whose result comes back through
    :meth:`connect_succeeded` / :meth:`connect_failed`."""

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
        #: polls in a row that found no nsqd (the next one comes sooner: FIRST_EMPTY_POLL * 2**n)
        self.empty_polls = 0
        self._wait_logged = False  # the INFO "waiting for the topic" of this wait was logged
        # servers failing now ("nsqd host:port", "lookupd url") -> the last error: written by
        # connect tasks and the discovery task (single dict operations), read by unreached()
        self._down: dict[str, str] = {}
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
        """Stop the task and join it (it never waits on a lookupd query)."""
        self._stopped = True
        self._wakeup.set()
        if self._task is not None and not self.runtime.is_current(self._task):
            self._task.join(timeout)

    def abandon(self) -> None:
        """In a forked child (the consumer's fork hook; takes no lock): never reconnect."""
        self._stopped = True

    def knows_no_nsqd(self) -> bool:
        """True when there is no direct address and lookupd answered that no nsqd has the topic."""
        return not self.direct and self.answered and not self.discovered

    def unreached(self) -> list[str]:
        """The servers a consumer wants and has not reached, each with why (``"nsqd host:port
        (Connection refused)"``, ``"lookupd url (no answer yet)"``); thread-safe."""
        down = dict(self._down)
        connected = self.connected()
        wanted = sorted((set(self.direct) | self.discovered) - connected)
        servers = [f"nsqd {a} ({down.get('nsqd ' + a, 'not connected yet')})" for a in wanted]
        for url in self.lookupds:
            why = down.get(f"lookupd {url}")
            if why is not None:
                servers.append(f"lookupd {url} ({why})")
            elif not self.answered:
                servers.append(f"lookupd {url} (no answer yet)")
        return servers

    def connect_succeeded(self, address: str) -> None:
        """Subscribed. The failure count stays until the connection proves useful, so an nsqd that
        closes right after SUB is not redialled at the shortest backoff for ever."""
        self.connecting.discard(address)
        self.retry_at.pop(address, None)
        self._down.pop(f"nsqd {address}", None)

    def connect_failed(
        self, address: str, permanent: bool = False, error: BaseException | None = None
    ) -> None:
        """A dial or handshake failed (``error``, logged here: WARNING at the first failure of an
        outage, then DEBUG); a ``permanent`` failure (logged by the caller) waits
        ``reconnect_max``."""
        self.connecting.discard(address)
        if permanent:
            self.failures[address] = self.failures.get(address, 0) + 1
            self.retry_at[address] = self.clock() + self.reconnect_max
            if error is not None:
                self._down[f"nsqd {address}"] = _reason(error)
        else:
            self._schedule_retry(address)
            if error is not None:
                self._failed(f"nsqd {address}", f"cannot connect to nsqd {address}", error)
        self._wakeup.set()

    def connection_lost(self, address: str, useful: bool = True) -> None:
        """A live connection dropped: redial after a backoff, re-query lookupd soon. ``useful`` (it
        delivered or outlived a heartbeat) starts the backoff afresh."""
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

    def _failed(self, server: str, what: str, error: BaseException) -> None:
        """Log a failure to reach ``server``: WARNING the first time in an outage, else DEBUG."""
        reason = _reason(error)
        first = server not in self._down
        self._down[server] = reason
        if not first:
            self.log.debug("%s: %s (still failing)", what, reason)
            return
        alone = "" if self.connected() else f"; no nsqd is connected for topic {self.topic}"
        self.log.warning(
            "%s: %s%s (retrying; further failures are logged at DEBUG until it answers)",
            what,
            reason,
            alone,
        )

    def _next_interval(self) -> float:
        """The wait to the next poll, jittered: ``poll_interval``, or sooner while lookupd lists
        no nsqd (FIRST_EMPTY_POLL doubling per poll, up to ``poll_interval``)."""
        interval = self.poll_interval
        if not self.discovered:
            interval = min(interval, FIRST_EMPTY_POLL * 2.0 ** min(self.empty_polls, 30))
        return interval * (1.0 + self.poll_jitter * (2.0 * self.rng.random() - 1.0))

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
        """One pass: merge lookupd answers, start a query round when due, dial the wanted nsqds
        whose backoff allows. Returns the seconds until the next pass (None: when woken)."""
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
        """Query every lookupd in parallel, each on its own task."""
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
        """Merge the answers that arrived; end the round when all did or its deadline passed."""
        while self._answers:
            round_, url, addresses, error = self._answers.popleft()
            if round_ != self._round or self._round_deadline is None:
                continue  # a late answer from a round given up on
            self._round_answers += 1
            if addresses is None:
                assert error is not None
                self._failed(f"lookupd {url}", f"lookupd {url} query failed", error)
            else:
                if self._down.pop(f"lookupd {url}", None) is not None:
                    self.log.info("lookupd %s answers again", url)
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
        wait = self._next_interval()
        self.next_poll = now + wait
        if self.discovered:
            self.empty_polls = 0
            self._wait_logged = False
            return
        self.empty_polls += 1
        if self._round_ok and not self._wait_logged and not self.direct:
            self._wait_logged = True
            self.log.info(
                "no nsqd carries topic %s yet (nsqlookupd %s): waiting for it to appear, asking "
                "again in %.1f s, then less often (up to every %.0f s)",
                self.topic,
                ", ".join(self.lookupds),
                wait,
                self.poll_interval,
            )


def _reason(error: BaseException) -> str:
    """``error`` as the end of a log line."""
    return str(error) or type(error).__name__
