"""The ``nsq-sync`` command line (also ``python -m nsq_sync``): the parser and the exit status.

Data goes to stdout; logs, errors and progress go to stderr. Exit status: 0 done (SIGTERM or
SIGINT on tail or drain is a graceful stop), 1 messages failed, a server could not be
reached or a topic looked up does not exist, 2 bad usage or a bad name (nothing sent).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from nsq_sync._version import __version__
from nsq_sync.cli.arguments import PROG, UsageError, add_common, merge_common
from nsq_sync.cli.commands import add_commands
from nsq_sync.cli.dead_letter import add_dead_letter_command
from nsq_sync.cli.output import stdout_to_devnull
from nsq_sync.cli.servers import NoSuchTopic, Unreachable, why
from nsq_sync.errors import (
    ConfigError,
    InvalidBody,
    InvalidName,
    NSQConnectionError,
    NSQError,
    PublishError,
)

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The ``nsq-sync`` parser: ``--version``, the common options, and every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Publish to, read from and inspect NSQ from a shell."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_common(parser, "top_")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    add_commands(commands)
    add_dead_letter_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); return its exit status.

    Errors are one line on stderr. argparse's usage errors (a malformed address among them),
    ``--help`` and ``--version`` raise SystemExit (2 or 0)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    where = f"{PROG} {args.command}"
    try:
        merge_common(args)
    except ConfigError as exc:
        parser.error(str(exc))
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(stream=sys.stderr, level=level, format=f"{where}: %(message)s")
    try:
        status: int = args.func(args)
        return status
    except BrokenPipeError:  # `nsq-sync stats | head -1`: the reader had what it wanted
        stdout_to_devnull()
        return 0
    except (UsageError, InvalidName, InvalidBody, ConfigError) as exc:
        print(f"{where}: error: {exc}", file=sys.stderr)
        return 2
    except (Unreachable, NoSuchTopic) as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return 1
    except PublishError as exc:
        reason = exc.reason
        if isinstance(reason, NSQConnectionError) and reason.address:
            print(f"{where}: cannot reach nsqd {reason.address}: {why(reason)}", file=sys.stderr)
        else:
            print(f"{where}: {exc}", file=sys.stderr)
        return 1
    except NSQError as exc:  # a server refused or broke the protocol (TLS, AUTH...)
        print(f"{where}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1


def run() -> None:
    """The console script's entry point: exit with :func:`main`'s status."""
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
