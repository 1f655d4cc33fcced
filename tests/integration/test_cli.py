"""The ``nsq-sync`` command line, run as a real subprocess against a real nsqd/nsqlookupd:
output, exit status and stderr, bad input included."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.nsq import (
    bounded,
    free_closed_port,
    message_count,
    prepare_channel,
    settled_channel,
    wait_for,
)

from nsq_sync import Consumer, Message, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

pytestmark = [pytest.mark.integration]

#: How the command line is started: ``python -m nsq_sync``, and in a gevent run of the suite the
#: same module in a process that gevent patched first (as a gevent application that shells out to
#: its own entry point would), so the command line is exercised on both runtimes. The gevent run
#: is marked slow: once per CI run (3.11) is enough, the threads envs cover every interpreter.
if os.environ.get("NSQ_SYNC_TEST_RUNTIME", "").strip().lower() == "gevent":
    pytestmark.append(pytest.mark.slow)
    NSQ_SYNC_CMD = [
        sys.executable,
        "-c",
        "from gevent import monkey; monkey.patch_all(); import runpy; "
        "runpy.run_module('nsq_sync', run_name='__main__', alter_sys=True)",
    ]
else:
    NSQ_SYNC_CMD = [sys.executable, "-m", "nsq_sync"]

RUN_TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    yield from bounded(180.0)


def nsq_sync(
    *args: str, stdin: bytes | None = None, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m nsq_sync ARGS`` to the end."""
    return subprocess.run(
        [*NSQ_SYNC_CMD, *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def spawn(*args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*NSQ_SYNC_CMD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def one_clear_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def http(nsqd: NsqdProcess) -> NsqdHTTPClient:
    return NsqdHTTPClient(nsqd.http_url)


def has_client(nsqd: NsqdProcess, topic: str) -> bool:
    with http(nsqd) as client:
        entry = client.topic_stats(topic)
    return bool(entry and any(c["clients"] for c in entry["channels"]))


# --------------------------------------------------------------------------- pub


def test_pub_arguments_and_stdin_lines_reach_nsqd(nsqd: NsqdProcess, nsq_topic: str) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 0)
    done = nsq_sync("pub", nsq_topic, "héllo", "world", "--nsqd-tcp-address", nsqd.tcp_address)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""
    lines = b"one\r\ntwo\n\nthree\nfour\nfive"
    done = nsq_sync(
        "--nsqd-tcp-address", nsqd.tcp_address, "pub", nsq_topic, "--batch", "2", stdin=lines
    )
    assert done.returncode == 0, done.stderr
    assert b"skipped 1 empty line" in done.stderr
    # read them back through the command line: every body, in order, as JSON lines
    drained = nsq_sync(
        "drain", nsq_topic, "ch", "--format", "json", "--idle-timeout", "0.5",
        "--nsqd-tcp-address", nsqd.tcp_address,
    )  # fmt: skip
    assert drained.returncode == 0, drained.stderr
    records = [json.loads(line) for line in drained.stdout.decode().splitlines()]
    assert [r["body"] for r in records] == ["héllo", "world", "one", "two", "three", "four", "five"]
    assert all(len(r["id"]) == 16 and r["attempts"] == 1 and r["timestamp"] > 0 for r in records)


def test_pub_delay_defers_and_rate_paces(nsqd: NsqdProcess, nsq_topic: str) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 0)
    addr = ("--nsqd-tcp-address", nsqd.tcp_address)

    def in_channel(n: int) -> tuple[int, int]:
        """(depth, deferred_count) once the channel holds ``n`` messages: nsqd's topic pump
        copies a message into the channel a moment after the publish was acknowledged."""

        def counted() -> dict[str, Any] | None:
            channel = http(nsqd).channel_stats(nsq_topic, "ch")
            return (
                channel if channel and channel["depth"] + channel["deferred_count"] >= n else None
            )

        channel = wait_for(counted, f"{n} messages in the channel")
        return channel["depth"], channel["deferred_count"]

    done = nsq_sync("pub", nsq_topic, "later", "--delay", "60", *addr)
    assert done.returncode == 0, done.stderr
    assert in_channel(1) == (0, 1)  # deferred
    done = nsq_sync("pub", nsq_topic, "--rate", "200", *addr, stdin=b"a\nb\nc\nd\n")
    assert done.returncode == 0, done.stderr
    assert in_channel(5) == (4, 1)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["pub", "bad topic!", "x"], "invalid topic name"),
        (["pub", "TOPIC", ""], "BODY 1 is empty"),
        (["pub", "TOPIC", "x", "--delay", "1", "--batch", "5"], "--delay"),
        (["pub", "TOPIC", "x", "--rate", "-3"], "--rate"),
        (["tail", "TOPIC", "-c", "no spaces"], "invalid channel name"),
        (["drain", "TOPIC", "ch", "--idle-timeout", "soon"], "--idle-timeout"),
        (["drain", "TOPIC", "ch", "--max-messages", "0"], "--max-messages"),
        (["stats", "--topic", "a/b"], "invalid topic name"),
        (["drain", "TOPIC", "ch", "-o", "/nonexistent-dir/out.txt"], "cannot open -o"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_nothing_sent(
    nsqd: NsqdProcess, nsq_topic: str, args: list[str], words: str
) -> None:
    args = [nsq_topic if a == "TOPIC" else a for a in args]
    done = nsq_sync(*args, "--nsqd-tcp-address", nsqd.tcp_address)
    assert done.returncode == 2
    assert words in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    assert http(nsqd).topic_stats(nsq_topic) is None  # nothing reached nsqd


def test_no_server_given_and_no_command_are_usage_errors() -> None:
    assert nsq_sync().returncode == 2
    done = nsq_sync("pub", "t", "x")
    assert done.returncode == 2
    assert "--nsqd-tcp-address" in one_clear_line(done.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["pub", "t", "x", "--nsqd-tcp-address", "127.0.0.1:{port}"],
        ["tail", "t", "--nsqd-tcp-address", "127.0.0.1:{port}"],
        ["drain", "t", "c", "--nsqd-tcp-address", "127.0.0.1:{port}"],
        ["drain", "t", "c", "--lookupd-http-address", "127.0.0.1:{port}"],
        ["stats", "--nsqd-http-address", "127.0.0.1:{port}"],
        ["lookup", "t", "--lookupd-http-address", "127.0.0.1:{port}"],
    ],
)
def test_an_unreachable_server_is_one_line_naming_it_and_exit_1(args: list[str]) -> None:
    port = free_closed_port()
    done = nsq_sync(*[a.format(port=port) for a in args])
    assert done.returncode == 1
    line = one_clear_line(done.stderr)
    assert f"127.0.0.1:{port}" in line
    assert "cannot reach" in line


