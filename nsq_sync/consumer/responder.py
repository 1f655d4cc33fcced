"""The consumer's responder: FIN, REQ and TOUCH, and their bookkeeping.

Every :class:`~nsq_sync.message.Message` a consumer hands out answers through its one
:class:`ConsumerResponder` (the :class:`~nsq_sync.message.Responder` protocol). An answer is
counted, and its step for the RDY manager taken, under the connection set's lock; the command
then leaves without it:

* a worker's batch of FINs (:meth:`ConsumerResponder.finish_many`) is written by the worker
  itself, one system call per connection;
* any other answer (``message.finish()`` from a handler or another thread, a REQ, a TOUCH)
  joins its connection's write buffer, and the flusher task writes buffered connections in
  batches.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

from nsq_sync.config import Config
from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.flusher import Flusher
from nsq_sync.credit.state import Action
from nsq_sync.errors import NSQConnectionError
from nsq_sync.message import Message
from nsq_sync.protocol import commands
from nsq_sync.wire.connection import NsqdConnection

__all__ = ["ConsumerResponder"]

_conn_of = operator.attrgetter("_conn")


class ConsumerResponder:
    """Answers a consumer's messages. Thread-safe (workers and application threads call it).

    Args:
        connections: the consumer's connections (lock, RDY manager, counters).
        flusher: writes buffered answers.
        config: requeue delays.
        log: the consumer's logger.
    """

    def __init__(
        self,
        connections: ConnectionSet,
        flusher: Flusher,
        config: Config,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.connections = connections
        self.flusher = flusher
        self.config = config
        self.log = log

    def finish(self, message: Message) -> None:
        conn = message._conn
        if conn is None:
            return
        rdy = self.connections.rdy
        self._answer(conn, commands.fin(message.id), "finished", lambda key: rdy.on_finish(key))

    def finish_many(self, messages: list[Message]) -> None:
        """FIN messages already claimed (a worker's batch of handled messages, a batch
        handler's messages), one write per connection.

        Outside backoff a FIN changes only counts, so a batch is counted under one lock and its
        commands go out in one system call, written by the calling task itself (no hand-off to
        the flusher). In backoff every FIN is a step for the RDY manager: one by one, as
        :meth:`finish`.
        """
        by_conn: dict[NsqdConnection | None, list[Message]]
        origins = set(map(_conn_of, messages))
        if len(origins) == 1:  # the common case: all from one nsqd (no Python loop to group)
            by_conn = {origins.pop(): messages}
        else:
            by_conn = {}
            for message in messages:
                group = by_conn.get(message._conn)
                if group is None:
                    by_conn[message._conn] = [message]
                else:
                    group.append(message)
        connections = self.connections
        for conn, group in by_conn.items():
            if conn is None:
                continue
            n = len(group)
            with connections.lock:
                key = connections.key(conn)
                quiet = connections.rdy.finish_quietly(key, n)
                if quiet:
                    connections.counts["finished"] += n
                    if connections.rdy.budgeted:  # its deadlines may have moved
                        connections.wake_timer()
                    observer = connections.observer
                    if observer is not None:
                        observer.answered(
                            "finished", conn.address, n, connections.in_flight_of(key)
                        )
            if not quiet:
                for message in group:
                    self.finish(message)
                continue
            # ids came from nsqd's own frames: always 16 bytes (commands.fin would check).
            # One join for the batch: a quarter of the cost of formatting each FIN.
            data = b"FIN " + b"\nFIN ".join([message.id for message in group]) + b"\n"
            self._write(conn, data, "finished", n, now=True)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn = message._conn
        if conn is None:
            return
        cfg = self.config
        if delay is None:
            delay = cfg.default_requeue_delay * message.attempts
        delay = min(delay, cfg.max_requeue_delay)
        counts = backoff and not self.connections.stopping
        rdy = self.connections.rdy
        self._answer(
            conn,
            commands.req(message.id, delay),
            "requeued",
            lambda key: rdy.on_requeue(key, backoff=counts),
        )

    def touch(self, message: Message) -> None:
        conn = message._conn
        if conn is not None:
            self.connections.send(conn, commands.touch(message.id))

    def _answer(
        self,
        conn: NsqdConnection,
        data: bytes,
        what: str,
        rdy_event: Callable[[str | None], list[Action]],
    ) -> None:
        """FIN or REQ ``conn``'s message: bookkeeping and RDY under one lock, then the command.

        RDY changes go out before the FIN/REQ, as in go-nsq: a result that starts a backoff
        window sends RDY 0 first, or nsqd would deliver the next message in the gap between the
        FIN/REQ (which frees a slot) and the RDY 0. A message from a connection that was replaced
        since counts for backoff but not for the new connection.
        """
        connections = self.connections
        with connections.lock:
            key = connections.key(conn)
            connections.apply_and_wake(lambda: rdy_event(key))
            connections.counts[what] += 1
            observer = connections.observer
            if observer is not None:
                observer.answered(what, conn.address, 1, connections.in_flight_of(key))
        self._write(conn, data, what, 1, now=False)

    def _write(self, conn: NsqdConnection, data: bytes, what: str, n: int, now: bool) -> None:
        """Send ``n`` answers' commands: ``now`` writes them from this task (a worker's batch),
        otherwise they join the connection's write buffer for the flusher."""
        try:
            first = conn.buffer(data)  # True: the buffer was empty
            if now:
                conn.flush()
            elif first:
                self.flusher.schedule(conn)
        except NSQConnectionError:
            self.log.warning(
                "could not tell nsqd %s that %d message(s) were %s (connection lost); "
                "nsqd will redeliver them",
                conn.address,
                n,
                what,
            )
