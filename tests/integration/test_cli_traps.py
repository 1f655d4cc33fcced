"""The ``nsq-sync`` command line where a newcomer fell in (issue 30), each as a real subprocess
against a real nsqd/nsqlookupd: exit status, how long it took, and what stderr said.

- a handler failure (a write that fails) is shown with its traceback, by default;
- nsqd's HTTP address given as a lookupd's: tail exits 1 naming it, as drain does (tail used to
  wait for ever on 404s);
- nsqlookupd's TCP port given as an nsqd's: one line saying so (it was "unknown frame type");
- tail does not take the messages nsqd keeps for a topic's first channel (its ephemeral channel
  lost them for every later consumer), and warns when it cannot see the topic;
- lookup of an unknown topic and pub reading a terminal say so on stderr.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.nsq import bounded, prepare_channel, settled_channel, wait_for

from nsq_sync import LookupdClient, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

pytestmark = [pytest.mark.integration]

if os.environ.get("NSQ_SYNC_TEST_RUNTIME", "").strip().lower() == "gevent":
    # the command line is the same program under either runtime of the suite: once is enough
    pytestmark.append(pytest.mark.slow)

NSQ_SYNC = [sys.executable, "-m", "nsq_sync"]
#: How long a command that fails fast may take on a slow, shared machine (it takes ~0.5 s).
FAST = 30.0
RUN_TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(180.0)


def nsq_sync(
    *args: str, timeout: float = RUN_TIMEOUT, **kwargs: Any
) -> tuple[int, str, str, float]:
    """Run ``python -m nsq_sync ARGS``: exit status, stdout, stderr and seconds taken."""
    began = time.monotonic()
    done = subprocess.run(
        [*NSQ_SYNC, *args], capture_output=True, timeout=timeout, check=False, **kwargs
    )
    took = time.monotonic() - began
    return done.returncode, done.stdout.decode(), done.stderr.decode(), took


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def http(nsqd: NsqdProcess) -> NsqdHTTPClient:
    return NsqdHTTPClient(nsqd.http_url)


# --------------------------------------------------------------------------- item 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", ["tail", "drain"])
def test_a_failing_write_is_shown_with_its_traceback(
    nsqd: NsqdProcess, nsq_topic: str, command: str
) -> None:
    """Standard output is /dev/full: the handler (the write) fails; by default, without -v, the
    failure and its traceback are on stderr, the run exits 1 and the message goes back."""
    prepare_channel(nsqd, nsq_topic, "ch", 1)
    args = (
        ["tail", nsq_topic, "-c", "ch", "-n", "1"]
        if command == "tail"
        else ["drain", nsq_topic, "ch", "--max-messages", "1"]
    )
    with open("/dev/full", "wb") as full:
        began = time.monotonic()
        done = subprocess.run(
            [*NSQ_SYNC, *args, "--nsqd-tcp-address", nsqd.tcp_address],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        took = time.monotonic() - began
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert took < FAST, err
    assert "handler failed on message" in err, err
    assert "Traceback (most recent call last)" in err, err
    assert "No space left on device" in err, err
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert (stats["in_flight_count"], stats["depth"] + stats["deferred_count"]) == (0, 1)


# --------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("command", ["tail", "drain"])
def test_nsqds_http_address_given_as_a_lookupd_exits_1_naming_it(
    nsqd: NsqdProcess, nsq_topic: str, command: str
) -> None:
    args = [nsq_topic] if command == "tail" else [nsq_topic, "ch"]
    status, out, err, took = nsq_sync(
        command, *args, "--lookupd-http-address", nsqd.http_address, timeout=FAST + 10
    )
    assert status == 1, err
    assert took < FAST, err
    line = one_line(err)
    assert nsqd.http_address in line and "nsqlookupd" in line, line
    assert out == ""


# --------------------------------------------------------------------------- item 4


@pytest.mark.parametrize("command", ["tail", "pub"])
def test_nsqlookupds_tcp_port_given_as_an_nsqds_says_so(
    nsqlookupd: NsqlookupdProcess, nsq_topic: str, command: str
) -> None:
    args = [nsq_topic] if command == "tail" else [nsq_topic, "x"]
    status, _, err, took = nsq_sync(command, *args, "--nsqd-tcp-address", nsqlookupd.tcp_address)
    assert status == 1, err
    assert took < FAST, err
    line = one_line(err)
    assert nsqlookupd.tcp_address in line, line
    assert "this looks like nsqlookupd's TCP port, not nsqd's" in line, line
    assert "unknown frame type" not in line, line


# --------------------------------------------------------------------------- item 5


def _backlog(nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, topic: str, n: int) -> None:
    """``n`` messages on a topic with no channel (nsqd keeps them for the first channel made),
    and nsqlookupd knows the topic (nsqd registers it asynchronously)."""
    http(nsqd).mpub(topic, [b"b%03d" % i for i in range(n)])
    with LookupdClient(nsqlookupd.http_url) as lookupd:
        wait_for(lambda: lookupd.lookup(topic), f"nsqlookupd to list {topic}")


def test_tail_refuses_a_backlog_and_a_channel_made_afterwards_gets_every_message(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    """Whether tail sees the topic through nsqd's HTTP API or through nsqlookupd, it refuses
    (exit 2, naming --take-backlog) and makes no channel; the channel made next gets all 200.
    Before, tail's ephemeral channel took them and they were gone with it."""
    _backlog(nsqd, nsqlookupd, nsq_topic, 200)
    views = (
        ["--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address", nsqd.http_address],
        ["--lookupd-http-address", nsqlookupd.http_address],
    )
    for view in views:
        status, out, err, took = nsq_sync("tail", nsq_topic, "-n", "1", *view)
        assert status == 2, err
        assert took < FAST, err
        line = one_line(err)
        assert "--take-backlog" in line and "200 message(s)" in line, line
        assert nsqd.http_address in line, line
        assert out == ""
    entry = http(nsqd).topic_stats(nsq_topic)
    assert entry is not None and entry["channels"] == [], entry  # nothing was made
    status, out, err, _ = nsq_sync(
        "drain", nsq_topic, "durable", "--idle-timeout", "1", "--nsqd-tcp-address", nsqd.tcp_address
    )
    assert status == 0, err
    assert sorted(out.splitlines()) == [f"b{i:03d}" for i in range(200)]


