"""Scarce credit on real nsqds: the longest stall while an nsqd holds messages, and the idle cost.

    python -m bench.profile.scarce_credit gaps [--runs 5] [--runtime threads|gevent]
    python -m bench.profile.scarce_credit idle [--seconds 60] [--nsqds 2] [--max-in-flight 1]

``gaps`` runs the scenarios of issue 25 (max_in_flight below the number of nsqds, a 10 ms
handler, every message published before the consumer starts) and prints, per run, the longest
time with nothing consumed while some nsqd still held messages: the largest difference between
consecutive handler starts, counting from ``start()`` (every message is published first, so
until the last one is handled some nsqd holds one). Scenarios: ``1/2``: two nsqds given
directly, max_in_flight 1, nsqd A holds 300 and B 1; ``2/3``: three nsqds, max_in_flight 2, A
300, B 1, C none; ``lookupd``: as 1/2 through an nsqlookupd.

``idle``: a consumer with max_in_flight below the number of nsqds and no message anywhere, for
``--seconds`` after a 2 s warm-up: RDY commands sent per minute (counted at
``ConnectionSet.apply``) and the process's CPU seconds per minute (nsqds are other processes).

Both import nsq_sync from ``sys.path``: ``PYTHONPATH=/tmp/base`` measures another tree (e.g.
``git archive <commit> nsq_sync | tar -x -C /tmp/base``) in the same session.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
import uuid
from typing import Any


def _servers(n: int, lookupd: bool) -> tuple[list[Any], Any]:
    from nsq_sync.testing import NsqdProcess, NsqlookupdProcess

    look = NsqlookupdProcess().start() if lookupd else None
    kwargs: dict[str, Any] = {}
    if look is not None:
        kwargs["lookupd_tcp_addresses"] = [look.tcp_address]
    nsqds = [NsqdProcess(**kwargs).start() for _ in range(n)]
    return nsqds, look


def _publish(nsqd: Any, topic: str, n: int) -> None:
    from nsq_sync import NsqdHTTPClient

    client = NsqdHTTPClient(nsqd.http_url)
    client.create_topic(topic)
    client.create_channel(topic, "ch")
    for start in range(0, n, 100):
        client.mpub(topic, [b"m%d" % i for i in range(start, min(n, start + 100))])


def gaps_run(scenario: str, runtime: str) -> dict[str, Any]:
    from nsq_sync import Consumer, LookupdClient

    counts = {"1/2": [300, 1], "2/3": [300, 1, 0], "lookupd": [300, 1]}[scenario]
    max_in_flight = 2 if scenario == "2/3" else 1
    nsqds, look = _servers(len(counts), scenario == "lookupd")
    topic = "t" + uuid.uuid4().hex[:10]
    try:
        for nsqd, count in zip(nsqds, counts):
            _publish(nsqd, topic, count)
        where: dict[str, Any] = {}
        if look is not None:
            deadline = time.monotonic() + 20
            with LookupdClient(look.http_url) as client:
                while len(client.lookup(topic)) < len(nsqds):
                    assert time.monotonic() < deadline, "lookupd never listed the nsqds"
                    time.sleep(0.05)
            where = {"lookupd_http_addresses": [look.http_address], "lookupd_poll_interval": 1}
        else:
            where = {"nsqd_tcp_addresses": [n.tcp_address for n in nsqds]}
        total = sum(counts)
        starts: list[float] = []
        lock = threading.Lock()
        done = threading.Event()

        def handler(message: Any) -> None:
            with lock:
                starts.append(time.monotonic())
                if len(starts) == total:
                    done.set()
            time.sleep(0.01)

        consumer = Consumer(
            topic, "ch", handler, max_in_flight=max_in_flight, runtime=runtime, **where
        )
        began = time.monotonic()
        consumer.start()
        finished = done.wait(120)
        consumer.stop(10)
        times = [began, *starts]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return {
            "scenario": scenario,
            "handled": len(starts),
            "complete": finished,
            "longest_gap_s": round(max(gaps), 3),
            "took_s": round(starts[-1] - began, 2) if starts else None,
        }
    finally:
        for proc in [*nsqds, look]:
            if proc is not None:
                proc.stop()


def idle_run(seconds: float, n: int, max_in_flight: int, runtime: str) -> dict[str, Any]:
    from nsq_sync import Consumer
    from nsq_sync.consumer.connections import ConnectionSet

    rdy_sent = [0]
    apply = ConnectionSet.apply

    def counting_apply(self: Any, actions: Any) -> None:
        rdy_sent[0] += len(actions)
        apply(self, actions)

    ConnectionSet.apply = counting_apply  # type: ignore[method-assign]
    nsqds, _ = _servers(n, False)
    topic = "t" + uuid.uuid4().hex[:10]
    try:
        for nsqd in nsqds:
            _publish(nsqd, topic, 0)
        consumer = Consumer(
            topic,
            "ch",
            lambda m: None,
            nsqd_tcp_addresses=[x.tcp_address for x in nsqds],
            max_in_flight=max_in_flight,
            runtime=runtime,
        )
        consumer.start()
        time.sleep(2.0)  # a measurement window, not a wait for a condition: connected by then
        connected = len(consumer.stats().connections)
        sent0 = rdy_sent[0]
        cpu0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        t0 = time.monotonic()
        time.sleep(seconds)
        cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - cpu0
        elapsed = time.monotonic() - t0
        sent = rdy_sent[0] - sent0
        consumer.stop(10)
        return {
            "nsqds": n,
            "connected": connected,
            "max_in_flight": max_in_flight,
            "seconds": round(elapsed, 1),
            "rdy_per_min": round(sent * 60 / elapsed, 1),
            "cpu_ms_per_min": round(cpu * 60_000 / elapsed, 1),
        }
    finally:
        for proc in nsqds:
            proc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["gaps", "idle"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scenarios", default="1/2,2/3,lookupd")
    parser.add_argument("--runtime", default="threads")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--nsqds", type=int, default=2)
    parser.add_argument("--max-in-flight", type=int, default=1)
    args = parser.parse_args(argv)
    if args.runtime == "gevent":
        from gevent import monkey

        monkey.patch_all()
    import nsq_sync

    tree = os.path.dirname(os.path.dirname(os.path.abspath(nsq_sync.__file__)))
    print(f"# nsq_sync from {tree}, runtime {args.runtime}", flush=True)
    if args.what == "gaps":
        for scenario in args.scenarios.split(","):
            for _ in range(args.runs):
                print(json.dumps(gaps_run(scenario, args.runtime)), flush=True)
    else:
        result = idle_run(args.seconds, args.nsqds, args.max_in_flight, args.runtime)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
