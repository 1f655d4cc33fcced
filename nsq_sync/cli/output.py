"""Output of the ``nsq-sync`` command line: message lines (raw or JSON), the stats table, and
what is done when nobody reads standard output any more."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from nsq_sync.cli.progress import Progress
from nsq_sync.consumer import Consumer
from nsq_sync.errors import RequeueMessage
from nsq_sync.message import Message

__all__ = [
    "STATS_COLUMNS",
    "ReaderGone",
    "format_message",
    "stats_rows",
    "stdout_to_devnull",
    "table",
    "writer",
]


def format_message(message: Message, fmt: str) -> bytes:
    """One output line: ``raw`` is the body and a newline; ``json`` an object with ``id``,
    ``timestamp`` (ns), ``attempts`` and ``body`` (UTF-8 text; a body that is not UTF-8 also
    gets ``body_base64``, so no byte is lost)."""
    if fmt == "raw":
        return message.body + b"\n"
    record: dict[str, Any] = {
        "id": message.id.decode("ascii", "replace"),
        "timestamp": message.timestamp,
        "attempts": message.attempts,
    }
    try:
        record["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:  # keep every byte: the exact body in base64 beside a readable one
        record["body"] = message.body.decode("utf-8", "replace")
        record["body_base64"] = base64.b64encode(message.body).decode("ascii")
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


def writer(
    stream: BinaryIO,
    fmt: str,
    progress: Progress | None = None,
    on_broken_pipe: Callable[[], None] | None = None,
) -> Any:
    """A handler writing each message to ``stream`` before it returns (and the message is
    finished). The line goes straight to the unbuffered layer, so a failed write leaves nothing
    in a buffer to be written again with the requeued message. ``on_broken_pipe`` is called
    when a pipe's reader has gone; the message is then requeued at once, without backoff.
    """
    stream.flush()
    raw = getattr(stream, "raw", stream)

    def handle(message: Message) -> None:
        data = memoryview(format_message(message, fmt))
        try:
            while data:
                written = raw.write(data)
                if written is None:  # (a non-blocking stream that would block)
                    raise BlockingIOError("output would block")
                data = data[written:]
        except BrokenPipeError:
            if on_broken_pipe is None:
                raise
            on_broken_pipe()
            raise RequeueMessage(0.0, backoff=False) from None
        if progress is not None:
            progress.add()

    return handle


STATS_COLUMNS = (
    "NSQD",
    "TOPIC",
    "CHANNEL",
    "DEPTH",
    "IN_FLIGHT",
    "DEFERRED",
    "MESSAGES",
    "REQUEUED",
    "TIMED_OUT",
    "CLIENTS",
    "PAUSED",
)


def stats_rows(nsqd: str, stats: dict[str, Any]) -> list[list[str]]:
    """The :data:`STATS_COLUMNS` rows of one nsqd's ``/stats``: each topic, then its channels."""
    rows = []
    for topic in sorted(stats.get("topics") or [], key=lambda t: str(t.get("topic_name"))):
        channels = topic.get("channels") or []
        rows.append(
            [
                nsqd,
                str(topic.get("topic_name")),
                "-",
                str(topic.get("depth", "")),
                str(sum(int(c.get("in_flight_count", 0)) for c in channels)),
                str(sum(int(c.get("deferred_count", 0)) for c in channels)),
                str(topic.get("message_count", "")),
                "-",
                "-",
                "-",
                "yes" if topic.get("paused") else "no",
            ]
        )
        for chan in sorted(channels, key=lambda c: str(c.get("channel_name"))):
            rows.append(
                [
                    nsqd,
                    str(topic.get("topic_name")),
                    str(chan.get("channel_name")),
                    str(chan.get("depth", "")),
                    str(chan.get("in_flight_count", "")),
                    str(chan.get("deferred_count", "")),
                    str(chan.get("message_count", "")),
                    str(chan.get("requeue_count", "")),
                    str(chan.get("timeout_count", "")),
                    str(len(chan.get("clients") or [])),
                    "yes" if chan.get("paused") else "no",
                ]
            )
    return rows


def table(header: Sequence[str], rows: list[list[str]]) -> str:
    """``header`` and ``rows`` as aligned text columns (the counts right-aligned), one line
    each."""
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    numeric = set(range(3, len(header) - 1))  # the counts (PAUSED and names are text)
    lines = []
    for row in [list(header), *rows]:
        cells = [
            cell.rjust(widths[i]) if i in numeric and row is not header else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def stdout_to_devnull() -> None:
    """Point standard output's descriptor at /dev/null, once nobody reads it any more: later
    writes (the interpreter's last flush at exit included) go nowhere instead of failing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class ReaderGone:
    """The ``on_broken_pipe`` of :func:`writer` on standard output (``nsq-sync tail T | head``):
    calls :func:`stdout_to_devnull` and stops :attr:`consumer` gracefully (what was written is
    finished, the rest requeued). Set :attr:`consumer` once the consumer is made."""

    def __init__(self) -> None:
        self.consumer: Consumer | None = None

    def __call__(self) -> None:
        stdout_to_devnull()
        if self.consumer is not None:
            # from a handler it returns at once; the stop goes on (its default deadline lets
            # every message received be requeued before the connections close)
            self.consumer.stop()
