"""One nsqd TCP connection: a reader task, thread-safe writes, and requests matched to answers.

:meth:`NsqdConnection.connect` runs the handshake (magic, IDENTIFY, upgrades, AUTH: see
:mod:`nsq_sync.handshake`).

The reader task (one per connection) decodes frames, answers ``_heartbeat_`` with NOP itself and
hands everything else to a :class:`ConnectionHandler` (the consumer) or to the request waiting
for it (the producer). It never runs user code, so a slow handler can never delay a heartbeat.

Requests are answered in order, so :meth:`NsqdConnection.request` keeps a FIFO of waiters:
response *n* belongs to request *n*. Non-fatal errors (E_FIN_FAILED, E_REQ_FAILED,
E_TOUCH_FAILED) answer fire-and-forget commands and are never matched to a waiter.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Protocol

from nsq_sync import _fork
from nsq_sync._addresses import parse_address
from nsq_sync.config import Config
from nsq_sync.errors import (
    ConnectionClosed,
    NSQConnectionError,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
)
from nsq_sync.handshake import Handshake, server_error
from nsq_sync.protocol import commands
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder
from nsq_sync.protocol.events import ErrorFrame, Event, Heartbeat, MessageFrame, Response
from nsq_sync.protocol.identify import IdentifyResult
from nsq_sync.runtime import Runtime, Task, resolve_runtime
from nsq_sync.transport import Transport

log = logging.getLogger(__name__)


class ConnectionHandler(Protocol):
    """Receives what the reader task does not handle itself. Methods run on the reader task and
    must return quickly (queue work; never block, never run user code)."""

    def on_messages(self, conn: NsqdConnection, messages: list[MessageFrame]) -> None: ...

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None: ...

    def on_response(self, conn: NsqdConnection, data: bytes) -> None: ...

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None: ...


# nsqd's answer to a publish, as a whole frame: size 6, frame type 0 (response), "OK"
_OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00" + OK


class NotSent(ConnectionClosed):
    """The command certainly did not take effect (safe to send elsewhere): the connection was
    closed before it was written, or nsqd closed it after a fatal error to an earlier command
    (nsqd executes nothing after such an error)."""


class _Waiter:
    """One request waiting for its answer. ``event`` exists only when the requester waits for
    another task to read its answer; ``reader`` is set when it is handed the reading role."""

    __slots__ = ("event", "result", "error", "done", "reader", "abandoned")

    def __init__(self) -> None:
        self.event: Any = None
        self.result: bytes = b""
        self.error: BaseException | None = None
        self.done = False
        self.reader = False
        self.abandoned = False


class NsqdConnection:
    """A connection to one nsqd.

    Two modes:

    * **consumer** (:meth:`start_reader` called): a reader task owns the socket's reading side,
      answers heartbeats and hands messages to the handler;
    * **request/response** (no reader task, used by the producer): whoever calls
      :meth:`request` while nobody is reading reads the answers itself, for every waiting
      request in order, and hands the reading role to the next waiter when its own answer
      arrived. A lone publisher thus writes and reads on its own thread, with no task switch
      per publish. Such connections IDENTIFY with heartbeats disabled (nothing reads while
      idle); dead peers show up as failed publishes, and TCP keepalive is on.

    :meth:`send` and :meth:`request` are thread-safe.

    Args:
        address: nsqd's TCP ``host:port``.
        config: options (timeouts, TLS, compression, AUTH, IDENTIFY fields).
        runtime: threads or gevent (see :func:`nsq_sync.runtime.resolve_runtime`).
        handler: receives messages, unsolicited responses/errors and the close notification.
        heartbeats: False asks nsqd not to send heartbeats (request/response connections).
    """

    def __init__(
        self,
        address: str,
        config: Config | None = None,
        *,
        runtime: Any = "auto",
        handler: ConnectionHandler | None = None,
        heartbeats: bool = True,
    ) -> None:
        parse_address(address)  # fail early on a malformed address
        self.address = address
        self.config = config or Config()
        self.runtime: Runtime = resolve_runtime(runtime)
        self.handler = handler
        self.heartbeats = heartbeats
        self.identify: IdentifyResult = IdentifyResult()
        self.log = logging.LoggerAdapter(log, {"nsqd": address})
        self._transport: Transport | None = None
        self._decoder = FrameDecoder(self.config.max_frame_size)
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._request_lock = self.runtime.lock()
        self._reader: Task | None = None
        self._reading = False  # request/response mode: a requester holds the reading role
        self._closing = False
        self.closed = False
        self.close_error: BaseException | None = None
        #: messages the reader task handed to the handler (written by the reader task only)
        self.messages_received = 0

    def __repr__(self) -> str:
        return f"<NsqdConnection {self.address}{' closed' if self.closed else ''}>"

    @property
    def max_rdy_count(self) -> int:
        return self.identify.max_rdy_count

    # ------------------------------------------------------------------ handshake

    def connect(self, timeout: float | None = None) -> IdentifyResult:
        """Dial and run the handshake: magic, IDENTIFY, TLS, compression, AUTH.

        Args:
            timeout: seconds the whole of it may take (None: ``dial_timeout`` for the dial, then
                ``read_timeout`` for each answer of the handshake). Every step is bounded by
                what is left of it, so a server that accepts TCP and never answers costs at
                most ``timeout``.

        Raises:
            NSQConnectionError: cannot connect, or the connection broke (ConnectTimeout,
                ReadTimeout, ConnectionClosed).
            TLSError: TLS requested but unavailable, or the certificate did not verify.
            AuthError: nsqd requires AUTH and no ``auth_secret`` is configured.
            ServerError: nsqd rejected IDENTIFY or AUTH (E_UNAUTHORIZED, E_AUTH_FAILED...).
            RemoteProtocolError: garbage from the peer (for example an HTTP port).
        """
        cfg = self.config
        dial_timeout = cfg.dial_timeout
        deadline = None
        if timeout is not None:
            deadline = time.monotonic() + timeout
            dial_timeout = max(0.001, min(dial_timeout, timeout))
        self._transport = Transport(
            self.runtime,
            self.address,
            dial_timeout=dial_timeout,
            read_timeout=cfg.read_timeout,
            write_timeout=cfg.write_timeout,
        )
        # In a forked child the fork hook closes the child's copy of the socket (nsq_sync._fork)
        _fork.track(self, NsqdConnection.abandon)
        handshake = Handshake(self._transport, self._decoder, cfg, self.address, self.log, deadline)
        try:
            self.identify = handshake.run(self.heartbeats)
        except BaseException:
            self._close_transport()
            raise
        return self.identify

    def subscribe(self, topic: str, channel: str) -> None:
        """Send SUB and wait for OK (before the reader starts).

        Raises:
            InvalidName, ServerError (E_BAD_TOPIC, E_UNAUTHORIZED...), NSQConnectionError.
        """
        data = commands.sub(topic, channel)
        transport = self._transport
        assert transport is not None
        try:
            transport.send(data)
            Handshake(transport, self._decoder, self.config, self.address, self.log).expect_ok(
                "SUB"
            )
        except BaseException:
            self._close_transport()
            raise

    # ------------------------------------------------------------------ reader

    def start_reader(self) -> None:
        """Spawn the reader task (named ``nsq_sync-reader-<address>``)."""
        self._reader = self.runtime.spawn(self._read_loop, name=f"nsq_sync-reader-{self.address}")

    def _read_loop(self) -> None:
        error: BaseException | None = None
        transport = self._transport
        decoder = self._decoder
        assert transport is not None
        handler = self.handler
        try:
            while True:
                # Messages go to the handler in batches (one per read): one lock round trip
                # in the consumer for many messages. Order relative to other frames is kept.
                batch: list[MessageFrame] = []
                try:
                    while True:
                        event = decoder.next_messages(batch)
                        if event is NEED_DATA or event is EOF:
                            break
                        if type(event) is MessageFrame:
                            batch.append(event)
                            continue
                        if batch:
                            ready, batch = batch, []
                            self.messages_received += len(ready)
                            if handler is not None:
                                handler.on_messages(self, ready)
                        if type(event) is Heartbeat:
                            transport.send(commands.NOP)
                        elif type(event) is Response:
                            self._on_response(event.data)
                        else:
                            self._on_error(server_error(event, self.address))  # type: ignore[arg-type]
                finally:
                    # also when the decoder hits garbage: the messages before it are good
                    if batch:
                        self.messages_received += len(batch)
                        if handler is not None:
                            handler.on_messages(self, batch)
                data = transport.recv()
                if not data:
                    if not self._closing:
                        error = ConnectionClosed("nsqd closed the connection", self.address)
                    break
                decoder.receive_data(data)
        except ConnectionClosed as exc:
            if not self._closing:
                error = exc
        except BaseException as exc:  # recorded and reported, never silent
            if not self._closing:
                error = exc
        finally:
            self._finish(error)

    def _on_response(self, data: bytes) -> None:
        if self._waiters:
            self._answer(data, None)
        elif self.handler is not None:
            self.handler.on_response(self, data)

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
        elif self.handler is not None and isinstance(error, ServerError):
            self.handler.on_error(self, error)
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

    def _finish(self, error: BaseException | None) -> None:
        self.close_error = error
        self._close_transport()
        if error is not None:
            self.log.warning("connection lost: %s", error)
        self._fail_waiters(
            ConnectionClosed(
                "connection closed before nsqd answered", self.address, by_server=error is not None
            )
        )
        if self.handler is not None:
            try:
                self.handler.on_close(self, error)
            except Exception:
                self.log.exception("connection close handler failed")

    # ------------------------------------------------------------------ writing

    def send(self, data: bytes) -> None:
        """Write one encoded command. Thread-safe.

        Raises:
            ConnectionClosed: the connection is closed.
            NSQConnectionError: the write failed or timed out.
        """
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        transport.send(data)

    def buffer(self, data: bytes) -> bool:
        """Buffer a command for the next :meth:`flush` (or :meth:`send`). Thread-safe.

        Returns:
            True when the buffer was empty: the caller must make sure :meth:`flush` follows.

        Raises:
            ConnectionClosed: the connection is closed.
        """
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        return transport.buffer(data)

    def flush(self) -> None:
        """Write what :meth:`buffer` buffered. Thread-safe.

        Raises:
            ConnectionClosed, NSQConnectionError.
        """
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        transport.flush()

    def request(self, data: bytes, timeout: float) -> bytes:
        """Write a command and wait for *its* response (OK, or an error frame). Thread-safe;
        many threads may pipeline requests on one connection.

        A timeout abandons only this request: the connection stays up, and the answer, if it
        comes, is matched to this request (FIFO) and dropped. A write that fails (or times out)
        closes the connection and fails every request waiting on it: a torn command would leave
        the answers out of step with the requests.

        Raises:
            ServerError: nsqd answered with a (fatal) error frame for this command.
            NotSent: the connection was closed before anything was written (nothing reached nsqd).
            ReadTimeout: no answer within ``timeout`` seconds (the outcome is unknown).
            ConnectionClosed / NSQConnectionError: the connection broke before the answer (the
                outcome is unknown).
        """
        waiter = _Waiter()
        with self._request_lock:
            transport = self._transport
            if self.closed or transport is None:
                raise NotSent("connection is closed", self.address, by_server=False)
            if self._reader is not None or self._reading:
                waiter.event = self.runtime.signal()
            else:
                self._reading = waiter.reader = True
            # waiter order == write order: both happen under _request_lock
            self._waiters.append(waiter)
            write = transport.enqueue(data)
        if write:
            try:
                transport.drain()
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
        if not waiter.reader:
            waiter.event.wait(timeout)
            if not waiter.done and not waiter.reader:
                with self._request_lock:
                    if not waiter.done and not waiter.reader:
                        waiter.abandoned = True
                        raise ReadTimeout(f"no answer from nsqd within {timeout} s", self.address)
        if waiter.reader:
            self._read_answers(waiter, deadline)
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _read_answers(self, waiter: _Waiter, deadline: float) -> None:
        """Holding the reading role: read until ``waiter`` is answered, then pass the role on."""
        transport = self._transport
        assert transport is not None
        decoder = self._decoder
        try:
            if not waiter.done and not decoder.buffered:
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
                    self._answer(OK, None)
                elif data is not None:
                    if not data:
                        raise ConnectionClosed("nsqd closed the connection", self.address)
                    decoder.receive_data(data)
            while not waiter.done:
                event = decoder.next_event()
                if event is NEED_DATA:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        waiter.abandoned = True
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
            waiter.abandoned = True
            self._pass_reading_role()
            raise
        except BaseException as exc:
            self.close_error = exc
            self._torn(exc)
            raise
        self._pass_reading_role()

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
        """The connection broke mid-request (a failed write or read): close it and fail every
        waiting request with ``error`` (their outcome is unknown), and free the reading role."""
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

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Write what is buffered, then close the socket (no CLS); the reader task ends and
        reports the close. Idempotent, thread-safe."""
        self._closing = True
        if self._transport is not None and not self.closed:
            try:
                self._transport.flush()
            except NSQConnectionError:
                pass
        self._close_transport()

    def abandon(self) -> None:
        """Drop the connection in a forked child without touching the parent's socket: close
        only this process's descriptors. A task of the parent copied into the child (gevent)
        that waits on this connection then fails, and its reader ends quietly. Takes no lock."""
        self._closing = True
        self.closed = True
        if self._transport is not None:
            self._transport.abandon()

    def _close_transport(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the reader task to end; True if it has. Never joins from the reader itself."""
        reader = self._reader
        if reader is None:
            return True
        if self.runtime.is_current(reader):
            return False
        reader.join(timeout)
        return not reader.is_alive()

    @property
    def reader_alive(self) -> bool:
        return self._reader is not None and self._reader.is_alive()


__all__ = ["ConnectionHandler", "NSQConnectionError", "NotSent", "NsqdConnection"]
