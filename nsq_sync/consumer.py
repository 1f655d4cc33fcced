"""Consumer: wiring and lifecycle only.

    socket ──► reader task (one per nsqd) ──► dispatch queue ──► worker pool ──► handler(message)
    discovery task (lookupd polls with jitter) ──► connect / reconnect nsqds (lookupd only adds)
    RDY manager (one per consumer, pure policy) ◄── every message, FIN, REQ, timer tick

Lock order: ``_lock`` (RDY manager + connection table) is the only consumer lock; RDY commands
are written while holding it so the wire order matches the manager's view. User code (handler,
giving_up) never runs under it, nor on a reader task.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsq_sync import _fork
from nsq_sync._addresses import parse_address, parse_http_address
from nsq_sync.backoff import make_backoff
from nsq_sync.config import Config, address_list, to_seconds
from nsq_sync.connection import NsqdConnection
from nsq_sync.discovery import ConnectionManager
from nsq_sync.dispatch import GiveUpHandler, Handler, WorkerPool
from nsq_sync.errors import (
    AuthError,
    ConfigError,
    NSQConnectionError,
    ProtocolError,
    ServerError,
    Stopped,
    TLSError,
)
from nsq_sync.flusher import Flusher
from nsq_sync.message import Message
from nsq_sync.protocol import commands
from nsq_sync.protocol.events import MessageFrame
from nsq_sync.protocol.names import validate_channel, validate_topic
from nsq_sync.rdy import RDYManager
from nsq_sync.running import RunSummary, run_to_end
from nsq_sync.runtime import Runtime, patched_after, resolve_runtime

log = logging.getLogger(__name__)

__all__ = ["ConnectionStats", "Consumer", "ConsumerStats"]


@dataclass(frozen=True)
class ConnectionStats:
    address: str
    rdy: int
    in_flight: int
    messages_received: int


@dataclass(frozen=True)
class ConsumerStats:
    """A snapshot of a consumer's state (see :meth:`Consumer.stats`)."""

    connections: list[ConnectionStats] = field(default_factory=list)
    max_in_flight: int = 0
    total_rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0  # every REQ sent: after failures, by message.requeue(), at stop
    failed: int = 0  # handler calls that raised (RequeueMessage aside)
    gave_up: int = 0
    skipped: int = 0
    backoff_level: int = 0
    in_backoff: bool = False
    is_starved: bool = False


