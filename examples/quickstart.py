"""Quick start: publish through nsq_sync, then consume through a Consumer that finds nsqd via
nsqlookupd, and print a short summary.

Run it with ``scripts/demo`` (which starts a local nsqlookupd and nsqd), or point it at your own
servers:

    NSQD_TCP_ADDRESS=127.0.0.1:4150 NSQLOOKUPD_HTTP_ADDRESS=127.0.0.1:4161 python examples/quickstart.py

Exits 0 when every message was handled and the consumer stopped cleanly, 1 otherwise.
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
BATCH = 10_000


def main() -> int:
    # --- publish: PUB waits for nsqd's OK; MPUB publishes a batch atomically.
    # (producer.deferred_publish(TOPIC, body, delay=1.0) delivers a message 1 s later, but no
    # sooner than nsqd's next look at the channel's deferred messages: nsqd v1.3.0 refreshes its
    # list of channels to look at every 5 s, so on a channel made a moment ago it can take 5 s.)
    started = time.monotonic()
    with Producer(NSQD) as producer:
        producer.publish(TOPIC, b"hello from nsq_sync")
        producer.multi_publish(TOPIC, [f"order {i}".encode() for i in range(BATCH)])
    expected = BATCH + 1
    print(
        f"published {expected:,} messages to {TOPIC} on nsqd {NSQD} "
        f"in {time.monotonic() - started:.2f} s (1 PUB, 1 MPUB of {BATCH:,})"
    )

    # --- consume: the Consumer asks nsqlookupd where TOPIC lives and connects to that nsqd
    lock = threading.Lock()
    handled = 0
    all_done = threading.Event()

    def handle(message: Message) -> None:  # returning finishes (FIN) the message; raising requeues
        nonlocal handled
        with lock:
            handled += 1
            if handled == expected:
                all_done.set()

    consumer = Consumer(
        TOPIC,
        "quickstart",
        handle,
        lookupd_http_addresses=[LOOKUPD],
        max_in_flight=200,
        concurrency=4,
    )
    consuming = time.monotonic()
    consumer.start()
    try:
        complete = all_done.wait(timeout=60.0)
        took = time.monotonic() - consuming
    finally:
        clean = consumer.stop(timeout=10.0)
    stats = consumer.stats()
    print(
        f"consumed {handled:,}/{expected:,} via nsqlookupd {LOOKUPD} in {took:.2f} s "
        f"({handled / took:,.0f} msg/s); finished {stats.finished:,}, requeued {stats.requeued}; "
        f"{'stopped cleanly' if clean else 'did NOT stop cleanly'}"
    )
    return 0 if complete and clean else 1


if __name__ == "__main__":
    sys.exit(main())
