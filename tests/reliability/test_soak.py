"""Soak: nsqds join and leave through nsqlookupd while messages flow.

For ``NSQ_SYNC_SOAK_SECONDS`` (60 by default) a publisher streams messages to whichever nsqds are
up, a churn task starts new nsqds, stops running ones (SIGTERM: nsqd keeps its messages on disk)
and restarts stopped ones, and a sampler reads every live nsqd's ``/stats``. At the end every
stopped nsqd is restarted so that what it kept can be consumed, and then:

* every acknowledged publish was handled (0 lost), duplicates counted;
* the RDY the nsqds reported never added up to more than ``max_in_flight``: each nsqd's value is
  the smaller of two back-to-back sweeps (a sweep reads the nsqds one after the other, so credit
  that moves from A to B between the reads of A and B would otherwise be counted twice). The
  consumer sends a move's RDY 0 before its RDY 1, but two nsqds apply them independently: on a
  loaded machine B's RDY 1 can be in force while A's RDY 0 still waits to be read (CI once saw
  that through two sweeps). An excess therefore counts when a third sweep, 50 ms later, still
  shows it; the excesses gone by then are counted as a figure. What the consumer itself holds
  (``stats().total_rdy``) must never exceed ``max_in_flight``, in any sample;
* the consumer left no thread (or greenlet) and no file descriptor behind.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from nsq_sync import Consumer, NsqdHTTPClient, Producer
from nsq_sync.errors import NSQError
from nsq_sync.testing import NsqdProcess

from .helpers import (
    CHANNEL,
    Tally,
    channel_if_drained,
    live_tasks,
    make_bodies,
    open_fds,
    settle_leaks,
    soak_seconds,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_IN_FLIGHT = 3  # below the number of nsqds at times: credit must rotate
NSQD_ARGS = ("--msg-timeout=5s",)
CHURN_EVERY = 3.0  # seconds between churn actions
MAX_RUNNING = 4
MAX_NSQDS = 6


def _ready(nsqd: NsqdProcess, topic: str) -> int | None:
    """Sum of ready_count over the channel's clients, or None when nsqd cannot tell."""
    try:
        with NsqdHTTPClient(nsqd.http_url, timeout=1.0) as client:
            stats = client.channel_stats(topic, CHANNEL)
    except NSQError:
        return None
    if stats is None:
        return None
    return sum(int(c["ready_count"]) for c in stats["clients"])


def _channel_counts(nsqd: NsqdProcess, topic: str) -> str:
    """What nsqd holds for the topic and its channel, for a failure message."""
    with NsqdHTTPClient(nsqd.http_url, timeout=5.0) as client:
        stats = client.topic_stats(topic, include_clients=False)
    if stats is None:
        return "no topic"
    channels = [c for c in stats["channels"] if c["channel_name"] == CHANNEL]
    if not channels:
        return f"topic depth {stats['depth']}, no channel"
    return ", ".join(
        f"{key} {channels[0][key]}" for key in ("depth", "in_flight_count", "deferred_count")
    )


def _drained(nsqd: NsqdProcess, topic: str) -> bool:
    """Nothing is left for the consumer on ``nsqd``. An nsqd the churn started near the end
    may never have received a message (no topic), or hold the topic and not yet the channel
    (the consumer subscribes once lookupd lists it): not drained while the topic holds any."""
    with NsqdHTTPClient(nsqd.http_url, timeout=5.0) as client:
        stats = client.topic_stats(topic, include_clients=False)
    if stats is None:
        return True
    if not any(c["channel_name"] == CHANNEL for c in stats["channels"]):
        return int(stats["depth"]) == 0
    return channel_if_drained(nsqd.http_url, topic) is not None


