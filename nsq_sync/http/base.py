"""Plumbing shared by the nsqd and nsqlookupd HTTP clients (:mod:`nsq_sync.http`,
:mod:`nsq_sync.http.lookupd`).

Both servers speak the same small HTTP dialect, so one base class owns what they have in common:

- Address parsing (:func:`nsq_sync.addresses.parse_http_address`). Users write
  ``127.0.0.1:4151`` or ``http://127.0.0.1:4151`` (both forms appear in go-nsq, pynsq and the nsq
  tools' flags). Anything else, such as a missing port, an ``ftp://`` scheme or a path, is a
  configuration mistake and fails at construction with the address in the message, rather than
  as a confusing 404 on the first request.
- One constructor, one ``ping``, one ``info`` and one each of the topic and channel calls both
  servers take (``create_topic``, ``delete_topic``, ``create_channel``, ``delete_channel``) for
  both clients, and a timeout checked by :func:`nsq_sync.config.to_seconds` like every other
  duration.
- One ``requests.Session`` per client, so keep-alive connections are reused. Creating a Session
  does no I/O, so constructing a client never touches the network.
- A timeout on every request. requests waits forever by default, and a hung nsqlookupd must not
  hang a worker.
- Uniform errors. Every failure becomes the client's error class (``HTTPAPIError`` or
  ``LookupdError``) with ``url``, ``status`` (None when no response arrived) and ``body``, and
  transport errors are chained with ``from``.
- The pre-1.0 response envelope. nsqd/nsqlookupd before v1.0 wrapped JSON in
  ``{"status_code": .., "status_txt": .., "data": ..}`` unless the request asked for
  ``Accept: application/vnd.nsq; version=1.0``. We always send that header and still unwrap an
  envelope when one arrives.
- Fork safety. A Session's pooled sockets inherited through ``fork()`` (gunicorn, celery, Spark
  workers) must not be used by parent and child at once, so a client that owns its Session starts
  a fresh one when it finds itself in a new process (redis-py's ``_checkpid``), exactly once per
  process however many threads notice it (``nsq_sync.process.PerProcess``), and the fork hook
  closes the child's copies of every socket the client's sessions opened (``nsq_sync.process``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlencode

import requests
import requests.adapters
import urllib3

from nsq_sync import process as _fork
from nsq_sync._version import __version__
from nsq_sync.addresses import parse_http_address
from nsq_sync.durations import Duration, to_seconds
from nsq_sync.errors import ConfigError, HTTPAPIError, Stopped
from nsq_sync.protocol.names import validate_channel, validate_topic

__all__ = [
    "DEFAULT_TIMEOUT",
    "HTTPClientBase",
    "unwrap_envelope",
]

#: Seconds each HTTP request may take (connect, and then each read), unless told otherwise.
DEFAULT_TIMEOUT = 5.0

# Asks pre-1.0 servers for the bare JSON format that v1.x always uses.
_ACCEPT = "application/vnd.nsq; version=1.0"
_USER_AGENT = f"nsq_sync/{__version__}"
# Error bodies from nsqd are tiny ({"message":"TOPIC_NOT_FOUND"}); anything longer is not nsqd.
_MAX_ERROR_BODY = 4096

_C = TypeVar("_C", bound="HTTPClientBase")


def unwrap_envelope(data: Any) -> Any:
    """Strip the pre-1.0 ``{"status_code", "status_txt", "data"}`` envelope, if present.

    v1.x servers return the payload bare; older ones wrapped it unless asked not to. A v1.x payload
    never has all three keys, so the check cannot misfire on current servers. Never raises.
    """
    if isinstance(data, dict) and {"status_code", "status_txt", "data"} <= data.keys():
        return data["data"]
    return data


def _error_text(body: str) -> str:
    """nsqd's error code from a ``{"message": "CODE"}`` body, or the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(data, dict):
        for key in ("message", "status_txt"):  # v1.x, then the pre-1.0 envelope
            if isinstance(data.get(key), str):
                return str(data[key])
    return body.strip()[:200]


def _close_in_child(conn: Any) -> None:
    """The fork hook, in a child: close this process's copy of the connection's socket (never
    shut it down: the parent may still use it), so a request of the parent copied into the
    child (gevent copies every greenlet) cannot read the parent's response."""
    _fork.close_socket(getattr(conn, "sock", None))


