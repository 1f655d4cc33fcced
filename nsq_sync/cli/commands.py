"""The ``nsq-sync`` subcommands pub, tail, drain, stats and lookup.

Each ``cmd_*`` takes the parsed arguments and returns the exit status; bad usage raises
UsageError, ConfigError, InvalidName or InvalidBody (exit 2), an unreachable server Unreachable
(exit 1), which ``main`` turns into one line.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from nsq_sync.cli.arguments import (
    PROG,
    UsageError,
    add_subcommand,
    non_negative_seconds,
    positive_int,
    positive_seconds,
)
from nsq_sync.cli.dead_letter import add_dead_letter_flags, dead_letter_options
from nsq_sync.cli.metrics import add_metrics_options, serve_metrics
from nsq_sync.cli.output import STATS_COLUMNS, ReaderGone, stats_rows, table, writer
from nsq_sync.cli.progress import Progress
from nsq_sync.cli.servers import (
    NoSuchTopic,
    Unreachable,
    check_nsqd,
    check_sources,
    guard_backlog,
    host_port,
    http_call,
    lookup,
    lookupd_answers,
    reachable,
)
from nsq_sync.consumer import Consumer
from nsq_sync.errors import HTTPAPIError, InvalidBody
from nsq_sync.http import NsqdHTTPClient
from nsq_sync.http.lookupd import LookupdClient
from nsq_sync.producer import Producer
from nsq_sync.protocol.names import validate_channel, validate_topic

__all__ = ["add_commands", "cmd_drain", "cmd_lookup", "cmd_pub", "cmd_stats", "cmd_tail"]

log = logging.getLogger("nsq_sync.cli")


def add_commands(commands: Any) -> None:
    """Add pub, tail, drain, stats and lookup to ``commands`` (the main parser's
    ``add_subparsers()``), each with the common options."""

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return add_subcommand(commands, name, text)

    pub = command("pub", "publish BODY arguments, or one message per stdin line")
    pub.add_argument("topic", metavar="TOPIC")
    pub.add_argument("bodies", metavar="BODY", nargs="*", help="message bodies (UTF-8)")
    pub.add_argument("--delay", type=non_negative_seconds, help="defer each message S seconds")
    pub.add_argument("--batch", type=positive_int, default=1, help="N messages per MPUB")
    pub.add_argument("--rate", type=positive_seconds, help="at most R messages per second")
    pub.set_defaults(func=cmd_pub)

    tail = command("tail", "print messages as they arrive (an ephemeral channel by default)")
    tail.add_argument("topic", metavar="TOPIC")
    tail.add_argument("-c", "--channel", help="channel (default: a new ephemeral one)")
    tail.add_argument("-n", type=positive_int, dest="count", help="exit after N messages")
    tail.add_argument("--format", choices=("raw", "json"), default="raw")
    tail.add_argument(
        "--take-backlog",
        action="store_true",
        help="on a topic with no channel yet, read the messages nsqd keeps for its first "
        "channel (by default tail refuses: its ephemeral channel would lose them)",
    )
    add_dead_letter_flags(tail)
    add_metrics_options(tail)
    tail.set_defaults(func=cmd_tail)

    drain = command("drain", "consume a channel until it is idle, then exit")
    drain.add_argument("topic", metavar="TOPIC")
    drain.add_argument("channel", metavar="CHANNEL")
    drain.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    drain.add_argument("--idle-timeout", type=positive_seconds, default=5.0, metavar="S")
    drain.add_argument("--max-messages", type=positive_int, metavar="N")
    drain.add_argument("--timeout", type=positive_seconds, metavar="S", help="stop after S s")
    drain.add_argument("--max-in-flight", type=positive_int, default=100, metavar="N")
    drain.add_argument("--format", choices=("raw", "json"), default="raw")
    add_dead_letter_flags(drain)
    add_metrics_options(drain)
    drain.set_defaults(func=cmd_drain)

    stats = command("stats", "topics and channels of nsqd(s) as a table")
    stats.add_argument("--topic", help="only this topic")
    stats.set_defaults(func=cmd_stats)

    lookup = command("lookup", "the nsqds that carry TOPIC, from nsqlookupd")
    lookup.add_argument("topic", metavar="TOPIC")
    lookup.set_defaults(func=cmd_lookup)


def _consumer(args: argparse.Namespace, channel: str, handler: Any, **options: Any) -> Consumer:
    """The Consumer of tail and drain on ``args.topic``/``channel``, with the servers and the
    dead-letter flags of ``args``. Raises UsageError (``--max-attempts`` alone)."""
    return Consumer(
        args.topic,
        channel,
        handler,
        nsqd_tcp_addresses=args.nsqd_tcp_addresses,
        lookupd_http_addresses=args.lookupd_http_addresses,
        runtime="threads",
        # Writing a message out is its handling: never give one up (the default give-up
        # finishes it unwritten), however often other consumers failed on it before; unless
        # --dead-letter-topic keeps what is given up there.
        **{"max_attempts": 0, **options, **dead_letter_options(args)},
    )


def _stdin_bodies(stdin: BinaryIO) -> Iterator[bytes]:
    """The lines of ``stdin`` without their line ends; empty lines are skipped (and counted in
    one warning at the end)."""
    skipped = 0
    for line in stdin:
        body = line.rstrip(b"\n").rstrip(b"\r")
        if body:
            yield body
        else:
            skipped += 1
    if skipped:
        log.warning("skipped %d empty line(s): nsqd rejects empty messages", skipped)


def _chunks(bodies: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """``bodies`` in lists of ``size`` (the last one may be shorter)."""
    chunk: list[bytes] = []
    for body in bodies:
        chunk.append(body)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_pub(args: argparse.Namespace) -> int:
    """``pub``: publish the BODY arguments, or each stdin line, to the reachable nsqds (those
    of nsqlookupd without --nsqd-tcp-address); returns 0. Raises PublishError when one fails."""
    topic = validate_topic(args.topic)
    if args.delay is not None and args.batch > 1:
        raise UsageError("--delay publishes one message at a time (DPUB): drop --batch")
    bodies: Iterable[bytes]
    if args.bodies:
        # UTF-8; argv bytes that are not UTF-8 (surrogate-escaped by Python) pass through as is
        encoded = [b.encode("utf-8", "surrogateescape") for b in args.bodies]
        for index, body in enumerate(encoded):
            if not body:
                raise InvalidBody(f"BODY {index + 1} is empty: nsqd rejects empty messages")
        bodies = encoded
    else:
        if sys.stdin.isatty():  # not a silent wait: say what it waits for
            print(
                f"{PROG} pub: reading messages from standard input, one per line (end with Ctrl-D)",
                file=sys.stderr,
                flush=True,
            )
        bodies = _stdin_bodies(sys.stdin.buffer)
    addresses = list(args.nsqd_tcp_addresses)
    if not addresses and args.lookupd_http_addresses:
        for nodes in lookupd_answers(args.lookupd_http_addresses, lambda c: c.nodes()):
            addresses += [n.tcp_address for n in nodes if n.tcp_address not in addresses]
        if not addresses:
            raise Unreachable("no nsqd is registered with nsqlookupd")
    if not addresses:
        raise UsageError("needs --nsqd-tcp-address or --lookupd-http-address")
    # one clear line now rather than retries until the publish timeout when none is up; the
    # reachable ones first (the producer fails over to the others if they come back)
    up = reachable(addresses, check_nsqd)
    addresses = up + [a for a in addresses if a not in up]
    sent = 0
    began = time.monotonic()
    with Producer(addresses) as producer:
        for chunk in _chunks(bodies, args.batch):
            if args.rate is not None:  # pace: chunk k may start at k * batch / rate
                wait = began + sent / args.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            if args.delay is not None:
                producer.deferred_publish(topic, chunk[0], delay=args.delay)
            elif len(chunk) == 1:
                producer.publish(topic, chunk[0])
            else:
                producer.multi_publish(topic, chunk)
            sent += len(chunk)
    log.info(
        "published %d message%s to topic %s on nsqd %s",
        sent,
        "" if sent == 1 else "s",
        topic,
        _nsqds(addresses),
    )
    return 0


def _nsqds(addresses: list[str]) -> str:
    """Where a Producer given ``addresses`` publishes: the first, failing over to the rest."""
    if len(addresses) == 1:
        return addresses[0]
    return f"{addresses[0]} (failing over to {', '.join(addresses[1:])} if it was down)"


def cmd_tail(args: argparse.Namespace) -> int:
    """``tail``: write each message to stdout until -n, SIGTERM/SIGINT or a closed pipe;
    returns the run's exit status."""
    validate_topic(args.topic)
    if args.channel is None:
        channel = f"nsq_sync_tail{random.randrange(10**6):06d}#ephemeral"
    else:
        channel = validate_channel(args.channel)
    check_sources(args)
    if channel.endswith("#ephemeral") and not args.take_backlog:
        guard_backlog(args, args.topic, "--take-backlog")
    serve_metrics(args)
    max_in_flight = 200  # run(max_messages=) lowers it to what --count leaves
    reader_gone = ReaderGone()
    consumer = _consumer(
        args,
        channel,
        writer(sys.stdout.buffer, args.format, on_broken_pipe=reader_gone),
        max_in_flight=max_in_flight,
    )
    reader_gone.consumer = consumer
    summary = consumer.run(max_messages=args.count)
    return summary.exit_status


