"""The consumer's responder: FIN, REQ and TOUCH. A FIN or REQ is counted (and its RDY step taken)
before it is written: a batch of FINs by the calling task, one write per connection; any other
through its connection's write buffer, by the flusher. A TOUCH is written at once.
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
    """Answers a consumer's messages. Thread-safe (workers and application threads call it)."""

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
        """FIN claimed messages from the calling task, one write per connection. A batch is counted
        in one step unless that changes RDY (backoff, scarce credit, a run's budget): then one by
        one, as :meth:`finish`."""
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

    def delay_for(self, message: Message, delay: float | None = None) -> float:
        """The seconds a REQ of ``message`` defers it: ``delay``, or (None)
        ``default_requeue_delay * attempts``; at most ``max_requeue_delay``."""
        cfg = self.config
        if delay is None:
            delay = cfg.default_requeue_delay * message.attempts
        return min(delay, cfg.max_requeue_delay)

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn = message.connection
        if conn is None:
            return
        delay = self.delay_for(message, delay)
        self.connections.answered(conn, "requeued", backoff)
        self._write(conn, commands.req(message.id, delay), "requeued", 1, now=False)

    def touch(self, message: Message) -> None:
        conn = message.connection
        if conn is not None:
            self.connections.send(conn, commands.touch(message.id))

    def _write(self, conn: NsqdConnection, data: bytes, what: str, n: int, now: bool) -> None:
        """Send ``n`` answers' commands: from this task when ``now``, else via the flusher."""
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
