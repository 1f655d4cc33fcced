"""The ``nsq-sync`` command line's arguments: the argparse types of counts and durations, the
server options every subcommand takes (before or after its name), and :class:`UsageError`.

The types apply the package's own checks, so the command line takes what the API takes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from nsq_sync import config, durations
from nsq_sync.addresses import parse_address, parse_http_address
from nsq_sync.errors import ConfigError

__all__ = [
    "COMMON",
    "PROG",
    "UsageError",
    "add_common",
    "add_subcommand",
    "merge_common",
    "non_negative_seconds",
    "positive_int",
    "positive_seconds",
]

PROG = "nsq-sync"
#: (dest, flag, metavar, help) of the options every subcommand takes, before or after its name
COMMON = (
    ("nsqd_tcp_addresses", "--nsqd-tcp-address", "HOST:PORT", "an nsqd's TCP address"),
    ("lookupd_http_addresses", "--lookupd-http-address", "URL", "an nsqlookupd's HTTP address"),
    ("nsqd_http_addresses", "--nsqd-http-address", "URL", "an nsqd's HTTP address"),
)
#: what the ConfigError of a check calls the value (argparse names the option before it)
_VALUE = "value"


class UsageError(Exception):
    """Bad usage found after parsing (exit 2, nothing sent)."""


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (:func:`nsq_sync.config.positive_int`).

    Raises:
        argparse.ArgumentTypeError: not a whole number, or < 1.
    """
    try:
        value = config.positive_int(_VALUE, int(text))
    except ConfigError as exc:  # (a ValueError too: first)
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    assert value is not None  # the check returns None for None only
    return value


def positive_seconds(text: str) -> float:
    """argparse type: finite seconds > 0 (:func:`nsq_sync.durations.positive_seconds`).

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or <= 0.
    """
    return _seconds(text, durations.positive_seconds)


def non_negative_seconds(text: str) -> float:
    """argparse type: finite seconds >= 0 (:func:`nsq_sync.durations.to_seconds`, a delay).

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or < 0.
    """
    return _seconds(text, lambda name, value: durations.to_seconds(value, name))


def _seconds(text: str, check: Callable[[str, float], float | None]) -> float:
    """``check(name, seconds)`` on ``text`` read as float seconds; its errors as argparse's."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        checked = check(_VALUE, seconds)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert checked is not None  # the checks return None for None only
    return checked


def add_common(parser: argparse.ArgumentParser, prefix: str) -> None:
    """Add the common options (:data:`COMMON` and ``-v``) to ``parser``, stored under ``prefix +
    dest``: ``"top_"`` on the main parser, ``"sub_"`` on a subcommand's, so that
    :func:`merge_common` adds up values given before and after the subcommand."""
    group = parser.add_argument_group("servers")
    for dest, flag, metavar, text in COMMON:
        group.add_argument(
            flag,
            dest=prefix + dest,
            metavar=metavar,
            action="append",
            default=[],
            help=text + " (repeatable)",
        )
    parser.add_argument(
        "-v", "--verbose", dest=prefix + "verbose", action="count", default=0, help="more logs"
    )


def add_subcommand(
    subparsers: Any, name: str, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand ``name`` of ``subparsers`` (argparse's ``add_subparsers()``), taking the
    common options after its name; ``description`` defaults to ``help``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=help if description is None else description
    )
    add_common(parser, "sub_")
    return parser


def merge_common(args: argparse.Namespace) -> None:
    """Set ``args.<dest>`` of each common option to the values given before the subcommand
    then after it, and ``args.verbose`` to the count of both; HTTP addresses become URLs.

    Raises:
        ConfigError: an address is malformed (the message names it).
    """
    for dest, *_ in COMMON:
        setattr(args, dest, getattr(args, "top_" + dest) + getattr(args, "sub_" + dest))
    args.verbose = args.top_verbose + args.sub_verbose
    for address in args.nsqd_tcp_addresses:
        parse_address(address)  # ConfigError names the bad one
    args.lookupd_http_addresses = [parse_http_address(a)[0] for a in args.lookupd_http_addresses]
    args.nsqd_http_addresses = [parse_http_address(a)[0] for a in args.nsqd_http_addresses]