def test_nsqds_join_and_leave_while_messages_flow(
    nsq_cluster: Any,
    nsqd_factory: Callable[..., NsqdProcess],
    nsq_topic: str,
    record_property: Any,
) -> None:
    """nsqd flags: --msg-timeout=5s on every nsqd; nsqlookupd flags: none."""
    duration = soak_seconds()
    rng = random.Random(6)
    cluster = nsq_cluster(2, nsqd_args=NSQD_ARGS)
    nsqds: list[NsqdProcess] = list(cluster.nsqds)
    for nsqd in nsqds:
        with NsqdHTTPClient(nsqd.http_url) as client:
            client.create_topic(nsq_topic)
            client.create_channel(nsq_topic, CHANNEL)
    nsqds_lock = threading.Lock()

    # Baselines, once the servers run and the HTTP machinery has been used once.
    tasks_before, fds_before = live_tasks(), open_fds()

    tally = Tally()
    consumer = Consumer(
        nsq_topic,
        CHANNEL,
        tally,
        lookupd_http_addresses=cluster.lookupd_http_addresses,
        max_in_flight=MAX_IN_FLIGHT,
        concurrency=4,
        lookupd_poll_interval=1.0,
        lookupd_poll_jitter=0.2,
        rdy_redistribute_interval=0.5,
        low_rdy_idle_timeout=1.0,
        reconnect_backoff_max=1.0,
    )
    stop = threading.Event()
    succeeded: list[bytes] = []
    failed: list[bytes] = []
    sweeps: list[tuple[int, ...]] = []
    over: list[tuple[dict[str, int], ...]] = []
    in_transit = [0]  # excesses that a third sweep no longer showed
    client_rdy_max = [0]
    churn_log: list[str] = []
    errors: list[BaseException] = []

    def running() -> list[NsqdProcess]:
        with nsqds_lock:
            return [n for n in nsqds if n.is_running]

    def publisher() -> None:
        producers: dict[str, Producer] = {}
        seq = 0
        try:
            while not stop.is_set():
                up = running()
                if not up:
                    time.sleep(0.01)
                    continue
                nsqd = rng.choice(up)
                producer = producers.get(nsqd.tcp_address)
                if producer is None:
                    producer = producers[nsqd.tcp_address] = Producer(
                        nsqd.tcp_address, publish_timeout=2.0, reconnect_backoff_max=0.5
                    )
                batch = make_bodies(10, f"s{seq}")
                seq += 1
                try:
                    producer.multi_publish(nsq_topic, batch)
                except NSQError:
                    failed.extend(batch)  # outcome unknown: the nsqd went away
                else:
                    succeeded.extend(batch)
                time.sleep(0.02)  # the load: ~500 messages/s
        except BaseException as exc:
            errors.append(exc)
        finally:
            for producer in producers.values():
                producer.close()

    def churn() -> None:
        try:
            while not stop.wait(CHURN_EVERY):  # the churn schedule
                with nsqds_lock:
                    up = [n for n in nsqds if n.is_running]
                    down = [n for n in nsqds if not n.is_running]
                    total = len(nsqds)
                actions = []
                if len(up) > 2:
                    actions.append("stop")
                if len(up) < MAX_RUNNING and down:
                    actions.append("restart")
                if len(up) < MAX_RUNNING and total < MAX_NSQDS:
                    actions.append("start")
                action = rng.choice(actions)
                if action == "stop":
                    victim = rng.choice(up)
                    victim.stop()
                    churn_log.append(f"stop {victim.tcp_address}")
                elif action == "restart":
                    back = rng.choice(down)
                    back.restart()
                    churn_log.append(f"restart {back.tcp_address}")
                else:
                    new = nsqd_factory(*NSQD_ARGS, lookupd=cluster.lookupd)
                    with nsqds_lock:
                        nsqds.append(new)
                    churn_log.append(f"start {new.tcp_address}")
        except BaseException as exc:
            errors.append(exc)

    def sampler() -> None:
        def sweep() -> dict[str, int]:
            found = {}
            for nsqd in running():
                ready = _ready(nsqd, nsq_topic)
                if ready is not None:
                    found[nsqd.tcp_address] = ready
            return found

        try:
            while not stop.is_set():
                first, second = sweep(), sweep()
                settled = {a: min(first[a], second[a]) for a in first.keys() & second.keys()}
                sweeps.append(tuple(settled.values()))
                if sum(settled.values()) > MAX_IN_FLIGHT:
                    time.sleep(0.05)
                    third = sweep()
                    lasting = {a: min(settled[a], third[a]) for a in settled.keys() & third.keys()}
                    if sum(lasting.values()) > MAX_IN_FLIGHT:
                        over.append((first, second, third))
                    else:
                        in_transit[0] += 1
                client_rdy_max[0] = max(client_rdy_max[0], consumer.stats().total_rdy)
                time.sleep(0.02)  # the sampling rate
        except BaseException as exc:
            errors.append(exc)

    consumer.start()
    threads = [
        threading.Thread(target=fn, name=f"soak-{fn.__name__}", daemon=True)
        for fn in (publisher, churn, sampler)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: errors or time.monotonic() - started >= duration, "the soak", duration + 30
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30.0)
    assert errors == [], errors
    assert not any(thread.is_alive() for thread in threads)

    # Bring back every nsqd that was left stopped: what it kept on disk must be consumed too.
    with nsqds_lock:
        stopped = [n for n in nsqds if not n.is_running]
    for nsqd in stopped:
        nsqd.restart()
    try:
        wait_for(lambda: tally.covers(succeeded), "every acknowledged message handled", 90.0)
        for nsqd in nsqds:
            wait_for(lambda nsqd=nsqd: _drained(nsqd, nsq_topic), f"{nsqd.tcp_address} drained")
    except AssertionError as exc:
        lost = tally.lost(succeeded)
        raise AssertionError(
            f"{exc}: {len(lost)} of {len(succeeded)} acknowledged messages not handled "
            f"(e.g. {lost[:3]}); the nsqds' channels: "
            f"{ {n.tcp_address: _channel_counts(n, nsq_topic) for n in nsqds} }; "
            f"churn: {', '.join(churn_log)}"
        ) from None
    assert consumer.stop(timeout=10.0) is True
    tasks_after, fds_after = settle_leaks(tasks_before, fds_before)

    lost = tally.lost(succeeded)
    _record = {
        "messages": len(succeeded),
        "handled": tally.handled,
        "faults": len(churn_log),
        "lost": len(lost),
        "duplicates": tally.duplicates(),
        "soak_s": round(time.monotonic() - started, 1),
        "publish_failed": len(failed),
        "failed_but_handled": sum(1 for b in failed if b in tally.counts),
        "nsqds_used": len(nsqds),
        "rdy_samples": len(sweeps),
        "rdy_max_seen": max((sum(s) for s in sweeps), default=0),
        "rdy_over_in_transit": in_transit[0],
        "tasks_before_after": f"{tasks_before}/{tasks_after}",
        "fds_before_after": f"{fds_before}/{fds_after}",
    }
    for name, value in _record.items():
        record_property(name, value)
    print("churn:", ", ".join(churn_log))

    assert lost == []
    assert len(churn_log) >= min(5, int(duration / CHURN_EVERY) - 1), churn_log
    assert len(sweeps) >= 50, "too few RDY samples to say anything"
    assert any(sum(s) > 0 for s in sweeps), "the sampler never saw any RDY"
    assert over == [], f"sum(RDY) over max_in_flight in {len(over)} samples: {over[:3]}"
    assert client_rdy_max[0] <= MAX_IN_FLIGHT
    assert tasks_after <= tasks_before, f"{tasks_after - tasks_before} thread(s)/greenlet(s) leaked"
    assert fds_after <= fds_before, f"{fds_after - fds_before} file descriptor(s) leaked"
