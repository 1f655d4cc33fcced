"""The ``nsq-sync`` command line's servers: the reachability error (:class:`Unreachable`, exit 1),
the check before a run (one reachable server is enough), nsqlookupd answers, and the guard
against an ephemeral channel taking a new topic's backlog."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from nsq_sync.cli.arguments import UsageError
from nsq_sync.config import Config
from nsq_sync.errors import HTTPAPIError, NSQConnectionError, NSQError
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.http.lookupd import LookupdClient
from nsq_sync.wire.connection import NsqdConnection

__all__ = [
    "DIAL_TIMEOUT",
    "NoSuchTopic",
    "Unreachable",
    "check_lookupd",
    "check_nsqd",
    "check_sources",
    "guard_backlog",
    "host_port",
    "http_call",
    "lookup",
    "lookupd_answers",
    "reachable",
    "unreachable",
    "why",
]

log = logging.getLogger("nsq_sync.cli")

DIAL_TIMEOUT = 5.0


class Unreachable(Exception):
    """A server could not be reached (exit 1); the message names its host:port."""


class NoSuchTopic(Exception):
    """The servers asked have no topic of that name (exit 1); the message names them."""


def host_port(url_or_address: str) -> str:
    """``host:port`` of a URL (an address as it is)."""
    return urlsplit(url_or_address).netloc or url_or_address


def why(exc: BaseException) -> str:
    """A short reason (the innermost OS error's text) for an unreachable server."""
    match = re.search(r"\[Errno -?\d+\] ([^\"'()]+)", str(exc))
    if match:
        return match.group(1).strip().rstrip(".")
    text = str(exc)
    if "timed out" in text.lower():
        return "timed out"
    if "RemoteDisconnected" in text or "BadStatusLine" in text or "aborted" in text:
        return "no HTTP answer (is this its HTTP port?)"
    return "no answer"


def unreachable(what: str, address: str, exc: BaseException) -> Unreachable:
    """The Unreachable naming ``what`` (``"nsqd"``) at ``address`` and why (``exc``)."""
    return Unreachable(f"cannot reach {what} {host_port(address)}: {why(exc)}")


def http_call(what: str, client: Any, call: Any) -> Any:
    """``call(client)``; a request that got no answer, or an HTTP error, becomes one line
    naming the server (Unreachable)."""
    try:
        return call(client)
    except HTTPAPIError as exc:
        if exc.status is None:
            raise unreachable(what, client.address, exc) from None
        raise Unreachable(
            f"{what} {host_port(client.address)} answered HTTP {exc.status} "
            f"({exc.body.strip()[:100] or 'no body'}): is this an {what} HTTP address?"
        ) from None


def reachable(addresses: Sequence[str], check: Any) -> list[str]:
    """The addresses for which ``check(address)`` does not raise Unreachable. Fails fast
    (Unreachable: exit 1, one line naming the first) only when none is reachable, as a consumer
    would retry quietly for ever; with some reachable, each of the others is a warning and the
    command goes on (a consumer or producer reconnects to it when it is back)."""
    ok: list[str] = []
    errors: list[Unreachable] = []
    for address in addresses:
        try:
            check(address)
        except Unreachable as exc:
            errors.append(exc)
        else:
            ok.append(address)
    if errors and not ok:
        raise errors[0]
    for error in errors:
        log.warning("%s; going on with the others", error)
    return ok


def check_nsqd(address: str) -> None:
    """Connect to the nsqd at the TCP ``address`` and close.

    Raises:
        Unreachable: no connection, or nsqd refused the handshake (TLS, AUTH, not nsqd...).
    """
    # a full handshake: a bare TCP connect and close makes nsqd log an ERROR every run
    conn = NsqdConnection(address, Config(dial_timeout=DIAL_TIMEOUT), runtime="threads")
    try:
        conn.connect()
    except NSQConnectionError as exc:
        raise unreachable("nsqd", address, exc) from None
    except NSQError as exc:  # e.g. an HTTP port, TLS or AUTH required
        raise Unreachable(f"nsqd {address}: {exc}") from None
    finally:
        conn.close()


def check_lookupd(address: str) -> None:
    """Ask the nsqlookupd at the HTTP ``address`` for its nodes. Raises Unreachable."""
    # /nodes, not /ping: nsqd answers /ping too, and a consumer given nsqd's HTTP address as a
    # lookupd's would then wait for ever on 404s from /lookup
    with LookupdClient(address) as client:
        http_call("nsqlookupd", client, lambda c: c.nodes())


def lookupd_answers(addresses: Sequence[str], call: Any) -> list[Any]:
    """``call(client)`` on every lookupd that answers (see :func:`reachable`: raises Unreachable
    only when none does)."""
    answers: list[Any] = []

    def ask(address: str) -> None:
        with LookupdClient(address) as client:
            answers.append(http_call("nsqlookupd", client, call))

    reachable(addresses, ask)
    return answers


def lookup(args: argparse.Namespace, topic: str) -> list[str]:
    """The TCP addresses of the nsqds that carry ``topic``, from every lookupd that answers
    (merged, sorted). Raises Unreachable when none answers."""
    found: set[str] = set()
    for producers in lookupd_answers(args.lookupd_http_addresses, lambda c: c.lookup(topic)):
        found.update(p.tcp_address for p in producers)
    return sorted(found)


def check_sources(args: argparse.Namespace) -> None:
    """Check the servers of ``args`` before a run: one nsqd that accepts a connection or one
    lookupd that answers is enough (the others are warnings).

    Raises:
        UsageError: no server given (exit 2).
        Unreachable: none of them could be reached (exit 1).
    """
    if not args.nsqd_tcp_addresses and not args.lookupd_http_addresses:
        raise UsageError("needs --nsqd-tcp-address or --lookupd-http-address")
    # any one reachable source will do (the consumer reconnects to the others)
    nsqds = set(args.nsqd_tcp_addresses)
    reachable(
        [*args.nsqd_tcp_addresses, *args.lookupd_http_addresses],
        lambda a: check_nsqd(a) if a in nsqds else check_lookupd(a),
    )


def _backlogs(args: argparse.Namespace, topic: str) -> tuple[list[tuple[str, int]], list[str]]:
    """What nsqd's HTTP API shows of ``topic`` on the nsqds a consumer of ``args`` reaches:
    ``(nsqd, depth)`` of each one holding messages for a topic with no channel (nsqd keeps them
    for the first channel made), and the nsqds it cannot see (a TCP address with no HTTP one, or
    an HTTP API that did not answer)."""
    views = list(args.nsqd_http_addresses)
    listed: set[str] = set()
    if args.lookupd_http_addresses:
        for producers in lookupd_answers(args.lookupd_http_addresses, lambda c: c.lookup(topic)):
            for producer in producers:
                listed.add(producer.tcp_address)
                if producer.http_address not in views:
                    views.append(producer.http_address)
    unseen = (
        [] if args.nsqd_http_addresses else [a for a in args.nsqd_tcp_addresses if a not in listed]
    )
    backlogs: list[tuple[str, int]] = []
    for address, entry in _topic_entries(views, topic, unseen):
        if entry is not None and not entry.get("channels") and int(entry.get("depth") or 0) > 0:
            backlogs.append((host_port(address), int(entry["depth"])))
    return backlogs, unseen


def guard_backlog(args: argparse.Namespace, topic: str, flag: str) -> None:
    """Before an ephemeral channel is made on ``topic``: nsqd keeps the messages of a topic with
    no channel for the first channel made, and an ephemeral channel would take them and lose
    them when it goes. Raises UsageError (exit 2, nothing made) naming ``flag`` when an nsqd in
    view holds such messages; logs a warning when some nsqd is out of view."""
    backlogs, unseen = _backlogs(args, topic)
    if backlogs:
        held = ", ".join(f"nsqd {address} keeps {n} message(s)" for address, n in backlogs)
        raise UsageError(
            f"topic {topic} has no channel yet: {held} for the first channel made, and an "
            f"ephemeral channel would take them and lose them when it goes. Start the topic's "
            f"real consumer first (its channel then keeps them), or pass {flag} to read them "
            f"anyway"
        )
    if unseen:
        log.warning(
            "cannot see topic %s on nsqd %s (no --nsqd-http-address): if it has no channel yet, "
            "nsqd keeps its messages for the first channel made, and this ephemeral channel "
            "would take them and lose them when it goes",
            topic,
            ", ".join(unseen),
        )


def _http_view(tcp_address: str) -> str | None:
    """The HTTP address of the nsqd at ``tcp_address`` when it listens on the usual port (TCP
    port + 1) and says so in its ``/info``; else None."""
    host, _, port = tcp_address.rpartition(":")
    guess = f"{host}:{int(port) + 1}"
    with NsqdHTTPClient(guess, timeout=DIAL_TIMEOUT) as client:
        try:
            info = client.info()
        except (NSQError, ValueError):
            return None
    return guess if info.get("tcp_port") == int(port) else None


def _topic_entries(
    views: list[str], topic: str, unseen: list[str]
) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """Each nsqd HTTP address with its /stats entry for ``topic`` (None: no such topic); one
    that does not answer is added to ``unseen`` instead."""
    for address in views:
        with NsqdHTTPClient(address, timeout=DIAL_TIMEOUT) as client:
            try:
                entry = client.topic_stats(topic, include_clients=False)
            except HTTPAPIError:
                unseen.append(host_port(address))
                continue
        yield address, entry


def require_topic(args: argparse.Namespace, topic: str) -> None:
    """Before a command that subscribes to ``topic`` (which creates it, and its channel, on
    nsqd): check through nsqd's HTTP API (``--nsqd-http-address``, the nsqds nsqlookupd lists,
    or a ``--nsqd-tcp-address``'s HTTP port next to it) that some nsqd has it.

    Raises:
        NoSuchTopic: every server in view answered, and none has the topic (nothing is made).
    """
    views = list(args.nsqd_http_addresses)
    unseen: list[str] = []
    if args.lookupd_http_addresses:
        for producers in lookupd_answers(args.lookupd_http_addresses, lambda c: c.lookup(topic)):
            if producers:
                return  # an nsqd registered it
    if not views:
        for address in args.nsqd_tcp_addresses:
            view = _http_view(address)
            if view is None:
                unseen.append(address)
            else:
                views.append(view)
    asked: list[str] = []
    for address, entry in _topic_entries(views, topic, unseen):
        if entry is not None:
            return
        asked.append(f"nsqd {host_port(address)}")
    if args.lookupd_http_addresses:
        asked.append("nsqlookupd " + ", ".join(map(host_port, args.lookupd_http_addresses)))
    if unseen:
        log.warning(
            "cannot see whether nsqd %s has topic %s (add --nsqd-http-address to check): if it "
            "does not, this creates it",
            ", ".join(unseen),
            topic,
        )
        return
    raise NoSuchTopic(f"no such topic {topic} (asked {'; '.join(asked)}); nothing was created")
