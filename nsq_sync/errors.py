"""The nsq_sync exception hierarchy: every exception nsq_sync raises is an :class:`NSQError`.

- The name says who refused. nsqd's error frames are :class:`ServerError`, one subclass per
  ``E_*`` code named ``Server`` + the code in CamelCase without ``E_`` (``E_BAD_TOPIC`` ->
  :class:`ServerBadTopic`; a unit test holds every class to it). Bad input refused before
  anything is sent is :class:`InvalidName`, :class:`InvalidBody` or :class:`ConfigError` (also
  ValueErrors), or :class:`LocalProtocolError`.
- Every exception pickles (Spark ships them between processes): ``self.args`` holds exactly
  the constructor's positional arguments; other attributes live in ``__dict__``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthError",
    "ConfigError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DeadLetter",
    "FrameTooLarge",
    "HTTPAPIError",
    "HandshakeError",
    "InvalidBody",
    "InvalidEnvelope",
    "InvalidName",
    "LocalProtocolError",
    "LookupdError",
    "NSQConnectionError",
    "NSQError",
    "ProtocolError",
    "PublishError",
    "PublishOutcomeUnknown",
    "ReadTimeout",
    "RemoteProtocolError",
    "RequeueMessage",
    "ServerAuthDisabled",
    "ServerAuthError",
    "ServerAuthFailed",
    "ServerAuthFirst",
    "ServerBadBody",
    "ServerBadChannel",
    "ServerBadMessage",
    "ServerBadTopic",
    "ServerDPubFailed",
    "ServerError",
    "ServerFinFailed",
    "ServerIdentifyFailed",
    "ServerInvalid",
    "ServerMPubFailed",
    "ServerPubFailed",
    "ServerReqFailed",
    "ServerSubFailed",
    "ServerTouchFailed",
    "ServerUnauthorized",
    "Stopped",
    "TLSError",
    "error_from_frame",
]


class NSQError(Exception):
    """Root of every exception nsq_sync raises."""


# --------------------------------------------------------------------------- local input errors


class ConfigError(NSQError, ValueError):
    """An option has an invalid value or type; the message names the option."""


class InvalidEnvelope(NSQError, ValueError):
    """A body that is not a dead-letter envelope (see :func:`nsq_sync.dead_letter.parse`)."""


class InvalidName(NSQError, ValueError):
    """A topic or channel name breaks nsqd's rules (charset ``[.a-zA-Z0-9_-]``, 1-64 chars)."""


class InvalidBody(NSQError, ValueError):
    """A message body is empty, too large, of the wrong type, or an MPUB holds no messages."""


# --------------------------------------------------------------------------- connection errors


class NSQConnectionError(NSQError):
    """A connection to nsqd could not be made, broke, or misbehaved; ``address`` is the peer's
    ``host:port``, when known."""

    def __init__(self, message: str = "", address: str | None = None) -> None:
        super().__init__(message, address)
        self.address = address

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        return f"{message} ({self.address})" if self.address else message


class ConnectTimeout(NSQConnectionError, TimeoutError):
    """Connecting took too long: the TCP dial outlasted ``dial_timeout`` (or what was left of a
    publish's timeout), or a publish's wait for another thread's attempt outlasted its timeout."""


class ReadTimeout(NSQConnectionError, TimeoutError):
    """Nothing arrived within ``read_timeout`` (missing heartbeats), or an answer or the
    handshake was late."""


class ConnectionClosed(NSQConnectionError):
    """The connection is closed; ``by_server`` is True when nsqd (or the network) closed it, False
    when we did."""

    def __init__(
        self, message: str = "connection closed", address: str | None = None, by_server: bool = True
    ) -> None:
        NSQError.__init__(self, message, address, by_server)
        self.address = address
        self.by_server = by_server


class HandshakeError(NSQConnectionError):
    """The handshake failed in a way no error frame covers: no OK after an upgrade or SUB, or an
    AUTH answer that is not JSON."""


class TLSError(HandshakeError):
    """TLS failed: the certificate did not verify, nsqd refused (or requires) TLS, or a TLS error
    on an established connection."""


class AuthError(HandshakeError):
    """AUTH could not proceed (nsqd requires it and no ``auth_secret`` was given)."""


# --------------------------------------------------------------------------- protocol errors


