"""Plumbing shared by the nsqd and nsqlookupd HTTP clients.

A malformed address fails at construction, not as a 404 later. Every request has a timeout
(requests has none by default: a hung server must not hang a worker). Fork safety: a client's
own Session is rebuilt once per process; the fork hook closes only the child's socket copies.
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
    """Strip the pre-1.0 ``{"status_code", "status_txt", "data"}`` envelope, if present."""
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
    """Fork hook: close the child's copy of the socket (no shutdown: the parent still uses it)."""
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
    """An HTTPAdapter whose connections are closed in a forked child."""

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
    """Base of the nsqd and nsqlookupd clients; not for direct use."""

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
        """Close the client's own connections (a ``session`` passed in stays open); later requests
        raise :class:`~nsq_sync.errors.Stopped`. Idempotent; never raises."""
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
        """``GET /ping``: True, or :class:`~nsq_sync.errors.HTTPAPIError` for no answer (``status``
        None) or an error status (an unhealthy nsqd answers 500 with the reason in ``body``)."""
        self._request("GET", "/ping")
        return True

    def info(self) -> dict[str, Any]:
        """The server's ``/info`` (nsqd: version, broadcast_address, hostname, ports...;
        nsqlookupd: version). Raises HTTPAPIError for an answer that is not a JSON object."""
        return self._get_json_object("/info")

    # ------------------------------------------------------------------ topic and channel admin
    # Both servers take the same requests; what each does with them is in its client's docstring.

    def create_topic(self, topic: str) -> None:
        """Create a topic (``POST /topic/create``); a no-op if it exists."""
        self._topic_op("create", topic)

    def delete_topic(self, topic: str) -> None:
        """Delete a topic and its channels (``POST /topic/delete``)."""
        self._topic_op("delete", topic)

    def create_channel(self, topic: str, channel: str) -> None:
        """Create a channel of a topic (``POST /channel/create``); a no-op if it exists."""
        self._channel_op("create", topic, channel)

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete a channel of a topic (``POST /channel/delete``)."""
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
        """Send one request; the response if its status is 2xx, else the client's error."""
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
        self._request("POST", f"/topic/{op}", {"topic": validate_topic(topic)})

    def _channel_op(self, op: str, topic: str, channel: str) -> None:
        params = {"topic": validate_topic(topic), "channel": validate_channel(channel)}
        self._request("POST", f"/channel/{op}", params)

    def _get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET ``path``: its JSON payload, unwrapped (an error status in an envelope raises)."""
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
