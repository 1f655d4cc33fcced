"""Faults against real nsqd/nsqlookupd processes: cut, stalled and refused connections, nsqd
restarted or killed mid-consumption, a lookupd that stops answering, SIGTERM to a consumer
process, and a producer failing over while an nsqd dies.

Every published message has a unique body and every handled one is counted, so "0 lost" is checked
body by body, and duplicates (at-least-once redeliveries) are counted and reported with
``record_property`` (see conftest.py for the summary). Waits poll against deadlines; the only
timed pauses are the fault schedule itself ("cut every 2 s"). Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fault_proxy import FaultProxy
from support.nsq import connected_addresses, topic_depth

from nsq_sync import Consumer, LookupdClient, NsqdHTTPClient, Producer
from nsq_sync.errors import NSQError, ReadTimeout
from nsq_sync.testing import NsqdProcess

from .helpers import (
    CHANNEL,
    Tally,
    channel_if_drained,
    channel_stats,
    gevent_patched,
    make_bodies,
    publish_http,
    record_figures,
    scaled,
    wait_for,
)

# slow: fault injection takes about a minute per runtime; CI runs it on 3.11 (threads and gevent)
pytestmark = [pytest.mark.integration, pytest.mark.slow]

Consumers = Callable[..., Consumer]


# --------------------------------------------------------------------------- connection cuts


def test_cut_every_two_seconds_loses_nothing(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
) -> None:
    """A producer streams messages for ~20 s while the fault proxy resets the consumer's
    connection every ~2 s: every message is handled (0 lost); redeliveries (FINs that died with
    a cut) are counted as duplicates.

    nsqd flags: --mem-queue-size (nothing spills to disk) and --msg-timeout=3s (messages in
    flight on a cut connection come back after 3 s instead of nsqd's default 60 s).
    """
    n = scaled(50_000)
    stream_s = 20.0
    batch = 100
    nsqd = nsqd_factory("--mem-queue-size=10000000", "--msg-timeout=3s")
    bodies = make_bodies(n)
    publish_http(nsqd.http_url, nsq_topic, bodies[:batch])
    tally = Tally()
    with FaultProxy(nsqd.tcp_address) as proxy:
        consumer = consumers(
            nsq_topic,
            CHANNEL,
            tally,
            nsqd_tcp_addresses=proxy.address,
            max_in_flight=200,
            concurrency=4,
            reconnect_backoff_max=0.5,
        )
        faults: list[tuple[float, list[Any]]] = []
        done = threading.Event()
        publish_errors: list[BaseException] = []
        stream_end = [float("inf")]

        def cutter() -> None:
            while not done.wait(2.0):  # the fault schedule, not a synchronisation
                old = list(consumer._connections.conns.values())
                t = time.monotonic()
                if proxy.cut():
                    faults.append((t, old))

        def stream() -> None:
            # Paced (the pace is the workload, not a synchronisation): n messages in stream_s.
            try:
                with Producer(nsqd.tcp_address) as producer:
                    t0 = time.monotonic()
                    for k, i in enumerate(range(batch, n, batch)):
                        producer.multi_publish(nsq_topic, bodies[i : i + batch])
                        ahead = t0 + (k + 1) * stream_s * batch / n - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
            except BaseException as exc:
                publish_errors.append(exc)
            stream_end[0] = time.monotonic()

        started = time.monotonic()
        consumer.start()
        threads = [
            threading.Thread(target=cutter, name="cutter", daemon=True),
            threading.Thread(target=stream, name="stream", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(
                lambda: tally.covers(bodies) or publish_errors,
                f"all {n} messages handled",
                timeout=stream_s + 60.0,
                interval=0.2,
            )
        finally:
            done.set()
            for thread in threads:
                thread.join(30.0)
        assert publish_errors == []
        elapsed = time.monotonic() - started
        # Redeliveries of messages already handled (their FIN died with a cut) may still be
        # due; count them all before comparing.
        wait_for(lambda: channel_if_drained(nsqd.http_url, nsq_topic), "nothing left on nsqd", 30.0)
        assert consumer.stop(timeout=10.0) is True

    # Recovery: from a cut to the first message handled on a new connection. Only cuts while
    # the stream ran count: after it, the next message is a redelivery due at --msg-timeout.
    recoveries = [tally.recovery_after(t, old) for t, old in faults if t < stream_end[0]]
    lost = tally.lost(bodies)
    record_figures(
        record_property,
        messages=n,
        handled=tally.handled,
        faults=len(faults),
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=max((r for r in recoveries if r is not None), default=None),
        elapsed_s=elapsed,
        recoveries_s=[round(r, 3) if r is not None else None for r in recoveries],
    )
    assert lost == []
    assert len(faults) >= 5, "too few cuts to say anything"
    # Every cut during the stream was followed by a new connection that delivered messages.
    assert all(r is not None for r in recoveries), recoveries


# --------------------------------------------------------------------------- nsqd restarts and kills


def test_nsqd_restarted_mid_consumption_loses_nothing(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
) -> None:
    """nsqd restarted three times (SIGTERM, same ports and data path) while the consumer works
    through a backlog: nsqd writes its queue and in-flight messages to disk on SIGTERM, the
    consumer reconnects each time, and every message is handled.

    nsqd flags: none (defaults: a 10 000-message memory queue, the rest on disk).
    """
    n = scaled(50_000)
    nsqd = nsqd_factory()
    bodies = make_bodies(n)
    publish_http(nsqd.http_url, nsq_topic, bodies)
    tally = Tally()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        tally,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=100,
        concurrency=4,
        reconnect_backoff_max=0.5,
    )
    consumer.start()
    recoveries: list[float | None] = []
    restarts_s = []
    handled_at = []
    for quarter in (1, 2, 3):
        wait_for(
            lambda q=quarter: tally.unique >= n * q // 4,
            f"{quarter}/4 of the messages handled",
            timeout=60.0,
            interval=0.002,
        )
        handled_at.append(tally.unique)
        wait_for(lambda: connected_addresses(consumer), "a connection to restart")
        old = list(consumer._connections.conns.values())
        t_fault = time.monotonic()
        nsqd.restart()
        restarts_s.append(time.monotonic() - t_fault)
        wait_for(lambda t=t_fault, o=old: tally.recovery_after(t, o), "a message after restart")
        recoveries.append(tally.recovery_after(t_fault, old))
    assert handled_at[-1] < n, "the restarts came too late to test anything"
    wait_for(lambda: tally.covers(bodies), f"all {n} messages (handled {tally.unique})", 60.0)
    wait_for(lambda: channel_if_drained(nsqd.http_url, nsq_topic), "nothing left on nsqd", 30.0)
    lost = tally.lost(bodies)
    record_figures(
        record_property,
        messages=n,
        handled=tally.handled,
        faults=len(recoveries),
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=max(r for r in recoveries if r is not None),
        restart_max_s=max(restarts_s),
        handled_before_faults=handled_at,
    )
    assert lost == []


def test_nsqd_killed_mid_consumption_loses_nothing_nsqd_kept(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
) -> None:
    """nsqd SIGKILLed mid-consumption. nsqd keeps every message on disk (--mem-queue-size=0
    --sync-every=1) except those it had already handed out (in flight, or moving between its
    topic and channel queues): those die with it, by nsqd's design. The client must lose none of
    what nsqd kept: after the restart every message nsqd delivers is handled, nsqd ends with
    nothing queued or in flight, and only what nsqd had handed out is missing.

    nsqd flags: --mem-queue-size=0 --sync-every=1 (everything on disk, synced every message).
    """
    n = scaled(5_000)
    max_in_flight = 20
    nsqd = nsqd_factory("--mem-queue-size=0", "--sync-every=1")
    bodies = make_bodies(n)
    publish_http(nsqd.http_url, nsq_topic, bodies, batch=1000)
    tally = Tally()
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        tally,
        nsqd_tcp_addresses=nsqd.tcp_address,
        max_in_flight=max_in_flight,
        concurrency=2,
        reconnect_backoff_max=0.5,
    )
    consumer.start()
    # --sync-every=1: nsqd fsyncs for every message it reads, slow on a busy disk (60 s, not 15)
    wait_for(
        lambda: tally.unique >= n // 4,
        "a quarter of the messages handled",
        timeout=60.0,
        interval=0.005,
    )
    old = list(consumer._connections.conns.values())
    t_fault = time.monotonic()
    nsqd.kill()
    wait_for(lambda: all(c.closed for c in old), "the consumer to see the kill")
    # Hold the consumer back while nsqd comes back, to read what nsqd kept before it drains.
    consumer.set_max_in_flight(0)
    wait_for(lambda: consumer.stats().in_flight == 0, "handlers of the dead connection done")
    handled_before = tally.bodies()
    calls_before = tally.handled
    received_before = consumer.stats().received
    nsqd.restart()
    wait_for(
        lambda: connected_addresses(consumer) == [nsqd.tcp_address], "the consumer reconnected"
    )
    # nsqd's topic pump may still be moving the topic's backlog into the channel (an fsync per
    # message): read what the channel holds once the topic holds nothing
    wait_for(
        lambda: topic_depth(nsqd.http_url, nsq_topic) == 0,
        "the topic's backlog moved to the channel",
        timeout=60.0,
    )
    kept = channel_stats(nsqd.http_url, nsq_topic)
    assert kept["in_flight_count"] == 0 and kept["deferred_count"] == 0, kept
    depth = kept["depth"]
    consumer.set_max_in_flight(max_in_flight)
    wait_for(
        lambda: tally.handled - calls_before >= depth,
        f"the {depth} messages nsqd kept",
        timeout=60.0,
    )
    wait_for(lambda: channel_if_drained(nsqd.http_url, nsq_topic), "nothing left on nsqd", 30.0)
    wait_for(lambda: consumer.stats().in_flight == 0, "the last handlers done")
    calls_after = tally.handled - calls_before
    received_after = consumer.stats().received - received_before
    lost_by_nsqd = len(tally.lost(bodies))
    recovery = tally.recovery_after(t_fault, old)
    record_figures(
        record_property,
        messages=n,
        handled=tally.handled,
        faults=1,
        lost=max(0, depth - calls_after),  # of what nsqd kept: must be 0
        duplicates=tally.duplicates(),
        recovery_max_s=recovery,  # includes the pause while nsqd's stats were read
        nsqd_kept=depth,
        delivered_after_restart=received_after,
        lost_by_nsqd_sigkill=lost_by_nsqd,
    )
    # Every message nsqd delivered after the restart was handled, and nothing is left on nsqd.
    assert calls_after == received_after
    # That is what nsqd said it kept (its on-disk depth counter may lag one message behind a
    # SIGKILL: the counter is synced right after the message itself).
    assert depth <= calls_after <= depth + 1, (depth, calls_after)
    assert len(tally.bodies() - handled_before) >= depth - 1
    # What is missing is what nsqd had handed out when it died, nothing more.
    assert lost_by_nsqd == n - len(tally.bodies())
    assert lost_by_nsqd <= max_in_flight + 2, lost_by_nsqd


# --------------------------------------------------------------------------- stalled connection


def test_stalled_connection_is_detected_and_replaced(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
) -> None:
    """The proxy stops forwarding (the connection stays open, bytes pile up): with 1 s
    heartbeats and a 2.5 s read timeout the reader notices the silence, drops the connection
    and reconnects once the proxy forwards again; consumption continues with nothing lost.

    nsqd flags: --msg-timeout=3s (messages in flight on the stalled connection come back soon).
    """
    n = scaled(3_000)
    nsqd = nsqd_factory("--msg-timeout=3s")
    bodies = make_bodies(n)
    publish_http(nsqd.http_url, nsq_topic, bodies)
    # One handler is held until the proxy forwards again, so a message is in flight across the
    # stall (its FIN cannot reach nsqd: it comes back after --msg-timeout, a duplicate).
    release = threading.Event()
    tally = Tally(lambda m: release.wait(30.0) if m.body == bodies[n // 3] else None)
    with FaultProxy(nsqd.tcp_address) as proxy:
        consumer = consumers(
            nsq_topic,
            CHANNEL,
            tally,
            nsqd_tcp_addresses=proxy.address,
            max_in_flight=20,
            concurrency=4,
            heartbeat_interval=1.0,
            read_timeout=2.5,
            reconnect_backoff_max=0.5,
        )
        consumer.start()
        wait_for(lambda: tally.unique >= n // 4, "consumption under way")
        [old] = list(consumer._connections.conns.values())
        t_fault = time.monotonic()
        proxy.stall()
        wait_for(lambda: old.closed, "the stalled connection dropped", timeout=10.0, interval=0.01)
        detected_s = time.monotonic() - t_fault
        assert isinstance(old.close_error, ReadTimeout), old.close_error
        # While stalled, reconnects through the proxy cannot complete their handshake.
        handled_while_stalled = tally.handled
        wait_for(lambda: proxy.accepted >= 2, "a reconnect attempt through the stalled proxy")
        assert connected_addresses(consumer) == []
        t_resume = time.monotonic()
        proxy.resume()
        release.set()
        wait_for(lambda: tally.covers(bodies), f"all {n} messages (handled {tally.unique})", 60.0)
        wait_for(lambda: channel_if_drained(nsqd.http_url, nsq_topic), "nothing left on nsqd", 30.0)
        # Recovery: from the proxy forwarding again to the first message on a new connection.
        recovery = tally.recovery_after(t_resume, [old])
    lost = tally.lost(bodies)
    record_figures(
        record_property,
        messages=n,
        handled=tally.handled,
        faults=1,
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=recovery,
        detected_s=detected_s,
        stalled_s=t_resume - t_fault,
        handled_while_stalled=handled_while_stalled,
    )
    assert lost == []
    # Noticed by the read timeout (2.5 s), not much later.
    assert 2.0 <= detected_s <= 6.0, detected_s


# --------------------------------------------------------------------------- lookupd outage


@pytest.mark.parametrize("outage", ["stall", "refuse"])
def test_lookupd_outage_keeps_known_nsqds_and_finds_new_ones_after(
    nsq_cluster: Any,
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
    outage: str,
) -> None:
    """The consumer reaches nsqlookupd's HTTP API through the fault proxy. While lookupd does
    not answer (``stall``: accepted, never answered; ``refuse``: connections reset, as when the
    process is down), the consumer keeps consuming from the nsqd it knows; an nsqd that joins
    during the outage is found once lookupd answers again. Nothing is lost.

    nsqd flags: none; nsqlookupd flags: none (nsqds register over TCP, not through the proxy).
    """
    cluster = nsq_cluster(1)
    [first] = cluster.nsqds
    per_phase = scaled(300)
    publish_http(first.http_url, nsq_topic, make_bodies(1, "warmup"))
    with LookupdClient(cluster.lookupd.http_url) as lookupd:
        wait_for(lambda: lookupd.lookup(nsq_topic), "lookupd to list the topic")
    tally = Tally()
    published: list[bytes] = list(make_bodies(1, "warmup"))
    with FaultProxy(cluster.lookupd.http_address) as proxy:
        consumer = consumers(
            nsq_topic,
            CHANNEL,
            tally,
            lookupd_http_addresses=[f"http://{proxy.address}"],
            max_in_flight=10,
            lookupd_poll_interval=0.5,
            lookupd_poll_jitter=0.1,
            lookupd_http_timeout=1.0,
        )
        consumer.start()
        wait_for(lambda: tally.covers(published), "the first message")

        t_fault = time.monotonic()
        if outage == "stall":
            proxy.stall()
        else:
            proxy.refuse()
        accepted = proxy.accepted
        # Messages keep flowing from the known nsqd throughout the outage.
        for phase in range(3):
            batch = make_bodies(per_phase, f"during{phase}")
            publish_http(first.http_url, nsq_topic, batch)
            published.extend(batch)
            wait_for(lambda: tally.covers(batch), f"messages during the outage ({phase})")  # noqa: B023
        wait_for(lambda: proxy.accepted >= accepted + 2, "polls failing during the outage")
        # A new nsqd joins while lookupd cannot be asked.
        second = nsqd_factory(lookupd=cluster.lookupd)
        new_bodies = make_bodies(per_phase, "second")
        publish_http(second.http_url, nsq_topic, new_bodies)
        published += new_bodies
        with LookupdClient(cluster.lookupd.http_url) as lookupd:
            wait_for(
                lambda: second.tcp_address in {p.tcp_address for p in lookupd.lookup(nsq_topic)},
                "lookupd to list the new nsqd",
            )
        wait_for(lambda: proxy.accepted >= accepted + 4, "more polls failing")
        assert connected_addresses(consumer) == [first.tcp_address], (
            "known nsqd kept, new one unknown"
        )
        outage_s = time.monotonic() - t_fault
        proxy.resume()
        t_back = time.monotonic()
        wait_for(
            lambda: second.tcp_address in connected_addresses(consumer),
            "the new nsqd found",
            timeout=10.0,
        )
        found_s = time.monotonic() - t_back
        wait_for(lambda: tally.covers(published), f"all {len(published)} messages", 30.0)
        for nsqd in (first, second):
            wait_for(
                lambda nsqd=nsqd: channel_if_drained(nsqd.http_url, nsq_topic), "channels empty"
            )
    lost = tally.lost(published)
    record_figures(
        record_property,
        messages=len(published),
        handled=tally.handled,
        faults=1,
        lost=len(lost),
        duplicates=tally.duplicates(),
        recovery_max_s=found_s,
        outage_s=outage_s,
    )
    assert lost == []


# --------------------------------------------------------------------------- SIGTERM a consumer


CONSUMER_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    if os.environ.get("NSQ_SYNC_TEST_GEVENT") == "1":
        from gevent import monkey

        monkey.patch_all()

    import threading

    from nsq_sync import Consumer
    address, topic, channel, out_path = sys.argv[1:5]
    out = open(out_path, "wb")
    lock = threading.Lock()

    def handler(message):
        with lock:
            out.write(message.body + b"\\n")

    consumer = Consumer(topic, channel, handler, nsqd_tcp_addresses=address, max_in_flight=200,
                        concurrency=4)
    consumer.run()  # until SIGTERM; then stop() with its default 30 s deadline
    stats = consumer.stats()
    out.close()
    print("stopped", stats.finished, stats.requeued, stats.in_flight, flush=True)
    """
)


