"""Profile target: PUB (or MPUB) through one Producer from T threads, print the rate.

    .venv/bin/python bench/profile/publish.py [N] [--threads T] [--mpub B] [--gevent]
    strace -f -c -o pub.strace .venv/bin/python bench/profile/publish.py 20000 --threads 8
    /usr/bin/time .venv/bin/python bench/profile/publish.py 80000 --threads 8

Starts its own nsqd on 127.0.0.1 (nsq_sync.testing; note strace and time then count nsqd's
start-up in the parent, not nsqd itself). One warm-up publish connects before the clock starts.
"""

import argparse
import sys
import threading
import time

if "--gevent" in sys.argv:
    from gevent import monkey

    monkey.patch_all()

from nsq_sync import Producer  # noqa: E402
from nsq_sync.testing import NsqdProcess  # noqa: E402

BODY = b"x" * 200


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", type=int, nargs="?", default=40_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mpub", type=int, default=0, help="MPUB batches of this size")
    parser.add_argument("--gevent", action="store_true")
    args = parser.parse_args()
    with NsqdProcess(extra_args=["--mem-queue-size=10000000"]) as nsqd:
        elapsed = run(nsqd.tcp_address, args)
    print(
        f"{args.n // args.threads * args.threads / elapsed:,.0f} msg/s from {args.threads} thread(s)"
    )


def run(address: str, args: argparse.Namespace) -> float:
    """Publish from the threads; return the seconds it took (after a warm-up publish)."""
    per_thread = args.n // args.threads
    with Producer([address]) as producer:
        producer.publish("t", BODY)
        barrier = threading.Barrier(args.threads + 1)

        def work() -> None:
            barrier.wait()
            if args.mpub:
                batch = [BODY] * args.mpub
                for _ in range(per_thread // args.mpub):
                    producer.multi_publish("t", batch)
            else:
                for _ in range(per_thread):
                    producer.publish("t", BODY)

        threads = [threading.Thread(target=work) for _ in range(args.threads)]
        for thread in threads:
            thread.start()
        barrier.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start


if __name__ == "__main__":
    main()
