"""Consumer: wiring and lifecycle; its parts do the work. The connection set's lock is the
consumer's central lock (ARCHITECTURE.md); user code (handler, giving_up) never runs under it,
nor on a reader task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from nsq_sync import process
from nsq_sync.addresses import parse_address, parse_http_address
from nsq_sync.config import Config, address_list, positive_int
from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.dead_letters import DeadLetterer, check_topic
from nsq_sync.consumer.discovery import Discovery
from nsq_sync.consumer.flusher import Flusher
from nsq_sync.consumer.lifecycle import Lifecycle
from nsq_sync.consumer.parts import ConsumerParts, PartsUser
from nsq_sync.consumer.responder import ConsumerResponder
from nsq_sync.consumer.running import RunSummary, run_to_end
from nsq_sync.consumer.stats import ConnectionStats, ConsumerStats
from nsq_sync.consumer.workers import GiveUpHandler, Handler, WorkerPool
from nsq_sync.credit.manager import RDYManager
from nsq_sync.durations import to_seconds
from nsq_sync.errors import ConfigError, Stopped
from nsq_sync.metrics import observer
from nsq_sync.metrics.observer import ConsumerObserver
from nsq_sync.protocol.names import validate_channel, validate_topic
from nsq_sync.runtime import Runtime, patched_after, resolve_runtime
from nsq_sync.wire.connection import NsqdConnection

log = logging.getLogger(__name__)

__all__ = ["ConnectionStats", "Consumer", "ConsumerStats"]


def check_argument_order(
    kind: str, name: str, topic: Any, channel: Any, handler: Callable[..., Any] | None
) -> Callable[..., Any]:
    """``handler`` once the arguments are in the order ``kind(topic, channel, handler, ...)``.

    Raises:
        ConfigError: the channel was forgotten (a callable where the channel goes) or the
            handler is missing; the message gives the order.
    """
    order = f"{kind}(topic, channel, {name}, ...)"
    if callable(channel):
        raise ConfigError(
            f"{kind} got the callable {channel!r} as its channel: the channel is missing. The "
            f"arguments are {order}, e.g. {kind}({topic!r}, 'my-channel', "
            f"{getattr(channel, '__name__', name)}, ...)"
        )
    if handler is None:
        raise ConfigError(f"{kind} needs a {name}: the arguments are {order}")
    return handler


class Consumer:
    """Consumes ``topic``/``channel`` from nsqd(s), running ``handler(message)`` on a worker pool.

    ``handler`` returning finishes the message; raising requeues it (with backoff): the rules,
    ``max_attempts`` and ``giving_up`` are in :mod:`nsq_sync.consumer.workers`. Every public
    method may be called from any thread.

    Args:
        nsqd_tcp_addresses: nsqds to connect to directly (``host:port``): a list, or one
            comma-separated string. Default (both address arguments empty): the config's.
        lookupd_http_addresses: nsqlookupds to discover nsqds from (same forms, same default).
            lookupd only adds nsqds: a connection closes when nsqd closes it.
        concurrency: number of worker tasks running the handler.
        giving_up: called with a message that used up ``max_attempts`` (default: log WARNING).
        dead_letter_topic: publish given-up messages there before finishing them (see
            :mod:`nsq_sync.dead_letter`).
        config: a Config; keyword ``overrides`` (any Config option) apply on top.
        runtime: ``"threads"``, ``"gevent"`` or ``"auto"`` (gevent if gevent patched ``socket``,
            decided at :meth:`start`).

    Raises:
        InvalidName: a bad topic, channel or dead-letter topic name.
        ConfigError: no addresses, a malformed one, an invalid option or argument (a handler that
            is not callable, ``dead_letter_topic`` equal to ``topic``).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,  # required: None only to name a forgotten channel
        *,
        nsqd_tcp_addresses: str | Sequence[str] = (),
        lookupd_http_addresses: str | Sequence[str] = (),
        concurrency: int = 1,
        giving_up: GiveUpHandler | None = None,
        config: Config | None = None,
        runtime: Any = "auto",
        dead_letter_topic: str | None = None,
        **overrides: Any,
    ) -> None:
        handler = check_argument_order("Consumer", "handler", topic, channel, handler)
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        self.dead_letter_topic = check_topic(dead_letter_topic, self.topic)
        if not callable(handler):
            raise ConfigError(f"handler must be callable, got {handler!r}")
        if giving_up is not None and not callable(giving_up):
            raise ConfigError(f"giving_up must be callable, got {giving_up!r}")
        positive_int("concurrency", concurrency)
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
        self._handler = handler
        self.log = logging.LoggerAdapter(
            logging.getLogger(f"nsq_sync.consumer.{self.topic}.{self.channel}"), {}
        )
        self._lifecycle = Lifecycle()
        self._metrics: _Metrics | None = None
        self._build(resolve_runtime(runtime), direct, lookupds, concurrency, giving_up)
        self._stop_clean = False
        self._started = False

    def _build(
        self,
        runtime: Runtime,
        direct: list[str],
        lookupds: list[str],
        concurrency: int,
        giving_up: GiveUpHandler | None,
        credit: RDYManager | None = None,
    ) -> None:
        """Build the parts for ``runtime``, idle until start(); ``credit``: the manager to keep."""
        self._runtime = runtime
        cfg = self.config
        log = self.log
        connections = ConnectionSet(self.topic, self.channel, cfg, runtime, log, credit)
        dead_letters = None
        if self.dead_letter_topic is not None:
            dead_letters = DeadLetterer(
                self.dead_letter_topic,
                self.topic,
                self.channel,
                cfg,
                runtime,
                log,
                on_dead_lettered=lambda message: connections.count("dead_lettered"),
            )
        flusher = Flusher(runtime, log)
        responder = ConsumerResponder(connections, flusher, cfg, log)
        pool = WorkerPool(
            runtime,
            self._handler,
            concurrency=concurrency,
            max_attempts=cfg.max_attempts,
            giving_up=giving_up,
            log=log,
            on_skip=connections.skipped,
            on_gave_up=lambda message: connections.count("gave_up"),
            on_fatal=self._on_fatal,
            finish_many=responder.finish_many,
            backstop=flusher,
            on_failed=lambda message: connections.count("failed"),
            dead_letter=dead_letters,
            requeue_delay=responder.delay_for,
        )
        discovery = Discovery(
            topic=self.topic,
            direct=direct,
            lookupds=lookupds,
            poll_interval=cfg.lookupd_poll_interval,
            poll_jitter=cfg.lookupd_poll_jitter,
            http_timeout=cfg.lookupd_http_timeout,
            reconnect_max=cfg.reconnect_backoff_max,
            runtime=runtime,
            connected=connections.addresses,
            connect=connections.spawn_connect,
            log=log,
        )
        connections.responder = responder
        connections.deliver = pool.submit_many
        connections.discovery = discovery
        self._connections, self._flusher, self._pool = connections, flusher, pool
        self._discovery = discovery
        self._stop_done = runtime.event()  # fully stopped
        self._lifecycle.attach(runtime, connections, pool, discovery)
        if isinstance(self._handler, PartsUser):
            self._handler.attach(
                ConsumerParts(runtime, log, connections, responder, pool, self._lifecycle)
            )

    def _decide_runtime(self) -> bool:
        """With runtime="auto", at start: rebuild the parts on gevent if gevent patched the process
        since (threading locks would block the hub). True when rebuilt."""
        if not self._auto_runtime or self._started or self._connections.stopping:
            return False
        if not patched_after(self._runtime):
            return False
        pool, connections = self._pool, self._connections
        with connections.lock:
            self._build(
                resolve_runtime("auto"),
                self._discovery.direct,
                self._discovery.lookupds,
                pool.concurrency,
                pool.giving_up,
                connections.rdy,
            )
        self.log.debug("runtime decided at start: %s", self._runtime.name)
        return True

    @property
    def runtime(self) -> Runtime:
        """The runtime in use (``.name`` is ``"threads"`` or ``"gevent"``); with ``runtime="auto"``
        decided at :meth:`start` (before that: what "auto" would pick now)."""
        if self._auto_runtime and not self._started and patched_after(self._runtime):
            return resolve_runtime("auto")
        return self._runtime

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start workers, discovery and connections; returns at once. With ``max_in_flight=0`` it
        starts paused (a WARNING says so) until :meth:`set_max_in_flight`.

        Raises:
            Stopped: the consumer was stopped (consumers are not restartable), or it was started
                in another process before a fork (start a new one in each process).
        """
        self._lifecycle.check_process()
        if self._connections.stopping:
            raise Stopped("consumer was stopped; create a new one")
        if self._started:
            return
        self._decide_runtime()
        self._started = True
        self._lifecycle.started()
        if self._connections.max_in_flight() == 0:
            self.log.warning(
                "max_in_flight is 0: the consumer is paused and receives nothing until "
                "set_max_in_flight() raises it"
            )
        # in a forked child this copy is dead: nothing it holds may reconnect there
        process.track(self._connections, ConnectionSet.abandon)
        name = f"{self.topic}/{self.channel}"
        self._pool.start(name)
        self._flusher.start(name, self._pool)
        self._connections.start(name)
        self._discovery.start(name)
        # metrics (nsq_sync.metrics), when enabled, now or later
        self._metrics = _Metrics(
            self.topic, self.channel, self._handler, self._connections, self._pool
        )
        observer.track(self._metrics)

    def run(
        self, timeout: Any = None, idle_timeout: Any = None, max_messages: int | None = None
    ) -> RunSummary:
        """Start, block until an end, stop gracefully, and return what the run did. The ends
        (``summary.reason``):

        * ``"stopped"``: :meth:`stop` was called (from another thread, or a handler);
        * ``"signal"``: SIGTERM or SIGINT (handlers are installed only when run() is called
          from the main thread, and restored after);
        * ``"timeout"``: ``timeout`` seconds passed since the run started;
        * ``"idle"``: ``idle_timeout`` seconds without a message while credit was open, or while
          lookupd listed no nsqd for the topic. Backoff, a pause and every allowed message in
          flight are not idle;
        * ``"unreachable"``: ``idle_timeout`` came while no nsqd was connected (none could be
          reached, or the last one was lost mid-run): time without a connected nsqd counts as
          idle. ``summary.ok`` is then False, and a WARNING named the servers at their first
          failure;
        * ``"max_messages"``: ``max_messages`` messages handled (handler calls started, and
          messages given up without one). The consumer pauses at once, and the credit nsqds hold
          never exceeds the deliveries left (docs/cron.md says why).

        Args:
            timeout, idle_timeout: seconds (float or timedelta) > 0, or None.
            max_messages: an int >= 1, or None.

        Raises:
            ConfigError: a bad argument (nothing started).
            Stopped: the consumer was stopped before, or it was started in another process
                before a fork.
            SystemExit, KeyboardInterrupt: a handler raised it; that message was requeued and
                the consumer stopped gracefully first.
        """
        return run_to_end(
            self,
            self._lifecycle,
            timeout=timeout,
            idle_timeout=idle_timeout,
            max_messages=max_messages,
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully: RDY 0 everywhere, requeue what was received but not started, let
        running handlers (and async messages) finish until ``timeout``, CLS, close.

        Every call returns once the consumer is fully stopped (True when everything in flight was
        answered in time), or when its own ``timeout`` passed first (False). Called from a handler,
        it starts the stop and returns False at once; the stop completes once that handler returns.

        Raises:
            ConfigError: ``timeout`` is not a duration >= 0.
            Stopped: called in a forked child of the process that started the consumer.
        """
        self._lifecycle.check_process()
        deadline = time.monotonic() + to_seconds(timeout, "timeout")
        conns = self._connections.close_subscription(self._on_stopping)  # None: stop had begun
        own_task = self._on_own_task()
        if conns is not None:
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

    def _on_stopping(self) -> None:
        """In stop()'s first critical section: requeue what has not started; wake run()."""
        self._pool.stopping = True
        self._lifecycle.end_run()

    def _on_own_task(self) -> bool:
        """True on one of this consumer's worker tasks (a handler is calling)."""
        is_current = self.runtime.is_current
        return any(is_current(task) for task in self._pool.tasks)

    def _complete_stop(self, conns: list[NsqdConnection], deadline: float) -> None:
        """The rest of :meth:`stop`, after RDY 0 and CLS went out: drain, close, join."""
        try:
            self._discovery.stop(max(0.1, deadline - time.monotonic()))
            connections = self._connections
            while True:
                for message in self._pool.drain():  # queued, or arrived after RDY 0
                    message.requeue(0.0, backoff=False)
                if connections.settled(conns) or time.monotonic() >= deadline:
                    break
                self.runtime.sleep(0.01)
            clean = connections.settled(conns)
            if not clean:
                self.log.warning(
                    "stop deadline passed with %d message(s) in flight; nsqd will redeliver them",
                    connections.in_flight(),
                )
            self._pool.stop(max(0.1, deadline - time.monotonic()))
            self._flusher.stop()
            connections.close_all(conns, deadline)
            self._stop_clean = clean
        finally:
            self._stop_done.set()

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries

    def is_starved(self) -> bool:
        """True when some connection has >= 85 % of its RDY in flight (flush batches now)."""
        return self._connections.is_starved()

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
        self._connections.set_max_in_flight(max_in_flight)

    def stats(self) -> ConsumerStats:
        """A consistent snapshot of connections, RDY, in-flight and counters."""
        return self._connections.snapshot()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until at least one nsqd connection is subscribed; False when ``timeout`` seconds
        passed first."""
        return bool(self._connections.connected.wait(timeout))

    # ------------------------------------------------------------------ WorkerPool hooks

    def _on_fatal(self, error: BaseException) -> None:
        """A handler raised SystemExit/KeyboardInterrupt (message requeued): stop gracefully."""
        self._lifecycle.set_fatal(error)
        self.log.error("handler raised %r; stopping the consumer", error)
        self.stop()


class _Metrics:
    """A started consumer as nsq_sync.metrics tracks it (:class:`observer.Observed`)."""

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        connections: ConnectionSet,
        pool: WorkerPool,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.connections = connections
        self.pool = pool

    def observe(self, observer: ConsumerObserver | None) -> None:
        """Report to ``observer`` from now on (None: to nothing). Thread-safe."""
        handler = self.handler
        if isinstance(handler, PartsUser):
            handler.observe(observer)
        elif observer is None:
            self.pool.handler = handler
        else:
            self.pool.handler = observer.wrap_handler(handler, False)
        self.connections.set_observer(observer)