class _HTTPPool(urllib3.HTTPConnectionPool):
    def _new_conn(self) -> Any:
        conn = super()._new_conn()
        _fork.track(conn, _close_in_child)
        return conn


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    def _new_conn(self) -> Any:
        conn = super()._new_conn()
        _fork.track(conn, _close_in_child)
        return conn


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _ForkSafeAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose connections are closed in a forked child (see nsq_sync.process)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


def _new_session() -> requests.Session:
    session = requests.Session()
    for prefix in ("http://", "https://"):
        session.mount(prefix, _ForkSafeAdapter())
    return session


class HTTPClientBase:
    """Base of :class:`~nsq_sync.http.NsqdHTTPClient` and :class:`~nsq_sync.http.lookupd.LookupdClient`.

    Not meant to be used directly; see those classes for the constructor arguments.
    """

    #: Raised for every failed request; subclasses narrow it (LookupdError).
    _error_class: ClassVar[type[HTTPAPIError]] = HTTPAPIError
    #: How messages name the server ("nsqd", "nsqlookupd").
    _server: ClassVar[str] = "nsq"

    def __init__(
        self,
        address: str,
        *,
        timeout: Duration = DEFAULT_TIMEOUT,
        session: requests.Session | None = None,
    ) -> None:
        self._base_url, self._address = parse_http_address(address)
        self._timeout = to_seconds(timeout, "timeout", positive=True)
        if session is not None and not isinstance(session, requests.Session):
            raise ConfigError(f"session: expected a requests.Session, got {session!r}")
        self._owns_session = session is None
        # A session of our own is per process (see nsq_sync.process): a forked child builds its
        # own on first use, once; the fork hook already closed the child's copies of the
        # inherited session's sockets (close(2) only: the parent keeps using them). A caller's
        # session is theirs.
        self._sessions: _fork.PerProcess[requests.Session] | None = (
            _fork.PerProcess(_new_session) if session is None else None
        )
        self._session = session
        self._closed = False

    # ------------------------------------------------------------------ public, shared

    @property
    def address(self) -> str:
        """The server's ``host:port`` (normalised; IPv6 hosts in brackets)."""
        return self._address

    @property
    def base_url(self) -> str:
        """``http://host:port`` or ``https://host:port``, without a trailing slash."""
        return self._base_url

    @property
    def timeout(self) -> float:
        """Seconds allowed for connecting and then for each read, per request."""
        return self._timeout

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    def close(self) -> None:
        """Close the client's connections; later requests raise :class:`~nsq_sync.errors.Stopped`.

        A ``session`` passed to the constructor belongs to the caller and is left open. Idempotent;
        never raises.
        """
        if self._closed:
            return
        self._closed = True
        if self._sessions is not None:
            own = self._sessions.peek()  # only this process's; never the parent's
            if own is not None:
                own.close()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} {self._base_url}{state}>"

    def ping(self) -> bool:
        """Check that the server is up and healthy (``GET /ping``).

        Returns:
            True. Failures raise rather than return False.

        Raises:
            HTTPAPIError (LookupdError from a LookupdClient): no answer (``status`` None), or an
                error status (an unhealthy nsqd answers 500 with the reason, e.g. a failing
                disk, in ``body``).
            Stopped: the client is closed.
        """
        self._request("GET", "/ping")
        return True

    def info(self) -> dict[str, Any]:
        """The server's ``/info``: nsqd's version, broadcast_address, hostname, tcp_port,
        http_port...; nsqlookupd's version (v1.3.0 says nothing else).

        Raises:
            HTTPAPIError (LookupdError from a LookupdClient): the request failed or the answer
                is not a JSON object.
            Stopped: the client is closed.
        """
        return self._get_json_object("/info")

    # ------------------------------------------------------------------ topic and channel admin
    # Both servers take the same requests; what each does with them is in its client's docstring.

    def create_topic(self, topic: str) -> None:
        """Create a topic (``POST /topic/create``); a no-op if it exists. Thread-safety: as the
        client's.

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            HTTPAPIError (LookupdError from a LookupdClient): the request failed.
            Stopped: the client is closed.
        """
        self._topic_op("create", topic)

    def delete_topic(self, topic: str) -> None:
        """Delete a topic and its channels (``POST /topic/delete``). Thread-safety: as the
        client's.

        Raises:
            InvalidName, HTTPAPIError (also a 404, see the client's docstring), Stopped: as
                :meth:`create_topic`.
        """
        self._topic_op("delete", topic)

    def create_channel(self, topic: str, channel: str) -> None:
        """Create a channel of a topic (``POST /channel/create``); a no-op if it exists.
        Thread-safety: as the client's.

        Raises:
            InvalidName: a bad topic or channel name (nothing is sent).
            HTTPAPIError (LookupdError from a LookupdClient): the request failed, e.g. a 404
                (the client's docstring says when).
            Stopped: the client is closed.
        """
        self._channel_op("create", topic, channel)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete a channel of a topic (``POST /channel/delete``). Thread-safety: as the
        client's.

        Raises:
            InvalidName, HTTPAPIError (also a 404, see the client's docstring), Stopped: as
                :meth:`create_channel`.
        """
        self._channel_op("delete", topic, channel)

    # ------------------------------------------------------------------ for subclasses

    def _url(self, path: str, params: Mapping[str, str] | None = None) -> str:
        query = f"?{urlencode(params)}" if params else ""
        return f"{self._base_url}{path}{query}"

    def _current_session(self) -> requests.Session:
        if self._closed:
            raise Stopped(f"{type(self).__name__} for {self._base_url} is closed")
        if self._sessions is not None:
            return self._sessions.get()
        assert self._session is not None
        return self._session

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> requests.Response:
        """Send one request; return the response if its status is 2xx.

        Raises:
            HTTPAPIError (or the subclass's error class): with ``status=None`` and the requests
                exception chained when no response arrived, else with the status and body.
            Stopped: the client is closed.
        """
        session = self._current_session()
        url = self._url(path, params)
        where = f"{self._server} {method} {path}"
        try:
            response = session.request(
                method,
                url,
                data=data,
                timeout=self._timeout,
                headers={"Accept": _ACCEPT, "User-Agent": _USER_AGENT},
                allow_redirects=False,
            )
        except requests.Timeout as exc:
            raise self._error_class(
                f"{where}: no response within {self._timeout:g} s ({exc})", url, None
            ) from exc
        except requests.RequestException as exc:
            raise self._error_class(f"{where}: request failed ({exc})", url, None) from exc
        if not 200 <= response.status_code < 300:
            body = response.text[:_MAX_ERROR_BODY]
            raise self._error_class(
                f"{where} failed: {response.status_code} {_error_text(body)}".rstrip(),
                url,
                response.status_code,
                body,
            )
        return response

    def _topic_op(self, op: str, topic: str) -> None:
        """``POST /topic/<op>?topic=`` (both servers administer topics the same way).

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            HTTPAPIError (or subclass), Stopped: as :meth:`_request`.
        """
        self._request("POST", f"/topic/{op}", {"topic": validate_topic(topic)})

    def _channel_op(self, op: str, topic: str, channel: str) -> None:
        """``POST /channel/<op>?topic=&channel=``; raises as :meth:`_topic_op`."""
        params = {"topic": validate_topic(topic), "channel": validate_channel(channel)}
        self._request("POST", f"/channel/{op}", params)

    def _get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET ``path`` and return its decoded JSON payload (envelope removed).

        Raises:
            HTTPAPIError (or subclass): the request failed, the body is not JSON, or a pre-1.0
                envelope reports an error status.
            Stopped: the client is closed.
        """
        response = self._request("GET", path, params)
        url = self._url(path, params)
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            raise self._error_class(
                f"{self._server} GET {path}: response is not JSON ({exc})",
                url,
                response.status_code,
                response.text[:_MAX_ERROR_BODY],
            ) from exc
        if isinstance(data, dict) and {"status_code", "status_txt", "data"} <= data.keys():
            status = data["status_code"]
            if status != 200:
                raise self._error_class(
                    f"{self._server} GET {path} failed: {status} {data['status_txt']}",
                    url,
                    status if isinstance(status, int) else response.status_code,
                    response.text[:_MAX_ERROR_BODY],
                )
        return unwrap_envelope(data)

    def _get_json_object(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Like :meth:`_get_json`, but the payload must be a JSON object."""
        data = self._get_json(path, params)
        if not isinstance(data, dict):
            raise self._malformed(
                path, params, f"expected a JSON object, got {type(data).__name__}", data
            )
        return data

    def _malformed(
        self, path: str, params: Mapping[str, str] | None, reason: str, data: Any
    ) -> HTTPAPIError:
        """The error for a 2xx response whose JSON does not have the documented shape."""
        return self._error_class(
            f"{self._server} GET {path}: unexpected response: {reason}",
            self._url(path, params),
            200,
            json.dumps(data)[:_MAX_ERROR_BODY],
        )
