"""Profile target: consume a pre-filled topic with one Consumer (FIN each), print the rate.

    .venv/bin/python bench/profile/consume.py [N] [--concurrency C] [--gevent]
    .venv/bin/py-spy record --gil --threads -r 1000 -f raw -o consume.txt -- \\
        .venv/bin/python bench/profile/consume.py 1000000

Starts its own nsqd on 127.0.0.1 (nsq_sync.testing, --mem-queue-size large enough that nothing
spills to disk), fills the topic through HTTP /mpub, then times Consumer construction to the
N-th handler call, as the benchmark's consume workload does. Bounded: 120 s at most.
"""

import argparse
import itertools
import struct
import sys
import threading
import time

if "--gevent" in sys.argv:
    from gevent import monkey

    monkey.patch_all()

import requests  # noqa: E402

from nsq_sync import Consumer  # noqa: E402
from nsq_sync.testing import NsqdProcess  # noqa: E402

BODY = b"x" * 200
CHUNK = 5000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", type=int, nargs="?", default=200_000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--gevent", action="store_true")
    args = parser.parse_args()
    with NsqdProcess(extra_args=["--mem-queue-size=10000000"]) as nsqd:
        url = f"http://{nsqd.http_address}"
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            requests.post(url + path, timeout=10).raise_for_status()
        payload = struct.pack(">I", CHUNK) + b"".join(
            struct.pack(">I", len(BODY)) + BODY for _ in range(CHUNK)
        )
        for _ in range((args.n + CHUNK) // CHUNK + 1):  # N + CHUNK: nsqd keeps sending
            requests.post(
                f"{url}/mpub?topic=t&binary=true", data=payload, timeout=30
            ).raise_for_status()
        counter = itertools.count(1)
        done = threading.Event()

        def handler(message: object) -> None:
            if next(counter) == args.n:
                done.set()

        start = time.perf_counter()
        consumer = Consumer(
            "t",
            "c",
            handler,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=2500,
            concurrency=args.concurrency,
        )
        consumer.start()
        finished = done.wait(120)
        elapsed = time.perf_counter() - start
        consumer.stop(10)
        if not finished:
            sys.exit(f"only {consumer.stats().finished} of {args.n} messages in 120 s")
        print(f"{args.n / elapsed:,.0f} msg/s ({elapsed:.2f} s)")


if __name__ == "__main__":
    main()