def cmd_drain(args: argparse.Namespace) -> int:
    """``drain``: write the channel's messages to -o (or stdout) until it is idle, with a
    progress line on a terminal; returns the run's exit status."""
    validate_topic(args.topic)
    channel = validate_channel(args.channel)
    check_sources(args)
    no_nsqd = args.lookupd_http_addresses and not args.nsqd_tcp_addresses
    if no_nsqd and not lookup(args, args.topic):
        log.info("no nsqd carries %s: nothing to drain", args.topic)
        return 0
    serve_metrics(args)
    progress = Progress(sys.stderr, "messages")
    output: BinaryIO = sys.stdout.buffer
    if args.output not in (None, "-"):
        try:
            output = open(args.output, "wb")  # noqa: SIM115 (closed below, after the run)
        except OSError as exc:
            raise UsageError(f"cannot open -o {args.output}: {exc.strerror or exc}") from None
    reader_gone = ReaderGone() if output is sys.stdout.buffer else None
    try:
        consumer = _consumer(
            args,
            channel,
            writer(output, args.format, progress, on_broken_pipe=reader_gone),
            max_in_flight=args.max_in_flight,
        )
        if reader_gone is not None:
            reader_gone.consumer = consumer
        progress.start()
        summary = consumer.run(
            timeout=args.timeout, idle_timeout=args.idle_timeout, max_messages=args.max_messages
        )
    finally:
        if output is not sys.stdout.buffer:
            try:
                output.close()
            except OSError as exc:
                # Every message is written unbuffered before its FIN (see writer()):
                # nothing of a finished message is left to write here.
                log.warning(
                    "closing %s: %s",
                    args.output,
                    exc.strerror or exc,
                )
    progress.close(
        f"drained {summary.finished} message(s) from {args.topic}/{channel} in "
        f"{summary.elapsed:.1f} s ({progress.rate():.1f}/s; ended: {summary.reason})"
    )
    if summary.reason == "unreachable":
        log.error("ended with no nsqd connected for --idle-timeout (see the warnings above)")
    elif not summary.ok:
        log.error(
            "%d handler call(s) failed and %d message(s) were given up; failed messages were "
            "requeued",
            summary.failed,
            summary.gave_up,
        )
    return summary.exit_status


