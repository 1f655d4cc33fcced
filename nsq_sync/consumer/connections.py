"""The consumer's connections: the connection table, its RDY credit, the reader callbacks and
the counters of ``stats()``. The RDY manager is only ever called under
:attr:`ConnectionSet.lock`, and the RDY commands it returns are written under the same lock, so
the wire order matches the manager's view.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from nsq_sync.backoff import make_backoff
from nsq_sync.config import Config
from nsq_sync.consumer.discovery import Discovery
from nsq_sync.consumer.stats import ConnectionStats, ConsumerStats
from nsq_sync.credit.manager import RDYManager
from nsq_sync.credit.state import Action
from nsq_sync.errors import AuthError, NSQConnectionError, ProtocolError, ServerError, TLSError
from nsq_sync.message import Message, Responder
from nsq_sync.metrics.observer import ConsumerObserver
from nsq_sync.protocol import commands
from nsq_sync.protocol.events import RawMessage
from nsq_sync.runtime import Runtime, Task
from nsq_sync.wire.connection import NsqdConnection

__all__ = ["COUNTERS", "ConnectionSet"]

#: the counters of ConsumerStats, in its order
COUNTERS = ("received", "finished", "requeued", "failed", "gave_up", "skipped", "dead_lettered")

#: error codes of a FIN/REQ nsqd rejected, and the counter that had counted it
_REJECTED = {"E_FIN_FAILED": "finished", "E_REQ_FAILED": "requeued"}


class ConnectionSet:
    """A consumer's live nsqd connections and their credit; ``rdy``: the RDY manager to keep.
    Thread-safe: every method takes :attr:`lock` (an RLock) where it touches shared state. The
    consumer sets :attr:`responder`, :attr:`deliver` and :attr:`discovery` before :meth:`start`."""

    def __init__(
        self,
        topic: str,
        channel: str,
        config: Config,
        runtime: Runtime,
        log: logging.Logger | logging.LoggerAdapter[Any],
        rdy: RDYManager | None = None,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.config = config
        self.runtime = runtime
        #: the RDY manager (the owner of credit and in-flight counts; used under :attr:`lock`)
        self.rdy = rdy if rdy is not None else credit_for(config)
        self.log = log
        #: guards the table, the RDY manager and the counters (the consumer's central lock)
        self.lock = runtime.rlock()
        self.conns: dict[str, NsqdConnection] = {}
        self.counts = dict.fromkeys(COUNTERS, 0)
        #: set by stop(): new messages are requeued at once, nothing reconnects
        self.stopping = False
        self.connected = runtime.event()  # set while some connection is subscribed
        self.responder: Responder | None = None
        self.deliver: Callable[[list[Message]], None] = _nowhere
        self.discovery: Discovery | None = None
        #: metrics and traces (nsq_sync.metrics); None while off: one check per event batch
        self.observer: ConsumerObserver | None = None
        self._connected_at: dict[NsqdConnection, float] = {}
        # connections that answered CLS with CLOSE_WAIT: nsqd sends them nothing more
        self._close_waited: set[NsqdConnection] = set()
        self._timer_wakeup = runtime.event()
        #: the deadline the RDY timer waits for (None: none, or not computed yet)
        self._timer_waits_until: float | None = None
        self._timer: Task | None = None

    # ------------------------------------------------------------------ queries

    def addresses(self) -> set[str]:
        with self.lock:
            return set(self.conns)

    def in_flight(self) -> int:
        """Messages delivered and not yet answered, over the live connections."""
        with self.lock:
            return self.rdy.total_in_flight()

    def max_in_flight(self) -> int:
        """The total credit now (0: paused)."""
        with self.lock:
            return self.rdy.max_in_flight

    def credit(self) -> tuple[int, int, int]:
        """(messages nsqds may still send, messages in flight, messages received so far)."""
        with self.lock:
            return self.rdy.credit_left(), self.in_flight(), self.counts["received"]

    def is_starved(self) -> bool:
        """True when some connection has >= 85 % of its RDY in flight."""
        with self.lock:
            return self.rdy.is_starved()

    def set_observer(self, observer: ConsumerObserver | None) -> None:
        """Report to ``observer`` from now on (None: to nothing), first what is up already."""
        with self.lock:
            self.observer = observer
            if observer is not None:
                for address, state in self.rdy.holdings():
                    if address in self.conns:
                        observer.connection(address, True)
                        observer.rdy(address, state.rdy)
                observer.backoff(self.rdy.backoff_level)

    def snapshot(self) -> ConsumerStats:
        """The consumer's stats, consistent (taken under one lock)."""
        with self.lock:
            rdy = self.rdy
            table = self.conns
            return ConsumerStats(
                connections=[
                    ConnectionStats(addr, st.rdy, st.in_flight, table[addr].messages_received)
                    for addr, st in rdy.holdings()
                    if addr in table
                ],
                max_in_flight=rdy.max_in_flight,
                total_rdy=rdy.total_rdy,
                in_flight=rdy.total_in_flight(),
                backoff_level=rdy.backoff_level,
                in_backoff=rdy.in_backoff,
                is_starved=rdy.is_starved(),
                **self.counts,
            )

    def skipped(self, message: Message, admitted: bool = False) -> None:
        """``message`` is dropped unanswered (its connection closed; nsqd redelivers it): counted,
        and out of a budgeted run's count (``admitted``: it took a place of the run)."""
        self.log.debug("skipping %r: its connection closed; nsqd will redeliver it", message)
        with self.lock:
            self.counts["skipped"] += 1
            if self.rdy.budgeted:
                conn = message.connection
                key = None if conn is None else self.key(conn)
                self.apply_and_wake(lambda: self.rdy.on_skip(key, admitted))

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``what`` (one of :data:`COUNTERS`)."""
        with self.lock:
            self.counts[what] += n
            observer = self.observer
            if observer is not None and n > 0:  # (a rejected FIN/REQ is not taken back there)
                observer.counted(what, n)

    def key(self, conn: NsqdConnection) -> str | None:
        """``conn``'s RDY key; None once it was replaced (caller holds :attr:`lock`)."""
        return conn.address if self.conns.get(conn.address) is conn else None

    # ------------------------------------------------------------------ answers

    def answered(self, conn: NsqdConnection, what: str, backoff: bool = True) -> None:
        """Count one answer of ``conn``'s message (``what``: "finished" or "requeued") and send its
        RDY updates (a replaced connection's counts for backoff only); a REQ is a backoff failure
        when ``backoff`` and not stopping. Call it before writing the FIN/REQ: RDY 0 goes first."""
        with self.lock:
            key = self.key(conn)
            rdy = self.rdy
            if what == "finished":
                self.apply_and_wake(lambda: rdy.on_finish(key))
            else:
                failure = backoff and not self.stopping
                self.apply_and_wake(lambda: rdy.on_requeue(key, backoff=failure))
            self.counts[what] += 1
            if self.observer is not None:
                self.observer.answered(what, conn.address, 1, rdy.in_flight(key))

    def finished_quietly(self, conn: NsqdConnection, n: int) -> bool:
        """Count ``n`` FINs of ``conn`` in one step and return True if that changes no RDY; False:
        nothing was counted, call :meth:`answered` for each."""
        with self.lock:
            key = self.key(conn)
            rdy = self.rdy
            if not rdy.finish_quietly(key, n):
                return False
            self.counts["finished"] += n
            if rdy.budgeted:  # its deadlines may have moved
                self._wake_timer_if_sooner()
            if self.observer is not None:
                self.observer.answered("finished", conn.address, n, rdy.in_flight(key))
            return True

    # ------------------------------------------------------------------ RDY

    def start(self, name: str) -> None:
        """Start the RDY timer task."""
        self._timer = self.runtime.spawn(self._timer_loop, name=f"nsq_sync-rdy-{name}")

    def apply(self, actions: list[Action]) -> None:
        """Send RDY updates in order (caller holds :attr:`lock`)."""
        observer = self.observer
        for address, count in actions:
            conn = self.conns.get(cast(str, address))
            if conn is not None:
                self.send(conn, commands.rdy(count))
                if observer is not None:
                    observer.rdy(conn.address, count)

    def apply_and_wake(self, event: Callable[[], list[Action]]) -> None:
        """Apply ``event()``'s RDY updates; wake the timer if its deadline moved (lock held)."""
        before = self.rdy.next_deadline()
        self.apply(event())
        if self.rdy.next_deadline() != before:
            self._timer_wakeup.set()
        if self.observer is not None:
            self.observer.backoff(self.rdy.backoff_level)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        with self.lock:
            self.apply(self.rdy.set_max_in_flight(max_in_flight))
        self._timer_wakeup.set()

    def set_budget(self, deliveries: int) -> None:
        """Deliver no more than ``deliveries`` messages from now on (RDYManager.set_budget)."""
        with self.lock:
            self.apply(self.rdy.set_budget(deliveries))
        self._timer_wakeup.set()

    def send(self, conn: NsqdConnection, data: bytes) -> bool:
        """Write ``data`` now; a failed write closes the connection (its reader reports it)."""
        try:
            conn.send(data)
            return True
        except NSQConnectionError as exc:
            self.log.debug("write to %s failed: %s", conn.address, exc)
            conn.close()
            return False

    def _wake_timer_if_sooner(self) -> None:
        """Wake the RDY timer if the manager's next deadline comes before the one it waits for
        (caller holds :attr:`lock`). A budgeted run's deadlines follow every delivery and FIN,
        mostly later: waking the timer for each of those cost a tenth of a batch run's CPU."""
        deadline = self.rdy.next_deadline()
        waits = self._timer_waits_until
        if deadline is not None and (waits is None or deadline < waits):
            self._timer_wakeup.set()

    def _timer_loop(self) -> None:
        """Drive the RDY manager's timers (backoff expiry, redistribution)."""
        while not self.stopping:
            with self.lock:
                deadline = self._timer_waits_until = self.rdy.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._timer_wakeup.wait(timeout)
            self._timer_wakeup.clear()
            if self.stopping:
                return
            with self.lock:
                self.apply(self.rdy.tick())
                if self.observer is not None:
                    self.observer.backoff(self.rdy.backoff_level)

    # ------------------------------------------------------------------ connecting

    def spawn_connect(self, address: str) -> None:
        """Dial ``address`` on a task of its own."""
        self.runtime.spawn(self._connect, address, name=f"nsq_sync-connect-{address}")

    def _connect(self, address: str) -> None:
        discovery = self.discovery
        assert discovery is not None
        conn = NsqdConnection(address, self.config, runtime=self.runtime, handler=self)
        try:
            conn.connect()
            conn.subscribe(self.topic, self.channel)
        except (NSQConnectionError, ServerError, ProtocolError) as exc:
            permanent = _is_configuration_error(exc)
            if permanent:
                self.log.error(
                    "cannot subscribe on nsqd %s: %s; this looks like a configuration error, "
                    "retrying in %.0f s",
                    address,
                    exc,
                    self.config.reconnect_backoff_max,
                )
            # (a transient failure is logged by discovery: once per outage at WARNING)
            discovery.connect_failed(address, permanent, exc)
            return
        except Exception as exc:
            self.log.exception("connecting to nsqd %s failed", address)
            discovery.connect_failed(address, error=exc)
            return
        with self.lock:
            # (discovery dials only what is neither connected nor connecting: a second
            # connection to one nsqd would be a bug, and its credit would be counted twice)
            duplicate = address in self.conns
            added = not (self.stopping or duplicate)
            if added:
                self.conns[address] = conn
                self._connected_at[conn] = time.monotonic()
                conn.start_reader()
                if self.observer is not None:
                    self.observer.connection(address, True)
                self.apply(self.rdy.add(address, conn.max_rdy_count))
                self.connected.set()
            else:
                conn.close()
        if duplicate:
            self.log.warning(
                "nsqd %s was dialled while connected; closed the new connection", address
            )
            discovery.connect_succeeded(address)
        if not added:
            return
        discovery.connect_succeeded(address)
        self._timer_wakeup.set()
        self.log.info("connected to nsqd %s (max_rdy_count %d)", address, conn.max_rdy_count)

    # ------------------------------------------------------------------ reader tasks

    def on_messages(self, conn: NsqdConnection, frames: list[RawMessage]) -> None:
        messages = Message.from_frames(frames, self.responder, conn.address, conn)
        n = len(messages)
        with self.lock:
            self.counts["received"] += n
            stale = self.stopping
            # counted in flight even while stopping: their REQ below counts them out
            key = self.key(conn)
            actions = self.rdy.on_messages(key, n)
            if actions and not stale:
                self.apply(actions)
            observer = self.observer
            if observer is not None:
                observer.received(conn.address, n, self.rdy.in_flight(key))
            # a budgeted run's deadlines follow messages; scarce credit's move when an nsqd
            # that had nothing sends (those found empty before may have filled up too)
            if self.rdy.take_woken():
                self._timer_wakeup.set()
            elif self.rdy.budgeted:
                self._wake_timer_if_sooner()
        if stale:
            for message in messages:
                message.requeue(0.0, backoff=False)
        else:
            self.deliver(messages)

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None:
        # A FIN/REQ nsqd rejected (the message had timed out, and nsqd requeued it itself) was
        # counted when it was sent: it did not happen.
        counter = _REJECTED.get(error.code)
        if counter is not None:
            self.count(counter, -1)
        if error.fatal:
            self.log.error("nsqd %s: %s; the connection will be replaced", conn.address, error)
        else:
            self.log.warning("nsqd %s: %s", conn.address, error)

    def on_response(self, conn: NsqdConnection, data: bytes) -> None:
        if data == b"CLOSE_WAIT":
            self.log.debug("nsqd %s acknowledged CLS", conn.address)
            with self.lock:
                self._close_waited.add(conn)
        else:
            self.log.debug("nsqd %s sent an unexpected response %r", conn.address, data[:100])

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None:
        in_flight = 0
        with self.lock:
            if self.conns.get(conn.address) is conn:
                del self.conns[conn.address]
                in_flight = self.rdy.in_flight(conn.address)
                self.apply(self.rdy.remove(conn.address))
                if self.observer is not None:
                    self.observer.connection(conn.address, False)
            since = self._connected_at.pop(conn, None)
            # useful: it delivered, or outlived a heartbeat; a connection that nsqd closes
            # right after SUB is not, and its reconnect backoff keeps growing
            useful = conn.messages_received > 0 or (
                since is not None and time.monotonic() - since >= self.config.heartbeat_interval
            )
            if not self.conns:
                self.connected.clear()
            if not self.stopping:
                self._close_waited.discard(conn)
        if in_flight:
            self.log.warning(
                "connection to %s closed with %d message(s) in flight; nsqd will redeliver them",
                conn.address,
                in_flight,
            )
        if not self.stopping and self.discovery is not None:
            self.discovery.connection_lost(conn.address, useful)
        self._timer_wakeup.set()

    # ------------------------------------------------------------------ stopping

    def abandon(self) -> None:
        """In a forked child (the fork hook; takes no lock): nothing may reconnect."""
        self.stopping = True
        if self.discovery is not None:
            self.discovery.abandon()

    def close_subscription(self, stopping: Callable[[], None]) -> list[NsqdConnection] | None:
        """Start the stop: ``stopping()``, RDY 0 everywhere and CLS on every connection, in one
        critical section (else stale requeues come straight back, and under gevent never yield).
        Returns the connections for :meth:`settled` (CLOSE_WAIT: every message nsqd wrote arrived),
        or None if a stop had begun."""
        with self.lock:
            if self.stopping:
                return None
            self.stopping = True
            stopping()
            self.apply(self.rdy.set_max_in_flight(0))
            conns = list(self.conns.values())
            for conn in conns:
                self.send(conn, commands.cls())
        self._timer_wakeup.set()
        return conns

    def settled(self, conns: list[NsqdConnection]) -> bool:
        """Nothing in flight, and every one of ``conns`` closed or said CLOSE_WAIT."""
        with self.lock:
            return self.in_flight() == 0 and all(
                conn.closed or conn in self._close_waited for conn in conns
            )

    def close_all(self, conns: list[NsqdConnection], deadline: float) -> None:
        """Close ``conns`` and every live connection; join their readers and the timer task."""
        with self.lock:
            conns = list(dict.fromkeys([*conns, *self.conns.values()]))
        for conn in conns:
            conn.close()
            conn.join(max(0.1, deadline - time.monotonic()))
        if self._timer is not None:
            self._timer.join(1.0)


def credit_for(config: Config) -> RDYManager:
    """The RDY manager of a consumer with ``config``."""
    backoff = None
    if config.max_backoff_duration > 0 and config.backoff_multiplier > 0:
        backoff = make_backoff(
            config.backoff_strategy, config.backoff_multiplier, config.max_backoff_duration
        )
    return RDYManager(
        config.max_in_flight,
        backoff=backoff,
        low_rdy_idle_timeout=config.low_rdy_idle_timeout,
        redistribute_interval=config.rdy_redistribute_interval,
        clock=time.monotonic,
        # nsqd may hold what it sent in its output buffer for output_buffer_timeout
        settle=1.0 + (config.output_buffer_timeout or 0.0),
        buffering=config.output_buffer_timeout or 0.0,
    )


def _nowhere(messages: list[Message]) -> None:
    raise RuntimeError("ConnectionSet.deliver was not set")


def _is_configuration_error(error: BaseException) -> bool:
    """Errors a reconnect would only repeat (TLS, AUTH, garbage, a non-retriable refusal)."""
    if isinstance(error, (TLSError, AuthError, ProtocolError)):
        return True
    return isinstance(error, ServerError) and not error.retriable
