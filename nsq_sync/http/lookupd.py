"""nsqlookupd: the HTTP client and the parsing of its answers.

Consumers find the nsqds that carry a topic by asking nsqlookupd (``GET /lookup?topic=``).
:func:`parse_producers` turns that answer (or ``/nodes``) into :class:`ProducerInfo` values; it is
pure, so the parsing rules are testable without a server and usable on answers fetched elsewhere.
:class:`LookupdClient` wraps the rest of nsqlookupd's HTTP API.

nsqlookupd v1.3.0 behaviour this module relies on (checked against the real server):

- Answers are bare JSON (``{"channels": [...], "producers": [...]}``). Versions before 1.0 wrapped
  them in ``{"status_code", "status_txt", "data"}``; both are accepted.
- ``/lookup`` of an unknown topic is 404 ``TOPIC_NOT_FOUND`` (also for names nsqd would reject).
  A topic that is registered but has no live producer (created through nsqlookupd, or tombstoned)
  is a 200 with ``"producers": []``.
- ``/channels`` of an unknown topic is a 200 with an empty list.
- Tombstoning matches ``node`` against each producer's ``broadcast_address:http_port`` literally
  and answers 200 even when nothing matches.
- Topics stay listed by ``/topics`` after nsqd deletes them: nsqlookupd drops only the producer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nsq_sync.addresses import join_host_port, split_host_port
from nsq_sync.errors import ConfigError, LookupdError
from nsq_sync.http.base import HTTPClientBase, unwrap_envelope
from nsq_sync.protocol.names import validate_topic

__all__ = ["LookupdClient", "ProducerInfo", "parse_producers"]


@dataclass(frozen=True)
class ProducerInfo:
    """One nsqd as nsqlookupd describes it. Immutable and hashable.

    Attributes:
        broadcast_address: the address nsqd asks clients to use (its ``--broadcast-address``).
        hostname: nsqd's host name (informational).
        tcp_port: nsqd's TCP port, for consumers and producers.
        http_port: nsqd's HTTP port.
        version: nsqd's version string, e.g. ``"1.3.0"`` (empty if not reported).
    """

    broadcast_address: str
    hostname: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``broadcast_address:tcp_port`` (IPv6 in brackets): where to connect, and the key that
        identifies an nsqd across lookupds."""
        return join_host_port(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``broadcast_address:http_port`` (IPv6 in brackets), e.g. for
        :class:`~nsq_sync.http.NsqdHTTPClient` or :meth:`LookupdClient.tombstone_topic_producer`."""
        return join_host_port(self.broadcast_address, self.http_port)


def _port(entry: Mapping[str, Any], key: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise LookupdError(f"malformed nsqlookupd producer: {key} is {value!r}, not a port")
    return value


def _producer(entry: Any) -> ProducerInfo:
    if not isinstance(entry, dict):
        raise LookupdError(f"malformed nsqlookupd producer: expected an object, got {entry!r}")
    # "address" is what nsqlookupd called broadcast_address before v0.2.28.
    address = entry.get("broadcast_address", entry.get("address"))
    if not isinstance(address, str) or not address:
        raise LookupdError(f"malformed nsqlookupd producer: no broadcast_address in {entry!r}")
    hostname = entry.get("hostname", "")
    version = entry.get("version", "")
    return ProducerInfo(
        broadcast_address=address,
        hostname=hostname if isinstance(hostname, str) else str(hostname),
        tcp_port=_port(entry, "tcp_port"),
        http_port=_port(entry, "http_port"),
        version=version if isinstance(version, str) else str(version),
    )


def parse_producers(lookup_json: Any) -> list[ProducerInfo]:
    """The producers of a decoded ``/lookup`` or ``/nodes`` answer, in the order given.

    Accepts both the bare v1.x object and the pre-1.0 ``{"status_code", "status_txt", "data"}``
    envelope. ``"producers": null`` counts as none. Pure: no I/O, never mutates its argument.

    Args:
        lookup_json: the decoded JSON (``json.loads`` of the response body).

    Returns:
        One :class:`ProducerInfo` per producer entry (duplicates are kept; merge by
        :attr:`ProducerInfo.tcp_address`).

    Raises:
        LookupdError: the answer does not have the documented shape (not an object, producers not
            a list, an entry without broadcast_address or with a bad port). Its ``url`` is empty;
            :class:`LookupdClient` re-raises with the URL and body filled in.
    """
    data = unwrap_envelope(lookup_json)
    if not isinstance(data, dict):
        raise LookupdError(f"malformed nsqlookupd answer: expected an object, got {data!r}"[:300])
    producers = data.get("producers")
    if producers is None:
        return []
    if not isinstance(producers, list):
        raise LookupdError(f"malformed nsqlookupd answer: producers is {producers!r}"[:300])
    return [_producer(entry) for entry in producers]


def _strings(data: dict[str, Any], key: str) -> list[str] | None:
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


class LookupdClient(HTTPClientBase):
    """Client for one nsqlookupd's HTTP API (default port 4161).

    Every method sends one request with the client's timeout and no retries; names are validated
    before anything is sent. Constructing the client does no I/O.

    Thread-safety: requests does not promise that a ``Session`` is thread-safe. Simple concurrent
    calls on one client work in practice (urllib3's connection pool is thread-safe), but the
    supported pattern is one client per thread (each discovery query makes its own); clients are cheap.
    Safe to use after ``fork()``: a client that owns its session opens new connections in the
    child.

    Topic and channel administration on nsqlookupd changes registrations only:
    :meth:`create_topic` registers a topic without any producer, and :meth:`create_channel` its
    topic too if needed. :meth:`delete_topic` removes a topic's registrations (its channels too)
    and succeeds for an unknown topic, but nsqds that still carry the topic register it again on
    their next update: delete it on the nsqds as well. :meth:`delete_channel` is 404
    ``CHANNEL_NOT_FOUND`` for an unknown channel.

    Args:
        address: ``host:port``, ``http://host:port`` or ``https://host:port``.
        timeout: seconds (or a :class:`datetime.timedelta`, or ``"250ms"``) allowed for
            connecting, and then for each read, per request; 5 by default.
        session: a ``requests.Session`` to use. It stays the caller's: :meth:`close` does not
            close it. By default the client makes its own.

    Raises:
        ConfigError: a malformed address (named in the message), a timeout that is not a positive
            number, or a ``session`` that is not a ``requests.Session``.
    """

    _error_class = LookupdError
    _server = "nsqlookupd"

    def lookup(self, topic: str) -> list[ProducerInfo]:
        """The nsqds that carry ``topic`` (not tombstoned, seen recently).

        Returns:
            The producers; ``[]`` when nsqlookupd does not know the topic (its 404
            ``TOPIC_NOT_FOUND`` is not an error here).

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            LookupdError: the request failed or the answer is malformed.
            Stopped: the client is closed.
        """
        params = {"topic": validate_topic(topic)}
        try:
            data = self._get_json("/lookup", params)
        except LookupdError as exc:
            if exc.status is not None and "TOPIC_NOT_FOUND" in exc.body:
                return []
            raise
        return self._parse(data, "/lookup", params)

    def topics(self) -> list[str]:
        """Every topic nsqlookupd has a registration for (including topics nsqd has deleted).

        Raises:
            LookupdError: the request failed or the answer is malformed.
            Stopped: the client is closed.
        """
        return self._string_list("/topics", None, "topics")

    def channels(self, topic: str) -> list[str]:
        """The channels registered for ``topic``; ``[]`` for an unknown topic.

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            LookupdError: the request failed or the answer is malformed.
            Stopped: the client is closed.
        """
        return self._string_list("/channels", {"topic": validate_topic(topic)}, "channels")

    def nodes(self) -> list[ProducerInfo]:
        """Every nsqd registered with this nsqlookupd (``/nodes``).

        Raises:
            LookupdError: the request failed or the answer is malformed.
            Stopped: the client is closed.
        """
        return self._parse(self._get_json("/nodes"), "/nodes", None)

    def nodes_raw(self) -> dict[str, Any]:
        """``/nodes`` as decoded JSON: ``{"producers": [...]}`` where each producer also has
        ``remote_address``, ``topics`` and ``tombstones`` (a bool per topic, in the same order).

        Raises:
            LookupdError: the request failed or the answer is not a JSON object.
            Stopped: the client is closed.
        """
        return self._get_json_object("/nodes")

    def tombstone_topic_producer(self, topic: str, node: str) -> None:
        """Hide one nsqd from :meth:`lookup` of ``topic`` for nsqlookupd's tombstone lifetime
        (``--tombstone-lifetime``, 45 s by default), so consumers drain it before it is deleted.

        Args:
            topic: the topic.
            node: the nsqd as ``broadcast_address:http_port`` (:attr:`ProducerInfo.http_address`).
                nsqlookupd compares it literally and silently ignores a node it does not know.

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            ConfigError: ``node`` is not ``host:port`` (nothing is sent).
            LookupdError: the request failed.
            Stopped: the client is closed.
        """
        topic_name = validate_topic(topic)
        if not isinstance(node, str):
            raise ConfigError(f"invalid tombstone node {node!r}: expected 'host:http_port'")
        host, port = split_host_port(node.strip(), what="tombstone node")
        # nsqlookupd builds the key with fmt.Sprintf("%s:%d"): IPv6 hosts without brackets.
        self._request("POST", "/topic/tombstone", {"topic": topic_name, "node": f"{host}:{port}"})

    # ------------------------------------------------------------------ helpers

    def _parse(self, data: Any, path: str, params: Mapping[str, str] | None) -> list[ProducerInfo]:
        try:
            return parse_producers(data)
        except LookupdError as exc:
            raise self._malformed(path, params, str(exc.args[0]), data) from exc

    def _string_list(self, path: str, params: Mapping[str, str] | None, key: str) -> list[str]:
        data = self._get_json_object(path, params)
        values = _strings(data, key)
        if values is None:
            raise self._malformed(path, params, f"{key!r} is not a list of strings", data)
        return values
