"""One nsqd TCP connection: a reader task, thread-safe writes, and requests matched to answers.

The reader task answers heartbeats itself and hands everything else to a
:class:`ConnectionHandler` (the consumer) or to the request waiting for it (the producer). It
never runs user code, so a slow handler never delays a heartbeat.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from nsq_sync import process as _fork
from nsq_sync.addresses import parse_address
from nsq_sync.config import Config
from nsq_sync.errors import ConnectionClosed, NSQConnectionError, ServerError
from nsq_sync.protocol import commands
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder
from nsq_sync.protocol.events import Heartbeat, MessageFrame, RawMessage, Response
from nsq_sync.protocol.identify import IdentifyResult
from nsq_sync.runtime import Runtime, Task, resolve_runtime
from nsq_sync.wire.handshake import Handshake, server_error
from nsq_sync.wire.requests import NotSent, RequestsMixin
from nsq_sync.wire.transport import Transport

log = logging.getLogger(__name__)


class ConnectionHandler(Protocol):
    """Receives what the reader task does not handle itself. Its methods run on the reader task and
    must return quickly (queue work; never block, never run user code)."""

    def on_messages(self, conn: NsqdConnection, messages: list[RawMessage]) -> None: ...

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None: ...

    def on_response(self, conn: NsqdConnection, data: bytes) -> None: ...

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None: ...


class NsqdConnection(RequestsMixin):
    """A connection to one nsqd; :meth:`send` and :meth:`request` are thread-safe. Two modes:

    * **consumer** (:meth:`start_reader`): a reader task owns the reading side, answers heartbeats
      and hands messages to ``handler``;
    * **request/response** (no reader task: the producer): a caller of :meth:`request` reads the
      answers itself (:mod:`nsq_sync.wire.requests`), so a lone publisher has no task switch per
      publish. With ``heartbeats=False`` nsqd sends none (nothing reads while idle); TCP keepalive
      is on instead.
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
        self._reader: Task | None = None
        self._init_requests()  # the waiters and the reading role (nsq_sync.wire.requests)
        self._closing = False
        self.closed = False
        self.close_error: BaseException | None = None
        #: messages the reader task handed to the handler (written by the reader task only)
        self.messages_received = 0

    def __repr__(self) -> str:
        return f"<NsqdConnection {self.address}{' closed' if self.closed else ''}>"

    def _unsolicited_response(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.on_response(self, data)

    def _unsolicited_error(self, error: ServerError) -> None:
        if self.handler is not None:
            self.handler.on_error(self, error)
        else:
            self.log.error("error from nsqd: %s", error)

    @property
    def max_rdy_count(self) -> int:
        return self.identify.max_rdy_count

    # ------------------------------------------------------------------ handshake

    def connect(self, timeout: float | None = None) -> IdentifyResult:
        """Dial and run the handshake: magic, IDENTIFY, TLS, compression, AUTH.

        Args:
            timeout: seconds the whole handshake may take (None: ``dial_timeout`` for the dial,
                then ``read_timeout`` for each answer); each step is bounded by what is left of it.

        Raises:
            NSQConnectionError: cannot connect, or the connection broke (ConnectTimeout,
                ReadTimeout, ConnectionClosed, HandshakeError).
            TLSError: TLS refused (or required) by nsqd, or the certificate did not verify.
            ConfigError: a CA, certificate or key file cannot be loaded.
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
        # In a forked child the fork hook closes the child's copy of the socket (nsq_sync.process)
        _fork.track(self, NsqdConnection.abandon)
        handshake = Handshake(self._transport, self._decoder, cfg, self.address, self.log, deadline)
        try:
            self.identify = handshake.run(self.heartbeats)
        except BaseException:
            self._close_transport()
            raise
        return self.identify

    def subscribe(self, topic: str, channel: str) -> None:
        """Send SUB and wait for OK (before the reader starts). Raises InvalidName, ServerError or
        NSQConnectionError."""
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
                batch: list[RawMessage] = []
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
        """Write one encoded command. Thread-safe. Raises ConnectionClosed, NSQConnectionError."""
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        transport.send(data)

    def buffer(self, data: bytes) -> bool:
        """Buffer a command for the next :meth:`flush` (or :meth:`send`). Thread-safe. True when
        the buffer was empty: the caller must make sure a flush follows. Raises ConnectionClosed.
        """
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        return transport.buffer(data)

    def flush(self) -> None:
        """Write what :meth:`buffer` buffered. Thread-safe. Raises as :meth:`send`."""
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosed("connection is closed", self.address, by_server=False)
        transport.flush()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Write what is buffered (after a write under way, up to ``write_timeout``), then close
        the socket (no CLS); the reader task ends and reports the close. Idempotent, thread-safe.
        """
        self._closing = True
        if self._transport is not None and not self.closed:
            try:
                self._transport.flush(wait=True)
            except NSQConnectionError:
                pass
        self._close_transport()

    def abandon(self) -> None:
        """Fork hook: close this process's descriptors only (not the parent's socket); no lock."""
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