def test_sigterm_under_load_drains_and_exits_zero(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    tmp_path: Path,
    record_property: Any,
) -> None:
    """A consumer process under load gets SIGTERM: it drains within its deadline, exits 0,
    leaves nothing in flight at nsqd, and handled + remaining depth == published.

    nsqd flags: --mem-queue-size (the backlog stays in memory).
    """
    n = scaled(50_000)
    nsqd = nsqd_factory("--mem-queue-size=10000000")
    bodies = make_bodies(n)
    publish_http(nsqd.http_url, nsq_topic, bodies)
    # nsqd's topic pump copies the backlog into the channel after the publishes were
    # acknowledged; the progress below is read from the channel's depth
    wait_for(
        lambda: channel_stats(nsqd.http_url, nsq_topic)["depth"] == n,
        "the backlog in the channel",
        timeout=30.0,
    )
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER_SCRIPT)
    handled_path = tmp_path / "handled.txt"
    log_path = tmp_path / "consumer.log"
    env = dict(os.environ, NSQ_SYNC_TEST_GEVENT="1" if gevent_patched() else "0")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), nsqd.tcp_address, nsq_topic, CHANNEL, str(handled_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(
            lambda: n - channel_stats(nsqd.http_url, nsq_topic)["depth"] >= n // 10,
            "the subprocess under load",
            timeout=30.0,
        )
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=40.0)  # stop()'s deadline is 30 s
        drain_s = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10.0)
    output = log_path.read_text()
    assert code == 0, output
    last = output.strip().splitlines()[-1].split()
    assert last[0] == "stopped", output
    finished, requeued, in_flight = (int(x) for x in last[1:4])
    lines = handled_path.read_bytes().splitlines()
    handled = set(lines)

    def settled() -> dict[str, Any] | None:
        stats = channel_stats(nsqd.http_url, nsq_topic)
        return stats if stats["in_flight_count"] == 0 and stats["client_count"] == 0 else None

    stats = wait_for(settled, "0 in flight and no client at nsqd", timeout=5.0)
    lost = n - len(handled) - stats["depth"]
    record_figures(
        record_property,
        messages=n,
        handled=len(lines),
        faults=1,
        lost=lost,
        duplicates=len(lines) - len(handled),
        drain_s=drain_s,
        requeued_on_stop=requeued,
        remaining_depth=stats["depth"],
    )
    assert stats["deferred_count"] == 0
    assert drain_s < 30.0, "stop() overran its deadline"
    assert in_flight == 0 and finished == len(lines)
    assert len(lines) < n, "SIGTERM came too late to test anything"
    assert handled <= set(bodies)
    assert len(handled) + stats["depth"] == n, "handled + remaining depth == published"
    assert len(lines) == len(handled), "nothing handled twice"