def test_tail_take_backlog_reads_it(nsqd: NsqdProcess, nsq_topic: str) -> None:
    http(nsqd).mpub(nsq_topic, [b"b0", b"b1", b"b2"])
    status, out, err, _ = nsq_sync(
        "tail", nsq_topic, "-n", "2", "--take-backlog",
        "--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address", nsqd.http_address,
    )  # fmt: skip
    assert status == 0, err
    assert out.splitlines() == ["b0", "b1"]
    assert err == ""


def test_tail_that_cannot_see_the_topic_warns_before_subscribing(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """Only nsqd's TCP address: no view of the topic, so a warning (naming the way to give
    one), then tail runs as asked."""
    prepare_channel(nsqd, nsq_topic, "other")  # new messages reach tail's channel too
    proc = subprocess.Popen(
        [*NSQ_SYNC, "tail", nsq_topic, "-n", "1", "--nsqd-tcp-address", nsqd.tcp_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def tail_subscribed() -> bool:
            # tail's channel with its client: nsqd lists a new channel before its topic pump
            # copies messages to it, and the client only once that is done
            entry = http(nsqd).topic_stats(nsq_topic)
            channels = entry["channels"] if entry else []
            return any(c["channel_name"] != "other" and c["clients"] for c in channels)

        wait_for(tail_subscribed, "tail to subscribe")
        http(nsqd).pub(nsq_topic, b"new")
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    line = one_line(err.decode())
    assert f"cannot see topic {nsq_topic} on nsqd {nsqd.tcp_address}" in line, line
    assert "--nsqd-http-address" in line, line
    assert out == b"new\n"


# --------------------------------------------------------------------------- item 6


def test_lookup_of_an_unknown_topic_says_so_on_stderr(
    nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    status, out, err, _ = nsq_sync(
        "lookup", nsq_topic, "--lookupd-http-address", nsqlookupd.http_address
    )
    assert (status, out) == (1, "")  # issue 39: a typo is an error, not an empty answer
    assert f"no such topic {nsq_topic}" in one_line(err)


def test_pub_reading_a_terminal_says_so(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """``nsq-sync pub TOPIC`` with no BODY on a terminal: a line on stderr says it reads stdin
    (it used to wait silently); the lines typed are published once stdin ends."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*NSQ_SYNC, "pub", nsq_topic, "--nsqd-tcp-address", nsqd.tcp_address],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(slave)
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], RUN_TIMEOUT)
        assert ready, "no hint on stderr"
        hint = proc.stderr.readline().decode()
        assert "reading messages from standard input" in hint, hint
        os.write(master, b"typed\n\x04")  # a line, then Ctrl-D: end of input
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert http(nsqd).depth(nsq_topic) == 1