@pytest.mark.parametrize("command", ["pub", "drain"])
def test_one_server_down_of_several_is_a_warning_and_the_others_serve(
    nsqd: NsqdProcess, nsq_topic: str, command: str
) -> None:
    """Two nsqds given, one down: pub publishes through the other and drain drains the other,
    each with one warning naming the one down (before, the check before the run required every
    server and exited 1 with nothing done: no failover)."""
    down = f"127.0.0.1:{free_closed_port()}"
    servers = ["--nsqd-tcp-address", down, "--nsqd-tcp-address", nsqd.tcp_address]
    if command == "pub":
        done = nsq_sync(*servers, "pub", nsq_topic, "hello")
        assert done.returncode == 0, done.stderr
        assert message_count(nsqd.http_address, nsq_topic) == 1
        lines = [one_clear_line(done.stderr)]
    else:
        prepare_channel(nsqd, nsq_topic, "ch", 3)
        done = nsq_sync(*servers, "drain", nsq_topic, "ch", "--idle-timeout", "0.5")
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == [b"m0", b"m1", b"m2"]
        # (then the consumer's own warnings as it tries the one down)
        assert b"Traceback" not in done.stderr
        lines = done.stderr.decode().splitlines()
    assert f"cannot reach nsqd {down}" in lines[0] and "going on with the others" in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["tail", "t", "--nsqd-tcp-address", "{http}"],  # nsqd's HTTP port given as TCP
        ["stats", "--nsqd-http-address", "{tcp}"],  # and the other way round
        ["lookup", "t", "--lookupd-http-address", "{http}"],  # nsqd is not a lookupd
    ],
)
def test_a_wrong_port_is_one_line_naming_it_and_exit_1(nsqd: NsqdProcess, args: list[str]) -> None:
    args = [a.format(http=nsqd.http_address, tcp=nsqd.tcp_address) for a in args]
    done = nsq_sync(*args)
    assert done.returncode == 1
    assert args[-1] in one_clear_line(done.stderr)
    assert done.stdout == b""


# --------------------------------------------------------------------------- tail