# --------------------------------------------------------------------------- producer failover


@pytest.mark.parametrize("death", ["sigterm", "sigkill"])
def test_producer_failover_while_nsqd_dies(
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    consumers: Consumers,
    record_property: Any,
    death: str,
) -> None:
    """Four threads publish through one Producer([first, second]); the first nsqd dies
    (SIGTERM or SIGKILL). Every publish either returned (succeeded) or raised, within
    publish_timeout; every succeeded body is held by one of the two nsqds (read back by
    consuming both after the first one restarted on its data path).

    nsqd flags: first --mem-queue-size=0 --sync-every=1 (what it acknowledged is on disk
    before the kill); second none. No channel exists while publishing, so messages stay in
    the topic queue (nsqd would drop one moving to a channel at the kill).
    """
    first = nsqd_factory("--mem-queue-size=0", "--sync-every=1")
    second = nsqd_factory()
    publishers = 4
    publish_timeout = 5.0
    lock = threading.Lock()
    succeeded: list[bytes] = []
    failed: list[tuple[bytes, BaseException]] = []
    longest = [0.0]
    stop = threading.Event()

    with Producer(
        [first.tcp_address, second.tcp_address], publish_timeout=publish_timeout
    ) as producer:

        def publish_forever(k: int) -> None:
            i = 0
            while not stop.is_set():
                body = b"p%d-%d" % (k, i)
                i += 1
                t0 = time.monotonic()
                try:
                    producer.publish(nsq_topic, body)
                except NSQError as exc:
                    outcome: Any = exc
                else:
                    outcome = None
                took = time.monotonic() - t0
                with lock:
                    longest[0] = max(longest[0], took)
                    if outcome is None:
                        succeeded.append(body)
                    else:
                        failed.append((body, outcome))

        threads = [
            threading.Thread(target=publish_forever, args=(k,), name=f"publisher-{k}")
            for k in range(publishers)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(succeeded) >= 500, "500 publishes to the first nsqd")
            t_fault = time.monotonic()
            if death == "sigkill":
                first.kill()
            else:
                first.stop()
            at_fault = len(succeeded)
            wait_for(lambda: len(succeeded) >= at_fault + 500, "500 publishes after the failover")
            failover_s = time.monotonic() - t_fault
        finally:
            stop.set()
            for thread in threads:
                thread.join(30.0)
        assert not any(thread.is_alive() for thread in threads)

    first.restart()
    # Read back what the two nsqds hold: their topic depths, then every body by consuming.
    held = Tally()
    depths = 0
    for nsqd in (first, second):
        with NsqdHTTPClient(nsqd.http_url) as client:
            stats = client.topic_stats(nsq_topic)
        depths += 0 if stats is None else int(stats["depth"])
    consumer = consumers(
        nsq_topic,
        CHANNEL,
        held,
        nsqd_tcp_addresses=[first.tcp_address, second.tcp_address],
        max_in_flight=200,
        concurrency=2,
    )
    consumer.start()
    wait_for(lambda: held.handled >= depths, f"the {depths} messages the nsqds hold", 60.0)
    for nsqd in (first, second):
        wait_for(lambda nsqd=nsqd: channel_if_drained(nsqd.http_url, nsq_topic), "channels empty")
    missing = [b for b in succeeded if b not in held.counts]
    assert held.handled >= depths
    dup_held = held.duplicates()
    record_figures(
        record_property,
        messages=len(succeeded) + len(failed),
        handled=held.handled,
        faults=1,
        lost=len(missing),
        duplicates=dup_held,
        failed_but_held=sum(1 for b, _ in failed if b in held.counts),
        recovery_max_s=failover_s,
        publish_failed=len(failed),
        held=held.unique,
        nsqd_depths=depths,
        longest_publish_s=longest[0],
    )
    assert missing == [], f"{len(missing)} acknowledged publishes are on neither nsqd"
    assert longest[0] <= publish_timeout + 2.0, "a publish hung past publish_timeout"
    assert all(isinstance(exc, NSQError) for _, exc in failed)
