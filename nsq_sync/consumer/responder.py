"""The consumer's responder: FIN, REQ and TOUCH, and their bookkeeping.

Every :class:`~nsq_sync.message.Message` a consumer hands out answers through its one
:class:`ConsumerResponder` (the :class:`~nsq_sync.message.Responder` protocol). The connection
set counts each answer and takes its step for the RDY manager
(:meth:`~nsq_sync.consumer.connections.ConnectionSet.answered`); the command then leaves:

* a worker's batch of FINs (:meth:`ConsumerResponder.finish_many`) is written by the worker
  itself, one system call per connection;
* any other answer (``message.finish()`` from a handler or another thread, a REQ, a TOUCH)
  joins its connection's write buffer, and the flusher task writes buffered connections in
  batches.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

from nsq_sync.config import Config
from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.flusher import Flusher
from nsq_sync.errors import NSQConnectionError
from nsq_sync.message import Message
from nsq_sync.protocol import commands
from nsq_sync.wire.connection import NsqdConnection

__all__ = ["ConsumerResponder"]

_conn_of = operator.attrgetter("connection")


class ConsumerResponder:
    """Answers a consumer's messages. Thread-safe (workers and application threads call it).

    Args:
        connections: the consumer's connections (they count answers and move credit).
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
        conn = message.connection
        if conn is not None:
            self.connections.answered(conn, "finished")
            self._write(conn, commands.fin(message.id), "finished", 1, now=False)

    def finish_many(self, messages: list[Message]) -> None:
        """FIN messages already claimed (a worker's batch of handled messages, a batch
        handler's messages), one write per connection.

        Outside backoff a FIN changes only counts, so a batch is counted in one step and its
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
                group = by_conn.get(message.connection)
                if group is None:
                    by_conn[message.connection] = [message]
                else:
                    group.append(message)
        for conn, group in by_conn.items():
            if conn is None:
                continue
            if not self.connections.finished_quietly(conn, len(group)):
                for message in group:
                    self.finish(message)
                continue
            # ids came from nsqd's own frames: always 16 bytes (commands.fin would check).
            # One join for the batch: a quarter of the cost of formatting each FIN.
            data = b"FIN " + b"\nFIN ".join([message.id for message in group]) + b"\n"
            self._write(conn, data, "finished", len(group), now=True)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn = message.connection
        if conn is None:
            return
        cfg = self.config
        if delay is None:
            delay = cfg.default_requeue_delay * message.attempts
        delay = min(delay, cfg.max_requeue_delay)
        self.connections.answered(conn, "requeued", backoff)
        self._write(conn, commands.req(message.id, delay), "requeued", 1, now=False)

    def touch(self, message: Message) -> None:
        conn = message.connection
        if conn is not None:
            self.connections.send(conn, commands.touch(message.id))

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
