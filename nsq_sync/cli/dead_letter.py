"""``nsq-sync dead-letter list|replay`` and the ``--dead-letter-topic`` flag of tail and drain.

Both subcommands read the dead-letter topic's durable ``dead-letter`` channel and put back what
they do not replay (see :mod:`nsq_sync.dead_letter`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from nsq_sync import dead_letter
from nsq_sync.cli.arguments import UsageError, add_subcommand, positive_int, positive_seconds
from nsq_sync.cli.servers import check_sources, require_topic
from nsq_sync.config import Config
from nsq_sync.protocol.names import validate_topic

__all__ = ["add_dead_letter_command", "add_dead_letter_flags", "dead_letter_options"]

COLUMNS = ("ID", "AGE", "ATTEMPTS", "FROM", "ERROR", "PREVIEW")
PREVIEW = 40
ERROR_WIDTH = 60


def add_dead_letter_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--dead-letter-topic`` and ``--max-attempts`` to ``parser`` (tail and drain)."""
    parser.add_argument(
        "--dead-letter-topic",
        metavar="TOPIC",
        type=validate_topic,
        help="give a message up after --max-attempts deliveries and publish it to TOPIC "
        "instead of writing it (without it, nothing is ever given up)",
    )
    parser.add_argument(
        "--max-attempts",
        type=positive_int,
        metavar="N",
        help=f"deliveries before a message is dead-lettered (default {Config().max_attempts}; "
        "needs --dead-letter-topic)",
    )


def dead_letter_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Consumer options of tail/drain's dead-letter flags (none without a topic).

    Raises:
        UsageError: ``--max-attempts`` without ``--dead-letter-topic``.
    """
    if args.dead_letter_topic is None:
        if args.max_attempts is not None:
            raise UsageError("--max-attempts needs --dead-letter-topic (else nothing is given up)")
        return {}
    attempts = Config().max_attempts if args.max_attempts is None else args.max_attempts
    return {"dead_letter_topic": args.dead_letter_topic, "max_attempts": attempts}


def add_dead_letter_command(commands: Any) -> None:
    """Add ``dead-letter list`` and ``dead-letter replay`` to ``commands`` (the main parser's
    ``add_subparsers()``)."""
    group = commands.add_parser(
        "dead-letter",
        help="list or replay the messages of a dead-letter topic",
        description="List or replay the messages of a dead-letter topic (its 'dead-letter' "
        "channel).",
    )
    actions = group.add_subparsers(dest="dead_letter_command", metavar="ACTION")
    actions.required = True

    def action(name: str, help: str, description: str) -> argparse.ArgumentParser:
        """An ACTION: it reads a dead-letter TOPIC from the servers of the common options."""
        parser = add_subcommand(actions, name, help, description)
        parser.add_argument("topic", metavar="TOPIC")
        return parser

    listing = action(
        "list",
        help="a table of the messages (each put back as it was)",
        description="Print a table of the messages of a dead-letter topic: id, age, attempts, "
        "origin, error, body preview. Each message is put back as it was.",
    )
    listing.add_argument("--limit", type=positive_int, default=1000, metavar="N")
    listing.add_argument("--idle-timeout", type=positive_seconds, default=2.0, metavar="S")
    listing.set_defaults(func=cmd_list)

    replay = action(
        "replay",
        help="republish the original bodies, then remove them from the dead-letter topic",
        description="Republish each original body to its original topic (or --to) and finish "
        "the dead-letter message once nsqd acknowledged the republish.",
    )
    replay.add_argument("--to", metavar="TOPIC", help="republish everything to this topic")
    replay.add_argument("--max-messages", type=positive_int, metavar="N")
    replay.add_argument("--where", metavar="TEXT", help="only messages whose error contains TEXT")
    replay.add_argument("--idle-timeout", type=positive_seconds, default=2.0, metavar="S")
    replay.add_argument("--max-in-flight", type=positive_int, default=100, metavar="N")
    replay.set_defaults(func=cmd_replay)


def _servers(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    """The server options of list_messages() and replay(), once check_sources() passed and an
    nsqd was seen to have ``topic`` (reading it would create it and a durable channel).

    Raises:
        NoSuchTopic: no nsqd in view has ``topic`` (exit 1, nothing made).
    """
    check_sources(args)
    require_topic(args, topic)
    return {
        "nsqd_tcp_addresses": args.nsqd_tcp_addresses,
        "lookupd_http_addresses": args.lookupd_http_addresses,
        "runtime": "threads",
    }


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _printable(text: str, width: int) -> str:
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[: width - 3] + "..."


def _row(entry: dead_letter.Listed, now: float) -> list[str]:
    record = entry.record
    if record is None:
        preview = _printable(entry.body.decode("utf-8", "replace"), PREVIEW)
        return [entry.message_id, "-", "-", "-", "(not a dead-letter envelope)", preview]
    return [
        record.id,
        _age(now - record.dead_lettered_at),
        str(record.attempts),
        f"{record.topic}/{record.channel}",
        _printable(record.error or "-", ERROR_WIDTH),
        _printable(record.body.decode("utf-8", "replace"), PREVIEW),
    ]


def _table(rows: list[list[str]]) -> str:
    everything = [list(COLUMNS), *rows]
    widths = [max(len(r[i]) for r in everything) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in everything]
    return "\n".join(lines) + "\n"


def cmd_list(args: argparse.Namespace) -> int:
    """``dead-letter list``: the table to stdout, the count to stderr; returns 0. Raises
    NoSuchTopic (exit 1) for a topic no nsqd in view has."""
    topic = validate_topic(args.topic)
    listing = dead_letter.list_messages(
        topic, limit=args.limit, idle_timeout=args.idle_timeout, **_servers(args, topic)
    )
    now = time.time()
    sys.stdout.write(_table([_row(entry, now) for entry in listing.messages]))
    sys.stdout.flush()
    more = "" if listing.complete else f" (the first {args.limit}: there may be more)"
    print(f"{len(listing.messages)} message(s) in {topic}{more}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """``dead-letter replay``: the summary to stderr; returns 0, or 1 if a republish failed."""
    topic = validate_topic(args.topic)
    summary = dead_letter.replay(
        topic,
        to=args.to,
        max_messages=args.max_messages,
        where=args.where,
        idle_timeout=args.idle_timeout,
        max_in_flight=args.max_in_flight,
        **_servers(args, topic),
    )
    print(
        f"replayed {summary.replayed} message(s) from {topic} in {summary.elapsed:.1f} s "
        f"(ended: {summary.reason}); left in place: {summary.skipped} not matching --where, "
        f"{summary.invalid} not envelopes; {summary.failed} failed republish(es)",
        file=sys.stderr,
    )
    return 0 if summary.ok else 1
