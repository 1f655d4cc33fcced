"""The ``nsq-sync`` command line's servers: usage and reachability errors, the check before a
run (one reachable server is enough), and nsqlookupd answers."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from nsq_sync.config import Config
from nsq_sync.connection import NsqdConnection
from nsq_sync.errors import HTTPAPIError, NSQConnectionError, NSQError
from nsq_sync.lookupd import LookupdClient

__all__ = [
    "DIAL_TIMEOUT",
    "Unreachable",
    "UsageError",
    "check_lookupd",
    "check_nsqd",
    "check_sources",
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


class UsageError(Exception):
    """Bad usage found after parsing (exit 2, nothing sent)."""


class Unreachable(Exception):
    """A server could not be reached (exit 1); the message names its host:port."""


def host_port(url_or_address: str) -> str:
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
    with LookupdClient(address) as client:
        http_call("nsqlookupd", client, lambda c: c.ping())


def lookupd_answers(addresses: Sequence[str], call: Any) -> list[Any]:
    """``call(client)`` on every lookupd that answers (see _reachable: fails only when none
    does)."""
    answers: list[Any] = []

    def ask(address: str) -> None:
        with LookupdClient(address) as client:
            answers.append(http_call("nsqlookupd", client, call))

    reachable(addresses, ask)
    return answers


def lookup(args: argparse.Namespace, topic: str) -> list[str]:
    """tcp addresses of the nsqds that carry ``topic``, from every lookupd (merged)."""
    found: set[str] = set()
    for producers in lookupd_answers(args.lookupd_http_addresses, lambda c: c.lookup(topic)):
        found.update(p.tcp_address for p in producers)
    return sorted(found)


def check_sources(args: argparse.Namespace) -> None:
    """Usage first (exit 2), then reachability (exit 1): nsqds accept connections, lookupds
    answer."""
    if not args.nsqd_tcp_addresses and not args.lookupd_http_addresses:
        raise UsageError("needs --nsqd-tcp-address or --lookupd-http-address")
    # any one reachable source will do (the consumer reconnects to the others)
    nsqds = set(args.nsqd_tcp_addresses)
    reachable(
        [*args.nsqd_tcp_addresses, *args.lookupd_http_addresses],
        lambda a: check_nsqd(a) if a in nsqds else check_lookupd(a),
    )
