"""Addresses as users write them, with one IPv6 rule everywhere (Go's ``net.SplitHostPort``): an
IPv6 host is bracketed, ``[::1]:4150``; ``::1:4150`` is refused rather than guessed at, and
zone ids are not supported. Every function is pure and raises ConfigError naming the value
and the problem, so a bad address fails where it is configured, before any I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable

from nsq_sync.errors import ConfigError

__all__ = [
    "address_list",
    "join_host_port",
    "parse_address",
    "parse_http_address",
    "split_host_port",
]

_PORT_RE = re.compile(r"[0-9]+")
_HOST_RE = re.compile(r"[A-Za-z0-9._-]+")
_IPV6_RE = re.compile(r"[0-9A-Fa-f:.]+")


def split_host_port(
    text: str, *, what: str = "address", original: object = None
) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as ``(host, port)``, IPv6 hosts without brackets; else
    ConfigError, where ``what`` names the value and ``original`` is it as written."""
    shown = text if original is None else original

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"invalid {what} {shown!r}: {reason}")

    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            raise bad("unclosed '[' in IPv6 address")
        host, rest = text[1:end], text[end + 1 :]
        if not rest.startswith(":"):
            raise bad("missing port (expected '[ipv6]:port')")
        port_text = rest[1:]
        if not _IPV6_RE.fullmatch(host) or ":" not in host:
            raise bad(f"{host!r} is not an IPv6 address")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise bad("missing port (expected 'host:port')")
        if ":" in host:
            raise bad("IPv6 addresses must be bracketed, as in '[::1]:4150'")
        if not host:
            raise bad("missing host")
        if not _HOST_RE.fullmatch(host):
            raise bad(f"{host!r} is not a valid host name")
    if not _PORT_RE.fullmatch(port_text):
        raise bad(f"port {port_text!r} is not a number" if port_text else "missing port")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise bad(f"port {port} is out of range 1-65535")
    return host, port


def join_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 hosts like Go's ``net.JoinHostPort``. Never raises."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: object, what: str = "nsqd TCP address") -> tuple[str, int]:
    """Validate an nsqd TCP address (``host:port``, ``[v6]:port``) and split it as
    :func:`split_host_port` does; ConfigError for a URL or anything else not ``host:port``."""
    if not isinstance(address, str):
        raise ConfigError(
            f"invalid {what} {address!r}: expected a str like 'host:port', "
            f"got {type(address).__name__}"
        )
    if "://" in address or "/" in address:
        raise ConfigError(f"invalid {what} {address!r}: expected 'host:port', not a URL")
    return split_host_port(address, what=what)


def parse_http_address(address: object) -> tuple[str, str]:
    """Normalise an nsqd/nsqlookupd HTTP address: ``host:port``, ``http://host:port`` or
    ``https://host:port`` (whitespace and one trailing ``/`` ignored) as ``(base_url,
    host_port)``. Raises ConfigError for a non-str, a missing host or port, another scheme, or a
    path, query, fragment or credentials."""
    if not isinstance(address, str):
        raise ConfigError(
            f"invalid HTTP address {address!r}: expected a str like 'host:port' or "
            f"'http://host:port', got {type(address).__name__}"
        )
    text = address.strip()
    scheme = "http"
    rest = text
    if "://" in text:
        scheme, rest = text.split("://", 1)
        scheme = scheme.lower()
        if scheme not in ("http", "https"):
            raise ConfigError(
                f"invalid HTTP address {address!r}: scheme must be http or https, got {scheme!r}"
            )
    if rest.endswith("/"):
        rest = rest[:-1]
    for char, part in (
        ("/", "a path"),
        ("?", "a query"),
        ("#", "a fragment"),
        ("@", "credentials"),
    ):
        if char in rest:
            raise ConfigError(
                f"invalid HTTP address {address!r}: expected 'host:port' or 'http://host:port' "
                f"without {part}"
            )
    host, port = split_host_port(rest, what="HTTP address", original=address)
    host_port = join_host_port(host, port)
    return f"{scheme}://{host_port}", host_port


def address_list(name: str, value: object) -> tuple[str, ...]:
    """One address, a comma-separated string of them or a list, as a tuple of strings (the
    addresses themselves are checked by :func:`parse_address` and :func:`parse_http_address`).
    Raises ConfigError, naming ``name``, for anything else or an empty entry (``"a,,b"``)."""
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{name} must be 'host:port' or a list of them, got {value!r}")
        items: list[object] = [part.strip() for part in value.split(",")]
    elif isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise ConfigError(f"{name} must be 'host:port' or a list of them, got {value!r}")
    else:
        items = list(value)
    addresses: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{name}: every address must be a non-empty string, got {value!r}")
        if "," in item:
            raise ConfigError(
                f"{name}: {item!r} holds several addresses; pass a list, or one string "
                "with the addresses separated by commas"
            )
        addresses.append(item.strip())
    return tuple(addresses)