def test_tail_n_prints_exactly_n_messages_on_an_ephemeral_channel(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    http(nsqd).create_topic(nsq_topic)
    proc = spawn(
        "tail", nsq_topic, "-n", "3", "--format", "raw", "--nsqd-tcp-address", nsqd.tcp_address
    )
    try:
        wait_for(lambda: has_client(nsqd, nsq_topic), "tail to subscribe")
        entry = http(nsqd).topic_stats(nsq_topic)
        assert entry is not None
        assert [c["channel_name"].endswith("#ephemeral") for c in entry["channels"]] == [True]
        http(nsqd).mpub(nsq_topic, [b"a", b"b", b"c", b"d", b"e"])
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == b"a\nb\nc\n"


@pytest.mark.parametrize("command", ["tail", "drain"])
def test_sigterm_is_a_graceful_stop_with_exit_0(
    nsqd: NsqdProcess, nsq_topic: str, command: str
) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 0)
    args = (
        ["tail", nsq_topic]
        if command == "tail"
        else ["drain", nsq_topic, "ch", "--idle-timeout", "600"]
    )
    proc = spawn(*args, "--nsqd-tcp-address", nsqd.tcp_address)
    try:
        wait_for(lambda: has_client(nsqd, nsq_topic), f"{command} to subscribe")
        http(nsqd).pub(nsq_topic, b"one")
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"one\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err.decode()
    if command == "drain":
        stats = settled_channel(http(nsqd), nsq_topic, "ch")
        assert (stats["depth"], stats["in_flight_count"], stats["message_count"]) == (0, 0, 1)


# --------------------------------------------------------------------------- drain


