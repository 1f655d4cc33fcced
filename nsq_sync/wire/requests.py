"""Requests matched to answers on one nsqd connection. nsqd answers commands in order, so
:meth:`~RequestsMixin.request` keeps a FIFO of waiters: answer *n* belongs to request *n*.

* With a reader task (a consumer connection), the reader hands answers to the oldest waiter
  (or to the connection's handler when nobody waits).
* Without one (the producer), whoever calls :meth:`~RequestsMixin.request` while nobody reads
  takes the *reading role*, reads answers for every waiting request in order, and hands the
  role on once its own answer arrived.

Non-fatal errors (E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) answer fire-and-forget commands
and are never matched to a waiter. A mixin of the connection, not an object it owns: a
delegating call would add a Python call to every publish.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable

from nsq_sync.errors import (
    ConnectionClosed,
    NSQConnectionError,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
)
from nsq_sync.protocol import commands
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder
from nsq_sync.protocol.events import ErrorFrame, Event, Heartbeat, Response
from nsq_sync.runtime import Runtime, Task
from nsq_sync.wire.handshake import server_error
from nsq_sync.wire.transport import Transport

# nsqd's answer to a publish, as a whole frame: size 6, frame type 0 (response), "OK"
_OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00" + OK


class NotSent(ConnectionClosed):
    """The command certainly did not take effect (safe to send elsewhere): the connection was
    closed before it was written, or nsqd closed it after a fatal error to an earlier command."""


class _Waiter:
    """One request waiting for its answer. ``event`` exists only when another task reads its
    answer; ``reader`` is set when it is handed the reading role."""

    __slots__ = ("event", "result", "error", "done", "reader", "abandoned")

    def __init__(self) -> None:
        self.event: Any = None
        self.result: bytes = b""
        self.error: BaseException | None = None
        self.done = False
        self.reader = False
        self.abandoned = False


class RequestsMixin:
    """The request/answer part of :class:`~nsq_sync.wire.connection.NsqdConnection`, which calls
    :meth:`_init_requests`; the attributes annotated below are the connection's."""

    # the connection's state, set by NsqdConnection.__init__ / connect()
    address: str
    runtime: Runtime
    log: logging.LoggerAdapter[logging.Logger]
    closed: bool
    close_error: BaseException | None
    _transport: Transport | None
    _decoder: FrameDecoder
    _reader: Task | None
    _close_transport: Callable[[], None]
    #: a response no request waits for (CLOSE_WAIT): the connection hands it to its handler
    _unsolicited_response: Callable[[bytes], None]
    #: an error frame no request waits for (E_FIN_FAILED...): likewise
    _unsolicited_error: Callable[[ServerError], None]

    def _init_requests(self) -> None:
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._request_lock = self.runtime.lock()
        self._reading = False  # no reader task: a requester holds the reading role

    # ------------------------------------------------------------------ answers

    def _on_response(self, data: bytes) -> None:
        if self._waiters:
            self._answer(data, None)
        else:
            self._unsolicited_response(data)

    def _on_error(self, error: BaseException) -> None:
        fatal = getattr(error, "fatal", True)
        if fatal and self._waiters:
            self._answer(b"", error)
            if self._reader is None:
                # nsqd executes nothing after a fatal error and closes the connection: the
                # requests behind this one certainly did not take effect (safe to send again).
                self._close_transport()
                self._fail_waiters(
                    NotSent(
                        "nsqd closed the connection after a fatal error; this command was not "
                        "executed",
                        self.address,
                    )
                )
        elif isinstance(error, ServerError):
            self._unsolicited_error(error)
        else:
            self.log.error("error from nsqd: %s", error)

    def _answer(self, data: bytes, error: BaseException | None) -> None:
        # Only the task holding the reading role pops; requesters append under _request_lock.
        waiter = self._waiters.popleft()
        waiter.result = data
        waiter.error = error
        waiter.done = True
        if waiter.event is not None:
            waiter.event.set()

    def _fail_waiters(self, error: BaseException) -> None:
        with self._request_lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                waiter.error = error
                waiter.done = True
                if waiter.event is not None:
                    waiter.event.set()

    # ------------------------------------------------------------------ requests

    def request(self, data: bytes, timeout: float) -> bytes:
        """Write a command and wait for *its* answer (OK, or an error frame). Thread-safe; threads
        pipeline requests on one connection.

        A timeout abandons only this request: the connection stays up, and the late answer is
        matched to it and dropped. A failed (or timed-out) write closes the connection and fails
        every request waiting on it: a torn command would put the answers out of step.

        Raises:
            ServerError: nsqd answered with a (fatal) error frame for this command.
            NotSent: the connection was closed before anything was written.
            ReadTimeout: no answer within ``timeout`` seconds (the outcome is unknown).
            ConnectionClosed / NSQConnectionError: the connection broke before the answer (the
                outcome is unknown).
        """
        # The common case, a request alone on its connection (no reader task, nobody reading,
        # no answer outstanding), takes the reading role without a waiter: the next answer on
        # the wire is its own. Requests that come meanwhile queue their waiters behind it, and
        # it makes itself one (_own_waiter) before it hands out anything but its own lone OK.
        waiter: _Waiter | None = None
        lock = self._request_lock
        with lock:
            transport = self._transport
            if self.closed or transport is None:
                raise NotSent("connection is closed", self.address, by_server=False)
            if self._reader is None and not self._reading and not self._waiters:
                self._reading = True
            else:
                waiter = _Waiter()
                if self._reader is not None or self._reading:
                    waiter.event = self.runtime.signal()
                else:
                    self._reading = waiter.reader = True
                self._waiters.append(waiter)
            # request order == write order: both are decided under _request_lock
            first = transport.enqueue(data)
        if first is not None:
            try:
                transport.drain(first)
            except ConnectionClosed:
                # nsqd closed or reset the connection (typically right after a fatal error
                # frame). Answers it sent before that may still be unread: stop writing, but
                # let whoever holds the reading role deliver them; it fails the rest at EOF.
                self.closed = True
            except BaseException as exc:
                # A torn write: the connection is unusable, and every request waiting on it
                # fails (their bytes may or may not have reached nsqd).
                self._torn(exc)
                raise
        deadline = time.monotonic() + timeout
        if waiter is not None and not waiter.reader:
            try:
                waiter.event.wait(timeout)
            except BaseException:
                # Interrupted (a gevent.Timeout around the call, a KeyboardInterrupt): give up
                # as a timeout would, or the reading role could be handed to a waiter nobody
                # waits on, and nobody would read this connection again.
                self._abandon(waiter)
                raise
            if not waiter.done and not waiter.reader:
                with lock:
                    if not waiter.done and not waiter.reader:
                        waiter.abandoned = True
                        raise ReadTimeout(f"no answer from nsqd within {timeout} s", self.address)
            if not waiter.reader:
                if waiter.error is not None:
                    raise waiter.error
                return waiter.result
        return self._read_answers(waiter, deadline)

    def _abandon(self, waiter: _Waiter) -> None:
        """Stop waiting: the answer will be dropped, and a reading role handed over moves on."""
        with self._request_lock:
            waiter.abandoned = True
            handed = waiter.reader
        if handed:
            self._pass_reading_role()

    def _own_waiter(self) -> _Waiter:
        """A request that took the reading role alone gets its waiter, at the queue's front."""
        waiter = _Waiter()
        waiter.reader = True
        with self._request_lock:
            self._waiters.appendleft(waiter)
        return waiter

    def _read_answers(self, waiter: _Waiter | None, deadline: float) -> bytes:
        """With the reading role: read until this request is answered, pass the role on, return
        the answer (or raise it). ``waiter`` None: the first answer is this request's."""
        transport = self._transport
        assert transport is not None
        decoder = self._decoder
        try:
            if (waiter is None or not waiter.done) and not decoder.buffered:
                # The common case first, without the decoder: one read brings one whole OK,
                # the answer to the oldest request (what decoding it would do). Anything else
                # goes to the loop below.
                data = None
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    try:
                        data = transport.recv(remaining)
                    except ReadTimeout:
                        if time.monotonic() >= deadline:
                            raise
                        # (the socket's timeout may be shorter than ours: the loop retries)
                if data == _OK_FRAME:
                    if waiter is None:
                        self._pass_reading_role()
                        return OK
                    self._answer(OK, None)
                elif data is not None:
                    if not data:
                        raise ConnectionClosed("nsqd closed the connection", self.address)
                    decoder.receive_data(data)
            if waiter is None:
                waiter = self._own_waiter()
            while not waiter.done:
                event = decoder.next_event()
                if event is NEED_DATA:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ReadTimeout("no answer from nsqd within the timeout", self.address)
                    try:
                        data = transport.recv(remaining)
                    except ReadTimeout:
                        if time.monotonic() < deadline:
                            continue  # the socket's timeout may be shorter than ours (recv)
                        raise
                    if data == _OK_FRAME and not decoder.buffered:
                        # The common case, one whole OK alone in the read: what decoding it
                        # would do (the oldest request is answered), without the decoder.
                        self._answer(OK, None)
                        continue
                    if not data:
                        raise ConnectionClosed("nsqd closed the connection", self.address)
                    decoder.receive_data(data)
                elif event is EOF:
                    raise ConnectionClosed("nsqd closed the connection", self.address)
                else:
                    self._on_publisher_event(event)  # type: ignore[arg-type]
            # Answers to other requests that arrived in the same reads: hand them out now. Left
            # in the buffer, they would wait for the next reader to wake up first (one thread
            # wake-up more on the path of every answer when many threads publish).
            while self._waiters:
                event = decoder.next_event()
                if event is NEED_DATA or event is EOF:
                    break
                self._on_publisher_event(event)  # type: ignore[arg-type]
        except ReadTimeout:
            # (also when the socket's own timeout fired first): this request gives up; its
            # answer, if it ever comes, is popped and dropped by the next reader
            if waiter is None:
                waiter = self._own_waiter()
            waiter.abandoned = True
            self._pass_reading_role()
            raise
        except BaseException as exc:
            self.close_error = exc
            self._torn(exc)
            raise
        self._pass_reading_role()
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _on_publisher_event(self, event: Event) -> None:
        if type(event) is Response:
            self._on_response(event.data)
        elif type(event) is ErrorFrame:
            self._on_error(server_error(event, self.address))
        elif type(event) is Heartbeat:
            assert self._transport is not None
            self._transport.send(commands.NOP)
        else:
            raise RemoteProtocolError(f"unexpected {type(event).__name__} on a publisher")

    def _torn(self, error: BaseException) -> None:
        """Broken mid-request: close, fail every waiting request, free the reading role."""
        self._close_transport()
        self._fail_waiters(
            error
            if isinstance(error, NSQConnectionError)
            else ConnectionClosed(str(error), self.address)
        )
        with self._request_lock:
            self._reading = False

    def _pass_reading_role(self) -> None:
        with self._request_lock:
            for waiter in self._waiters:
                if not waiter.abandoned:
                    waiter.reader = True
                    waiter.event.set()
                    return
            # Nobody waits (at most abandoned requests, whose answers the next reader pops).
            self._reading = False


__all__ = ["NotSent", "RequestsMixin"]