class ProtocolError(NSQError):
    """Bytes that violate the NSQ protocol."""


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (garbage, truncation, HTTP...)."""


class FrameTooLarge(RemoteProtocolError):
    """A frame announced a size above the configured ``max_frame_size``."""


# --------------------------------------------------------------------------- server error frames


class ServerError(NSQError):
    """nsqd answered with an error frame ``E_<CODE> <text>`` (``code``, ``text``). ``fatal``: nsqd
    closes the connection after it; ``retriable``: the request may succeed later or elsewhere."""

    code: str = "E_UNKNOWN"
    fatal: ClassVar[bool] = True
    retriable: ClassVar[bool] = False

    def __init__(self, code: str | None = None, text: str = "") -> None:
        code = code or type(self).code
        super().__init__(code, text)
        self.code = code
        self.text = text

    def __str__(self) -> str:
        return f"{self.code} {self.text}".rstrip()


class ServerInvalid(ServerError):
    code = "E_INVALID"


class ServerBadBody(ServerError):
    code = "E_BAD_BODY"


class ServerBadTopic(ServerError):
    code = "E_BAD_TOPIC"


class ServerBadChannel(ServerError):
    code = "E_BAD_CHANNEL"


class ServerBadMessage(ServerError):
    code = "E_BAD_MESSAGE"


class ServerPubFailed(ServerError):
    code = "E_PUB_FAILED"
    retriable = True


class ServerMPubFailed(ServerError):
    code = "E_MPUB_FAILED"
    retriable = True


class ServerDPubFailed(ServerError):
    code = "E_DPUB_FAILED"
    retriable = True


class ServerSubFailed(ServerError):
    code = "E_SUB_FAILED"
    retriable = True


class ServerIdentifyFailed(ServerError):
    code = "E_IDENTIFY_FAILED"


class ServerAuthFailed(ServerError):
    """nsqd could not reach its auth server, or the auth server failed."""

    code = "E_AUTH_FAILED"
    retriable = True


class ServerUnauthorized(ServerError):
    """The auth server gave this secret no permission for the topic/channel."""

    code = "E_UNAUTHORIZED"


class ServerAuthDisabled(ServerError):
    code = "E_AUTH_DISABLED"


class ServerAuthFirst(ServerError):
    code = "E_AUTH_FIRST"


class ServerAuthError(ServerError):
    code = "E_AUTH_ERROR"
    retriable = True


class ServerFinFailed(ServerError):
    """FIN for a message nsqd no longer holds in flight (timed out, or another connection's)."""

    code = "E_FIN_FAILED"
    fatal = False


class ServerReqFailed(ServerError):
    code = "E_REQ_FAILED"
    fatal = False


class ServerTouchFailed(ServerError):
    code = "E_TOUCH_FAILED"
    fatal = False


_BY_CODE: dict[str, type[ServerError]] = {
    cls.code: cls
    for cls in (
        ServerInvalid,
        ServerBadBody,
        ServerBadTopic,
        ServerBadChannel,
        ServerBadMessage,
        ServerPubFailed,
        ServerMPubFailed,
        ServerDPubFailed,
        ServerSubFailed,
        ServerIdentifyFailed,
        ServerAuthFailed,
        ServerUnauthorized,
        ServerAuthDisabled,
        ServerAuthFirst,
        ServerAuthError,
        ServerFinFailed,
        ServerReqFailed,
        ServerTouchFailed,
    )
}


def error_from_frame(data: bytes) -> ServerError:
    """The exception for the payload of an error frame (``b"E_CODE text"``); an unknown code is a
    plain, fatal :class:`ServerError` that keeps the code. Never raises."""
    text = data.decode("utf-8", "replace")
    code, _, rest = text.partition(" ")
    cls = _BY_CODE.get(code, ServerError)
    return cls(code or "E_UNKNOWN", rest)


# --------------------------------------------------------------------------- client-level errors


class PublishError(NSQError):
    """A publish did not succeed on any nsqd; ``reason`` is the last underlying error."""

    def __init__(self, message: str, reason: BaseException | None = None) -> None:
        super().__init__(message, reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.args[0]}: {self.reason!r}" if self.reason else str(self.args[0])


class PublishOutcomeUnknown(PublishError):
    """The command may or may not have reached nsqd: it was written, then the connection broke, the
    producer was closed, or the caller's ``timeout`` ran out before nsqd answered (``reason``).
    Not resent unless the Producer has ``retry_unknown=True`` (nsqd may then hold it twice)."""


class HTTPAPIError(NSQError):
    """An nsqd or nsqlookupd HTTP request failed: ``url``, ``status`` (None when no response
    arrived) and ``body`` (truncated) say how."""

    def __init__(
        self, message: str, url: str = "", status: int | None = None, body: str = ""
    ) -> None:
        super().__init__(message, url, status, body)
        self.url = url
        self.status = status
        self.body = body

    def __str__(self) -> str:
        parts = [str(self.args[0])]
        if self.url:
            parts.append(f"url={self.url}")
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.body:
            parts.append(f"body={self.body[:200]!r}")
        return " ".join(parts)


class LookupdError(HTTPAPIError):
    """An nsqlookupd HTTP request failed."""


class Stopped(NSQError):
    """The consumer, producer or HTTP client was stopped or closed and cannot be used any more."""


class RequeueMessage(NSQError):
    """Raise from a handler to requeue the message without logging it as a failure.

    Args:
        delay: seconds before nsqd redelivers it; None uses the consumer's default policy.
        backoff: whether this counts as a failure for the consumer's backoff.
    """

    def __init__(self, delay: float | None = None, backoff: bool = True) -> None:
        super().__init__(delay, backoff)
        self.delay = delay
        self.backoff = backoff


class DeadLetter(NSQError):
    """Raise from a handler (or a batch handler) to give the message up now: "poison, do not
    retry". It goes to the ``dead_letter_topic`` at once, with ``reason`` (bounded in size) in the
    envelope's error; without one, to the give-up handler and is finished, as after
    ``max_attempts``."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