def cmd_stats(args: argparse.Namespace) -> int:
    """``stats``: the table of every nsqd that answers to stdout; returns 1 if some did not.
    Raises NoSuchTopic (exit 1) when ``--topic`` names a topic none of them has."""
    topic = None if args.topic is None else validate_topic(args.topic)
    addresses = list(args.nsqd_http_addresses)
    if not addresses:
        if not args.lookupd_http_addresses:
            raise UsageError("needs --nsqd-http-address or --lookupd-http-address")
        for address in args.lookupd_http_addresses:
            with LookupdClient(address) as client:
                nodes = http_call("nsqlookupd", client, lambda c: c.nodes())
            addresses += [n.http_address for n in nodes if n.http_address not in addresses]
    rows: list[list[str]] = []
    failures: list[str] = []
    for address in addresses:
        with NsqdHTTPClient(address) as client:
            try:
                stats = http_call("nsqd", client, lambda c: c.stats(topic=topic))
            except (Unreachable, HTTPAPIError) as exc:
                failures.append(str(exc))
                continue
        rows += stats_rows(host_port(address), stats)
    if topic is not None and not rows and not failures:
        if not addresses:
            raise NoSuchTopic(f"no such topic {topic}: no nsqd is registered with nsqlookupd")
        raise NoSuchTopic(f"no such topic {topic} on nsqd {', '.join(map(host_port, addresses))}")
    if rows or not failures:
        sys.stdout.write(table(STATS_COLUMNS, rows))
    for failure in failures:
        print(f"{PROG} stats: {failure}", file=sys.stderr)
    return 1 if failures else 0


def cmd_lookup(args: argparse.Namespace) -> int:
    """``lookup``: the TCP address of each nsqd that carries TOPIC, a line each; returns 0.
    Raises NoSuchTopic (exit 1) when no nsqd carries it."""
    topic = validate_topic(args.topic)
    if not args.lookupd_http_addresses:
        raise UsageError("needs --lookupd-http-address")
    addresses = lookup(args, topic)
    if not addresses:
        lookupds = ", ".join(map(host_port, args.lookupd_http_addresses))
        known = any(
            topic in topics for topics in lookupd_answers(args.lookupd_http_addresses, _topics)
        )
        if not known:
            raise NoSuchTopic(f"no such topic {topic}: nsqlookupd {lookupds} does not know it")
        raise NoSuchTopic(
            f"no nsqd carries topic {topic}: nsqlookupd {lookupds} knows it, but has no nsqd "
            "registered for it now"
        )
    for address in addresses:
        print(address)
    return 0


def _topics(client: LookupdClient) -> list[str]:
    return client.topics()