def test_drain_to_a_file_stops_when_idle_and_leaves_nothing_in_flight(
    nsqd: NsqdProcess, nsq_topic: str, tmp_path: Path
) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 25)
    out = tmp_path / "drained.txt"
    done = nsq_sync(
        "--nsqd-tcp-address", nsqd.tcp_address,
        "drain", nsq_topic, "ch", "-o", str(out), "--idle-timeout", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (b"", b"")  # piped: no progress, nothing extra
    assert sorted(out.read_bytes().splitlines()) == sorted(f"m{i}".encode() for i in range(25))
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_drain_whose_nsqd_is_killed_mid_run_exits_1_unreachable(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """Issue 39: the start-up check passed, then nsqd went away: the drain waited for ever."""
    nsqd = nsqd_factory()
    prepare_channel(nsqd, nsq_topic, "ch", 0)
    proc = spawn(
        "--nsqd-tcp-address", nsqd.tcp_address, "drain", nsq_topic, "ch", "--idle-timeout", "2"
    )  # fmt: skip
    try:
        wait_for(lambda: has_client(nsqd, nsq_topic), "the drain subscribed")
        nsqd.kill()
        _, err = proc.communicate(timeout=30.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    text = err.decode()
    assert f"cannot connect to nsqd {nsqd.tcp_address}" in text, text
    assert "unreachable" in text, text


def test_drain_writes_a_message_delivered_many_times_before(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """A message other consumers failed on 6 times (past the default max_attempts of 5): drain
    writes it like any other. Before, the consumer gave it up before the output handler ran:
    finished at nsqd, missing from the output."""
    prepare_channel(nsqd, nsq_topic, "ch")
    http(nsqd).pub(nsq_topic, b"poison")
    deliveries: list[int] = []

    def requeue(message: Message) -> None:
        deliveries.append(message.attempts)
        message.requeue(0.0, backoff=False)

    failing = Consumer(
        nsq_topic, "ch", requeue, nsqd_tcp_addresses=nsqd.tcp_address, max_attempts=0
    )
    failing.start()
    try:
        wait_for(lambda: len(deliveries) >= 6, "six failed deliveries")
    finally:
        assert failing.stop(10.0)
    done = nsq_sync(
        "drain", nsq_topic, "ch", "--idle-timeout", "0.5", "--nsqd-tcp-address", nsqd.tcp_address
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"poison\n"
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)


def test_drain_max_messages_takes_that_many_and_hands_the_rest_back(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 20)
    done = nsq_sync(
        "drain", nsq_topic, "ch", "--max-messages", "5", "--nsqd-tcp-address", nsqd.tcp_address
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 5
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (15, 0, 0)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_drain_exits_1_when_messages_failed_and_requeues_them(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 3)
    done = nsq_sync(
        "drain", nsq_topic, "ch", "-o", "/dev/full", "--idle-timeout", "0.5", "--timeout", "20",
        "--nsqd-tcp-address", nsqd.tcp_address,
    )  # fmt: skip
    assert done.returncode == 1
    assert "failed" in done.stderr.decode()
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert stats["in_flight_count"] == 0
    assert stats["depth"] + stats["deferred_count"] == 3  # nothing was lost


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_drain_stopped_by_sigterm_after_failures_exits_0(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """SIGTERM is a graceful stop, and a graceful stop is success even after some messages
    failed and went back to nsqd (a deploy stopping a worker must not look like a failure)."""
    prepare_channel(nsqd, nsq_topic, "ch", 2)
    proc = spawn(
        "drain", nsq_topic, "ch", "-o", "/dev/full", "--nsqd-tcp-address", nsqd.tcp_address
    )
    try:

        def failed_once() -> bool:
            entry = http(nsqd).topic_stats(nsq_topic)
            return bool(entry and any(c["requeue_count"] for c in entry["channels"]))

        wait_for(failed_once, "a failed message to be requeued")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err  # (the failures themselves are logged with their traceback)
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert stats["in_flight_count"] == 0
    assert stats["depth"] + stats["deferred_count"] == 2  # nothing was lost


@pytest.mark.parametrize("command", ["tail", "drain"])
def test_a_reader_that_goes_away_stops_it_gracefully(
    nsqd: NsqdProcess, nsq_topic: str, command: str
) -> None:
    """`nsq-sync tail -c ch T | head -3` (or drain): once the reader has gone, the next write
    fails; the command stops gracefully and exits 0, without a traceback. What it wrote was
    finished, the message whose write failed and everything else went back to nsqd; nothing is
    left in flight. Before, SIGPIPE killed it (exit 141): FINs it held were never sent and up
    to 100 messages waited in flight for nsqd's timeout, to be delivered again."""
    prepare_channel(nsqd, nsq_topic, "ch", 5)
    args = (
        ["tail", nsq_topic, "-c", "ch"]
        if command == "tail"
        else ["drain", nsq_topic, "ch", "--idle-timeout", "600"]
    )
    proc = spawn(*args, "--nsqd-tcp-address", nsqd.tcp_address)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # `head` has what it wanted
        http(nsqd).mpub(nsq_topic, [b"later%d" % i for i in range(50)])  # writes that fail
        proc.wait(timeout=RUN_TIMEOUT)  # (its stderr is a few lines at most: no deadlock)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        proc.kill()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err, err
    assert all(line.startswith(b"m") for line in lines), lines
    stats = settled_channel(http(nsqd), nsq_topic, "ch")
    assert (stats["in_flight_count"], stats["timeout_count"]) == (0, 0)
    finished = 55 - stats["depth"] - stats["deferred_count"]
    assert 3 <= finished < 55  # what was written, and not what failed to be


def test_drain_draws_progress_on_a_terminal_only(nsqd: NsqdProcess, nsq_topic: str) -> None:
    prepare_channel(nsqd, nsq_topic, "ch", 30)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*NSQ_SYNC_CMD, "drain", nsq_topic, "ch", "--idle-timeout", "1",
             "--nsqd-tcp-address", nsqd.tcp_address],
            stdout=subprocess.PIPE,
            stderr=slave,
        )  # fmt: skip
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        proc.wait(RUN_TIMEOUT)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert len(out.splitlines()) == 30  # data still goes to stdout
    text = seen.decode()
    assert "\r" in text
    assert "messages" in text and "/s" in text  # the progress line: count and rate
    assert "drained 30 message(s) from" in text


# --------------------------------------------------------------------------- stats, lookup


def test_stats_prints_an_aligned_table_with_a_row_per_topic_and_channel(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    with http(nsqd) as client:
        client.create_topic(nsq_topic)
        client.create_channel(nsq_topic, "alpha")
        client.create_channel(nsq_topic, "beta")
        client.mpub(nsq_topic, [b"1", b"2", b"3", b"4"])  # 4 copies: one per channel
    for source in (["--nsqd-http-address", nsqd.http_address],
                   ["--lookupd-http-address", nsqlookupd.http_address]):  # fmt: skip
        done = nsq_sync("stats", "--topic", nsq_topic, *source)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().splitlines()
        header = lines[0]
        assert header.split()[:6] == ["NSQD", "TOPIC", "CHANNEL", "DEPTH", "IN_FLIGHT", "DEFERRED"]
        rows = [line.split() for line in lines[1:]]
        assert [r[1:4] for r in rows] == [
            [nsq_topic, "-", "0"],
            [nsq_topic, "alpha", "4"],
            [nsq_topic, "beta", "4"],
        ]
        assert {r[0] for r in rows} == {nsqd.http_address}
        # aligned: every column's cell ends where its header ends (numbers right-aligned)
        end = header.index("DEPTH") + len("DEPTH")
        assert all(
            line[end - 1].isdigit() and line[end : end + 1] in ("", " ") for line in lines[1:]
        )


def test_lookup_prints_the_nsqds_that_carry_the_topic(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    http(nsqd).create_topic(nsq_topic)
    wait_for(
        lambda: (
            nsq_sync("lookup", nsq_topic, "--lookupd-http-address", nsqlookupd.http_address).stdout
        ),
        "lookupd to learn the topic",
    )
    done = nsq_sync("--lookupd-http-address", nsqlookupd.http_address, "lookup", nsq_topic)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == [nsqd.tcp_address]
    unknown = nsq_sync(
        "lookup",
        "never_published_" + nsq_topic[-8:],
        "--lookupd-http-address",
        nsqlookupd.http_address,
    )
    assert (unknown.returncode, unknown.stdout) == (1, b"")
    assert "no such topic" in unknown.stderr.decode(), unknown.stderr


def test_stats_and_lookup_of_a_topic_that_does_not_exist_say_so_and_exit_1(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    """Issue 39: a mistyped topic printed nothing (stats: an empty table) and exited 0."""
    typo = "typo_" + nsq_topic[-8:]
    for command in (
        ["stats", "--topic", typo, "--nsqd-http-address", nsqd.http_address],
        ["stats", "--topic", typo, "--lookupd-http-address", nsqlookupd.http_address],
        ["lookup", typo, "--lookupd-http-address", nsqlookupd.http_address],
    ):
        done = nsq_sync(*command)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stdout == b"", command
        line = one_clear_line(done.stderr)
        assert f"no such topic {typo}" in line, line


def test_dead_letter_list_of_a_topic_that_does_not_exist_says_so_and_creates_nothing(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, nsq_topic: str
) -> None:
    """Issue 39: listing a mistyped topic created it and a durable dead-letter channel on it,
    then printed an empty table with exit status 0."""
    typo = "typo_" + nsq_topic[-8:]
    for source in (
        ["--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address", nsqd.http_address],
        ["--lookupd-http-address", nsqlookupd.http_address],
    ):
        done = nsq_sync("dead-letter", "list", typo, "--idle-timeout", "0.5", *source)
        assert done.returncode == 1, (source, done.stderr)
        assert done.stdout == b"", source
        line = one_clear_line(done.stderr)
        assert f"no such topic {typo}" in line and "nothing was created" in line, line
        with http(nsqd) as client:
            assert client.topic_stats(typo) is None, "the mistyped topic was created"


def test_pub_v_says_what_it_published_where(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """Issue 39: pub printed nothing on success, even with -v."""
    done = nsq_sync("-v", "pub", nsq_topic, "a", "--nsqd-tcp-address", nsqd.tcp_address)
    assert done.returncode == 0, done.stderr
    assert (
        f"published 1 message to topic {nsq_topic} on nsqd {nsqd.tcp_address}"
        in done.stderr.decode()
    ), done.stderr
    quiet = nsq_sync("pub", nsq_topic, "b", "c", "--nsqd-tcp-address", nsqd.tcp_address)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, b"", b"")


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cron_drain.py"


@pytest.mark.parametrize(("bodies", "status"), [([b'{"id": 1}', b'{"id": 2}'], 0), ([b"{"], 1)])
def test_the_cron_example_exits_by_whether_everything_was_handled(
    nsqd: NsqdProcess, nsq_topic: str, bodies: list[bytes], status: int
) -> None:
    prepare_channel(nsqd, nsq_topic, "export", 0)
    http(nsqd).mpub(nsq_topic, bodies)
    env = dict(os.environ, NSQD_TCP_ADDRESS=nsqd.tcp_address, TOPIC=nsq_topic, IDLE_TIMEOUT="0.5")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, timeout=RUN_TIMEOUT
    )
    assert done.returncode == status, done.stderr
    assert b"idle: handled" in done.stderr
    stats = settled_channel(http(nsqd), nsq_topic, "export")
    assert stats["in_flight_count"] == 0
    assert stats["depth"] + stats["deferred_count"] == (0 if status == 0 else len(bodies))


def test_the_console_script_is_installed() -> None:
    script = shutil.which("nsq-sync", path=os.path.dirname(sys.executable))
    if script is None:
        script = shutil.which("nsq-sync")
    assert script is not None, "nsq-sync is not on PATH: is the package installed?"
    done = subprocess.run([script, "--version"], capture_output=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0
    assert done.stdout.startswith(b"nsq-sync ")
