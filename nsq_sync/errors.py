"""The nsq_sync exception hierarchy.

Every exception raised by nsq_sync derives from :class:`NSQError`. Server error frames map to one
class per ``E_*`` code (:func:`error_from_frame`), each carrying ``fatal`` (nsqd closes the
connection after it) and ``retriable`` flags.

Naming: the name says who refused.

- **nsqd refused** (an error frame): :class:`ServerError` and one subclass per code, named
  ``Server`` + the code in CamelCase without ``E_``: ``E_INVALID`` -> :class:`ServerInvalid`,
  ``E_BAD_BODY`` -> :class:`ServerBadBody`, ``E_BAD_TOPIC`` -> :class:`ServerBadTopic`,
  ``E_PUB_FAILED`` -> :class:`ServerPubFailed`, ``E_AUTH_ERROR`` -> :class:`ServerAuthError`...
  (a unit test holds every class to this rule).
- **nsq_sync refused before sending anything** (bad input): :class:`InvalidName` (topic or
  channel), :class:`InvalidBody` (a message body or batch), :class:`ConfigError` (an option, an
  address, a timeout or a delay: every duration goes through :func:`nsq_sync.config.to_seconds`)
  (the first three are also ValueErrors) and :class:`LocalProtocolError` (a command the
  protocol does not allow: a malformed message id, a negative RDY count).

So ``InvalidBody`` is an empty or oversized body caught locally, while ``ServerBadBody`` is nsqd
rejecting one.

Every exception pickles: PySpark and multiprocessing ship exceptions between processes. The rule
that makes this work is simple: ``self.args`` always holds exactly the constructor's positional
arguments, so ``BaseException.__reduce__`` rebuilds the object. Extra attributes live in
``__dict__``, which pickling restores too.
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
    """A connection to nsqd could not be made, broke, or misbehaved.

    Attributes:
        address: ``host:port`` of the peer, when known.
    """

    def __init__(self, message: str = "", address: str | None = None) -> None:
        super().__init__(message, address)
        self.address = address

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        return f"{message} ({self.address})" if self.address else message


class ConnectTimeout(NSQConnectionError, TimeoutError):
    """Connecting (TCP, TLS or handshake) took longer than ``dial_timeout``."""


class ReadTimeout(NSQConnectionError, TimeoutError):
    """Nothing arrived within ``read_timeout`` (missing heartbeats), or a response was late."""


class ConnectionClosed(NSQConnectionError):
    """The connection is closed.

    Attributes:
        by_server: True when nsqd (or the network) closed it, False when we did.
    """

    def __init__(
        self, message: str = "connection closed", address: str | None = None, by_server: bool = True
    ) -> None:
        NSQError.__init__(self, message, address, by_server)
        self.address = address
        self.by_server = by_server


class HandshakeError(NSQConnectionError):
    """Magic, IDENTIFY, TLS/compression upgrade, AUTH or SUB failed in a way not covered by a
    server error frame (for example an unexpected IDENTIFY response)."""


class TLSError(HandshakeError):
    """The TLS upgrade failed: the certificate did not verify, or the server refused TLS."""


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
    """nsqd answered with an error frame ``E_<CODE> <text>``.

    Attributes:
        code: the ``E_*`` code.
        text: nsqd's explanation.
        fatal: nsqd closes the connection after this error.
        retriable: the same request may succeed later (or on another nsqd).
    """

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
    """FIN for a message nsqd no longer considers in flight (timed out, or another connection's)."""

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
    """Build the exception for the payload of an error frame (``b"E_CODE text"``).

    Unknown codes become a plain :class:`ServerError` that keeps the code (fatal, like every
    error nsqd does not document as non-fatal). Never raises.
    """
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
    """The command may or may not have reached nsqd: it was written, and then the connection
    broke, the producer was closed, or the caller's ``timeout`` ran out before nsqd answered.

    The producer does not resend such a command on its own (that is how duplicates happen);
    catch this error to decide, or create the Producer with ``retry_unknown=True`` to have it
    resent (at-least-once: nsqd may then hold the message twice). ``reason`` is the error that
    cut the wait short.
    """


class HTTPAPIError(NSQError):
    """An nsqd or nsqlookupd HTTP request failed.

    Attributes:
        url: the URL requested.
        status: the HTTP status, or None when no response arrived.
        body: the response body (truncated), if any.
    """

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
    """The consumer or producer was stopped/closed and cannot be used any more."""


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
    retry". With a ``dead_letter_topic`` the message goes there at once (the reason, ``str()``
    of this exception, in the envelope's error); without one it goes to the give-up handler and
    is finished, as after ``max_attempts``.

    Args:
        reason: why the message is poison (kept in the dead-letter envelope, bounded in size).
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
