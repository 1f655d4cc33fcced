"""The consumer's ConnectionSet and ConsumerResponder without sockets: in-memory connections that
record every byte written, a real RDY manager with a fake clock, the threads runtime's locks.

What is checked is what reaches nsqd (the bytes, and their order) and what ``stats()`` says: the
RDY manager is the one owner of in-flight counts, a worker's batch of FINs is one write per
connection, RDY 0 goes out before the REQ that starts a backoff window, and a FIN nsqd rejects is
not counted.
"""

from __future__ import annotations

import logging

from nsq_sync.backoff import ExponentialBackoff
from nsq_sync.config import Config
from nsq_sync.consumer.connections import ConnectionSet
from nsq_sync.consumer.flusher import Flusher
from nsq_sync.consumer.responder import ConsumerResponder
from nsq_sync.credit.manager import RDYManager
from nsq_sync.errors import ServerError, error_from_frame
from nsq_sync.message import Message
from nsq_sync.protocol.events import MessageFrame
from nsq_sync.runtime import resolve_runtime

LOG = logging.getLogger("test.responder")


class FakeConn:
    """What the consumer's parts use of an NsqdConnection; ``wire`` is every write, in order."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.wire: list[bytes] = []
        self._buffer: list[bytes] = []
        self.closed = False
        self.messages_received = 0

    def send(self, data: bytes) -> None:
        self.flush()
        self.wire.append(data)

    def buffer(self, data: bytes) -> bool:
        self._buffer.append(data)
        return len(self._buffer) == 1

    def flush(self) -> None:
        if self._buffer:
            self.wire.append(b"".join(self._buffer))
            self._buffer.clear()

    def close(self) -> None:
        self.closed = True


class Setup:
    def __init__(self, max_in_flight: int = 10, backoff: bool = False) -> None:
        self.clock = 1000.0
        runtime = resolve_runtime("threads")
        self.rdy = RDYManager(
            max_in_flight,
            backoff=ExponentialBackoff(1.0, 60.0) if backoff else None,
            clock=lambda: self.clock,
        )
        self.conns = ConnectionSet("t", "c", Config(), runtime, LOG, self.rdy)
        self.flusher = Flusher(runtime, LOG)  # not started: flushed by hand (stop)
        self.responder = ConsumerResponder(self.conns, self.flusher, Config(), LOG)
        self.delivered: list[Message] = []
        self.conns.responder = self.responder
        self.conns.deliver = self.delivered.extend

    def connect(self, address: str) -> FakeConn:
        conn = FakeConn(address)
        with self.conns.lock:
            self.conns.conns[address] = conn  # type: ignore[assignment]
            self.conns.apply(self.rdy.add(address, 2500))
        return conn

    def receive(self, conn: FakeConn, n: int, first: int = 0) -> list[Message]:
        frames = [MessageFrame(b"%016d" % (first + i), 0, 1, b"body") for i in range(n)]
        before = len(self.delivered)
        self.conns.on_messages(conn, frames)  # type: ignore[arg-type]
        return self.delivered[before:]


def test_a_workers_batch_of_fins_is_one_write_per_connection_and_counted_once() -> None:
    s = Setup()
    a, b = s.connect("a:4150"), s.connect("b:4150")
    messages = s.receive(a, 3) + s.receive(b, 2, first=10)
    assert s.conns.snapshot().in_flight == 5
    wire_a, wire_b = len(a.wire), len(b.wire)
    assert all(m.claim(None) for m in messages)  # as a worker claims them
    s.responder.finish_many(messages)
    assert a.wire[wire_a:] == [b"".join(b"FIN %s\n" % m.id for m in messages[:3])]
    assert b.wire[wire_b:] == [b"".join(b"FIN %s\n" % m.id for m in messages[3:])]
    stats = s.conns.snapshot()
    assert (stats.finished, stats.in_flight) == (5, 0)
    assert [c.in_flight for c in stats.connections] == [0, 0]


def test_an_answer_from_another_thread_is_counted_at_once_and_written_by_the_flusher() -> None:
    s = Setup()
    a = s.connect("a:4150")
    [message] = s.receive(a, 1)
    written = len(a.wire)
    message.finish()
    assert s.conns.snapshot().finished == 1 and s.conns.snapshot().in_flight == 0
    assert len(a.wire) == written  # buffered for the flusher, not written by this thread
    s.flusher.schedule(a)  # (what the responder did; the flusher task is not running here)
    s.flusher.stop()
    assert a.wire[written:] == [b"FIN %s\n" % message.id]


def test_rdy_0_reaches_nsqd_before_the_req_that_starts_a_backoff_window() -> None:
    s = Setup(backoff=True)
    a = s.connect("a:4150")
    [message] = s.receive(a, 1)
    assert a.wire == [b"RDY 1\n", b"RDY 10\n"]  # bootstrap, then its share
    message.requeue()
    s.flusher.schedule(a)
    s.flusher.stop()
    assert a.wire[2:] == [b"RDY 0\n", b"REQ %s 90000\n" % message.id]
    stats = s.conns.snapshot()
    assert (stats.requeued, stats.in_flight, stats.backoff_level) == (1, 0, 1)


def test_messages_arriving_while_stopping_are_requeued_at_once_and_counts_stay_right() -> None:
    s = Setup()
    a = s.connect("a:4150")
    [running] = s.receive(a, 1)  # a handler is running on this one
    assert s.conns.close_subscription(lambda: None) == [a]
    assert a.wire[-2:] == [b"RDY 0\n", b"CLS\n"]
    late = s.receive(a, 2, first=5)  # sent by nsqd before it saw the RDY 0
    assert late == []  # not handed to the workers
    s.flusher.stop()
    assert a.wire[-1] == b"".join(b"REQ %016d 0\n" % i for i in (5, 6))
    # the running handler's message is still in flight: the stop must wait for it
    assert s.conns.snapshot().in_flight == 1
    assert not s.conns.settled([a])
    running.finish()
    s.conns.on_response(a, b"CLOSE_WAIT")  # type: ignore[arg-type]
    assert s.conns.settled([a])


def test_a_fin_nsqd_rejected_is_not_counted() -> None:
    s = Setup()
    a = s.connect("a:4150")
    [message] = s.receive(a, 1)
    message.finish()
    error = error_from_frame(b"E_FIN_FAILED FIN failed")
    assert isinstance(error, ServerError)
    s.conns.on_error(a, error)  # type: ignore[arg-type]
    assert s.conns.snapshot().finished == 0


def test_an_answer_for_a_replaced_connection_leaves_the_new_one_alone() -> None:
    s = Setup()
    old = s.connect("a:4150")
    [message] = s.receive(old, 1)
    s.conns.on_close(old, None)  # type: ignore[arg-type]
    new = s.connect("a:4150")
    s.receive(new, 1, first=1)
    message.finish()  # the old connection's message (nsqd redelivers it anyway)
    stats = s.conns.snapshot()
    assert stats.finished == 1
    assert [c.in_flight for c in stats.connections] == [1]  # the new one's message only
