"""nsqlookupd's HTTP client, and the parsing of its answers (pure: :func:`parse_producers` also
reads answers fetched elsewhere)."""

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
    """One nsqd as nsqlookupd describes it; immutable, hashable. ``broadcast_address`` is nsqd's
    ``--broadcast-address``; ``version`` is empty when not reported."""

    broadcast_address: str
    hostname: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``broadcast_address:tcp_port`` (IPv6 bracketed), where to connect; the nsqd's key."""
        return join_host_port(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``broadcast_address:http_port`` (IPv6 bracketed), e.g. for
        :meth:`LookupdClient.tombstone_topic_producer`."""
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
    """The producers of a decoded ``/lookup`` or ``/nodes`` answer (bare or in the pre-1.0
    envelope), in order, duplicates kept (merge by :attr:`ProducerInfo.tcp_address`). Pure;
    raises :class:`~nsq_sync.errors.LookupdError` (``url`` empty) for an answer of another shape.
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
    """Client for one nsqlookupd's HTTP API (default port 4161). Construction does no I/O.

    Constructor, errors, thread- and fork-safety as for :class:`~nsq_sync.http.NsqdHTTPClient`,
    but a failed request raises :class:`~nsq_sync.errors.LookupdError` (an HTTPAPIError).

    Administration changes registrations only: :meth:`create_topic` registers a topic with no
    producer; :meth:`delete_topic` succeeds for an unknown topic, but nsqds that still carry it
    register it again (delete it on them too); :meth:`delete_channel` of an unknown channel is 404
    ``CHANNEL_NOT_FOUND``.
    """

    _error_class = LookupdError
    _server = "nsqlookupd"

    def lookup(self, topic: str) -> list[ProducerInfo]:
        """The nsqds that carry ``topic`` (not tombstoned, seen recently); ``[]`` for a topic
        nsqlookupd does not know (its 404 ``TOPIC_NOT_FOUND`` is not an error here)."""
        params = {"topic": validate_topic(topic)}
        try:
            data = self._get_json("/lookup", params)
        except LookupdError as exc:
            if exc.status is not None and "TOPIC_NOT_FOUND" in exc.body:
                return []
            raise
        return self._parse(data, "/lookup", params)

    def topics(self) -> list[str]:
        """Every topic registered, including topics nsqd has deleted (nsqlookupd keeps them)."""
        return self._string_list("/topics", None, "topics")

    def channels(self, topic: str) -> list[str]:
        """The channels registered for ``topic``; ``[]`` for an unknown topic."""
        return self._string_list("/channels", {"topic": validate_topic(topic)}, "channels")

    def nodes(self) -> list[ProducerInfo]:
        """Every nsqd registered with this nsqlookupd (``/nodes``)."""
        return self._parse(self._get_json("/nodes"), "/nodes", None)

    def nodes_raw(self) -> dict[str, Any]:
        """``/nodes`` as decoded JSON: each producer also has ``remote_address``, ``topics`` and
        ``tombstones`` (a bool per topic, in the same order)."""
        return self._get_json_object("/nodes")

    def tombstone_topic_producer(self, topic: str, node: str) -> None:
        """Hide nsqd ``node`` from :meth:`lookup` of ``topic`` for nsqlookupd's
        ``--tombstone-lifetime`` (45 s by default), so consumers drain it before it is deleted.
        ``node`` is :attr:`ProducerInfo.http_address` (an unknown one is silently ignored); a
        ``node`` that is not ``host:port`` raises :class:`~nsq_sync.errors.ConfigError`."""
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
