"""One nsqd TCP connection: handshake, upgrades, AUTH, a reader task and thread-safe writes.

The reader task (one per connection) decodes frames, answers ``_heartbeat_`` with NOP itself and
hands everything else to a :class:`ConnectionHandler` (the consumer) or to the request waiting
for it (the producer). It never runs user code, so a slow handler can never delay a heartbeat.

Requests are answered in order, so :meth:`NsqdConnection.request` keeps a FIFO of waiters:
response *n* belongs to request *n*. Non-fatal errors (E_FIN_FAILED, E_REQ_FAILED,
E_TOUCH_FAILED) answer fire-and-forget commands and are never matched to a waiter.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import threading
from typing import Any, Protocol

from nsq_sync._tls import build_ssl_context
from nsq_sync.config import Config
from nsq_sync.errors import (
    AuthError,
    ConnectionClosed,
    HandshakeError,
    NSQConnectionError,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    TLSError,
)
from nsq_sync.protocol import commands
from nsq_sync.protocol.codecs import DeflateCodec, SnappyCodec
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder
from nsq_sync.protocol.events import ErrorFrame, Heartbeat, MessageFrame, Response
from nsq_sync.protocol.identify import IdentifyResult
from nsq_sync.runtime import Runtime, Task, resolve_runtime
from nsq_sync.transport import Transport, parse_address

log = logging.getLogger(__name__)


class ConnectionHandler(Protocol):
    """Receives what the reader task does not handle itself. Methods run on the reader task and
    must return quickly (queue work; never block, never run user code)."""

    def on_message(self, conn: NsqdConnection, message: MessageFrame) -> None: ...

    def on_error(self, conn: NsqdConnection, error: ServerError) -> None: ...

    def on_response(self, conn: NsqdConnection, data: bytes) -> None: ...

    def on_close(self, conn: NsqdConnection, error: BaseException | None) -> None: ...


class _Waiter:
    __slots__ = ("event", "result", "error")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.result: bytes = b""
        self.error: BaseException | None = None


def identify_body(config: Config) -> dict[str, Any]:
    """The IDENTIFY JSON for ``config`` (durations converted to milliseconds here)."""
    hostname = config.hostname or socket.gethostname()
    body: dict[str, Any] = {
        "client_id": config.client_id or hostname.split(".")[0],
        "hostname": hostname,
        "feature_negotiation": True,
        "heartbeat_interval": int(config.heartbeat_interval * 1000),
        "output_buffer_size": config.output_buffer_size if config.output_buffer_size else -1,
        "output_buffer_timeout": (
            int(config.output_buffer_timeout * 1000) if config.output_buffer_timeout else -1
        ),
        "tls_v1": config.tls_enabled,
        "snappy": config.snappy,
        "deflate": config.deflate,
        "deflate_level": config.deflate_level,
        "sample_rate": config.sample_rate,
        "user_agent": config.user_agent,
    }
    if config.msg_timeout is not None:
        body["msg_timeout"] = int(config.msg_timeout * 1000)
    return body


class NsqdConnection:
    """A connection to one nsqd.

    Call :meth:`connect` (dial + handshake), optionally :meth:`subscribe`, then
    :meth:`start_reader`. :meth:`send` and :meth:`request` are thread-safe; counters are
    updated under a lock.

    Args:
        address: nsqd's TCP ``host:port``.
        config: options (timeouts, TLS, compression, AUTH, IDENTIFY fields).
        runtime: threads or gevent (see :func:`nsq_sync.runtime.resolve_runtime`).
        handler: receives messages, unsolicited responses/errors and the close notification.
    """

    def __init__(
        self,
        address: str,
        config: Config | None = None,
        *,
        runtime: Any = "auto",
        handler: ConnectionHandler | None = None,
    ) -> None:
        parse_address(address)  # fail early on a malformed address
        self.address = address
        self.config = config or Config()
        self.runtime: Runtime = resolve_runtime(runtime)
        self.handler = handler
        self.identify: IdentifyResult = IdentifyResult()
        self.log = logging.LoggerAdapter(log, {"nsqd": address})
        self._transport: Transport | None = None
        self._decoder = FrameDecoder(self.config.max_frame_size)
        self._pending: collections.deque[_Waiter] = collections.deque()
        self._request_lock = self.runtime.lock()
        self._reader: Task | None = None
        self._closing = False
        self.closed = False
        self.close_error: BaseException | None = None
        # RDY / in-flight bookkeeping, owned by the consumer's RDY manager.
        self.stats_lock = threading.Lock()
        self.rdy = 0  # last RDY value sent
        self.remaining_rdy = 0  # RDY left before nsqd stops sending
        self.in_flight = 0  # delivered, not yet FIN/REQ
        self.messages_received = 0
        self.last_message_at = 0.0
        self.last_rdy_at = 0.0

    def __repr__(self) -> str:
        return f"<NsqdConnection {self.address}{' closed' if self.closed else ''}>"

    @property
    def max_rdy_count(self) -> int:
        return self.identify.max_rdy_count

    # ------------------------------------------------------------------ handshake

    def connect(self) -> IdentifyResult:
        """Dial and run the handshake: magic, IDENTIFY, TLS, compression, AUTH.

        Raises:
            NSQConnectionError: cannot connect, or the connection broke (ConnectTimeout,
                ReadTimeout, ConnectionClosed).
            TLSError: TLS requested but unavailable, or the certificate did not verify.
            AuthError: nsqd requires AUTH and no ``auth_secret`` is configured.
            ServerError: nsqd rejected IDENTIFY or AUTH (E_UNAUTHORIZED, E_AUTH_FAILED...).
            RemoteProtocolError: garbage from the peer (for example an HTTP port).
        """
        cfg = self.config
        self._transport = Transport(
            self.runtime,
            self.address,
            dial_timeout=cfg.dial_timeout,
            read_timeout=cfg.read_timeout,
            write_timeout=cfg.write_timeout,
        )
        try:
            self._handshake()
        except BaseException:
            self._transport.close()
            self.closed = True
            raise
        return self.identify

    def _handshake(self) -> None:
        cfg = self.config
        transport = self._transport
        assert transport is not None
        transport.send(commands.magic() + commands.identify(identify_body(cfg)))
        self.identify = result = IdentifyResult.parse(self._read_response())
        if cfg.tls_enabled:
            if not result.tls_v1:
                raise TLSError(
                    "TLS was requested but nsqd did not agree (is it started with "
                    "--tls-cert/--tls-key?)",
                    self.address,
                )
            host = cfg.tls_server_name or parse_address(self.address)[0]
            transport.start_tls(build_ssl_context(cfg), host, self._decoder.take_trailing_data())
            self._expect_ok("TLS upgrade")
        if result.snappy:
            transport.install_codec(SnappyCodec(), self._decoder.take_trailing_data())
            self._expect_ok("snappy upgrade")
        elif result.deflate:
            level = result.deflate_level or cfg.deflate_level
            transport.install_codec(DeflateCodec(level), self._decoder.take_trailing_data())
            self._expect_ok("deflate upgrade")
        elif (cfg.snappy or cfg.deflate) and result.negotiated:
            self.log.warning(
                "compression %s requested but not enabled on nsqd; continuing uncompressed",
                "snappy" if cfg.snappy else "deflate",
            )
        if result.auth_required:
            if not cfg.auth_secret:
                raise AuthError(
                    "nsqd requires AUTH (--auth-http-address) but no auth_secret is configured",
                    self.address,
                )
            transport.send(commands.auth(cfg.auth_secret))
            reply = self._read_response()
            try:
                info = json.loads(reply)
            except ValueError:
                raise HandshakeError(
                    f"unexpected AUTH response {reply[:100]!r}", self.address
                ) from None
            self.log.debug("authenticated as %s", info.get("identity"))
        elif cfg.auth_secret:
            self.log.warning("auth_secret is set but nsqd does not require AUTH; not sending it")

    def subscribe(self, topic: str, channel: str) -> None:
        """Send SUB and wait for OK (before the reader starts).

        Raises:
            InvalidName, ServerError (E_BAD_TOPIC, E_UNAUTHORIZED...), NSQConnectionError.
        """
        data = commands.sub(topic, channel)
        assert self._transport is not None
        try:
            self._transport.send(data)
            self._expect_ok("SUB")
        except BaseException:
            self._close_transport()
            raise

    def _expect_ok(self, what: str) -> None:
        data = self._read_response()
        if data != OK:
            raise HandshakeError(f"expected OK after {what}, got {data[:100]!r}", self.address)

    def _read_response(self) -> bytes:
        """Read synchronously (before the reader task runs) until a response or error frame."""
        assert self._transport is not None
        while True:
            event = self._decoder.next_event()
            if event is NEED_DATA:
                self._decoder.receive_data(self._transport.recv())
                continue
            if event is EOF:
                raise ConnectionClosed(
                    "nsqd closed the connection during the handshake", self.address
                )
            if isinstance(event, Heartbeat):
                self._transport.send(commands.NOP)
            elif isinstance(event, Response):
                return event.data
            elif isinstance(event, ErrorFrame):
                raise self._server_error(event)
            else:
                raise RemoteProtocolError(f"unexpected {type(event).__name__} during the handshake")

    def _server_error(self, frame: ErrorFrame) -> BaseException:
        error = frame.to_exception()
        if error.code == "E_INVALID" and "TLS required" in error.text:
            return TLSError(
                f"nsqd requires TLS (--tls-required); set tls_v1=True: {error}", self.address
            )
        return error

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
                for event in decoder.events():
                    if type(event) is MessageFrame:
                        self._count_message()
                        if handler is not None:
                            handler.on_message(self, event)
                    elif type(event) is Heartbeat:
                        transport.send(commands.NOP)
                    elif type(event) is Response:
                        self._on_response(event.data)
                    else:
                        self._on_error(self._server_error(event))  # type: ignore[arg-type]
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

    def _count_message(self) -> None:
        with self.stats_lock:
            self.in_flight += 1
            self.messages_received += 1
            if self.remaining_rdy > 0:
                self.remaining_rdy -= 1

    def _on_response(self, data: bytes) -> None:
        if self._pending:
            waiter = self._pending.popleft()
            waiter.result = data
            waiter.event.set()
        elif self.handler is not None:
            self.handler.on_response(self, data)

    def _on_error(self, error: BaseException) -> None:
        fatal = getattr(error, "fatal", True)
        if fatal and self._pending:
            waiter = self._pending.popleft()
            waiter.error = error
            waiter.event.set()
        elif self.handler is not None and isinstance(error, ServerError):
            self.handler.on_error(self, error)
        else:
            self.log.error("error from nsqd: %s", error)

    def _finish(self, error: BaseException | None) -> None:
        self.close_error = error
        self._close_transport()
        if error is not None:
            self.log.warning("connection lost: %s", error)
        pending_error = ConnectionClosed(
            "connection closed before nsqd answered", self.address, by_server=error is not None
        )
        while self._pending:
            waiter = self._pending.popleft()
            waiter.error = pending_error
            waiter.event.set()
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

    def request(self, data: bytes, timeout: float) -> bytes:
        """Write a command and wait for *its* response (OK, or an error frame). Thread-safe;
        many threads may pipeline requests on one connection.

        Raises:
            ServerError: nsqd answered with a (fatal) error frame for this command.
            ReadTimeout: no answer within ``timeout`` seconds (the outcome is unknown).
            ConnectionClosed / NSQConnectionError: the connection broke before the answer.
        """
        waiter = _Waiter(self.runtime.event())
        with self._request_lock:
            if self.closed or self._transport is None:
                raise ConnectionClosed("connection is closed", self.address, by_server=False)
            self._pending.append(waiter)
            try:
                self._transport.send(data)
            except ConnectionClosed:
                # nsqd closed or reset the connection (typically right after a fatal error
                # frame). Answers it sent before that may still be unread: stop writing, but
                # let the reader deliver them; it ends at EOF and closes the transport.
                self._forget(waiter)
                self.closed = True
                raise
            except BaseException:
                # Nothing (or a torn write) reached nsqd: the connection is unusable now.
                self._forget(waiter)
                self._close_transport()
                raise
        if not waiter.event.wait(timeout):
            raise ReadTimeout(f"no answer from nsqd within {timeout} s", self.address)
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _forget(self, waiter: _Waiter) -> None:
        try:
            self._pending.remove(waiter)
        except ValueError:
            pass  # the reader, closing the connection, already failed every waiter

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close the socket at once (no CLS); the reader task ends and reports the close.
        Idempotent, thread-safe."""
        self._closing = True
        self._close_transport()

    def abandon(self) -> None:
        """Drop the connection in a forked child without touching the parent's socket."""
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


__all__ = ["ConnectionHandler", "NSQConnectionError", "NsqdConnection", "identify_body"]