class Consumer:
    """Consumes ``topic``/``channel`` from nsqd(s), running ``handler(message)`` on a worker pool.

    ``handler`` returning finishes the message; raising requeues it (with backoff). See
    :mod:`nsq_sync.dispatch` for the exact rules, ``max_attempts`` and ``giving_up``.

    Args:
        topic, channel: what to subscribe to.
        handler: called with each :class:`~nsq_sync.message.Message` on a worker.
        nsqd_tcp_addresses: nsqds to connect to directly (``host:port``): a list, or one string
            (several separated by commas). Default: ``config.nsqd_tcp_addresses``.
        lookupd_http_addresses: nsqlookupds to discover nsqds from (a list, or one string,
            several separated by commas). Default: ``config.lookupd_http_addresses``. lookupd
            only adds nsqds: a connection closes when nsqd closes it, never because a lookupd
            stopped listing it (as go-nsq; a restarted lookupd lists nothing for a while).
        concurrency: number of worker tasks running the handler.
        giving_up: called with a message that used up ``max_attempts`` (default: log WARNING).
        config: a Config; keyword ``overrides`` (any Config option) apply on top.
        runtime: ``"auto"`` (gevent if gevent patched ``socket``; decided at :meth:`start`, so
            a consumer made before ``monkey.patch_all()`` runs on gevent when started after),
            ``"threads"`` or ``"gevent"``.

    Raises:
        InvalidName: a bad topic or channel name.
        ConfigError: no addresses, a malformed one, or an invalid option.

    Thread-safety: every public method may be called from any thread.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        *,
        nsqd_tcp_addresses: str | Sequence[str] = (),
        lookupd_http_addresses: str | Sequence[str] = (),
        concurrency: int = 1,
        giving_up: GiveUpHandler | None = None,
        config: Config | None = None,
        runtime: Any = "auto",
        **overrides: Any,
    ) -> None:
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        if not callable(handler):
            raise ConfigError(f"handler must be callable, got {handler!r}")
        if giving_up is not None and not callable(giving_up):
            raise ConfigError(f"giving_up must be callable, got {giving_up!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.config = (config or Config()).replace(**overrides)
        direct = list(address_list("nsqd_tcp_addresses", nsqd_tcp_addresses))
        lookupds = list(address_list("lookupd_http_addresses", lookupd_http_addresses))
        if not direct and not lookupds:
            direct = list(self.config.nsqd_tcp_addresses)
            lookupds = list(self.config.lookupd_http_addresses)
        if not direct and not lookupds:
            raise ConfigError("Consumer needs nsqd_tcp_addresses and/or lookupd_http_addresses")
        for address in direct:
            parse_address(address)
        lookupds = [parse_http_address(a)[0] for a in lookupds]
        # runtime="auto" is decided at start() (a consumer made before gevent patched the
        # process runs on gevent when started after); until then its parts use what auto picks
        # now, and are built again at start() if that changed (see _decide_runtime).
        self._auto_runtime = runtime is None or runtime == "auto"
        self.handler = handler
        self.log = logging.LoggerAdapter(
            logging.getLogger(f"nsq_sync.consumer.{self.topic}.{self.channel}"), {}
        )
        cfg = self.config
        backoff = None
        if cfg.max_backoff_duration > 0 and cfg.backoff_multiplier > 0:
            backoff = make_backoff(
                cfg.backoff_strategy, cfg.backoff_multiplier, cfg.max_backoff_duration
            )
        self._rdy = RDYManager(
            cfg.max_in_flight,
            backoff=backoff,
            low_rdy_idle_timeout=cfg.low_rdy_idle_timeout,
            redistribute_interval=cfg.rdy_redistribute_interval,
            clock=time.monotonic,
        )
        self._conns: dict[str, NsqdConnection] = {}
        self._connected_at: dict[NsqdConnection, float] = {}
        # connections that answered CLS with CLOSE_WAIT: nsqd sends them nothing more
        self._close_waited: set[NsqdConnection] = set()
        self._build(resolve_runtime(runtime), direct, lookupds, concurrency, giving_up)
        self._stop_clean = False
        self._fatal: BaseException | None = None  # SystemExit/KeyboardInterrupt from a handler
        self._started = False
        self._started_in: tuple[int, int] | None = None  # (fork generation, pid): see start()
        self._stopping = False
        self._rdy_task: Any = None
        self._counts = dict.fromkeys(
            ("received", "finished", "requeued", "failed", "gave_up", "skipped"), 0
        )

    def _build(
        self,
        runtime: Runtime,
        direct: list[str],
        lookupds: list[str],
        concurrency: int,
        giving_up: GiveUpHandler | None,
    ) -> None:
        """Create the parts that depend on the runtime: lock, events, worker pool, flusher,
        discovery (all idle until start())."""
        self._runtime = runtime
        cfg = self.config
        self._lock = runtime.rlock()
        self._flusher = Flusher(runtime, self.log)
        self._pool = WorkerPool(
            runtime,
            self.handler,
            concurrency=concurrency,
            max_attempts=cfg.max_attempts,
            giving_up=giving_up,
            log=self.log,
            # a message whose connection closed before it started: C-level, once per message
            is_stale=operator.attrgetter("_conn.closed"),
            on_skip=self._on_skip,
            on_gave_up=self._on_gave_up,
            on_fatal=self._on_fatal,
            finish_many=self._finish_many,
            on_pending=self._flusher.watch,
            on_failed=self._on_failed,
        )
        self._discovery = ConnectionManager(
            topic=self.topic,
            direct=direct,
            lookupds=lookupds,
            poll_interval=cfg.lookupd_poll_interval,
            poll_jitter=cfg.lookupd_poll_jitter,
            http_timeout=cfg.lookupd_http_timeout,
            reconnect_max=cfg.reconnect_backoff_max,
            runtime=runtime,
            connected=self._connected_addresses,
            connect=self._spawn_connect,
            log=self.log,
        )
        self._rdy_wakeup = runtime.event()
        self._connected = runtime.event()
        self._stopped_event = runtime.event()  # stop requested (wakes run())
        self._stop_done = runtime.event()  # fully stopped

    def _decide_runtime(self) -> bool:
        """With runtime="auto", decide the runtime in this process now (at start): when gevent
        patched the process since the consumer was made on threads, build its parts again on
        gevent (threading locks would block the whole gevent hub). True when rebuilt."""
        if not self._auto_runtime or self._started or self._stopping:
            return False
        if not patched_after(self._runtime):
            return False
        old_lock, pool, stop_requested = self._lock, self._pool, self._stopped_event.is_set()
        with old_lock:
            self._build(
                resolve_runtime("auto"),
                self._discovery.direct,
                self._discovery.lookupds,
                pool.concurrency,
                pool.giving_up,
            )
            self._pool.admit = pool.admit  # run()'s gate, installed before start
            if stop_requested:  # a signal run() caught before it started
                self._stopped_event.set()
        self.log.debug("runtime decided at start: %s", self._runtime.name)
        return True

    @property
    def runtime(self) -> Runtime:
        """The runtime in use (``.name`` is ``"threads"`` or ``"gevent"``). With
        ``runtime="auto"`` it is decided at :meth:`start`; before that this is what "auto"
        would pick now."""
        if self._auto_runtime and not self._started and patched_after(self._runtime):
            return resolve_runtime("auto")
        return self._runtime

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start workers, discovery and connections; returns at once.

        With ``max_in_flight=0`` the consumer starts paused (it connects but receives nothing
        until :meth:`set_max_in_flight`); a WARNING says so.

        Raises:
            Stopped: the consumer was stopped (consumers are not restartable), or it was
                started in another process before a fork (start a new one in each process).
        """
        self._check_process()
        if self._stopping:
            raise Stopped("consumer was stopped; create a new one")
        if self._started:
            return
        self._decide_runtime()
        self._started = True
        self._started_in = _fork.stamp()
        if self._rdy.max_in_flight == 0:
            self.log.warning(
                "max_in_flight is 0: the consumer is paused and receives nothing until "
                "set_max_in_flight() raises it"
            )
        _fork.track(self, Consumer._abandon_in_child)
        name = f"{self.topic}/{self.channel}"
        self._pool.start(name)
        self._flusher.start(name, self._pool)
        self._rdy_task = self.runtime.spawn(self._rdy_loop, name=f"nsq_sync-rdy-{name}")
        self._discovery.start(name)

    def run(
        self, timeout: Any = None, idle_timeout: Any = None, max_messages: int | None = None
    ) -> RunSummary:
        """Start, block until an end, then stop gracefully (see :mod:`nsq_sync.running`).

        The ends: :meth:`stop` (reason ``"stopped"``), SIGTERM/SIGINT (``"signal"``),
        ``timeout`` seconds (``"timeout"``), ``idle_timeout`` seconds without a message while
        credit was open (``"idle"``; backoff, reconnecting and pausing are not idle), or
        ``max_messages`` handler calls started (``"max_messages"``; later messages are requeued
        at once). Signal handlers are installed only when called from the main thread, and
        restored after.

        Args:
            timeout, idle_timeout: seconds (float or timedelta) > 0, or None.
            max_messages: an int >= 1, or None.

        Returns:
            A :class:`~nsq_sync.running.RunSummary` (``summary.ok`` is False when a handler
            failed or a message was given up).

        Returns once the consumer is fully stopped, also when a handler called :meth:`stop`.

        Raises:
            ConfigError: a bad argument (nothing started).
            Stopped: the consumer was stopped before.
            SystemExit, KeyboardInterrupt: a handler raised it; that message was requeued and
                the consumer stopped gracefully first (as ``sys.exit()`` in a view ends a web
                worker).
        """
        return run_to_end(
            self, timeout=timeout, idle_timeout=idle_timeout, max_messages=max_messages
        )

    def _check_process(self) -> None:
        # A started consumer's threads do not survive a fork, and its sockets are the
        # parent's: a clear error in the child instead of silent sharing.
        message = _fork.started_elsewhere(self._started_in)
        if message is not None:
            raise Stopped(message)

    def _abandon_in_child(self) -> None:
        # The fork hook, in a forked child (nsq_sync._fork; takes no lock): this copy is dead.
        # Its connections and tasks are abandoned by their own hooks; nothing may reconnect.
        self._stopping = True
        self._discovery._stopped = True

    def _set_admit(self, admit: Callable[[Message], bool] | None) -> None:
        """Install the run's gate on handler calls (see WorkerPool.admit)."""
        self._pool.admit = admit

    def _nothing_to_consume(self) -> bool:
        """No nsqd to connect to: no direct address, and lookupd answered that none carries the
        topic. For run(), waiting then is idle (nothing will arrive), unlike reconnecting."""
        d = self._discovery
        with self._lock:
            return not self._conns and not d.direct and d.answered and not d.discovered

    def _credit(self) -> tuple[int, int, int]:
        """(messages nsqds may still send, messages in flight, messages received so far): what
        run() judges idleness by and BatchConsumer closes batches by."""
        with self._lock:
            return self._rdy.credit_left(), self._total_in_flight(), self._counts["received"]

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully: RDY 0 everywhere, requeue what was received but not started, let
        running handlers (and async messages) finish until ``timeout``, CLS, close.

        Every call returns only once the consumer is fully stopped (True when everything in
        flight was answered in time), or when its own ``timeout`` passed first (False); later
        calls return at once. Called from a handler, stop() cannot wait for that handler: it
        starts the stop and returns False at once; the handler's message is finished (or
        requeued) as usual when it returns, then the stop completes on its own, and
        :meth:`run` returns.

        Raises:
            ConfigError: ``timeout`` is not a duration >= 0.
            Stopped: called in a forked child of the process that started the consumer (its
                connections are the parent's: nothing is sent on them from here).
        """
        self._check_process()
        deadline = time.monotonic() + to_seconds(timeout, "timeout")
        with self._lock:
            first = not self._stopping
            if first:
                self._stopping = True
                self._pool.stopping = True
                self._stopped_event.set()
                # RDY 0 at once, in the same critical section that makes every new message
                # stale: a reader requeueing stale messages to an nsqd that still has RDY gets
                # each one straight back, and under gevent that loop never yields to let the
                # RDY 0 out.
                self._apply(self._rdy.set_max_in_flight(0))
                conns = list(self._conns.values())
                # CLS right behind the RDY 0. nsqd answers CLOSE_WAIT behind every message it
                # had already written (one buffered writer; a response flushes it), so once a
                # connection said CLOSE_WAIT its in-flight count is complete: closing as soon
                # as the count read 0 lost messages still on the wire, and nsqd kept them in
                # flight until --msg-timeout. FIN/REQ/TOUCH still work in nsqd's closing state.
                for conn in conns:
                    self._send(conn, commands.cls())
        own_task = self._on_own_task()
        if first:
            if own_task:
                # a handler (or giving_up) called stop: the stop waits for this very handler,
                # so it runs on a task of its own
                self.runtime.spawn(
                    self._complete_stop, conns, deadline, name=f"nsq_sync-stop-{self.topic}"
                )
            else:
                self._complete_stop(conns, deadline)
        if own_task:
            return False
        self._stop_done.wait(max(0.0, deadline - time.monotonic()))
        return self._stop_done.is_set() and self._stop_clean

    def _on_own_task(self) -> bool:
        """True on one of this consumer's worker tasks (a handler is calling)."""
        is_current = self.runtime.is_current
        return any(is_current(task) for task in self._pool.tasks)

    def _complete_stop(self, conns: list[NsqdConnection], deadline: float) -> None:
        """The rest of :meth:`stop`, after RDY 0 and CLS went out: drain, close, join."""
        try:
            self._discovery.stop(max(0.1, deadline - time.monotonic()))
            self._rdy_wakeup.set()
            while True:
                for message in self._pool.drain():  # queued, or arrived after RDY 0
                    message.requeue(0.0, backoff=False)
                if self._total_in_flight() == 0 and self._all_close_waited(conns):
                    break
                if time.monotonic() >= deadline:
                    break
                self.runtime.sleep(0.01)
            clean = self._total_in_flight() == 0 and self._all_close_waited(conns)
            if not clean:
                self.log.warning(
                    "stop deadline passed with %d message(s) in flight; nsqd will redeliver them",
                    self._total_in_flight(),
                )
            self._pool.stop(max(0.1, deadline - time.monotonic()))
            self._flusher.stop()
            with self._lock:
                conns = list(set(conns) | set(self._conns.values()))
            for conn in conns:
                conn.close()
                conn.join(max(0.1, deadline - time.monotonic()))
            if self._rdy_task is not None:
                self._rdy_task.join(1.0)
            self._stop_clean = clean
        finally:
            self._stop_done.set()

    def _all_close_waited(self, conns: list[NsqdConnection]) -> bool:
        with self._lock:
            return all(conn.closed or conn in self._close_waited for conn in conns)

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries

    def is_starved(self) -> bool:
        """True when some connection has >= 85 % of its RDY in flight (flush batches now)."""
        with self._lock:
            return self._rdy.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change the total in-flight credit at run time; 0 pauses consumption.

        Raises:
            ConfigError: not an int >= 0.
        """
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 0
        ):
            raise ConfigError(f"max_in_flight must be an int >= 0, got {max_in_flight!r}")
        with self._lock:
            self._apply(self._rdy.set_max_in_flight(max_in_flight))
        self._rdy_wakeup.set()

    def stats(self) -> ConsumerStats:
        """A consistent snapshot of connections, RDY, in-flight and counters."""
        with self._lock:
            conns = [
                ConnectionStats(addr, st.rdy, st.in_flight, self._conns[addr].messages_received)
                for addr, st in self._rdy.conns.items()
                if addr in self._conns
            ]
            return ConsumerStats(
                connections=conns,
                max_in_flight=self._rdy.max_in_flight,
                total_rdy=self._rdy.total_rdy,
                in_flight=self._total_in_flight(),
                backoff_level=self._rdy.backoff_level,
                in_backoff=self._rdy.in_backoff,
                is_starved=self._rdy.is_starved(),
                **self._counts,
            )

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until at least one nsqd connection is subscribed (cron jobs and tests use
        this before counting on consumption). Thread-safe.

        Returns:
            True when connected, False when ``timeout`` seconds passed first.
        """
        return bool(self._connected.wait(timeout))

    @property
    def connections(self) -> list[str]:
        with self._lock:
            return sorted(self._conns)

    # ------------------------------------------------------------------ connections

    def _connected_addresses(self) -> set[str]:
        with self._lock:
            return set(self._conns)

    def _spawn_connect(self, address: str) -> None:
        self.runtime.spawn(self._connect, address, name=f"nsq_sync-connect-{address}")

    def _connect(self, address: str) -> None:
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
            else:
                self.log.warning("cannot connect to nsqd %s: %s", address, exc)
            self._discovery.connect_failed(address, permanent)
            return
        except Exception:
            self.log.exception("connecting to nsqd %s failed", address)
            self._discovery.connect_failed(address)
            return
        with self._lock:
            if self._stopping:
                conn.close()
                return
            self._conns[address] = conn
            self._connected_at[conn] = time.monotonic()
            conn.start_reader()
            self._apply(self._rdy.add(address, conn.max_rdy_count))
            self._connected.set()
        self._discovery.connect_succeeded(address)
        self._rdy_wakeup.set()
        self.log.info("connected to nsqd %s (max_rdy_count %d)", address, conn.max_rdy_count)

    def _apply(self, actions: list[tuple[Any, int]]) -> None:
        """Send RDY updates in order (caller holds ``_lock``)."""
        for address, count in actions:
            conn = self._conns.get(address)
            if conn is not None:
                self._send(conn, commands.rdy(count))

    def _send(self, conn: NsqdConnection, data: bytes) -> bool:
        try:
            conn.send(data)
            return True
        except NSQConnectionError as exc:
            self.log.debug("write to %s failed: %s", conn.address, exc)
            conn.close()
            return False

    def _apply_and_wake(self, event: Any) -> None:
        """Apply the RDY manager's answer to ``event()``; wake the RDY timer task when its next
        deadline moved (caller holds ``_lock``)."""
        before = self._rdy.next_deadline()
        self._apply(event())
        if self._rdy.next_deadline() != before:
            self._rdy_wakeup.set()

    def _total_in_flight(self) -> int:
        with self._lock:
            return sum(c.in_flight for c in self._conns.values())

    def _rdy_loop(self) -> None:
        """Drives the RDY manager's timers (backoff expiry, redistribution); sleeps otherwise."""
        while not self._stopping:
            with self._lock:
                deadline = self._rdy.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._rdy_wakeup.wait(timeout)
            self._rdy_wakeup.clear()
            if self._stopping:
                return
            with self._lock:
                self._apply(self._rdy.tick())

    # ------------------------------------------------------------------ ConnectionHandler (reader tasks)

    def on_messages(self, conn: NsqdConnection, frames: list[MessageFrame]) -> None:
        address = conn.address
        messages = [
            Message(msg_id, body, timestamp, attempts, self, address, conn)
            for msg_id, timestamp, attempts, body in frames
        ]
        n = len(messages)
        with self._lock:
            conn.in_flight += n
            conn.messages_received += n
            self._counts["received"] += n
            stale = self._stopping
            if not stale:
                actions = self._rdy.on_messages(address, n)
                if actions:
                    self._apply(actions)
        if stale:
            for message in messages:
                message.requeue(0.0, backoff=False)
        else:
            self._pool.submit_many(messages)

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None:
        # A FIN/REQ nsqd rejected (the message had timed out, and nsqd requeued it itself) was
        # counted when it was sent: it did not happen.
        counter = _REJECTED.get(error.code)
        if counter is not None:
            with self._lock:
                self._counts[counter] -= 1
        if error.fatal:
            self.log.error("nsqd %s: %s; the connection will be replaced", conn.address, error)
        else:
            self.log.warning("nsqd %s: %s", conn.address, error)

    def on_response(self, conn: NsqdConnection, data: bytes) -> None:
        if data == b"CLOSE_WAIT":
            self.log.debug("nsqd %s acknowledged CLS", conn.address)
            with self._lock:
                self._close_waited.add(conn)
        else:
            self.log.debug("nsqd %s sent an unexpected response %r", conn.address, data[:100])

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None:
        with self._lock:
            if self._conns.get(conn.address) is conn:
                del self._conns[conn.address]
                self._apply(self._rdy.remove(conn.address))
            since = self._connected_at.pop(conn, None)
            # useful: it delivered, or outlived a heartbeat; a connection that nsqd closes
            # right after SUB is not, and its reconnect backoff keeps growing
            useful = conn.messages_received > 0 or (
                since is not None and time.monotonic() - since >= self.config.heartbeat_interval
            )
            if not self._conns:
                self._connected.clear()
            if not self._stopping:
                self._close_waited.discard(conn)
        if conn.in_flight:
            self.log.warning(
                "connection to %s closed with %d message(s) in flight; nsqd will redeliver them",
                conn.address,
                conn.in_flight,
            )
        if not self._stopping:
            self._discovery.connection_lost(conn.address, useful)
        self._rdy_wakeup.set()

    # ------------------------------------------------------------------ Responder (workers, app threads)

    def _requeue_delay(self, message: Message) -> float:
        cfg = self.config
        return min(cfg.default_requeue_delay * message.attempts, cfg.max_requeue_delay)

    def finish(self, message: Message) -> None:
        conn: NsqdConnection = message._conn  # type: ignore[assignment]
        self._answer(
            conn, commands.fin(message.id), "finished", lambda key: self._rdy.on_finish(key)
        )

    def _finish_many(self, messages: list[Message]) -> None:
        """FIN messages a worker handled (already marked answered), one write per connection.

        Outside backoff a FIN changes only counts, so a batch is counted under one lock and its
        commands go out in one system call, written by the worker itself (no hand-off to the
        flusher). In backoff every FIN is a step for the RDY manager: one by one, as
        :meth:`finish`.
        """
        by_conn: dict[NsqdConnection, list[Message]] = {}
        for message in messages:
            conn: NsqdConnection = message._conn  # type: ignore[assignment]
            group = by_conn.get(conn)
            if group is None:
                by_conn[conn] = [message]
            else:
                group.append(message)
        for conn, group in by_conn.items():
            n = len(group)
            with self._lock:
                quiet = self._rdy.finish_quietly(self._key(conn), n)
                if quiet:
                    self._count_answered(conn, "finished", n)
            if not quiet:
                for message in group:
                    self.finish(message)
                continue
            # ids came from nsqd's own frames: always 16 bytes (commands.fin would check)
            data = b"".join([b"FIN %s\n" % message.id for message in group])
            self._write_answers(conn, data, "finished", n, now=True)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn: NsqdConnection = message._conn  # type: ignore[assignment]
        if delay is None:
            delay = self._requeue_delay(message)
        delay = min(delay, self.config.max_requeue_delay)
        counts = backoff and not self._stopping
        self._answer(
            conn,
            commands.req(message.id, delay),
            "requeued",
            lambda key: self._rdy.on_requeue(key, backoff=counts),
        )

    def touch(self, message: Message) -> None:
        conn: NsqdConnection = message._conn  # type: ignore[assignment]
        self._send(conn, commands.touch(message.id))

    def _answer(
        self, conn: NsqdConnection, data: bytes, what: str, rdy_event: Callable[[Any], Any]
    ) -> None:
        """FIN or REQ ``conn``'s message: bookkeeping and RDY under one lock, then the command.

        RDY changes go out before the FIN/REQ, as in go-nsq: a result that starts a backoff
        window sends RDY 0 first, or nsqd would deliver the next message in the gap between the
        FIN/REQ (which frees a slot) and the RDY 0. A message from a connection that was replaced
        since counts for backoff but not for the new connection.

        The command itself only joins the connection's write buffer; the flusher task writes
        buffered answers in batches (one system call for many messages under load).
        """
        with self._lock:
            key = self._key(conn)
            self._apply_and_wake(lambda: rdy_event(key))
            self._count_answered(conn, what, 1)
        self._write_answers(conn, data, what, 1, now=False)

    def _key(self, conn: NsqdConnection) -> str | None:
        """``conn``'s RDY key; None for a connection that was replaced since (caller holds
        ``_lock``)."""
        return conn.address if self._conns.get(conn.address) is conn else None

    def _count_answered(self, conn: NsqdConnection, what: str, n: int) -> None:
        """Count ``n`` answers (``what``: "finished" or "requeued") of ``conn``'s messages
        (caller holds ``_lock``)."""
        conn.in_flight = max(0, conn.in_flight - n)
        self._counts[what] += n

    def _write_answers(
        self, conn: NsqdConnection, data: bytes, what: str, n: int, now: bool
    ) -> None:
        """Send ``n`` answers' commands: ``now`` writes them from this task (a worker's batch),
        otherwise they join the write buffer for the flusher."""
        try:
            first = conn.send_deferred(data)  # True: the buffer was empty
            if now:
                conn.flush()
            elif first:
                self._flusher.schedule(conn)
        except NSQConnectionError:
            self.log.warning(
                "could not tell nsqd %s that %d message(s) were %s (connection lost); "
                "nsqd will redeliver them",
                conn.address,
                n,
                what,
            )

    # ------------------------------------------------------------------ WorkerPool hooks

    def _on_skip(self, message: Message) -> None:
        with self._lock:
            self._counts["skipped"] += 1
        self.log.debug("skipping %r: its connection closed; nsqd will redeliver it", message)

    def _on_failed(self, message: Message) -> None:
        with self._lock:
            self._counts["failed"] += 1

    def _on_gave_up(self, message: Message) -> None:
        with self._lock:
            self._counts["gave_up"] += 1

    def _on_fatal(self, error: BaseException) -> None:
        """A handler raised SystemExit/KeyboardInterrupt (its message is already requeued):
        stop gracefully; :meth:`run` re-raises it in the thread that called it."""
        with self._lock:
            if self._fatal is None:
                self._fatal = error
        self.log.error("handler raised %r; stopping the consumer", error)
        self.stop()


#: error codes of a FIN/REQ nsqd rejected, and the counter that had counted it
_REJECTED = {"E_FIN_FAILED": "finished", "E_REQ_FAILED": "requeued"}


def _is_configuration_error(error: BaseException) -> bool:
    """Errors a reconnect would only repeat: TLS/AUTH setup, garbage (an HTTP port), or nsqd
    rejecting IDENTIFY/SUB/AUTH for reasons other than a transient failure."""
    if isinstance(error, (TLSError, AuthError, ProtocolError)):
        return True
    return isinstance(error, ServerError) and not error.retriable
