"""nsqd's HTTP API: publishing, stats and administration. For volume, publish with the TCP
:class:`~nsq_sync.Producer`: over HTTP every publish is a request."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from nsq_sync.durations import Duration, to_seconds
from nsq_sync.errors import ConfigError, HTTPAPIError, InvalidBody
from nsq_sync.http.base import HTTPClientBase
from nsq_sync.protocol.commands import Body, to_bodies, to_body, to_ms
from nsq_sync.protocol.names import validate_channel, validate_topic

__all__ = ["NsqdHTTPClient"]

_U32 = struct.Struct(">I")


def _bodies(bodies: Iterable[Body], *, binary: bool) -> list[bytes]:
    datas = to_bodies(bodies)  # the TCP MPUB's checks: a sequence, not empty, no empty body
    if not binary:
        for i, data in enumerate(datas):
            if b"\n" in data:
                raise InvalidBody(
                    f"message body (message {i}) contains a newline, which the newline-separated "
                    "mpub format cannot carry; use binary=True"
                )
    return datas


def _list_or_empty(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _normalise_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """Replace the ``null`` lists of nsqd's stats JSON with ``[]``, in place."""
    stats["topics"] = _list_or_empty(stats.get("topics"))
    stats["producers"] = _list_or_empty(stats.get("producers"))
    for topic in stats["topics"]:
        if isinstance(topic, dict):
            topic["channels"] = _list_or_empty(topic.get("channels"))
            for channel in topic["channels"]:
                if isinstance(channel, dict):
                    channel["clients"] = _list_or_empty(channel.get("clients"))
    return stats


