"""A consumer and a producer in one process serving ``/metrics`` (prometheus_client), driven
over stdin, for tests/integration/test_metrics_prometheus.py.

Environment: NSQD_TCP_ADDRESS, TOPIC, CHANNEL. Prints ``{"port": P}`` once ``/metrics``
listens on 127.0.0.1:P, then reads commands, one per line, answering each with ``ok``:

* ``publish BODY N``: publish N messages with body BODY (one PUB each); a publish that
  raises PublishError (the connection nsqd closed when it restarted) is tried again, and
  the answer is ``ok E`` with E the publishes that raised;
* ``mpub BODY N``: one MPUB of N such messages;
* ``release``: let the handlers holding ``hold`` messages return;
* ``quit``: stop the consumer and close the producer, then exit 0.

The handler finishes every message, except that a ``fail`` body raises on its first attempt
(it is requeued, then finished) and a ``hold`` body waits for ``release`` (it stays in flight).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from os import environ

from nsq_sync import Consumer, Message, Producer, metrics
from nsq_sync.errors import PublishError

released = threading.Event()


def handle(message: Message) -> None:
    if message.body == b"fail" and message.attempts == 1:
        raise RuntimeError("first attempt fails")
    if message.body == b"hold":
        released.wait(60)


def main() -> int:
    metrics.enable_prometheus()
    port = metrics.serve_prometheus(0, "127.0.0.1")
    address = environ["NSQD_TCP_ADDRESS"]
    producer = Producer(address, reconnect_backoff_max=0.2)
    consumer = Consumer(
        environ["TOPIC"],
        environ["CHANNEL"],
        handle,
        nsqd_tcp_addresses=[address],
        max_in_flight=10,
        concurrency=4,
        default_requeue_delay=0.0,
        reconnect_backoff_max=0.2,
    )
    consumer.start()
    print(json.dumps({"port": port}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "publish":
            errors = 0
            deadline = time.monotonic() + 20.0
            for _ in range(int(args[1])):
                while True:
                    try:
                        producer.publish(environ["TOPIC"], args[0].encode())
                        break
                    except PublishError:  # backing off: the next try after a moment
                        errors += 1
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
            print(f"ok {errors}", flush=True)
            continue
        elif command == "mpub":
            producer.multi_publish(environ["TOPIC"], [args[0].encode()] * int(args[1]))
        elif command == "release":
            released.set()
        elif command == "quit":
            break
        print("ok", flush=True)
    released.set()
    consumer.stop(10.0)
    producer.close()
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
