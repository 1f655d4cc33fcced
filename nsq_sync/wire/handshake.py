"""The handshake of one nsqd connection, before its reader runs: magic, IDENTIFY, TLS, snappy or
deflate, AUTH (and SUB's OK for a consumer), read synchronously by the task that dialled.
After an upgrade the decoder's trailing bytes go to the new layer first (nsqd may send its OK
right behind the IDENTIFY answer)."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

from nsq_sync.addresses import parse_address
from nsq_sync.config import Config
from nsq_sync.errors import (
    AuthError,
    ConnectionClosed,
    HandshakeError,
    ReadTimeout,
    RemoteProtocolError,
    TLSError,
)
from nsq_sync.protocol import commands
from nsq_sync.protocol.codecs import DeflateCodec, SnappyCodec
from nsq_sync.protocol.constants import OK
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder
from nsq_sync.protocol.events import ErrorFrame, Heartbeat, Response
from nsq_sync.protocol.identify import IdentifyResult
from nsq_sync.wire.tls import build_ssl_context
from nsq_sync.wire.transport import Transport

__all__ = ["Handshake", "identify_body", "server_error"]


def identify_body(config: Config, heartbeats: bool = True) -> dict[str, Any]:
    """The IDENTIFY JSON for ``config`` (durations become milliseconds here, and only here)."""
    hostname = config.hostname or socket.gethostname()
    body: dict[str, Any] = {
        "client_id": config.client_id or hostname.split(".")[0],
        "hostname": hostname,
        "feature_negotiation": True,
        "heartbeat_interval": int(config.heartbeat_interval * 1000) if heartbeats else -1,
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


def server_error(frame: ErrorFrame, address: str) -> BaseException:
    """The exception for an error frame (TLSError for ``E_INVALID ... TLS required``)."""
    error = frame.to_exception()
    if error.code == "E_INVALID" and "TLS required" in error.text:
        return TLSError(f"nsqd requires TLS (--tls-required); set tls_v1=True: {error}", address)
    return error


class Handshake:
    """Reads and writes of the handshake on one transport. ``deadline``: the monotonic time the
    whole handshake must end by, or None (``read_timeout`` per answer)."""

    def __init__(
        self,
        transport: Transport,
        decoder: FrameDecoder,
        config: Config,
        address: str,
        log: logging.Logger | logging.LoggerAdapter[Any],
        deadline: float | None = None,
    ) -> None:
        self.transport = transport
        self.decoder = decoder
        self.config = config
        self.address = address
        self.log = log
        self.deadline = deadline

    def run(self, heartbeats: bool) -> IdentifyResult:
        """Magic, IDENTIFY, then the upgrades and AUTH nsqd's answer calls for; raises as
        :meth:`NsqdConnection.connect <nsq_sync.wire.connection.NsqdConnection.connect>`."""
        cfg = self.config
        transport = self.transport
        if not heartbeats:
            transport.enable_keepalive()
        transport.send(commands.magic() + commands.identify(identify_body(cfg, heartbeats)))
        result = IdentifyResult.parse(self.read_response())
        if cfg.tls_enabled:
            if not result.tls_v1:
                raise TLSError(
                    "TLS was requested but nsqd did not agree (is it started with "
                    "--tls-cert/--tls-key?)",
                    self.address,
                )
            host = cfg.tls_server_name or parse_address(self.address)[0]
            transport.start_tls(build_ssl_context(cfg), host, self.decoder.take_trailing_data())
            self.expect_ok("TLS upgrade")
        if result.snappy:
            transport.install_codec(SnappyCodec(), self.decoder.take_trailing_data())
            self.expect_ok("snappy upgrade")
        elif result.deflate:
            level = result.deflate_level or cfg.deflate_level
            transport.install_codec(DeflateCodec(level), self.decoder.take_trailing_data())
            self.expect_ok("deflate upgrade")
        elif (cfg.snappy or cfg.deflate) and result.negotiated:
            self.log.warning(
                "compression %s requested but not enabled on nsqd; continuing uncompressed",
                "snappy" if cfg.snappy else "deflate",
            )
        if result.auth_required:
            self._auth()
        elif cfg.auth_secret:
            self.log.warning("auth_secret is set but nsqd does not require AUTH; not sending it")
        return result

    def _auth(self) -> None:
        if not self.config.auth_secret:
            raise AuthError(
                "nsqd requires AUTH (--auth-http-address) but no auth_secret is configured",
                self.address,
            )
        self.transport.send(commands.auth(self.config.auth_secret))
        reply = self.read_response()
        try:
            info = json.loads(reply)
        except ValueError:
            raise HandshakeError(
                f"unexpected AUTH response {reply[:100]!r}", self.address
            ) from None
        self.log.debug("authenticated as %s", info.get("identity"))

    def expect_ok(self, what: str) -> None:
        data = self.read_response()
        if data != OK:
            raise HandshakeError(f"expected OK after {what}, got {data[:100]!r}", self.address)

    def read_response(self) -> bytes:
        """Read until a response (returned) or an error frame (raised); heartbeats get NOP."""
        while True:
            event = self.decoder.next_event()
            if event is NEED_DATA:
                timeout = None
                if self.deadline is not None:
                    timeout = min(self.config.read_timeout, self.deadline - time.monotonic())
                    if timeout <= 0:
                        raise ReadTimeout("the handshake timed out", self.address)
                self.decoder.receive_data(self.transport.recv(timeout))
                continue
            if event is EOF:
                raise ConnectionClosed(
                    "nsqd closed the connection during the handshake", self.address
                )
            if isinstance(event, Heartbeat):
                self.transport.send(commands.NOP)
            elif isinstance(event, Response):
                return event.data
            elif isinstance(event, ErrorFrame):
                raise server_error(event, self.address)
            else:
                raise RemoteProtocolError(f"unexpected {type(event).__name__} during the handshake")