class NsqdHTTPClient(HTTPClientBase):
    """Client for one nsqd's HTTP API (default port 4151). Construction does no I/O.

    Every method sends one request (no retries: a publish is not idempotent) and raises
    :class:`~nsq_sync.errors.HTTPAPIError` when it fails or the answer is malformed (``status``
    None if no answer came), :class:`~nsq_sync.errors.InvalidName` or
    :class:`~nsq_sync.errors.InvalidBody` for bad input (nothing is sent), and
    :class:`~nsq_sync.errors.Stopped` once closed. Use one client per thread (requests does not
    promise that a Session is thread-safe); clients are cheap. Safe to use after ``fork()``.

    On nsqd, deleting a topic or channel deletes its messages; channel operations need the topic
    to exist; an unknown topic or channel is a 404 (``TOPIC_NOT_FOUND``, ``CHANNEL_NOT_FOUND``).

    Args:
        address: ``host:port``, ``http://host:port`` or ``https://host:port``.
        timeout: seconds (or a :class:`datetime.timedelta`, or ``"250ms"``) for connecting, then
            for each read; 5 by default.
        session: a ``requests.Session`` to use (TLS client certificates, proxies); it stays the
            caller's: :meth:`close` leaves it open.

    Raises:
        ConfigError: a malformed address, a timeout that is not positive, or a ``session`` that is
            not a ``requests.Session``.
    """

    _server = "nsqd"

    # ------------------------------------------------------------------ stats

    def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> dict[str, Any]:
        """nsqd's ``/stats?format=json``: ``version``, ``health``, ``topics`` (each with its
        ``channels``, each channel with its ``clients``), ``memory``, ``producers``..., optionally
        of one ``topic`` (``topics`` empty when it does not exist) or one ``channel`` of it. Lists
        nsqd sends as ``null`` are ``[]``; ``include_clients=False`` leaves ``clients`` empty.
        Raises :class:`~nsq_sync.errors.ConfigError` for a ``channel`` without ``topic``."""
        params = {"format": "json", "include_clients": "true" if include_clients else "false"}
        if channel is not None and topic is None:
            raise ConfigError("stats: channel filter needs a topic")
        if topic is not None:
            params["topic"] = validate_topic(topic)
        if channel is not None:
            params["channel"] = validate_channel(channel)
        stats = self._get_json_object("/stats", params)
        if stats.get("topics") is not None and not isinstance(stats["topics"], list):
            raise self._malformed("/stats", params, "'topics' is not a list", stats)
        return _normalise_stats(stats)

    def topic_stats(self, topic: str, *, include_clients: bool = True) -> dict[str, Any] | None:
        """One topic's entry of :meth:`stats`, or None when nsqd has no such topic."""
        name = validate_topic(topic)
        for entry in self.stats(name, include_clients=include_clients)["topics"]:
            if isinstance(entry, dict) and entry.get("topic_name") == name:
                return entry
        return None

    def channel_stats(
        self, topic: str, channel: str, *, include_clients: bool = True
    ) -> dict[str, Any] | None:
        """One channel's entry of :meth:`stats`, or None when the topic or channel is missing."""
        topic_name = validate_topic(topic)
        channel_name = validate_channel(channel)
        stats = self.stats(topic_name, channel_name, include_clients=include_clients)
        for entry in stats["topics"]:
            if isinstance(entry, dict) and entry.get("topic_name") == topic_name:
                for chan in entry["channels"]:
                    if isinstance(chan, dict) and chan.get("channel_name") == channel_name:
                        return chan
        return None

    def depth(self, topic: str, channel: str | None = None) -> int | None:
        """Messages waiting in a topic, or in one of its channels (deferred and in-flight ones not
        counted), or None when it does not exist."""
        if channel is None:
            entry = self.topic_stats(topic, include_clients=False)
        else:
            entry = self.channel_stats(topic, channel, include_clients=False)
        if entry is None:
            return None
        value = entry.get("depth")
        if isinstance(value, bool) or not isinstance(value, int):
            raise HTTPAPIError(f"nsqd /stats: 'depth' is not an integer: {value!r}", self.base_url)
        return value

    # ------------------------------------------------------------------ publishing

    def pub(self, topic: str, body: Body, delay: Duration | None = None) -> None:
        """Publish one message (``POST /pub``), creating the topic if needed. ``delay`` (seconds, a
        :class:`datetime.timedelta` or ``"250ms"``) defers it, up to nsqd's ``--max-req-timeout``
        (1 h by default; beyond: 400 ``INVALID_DEFER``). A negative, non-finite or non-duration
        ``delay`` raises :class:`~nsq_sync.errors.ConfigError` (nothing is sent)."""
        params = {"topic": validate_topic(topic)}
        data = to_body(body)
        if delay is not None:
            params["defer"] = str(to_ms(to_seconds(delay, "delay")))
        self._request("POST", "/pub", params, data)

    def dpub(self, topic: str, body: Body, delay: Duration) -> None:
        """:meth:`pub` with a ``delay``."""
        self.pub(topic, body, delay)

    def mpub(self, topic: str, bodies: Iterable[Body], binary: bool = True) -> None:
        """Publish several messages atomically (``POST /mpub``), creating the topic if needed.
        ``binary=False`` sends newline-separated bodies: a body with a newline then raises
        :class:`~nsq_sync.errors.InvalidBody`, as do no bodies and a single body (not a sequence).
        """
        params = {"topic": validate_topic(topic)}
        datas = _bodies(bodies, binary=binary)
        if binary:
            params["binary"] = "true"
            parts = [_U32.pack(len(datas))]
            for data in datas:
                parts.append(_U32.pack(len(data)))
                parts.append(data)
            payload = b"".join(parts)
        else:
            payload = b"\n".join(datas)
        self._request("POST", "/mpub", params, payload)

    # ------------------------------------------------------------------ topic admin
    # create_topic, delete_topic, create_channel and delete_channel are HTTPClientBase's.

    def empty_topic(self, topic: str) -> None:
        """Drop the messages queued in the topic itself (its channels keep theirs)."""
        self._topic_op("empty", topic)

    def pause_topic(self, topic: str) -> None:
        """Stop the topic handing messages to its channels; they queue in the topic."""
        self._topic_op("pause", topic)

    def unpause_topic(self, topic: str) -> None:
        """Resume a paused topic."""
        self._topic_op("unpause", topic)

    # ------------------------------------------------------------------ channel admin

    def empty_channel(self, topic: str, channel: str) -> None:
        """Drop every message of a channel, deferred and in-flight ones included."""
        self._channel_op("empty", topic, channel)

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop delivering the channel's messages to consumers; they keep queueing."""
        self._channel_op("pause", topic, channel)

    def unpause_channel(self, topic: str, channel: str) -> None:
        """Resume a paused channel."""
        self._channel_op("unpause", topic, channel)
