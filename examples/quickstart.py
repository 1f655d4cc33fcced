"""Quick start: publish through nsq_sync, then consume through a Consumer that finds nsqd via
nsqlookupd.

Run it with ``scripts/demo`` (which starts a local nsqlookupd and nsqd on loopback), or point it
at your own servers:

    NSQD_TCP_ADDRESS=127.0.0.1:4150 NSQLOOKUPD_HTTP_ADDRESS=127.0.0.1:4161 python examples/quickstart.py
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

from nsq_sync import Consumer, Message, Producer

NSQD = os.environ.get("NSQD_TCP_ADDRESS", "127.0.0.1:4150")
LOOKUPD = os.environ.get("NSQLOOKUPD_HTTP_ADDRESS", "127.0.0.1:4161")
TOPIC = f"quickstart_{uuid.uuid4().hex[:8]}"


def main() -> int:
    print(f"nsqd {NSQD}, nsqlookupd {LOOKUPD}, topic {TOPIC}")

    # --- publish: PUB waits for nsqd's OK, MPUB is atomic, DPUB is delivered later
    with Producer(NSQD) as producer:
        producer.publish(TOPIC, b"hello from nsq_sync")
        producer.multi_publish(TOPIC, [f"order {i}".encode() for i in range(1, 6)])
        producer.deferred_publish(TOPIC, b"this one was deferred by 1 s", delay=1.0)
    expected = 7
    print(f"published {expected} messages (1 PUB, 1 MPUB of 5, 1 DPUB)")

    # --- consume: the Consumer asks nsqlookupd where TOPIC lives and connects to that nsqd
    received: list[Message] = []
    done = threading.Event()
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            received.append(message)
            print(f"  handled {message.body.decode()!r} (attempt {message.attempts})")
            if len(received) == expected:
                done.set()

    consumer = Consumer(
        TOPIC,
        "quickstart",
        handle,
        lookupd_http_addresses=[LOOKUPD],
        max_in_flight=10,
        concurrency=2,
        lookupd_poll_interval=1.0,  # the default is 60 s; a demo should not wait that long
    )
    started = time.monotonic()
    consumer.start()
    try:
        finished = done.wait(timeout=30.0)
    finally:
        clean = consumer.stop(timeout=10.0)
    stats = consumer.stats()
    print(
        f"consumed {len(received)}/{expected} in {time.monotonic() - started:.2f} s via lookupd "
        f"(finished {stats.finished}, requeued {stats.requeued}); clean stop: {clean}"
    )
    return 0 if finished and clean else 1


if __name__ == "__main__":
    sys.exit(main())
