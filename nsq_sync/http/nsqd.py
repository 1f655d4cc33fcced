"""A small client for nsqd's HTTP API: publishing, stats, and topic/channel administration.

Publishing over HTTP costs a request per call, so the TCP :class:`~nsq_sync.Producer` is the tool
for volume. This client is for scripts, admin tasks, health checks and tests, and for publishing
from places where a long-lived TCP connection is awkward.

nsqd v1.3.0 behaviour this client relies on (checked against the real server):

- Success is a 2xx status. Errors are a 4xx/5xx status with a JSON body ``{"message": "CODE"}``
  (``TOPIC_NOT_FOUND``, ``INVALID_DEFER``, ``MSG_TOO_BIG``...), which the raised error carries.
- There is no ``/dpub`` endpoint; a deferred publish (``delay=``) is ``POST /pub?topic=..&defer=<ms>`` with an
  integer number of milliseconds between 0 and nsqd's ``--max-req-timeout`` (1 h by default).
- ``/channel/create`` and every channel operation need the topic to exist already (404
  ``TOPIC_NOT_FOUND``); creating an existing topic or channel succeeds.
- ``/stats?format=json`` answers ``null`` instead of ``[]`` for some lists (``topics`` when the
  topic filter matches nothing, ``clients`` when clients are excluded, ``producers`` when nothing
  publishes over TCP). :meth:`NsqdHTTPClient.stats` turns those into empty lists.
"""

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
    """Client for one nsqd's HTTP API (default port 4151).

    Every method sends one request (no retries: a publish is not idempotent) with the client's
    timeout, validates topic/channel names and bodies before sending, and returns once nsqd has
    answered. Constructing the client does no I/O.

    Thread-safety: requests does not promise that a ``Session`` is thread-safe. Simple concurrent
    calls on one client work in practice (urllib3's connection pool is thread-safe), but the
    supported pattern is one client per thread; clients are cheap. Safe to use after ``fork()``:
    a client that owns its session opens new connections in the child.

    Topic and channel administration on nsqd: :meth:`delete_topic` deletes the topic's channels
    and messages, and is 404 ``TOPIC_NOT_FOUND`` for an unknown topic; :meth:`create_channel` and
    every other channel operation need the topic to exist already (404 ``TOPIC_NOT_FOUND``);
    :meth:`delete_channel` deletes the channel's messages, and is 404 ``CHANNEL_NOT_FOUND`` for an
    unknown channel.

    Args:
        address: ``host:port``, ``http://host:port`` or ``https://host:port``.
        timeout: seconds (or a :class:`datetime.timedelta`, or ``"250ms"``) allowed for
            connecting, and then for each read, per request; 5 by default.
        session: a ``requests.Session`` to use (for TLS client certificates, proxies, adapters).
            It stays the caller's: :meth:`close` does not close it. By default the client makes
            its own.

    Raises:
        ConfigError: a malformed address (named in the message), a timeout that is not a positive
            number, or a ``session`` that is not a ``requests.Session``.

    Example::

        with NsqdHTTPClient("127.0.0.1:4151") as nsqd:
            nsqd.pub("orders", b"{...}")
            print(nsqd.depth("orders", "billing"))
    """

    _server = "nsqd"

    # ------------------------------------------------------------------ stats

    def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> dict[str, Any]:
        """nsqd's ``/stats?format=json``, optionally filtered to one topic or channel.

        The result has ``version``, ``health``, ``start_time``, ``topics`` (each with
        ``topic_name``, ``depth``, ``message_count``, ``paused``, ``channels``; each channel with
        ``channel_name``, ``depth``, ``in_flight_count``, ``deferred_count``, ``paused``,
        ``clients``...), ``memory`` and ``producers``. Lists nsqd sends as ``null`` are ``[]``.

        Args:
            topic: only this topic (``topics`` is empty when it does not exist).
            channel: only this channel of ``topic``.
            include_clients: False leaves every channel's ``clients`` empty, which is cheaper on
                an nsqd with many consumers.

        Raises:
            InvalidName: a bad topic or channel name (nothing is sent).
            ConfigError: ``channel`` without ``topic``.
            HTTPAPIError: the request failed or the answer is malformed.
            Stopped: the client is closed.
        """
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
        """One topic's entry from :meth:`stats`, or None when nsqd has no such topic.

        Raises:
            InvalidName, HTTPAPIError, Stopped: as :meth:`stats`.
        """
        name = validate_topic(topic)
        for entry in self.stats(name, include_clients=include_clients)["topics"]:
            if isinstance(entry, dict) and entry.get("topic_name") == name:
                return entry
        return None

    def channel_stats(
        self, topic: str, channel: str, *, include_clients: bool = True
    ) -> dict[str, Any] | None:
        """One channel's entry from :meth:`stats`, or None when the topic or channel is missing.

        Raises:
            InvalidName, HTTPAPIError, Stopped: as :meth:`stats`.
        """
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
        """Messages waiting in a topic, or in one of its channels (memory + disk).

        Deferred and in-flight messages are not part of the depth; see ``deferred_count`` and
        ``in_flight_count`` in :meth:`channel_stats`.

        Returns:
            The depth, or None when the topic (or channel) does not exist.

        Raises:
            InvalidName, HTTPAPIError, Stopped: as :meth:`stats`.
        """
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
        """Publish one message (``POST /pub``), creating the topic if needed.

        Args:
            topic: the topic.
            body: non-empty bytes or str (encoded as UTF-8).
            delay: seconds (or a :class:`datetime.timedelta`, or ``"250ms"``) before the
                message becomes visible to consumers; None or 0 for now. Sent as nsqd's
                ``defer`` parameter in whole milliseconds; nsqd rejects more than its
                ``--max-req-timeout`` (1 h by default) with 400 ``INVALID_DEFER``.

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            InvalidBody: an empty body or one that is not bytes/str (nothing is sent).
            ConfigError: a negative, non-finite or non-duration ``delay`` (nothing is sent).
            HTTPAPIError: no answer, or nsqd refused (e.g. 413 ``MSG_TOO_BIG``).
            Stopped: the client is closed.
        """
        params = {"topic": validate_topic(topic)}
        data = to_body(body)
        if delay is not None:
            params["defer"] = str(to_ms(to_seconds(delay, "delay")))
        self._request("POST", "/pub", params, data)

    def dpub(self, topic: str, body: Body, delay: Duration) -> None:
        """Deferred publish: :meth:`pub` with ``delay`` (seconds). Raises as :meth:`pub`."""
        self.pub(topic, body, delay)

    def mpub(self, topic: str, bodies: Iterable[Body], binary: bool = True) -> None:
        """Publish several messages atomically (``POST /mpub``), creating the topic if needed.

        Args:
            topic: the topic.
            bodies: non-empty bytes or str bodies (at least one).
            binary: send nsqd's binary format (a 4-byte count, then a 4-byte size and the bytes
                of each body), which carries any bytes. False sends newline-separated bodies,
                which cannot contain a newline.

        Raises:
            InvalidName: a bad topic name (nothing is sent).
            InvalidBody: no bodies, an empty or non-bytes/str body, a single body instead of a
                sequence, or a newline in a body when ``binary`` is False (nothing is sent).
            HTTPAPIError: no answer, or nsqd refused (e.g. 413 ``BODY_TOO_BIG``).
            Stopped: the client is closed.
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
        """Drop the messages queued in the topic itself (its channels keep theirs).

        Raises:
            InvalidName, HTTPAPIError (404 ``TOPIC_NOT_FOUND``), Stopped: as :meth:`delete_topic`.
        """
        self._topic_op("empty", topic)

    def pause_topic(self, topic: str) -> None:
        """Stop the topic from handing messages to its channels; they queue in the topic.

        Raises:
            InvalidName, HTTPAPIError (404 ``TOPIC_NOT_FOUND``), Stopped: as :meth:`delete_topic`.
        """
        self._topic_op("pause", topic)

    def unpause_topic(self, topic: str) -> None:
        """Resume a paused topic.

        Raises:
            InvalidName, HTTPAPIError (404 ``TOPIC_NOT_FOUND``), Stopped: as :meth:`delete_topic`.
        """
        self._topic_op("unpause", topic)

    # ------------------------------------------------------------------ channel admin

    def empty_channel(self, topic: str, channel: str) -> None:
        """Drop every message of a channel, deferred and in-flight ones included.

        Raises:
            InvalidName, HTTPAPIError (404), Stopped: as :meth:`delete_channel`.
        """
        self._channel_op("empty", topic, channel)

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop delivering the channel's messages to consumers; they keep queueing.

        Raises:
            InvalidName, HTTPAPIError (404), Stopped: as :meth:`delete_channel`.
        """
        self._channel_op("pause", topic, channel)

    def unpause_channel(self, topic: str, channel: str) -> None:
        """Resume a paused channel.

        Raises:
            InvalidName, HTTPAPIError (404), Stopped: as :meth:`delete_channel`.
        """
        self._channel_op("unpause", topic, channel)
