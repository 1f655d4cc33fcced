"""One client doing one operation N times, for bench/profile/instructions.py (run under callgrind).

    python _ir_worker.py CLIENT OP N TCP_ADDRESS TOPIC

CLIENT is nsq_sync, nsq-py or raw (a bare stdlib socket), or nsq_sync with metrics on:
nsq_sync+prometheus (``metrics.enable_prometheus()``, the default registry) or nsq_sync+otel
(``metrics.enable_otel()`` with the SDK: a tracer provider with a batch span processor and a
meter provider with a reader, both in memory); nsq_sync-base is nsq_sync from the tree on
PYTHONPATH (instructions.py --baseline). OP is ``pub`` (one PUB at a time, each
waiting for its OK, after one warm-up PUB) or ``consume`` (N messages of a topic the harness
filled with exactly N, FIN each, max_in_flight 2500). Standard library plus the client: it runs
with each peer's own interpreter. Bounded: a consume that has not got N messages in 600 s exits 1.
"""

from __future__ import annotations

import logging
import socket
import struct
import sys
import threading

BODY = b"x" * 200


def nsq_sync_pub(n: int, address: str, topic: str) -> None:
    from nsq_sync import Producer

    with Producer(address) as producer:
        producer.publish(topic, BODY)
        for _ in range(n):
            producer.publish(topic, BODY)


def nsq_sync_consume(n: int, address: str, topic: str) -> None:
    from nsq_sync import Consumer

    done = threading.Event()
    count = 0

    def handle(message: object) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    consumer = Consumer(topic, "ch", handle, nsqd_tcp_addresses=[address], max_in_flight=2500)
    consumer.start()
    try:
        if not done.wait(600):
            sys.exit(f"consumed {count} of {n}")
    finally:
        consumer.stop()


def nsqpy_pub(n: int, address: str, topic: str) -> None:
    import nsq.client

    logging.getLogger("nsq").setLevel(logging.WARNING)
    client = nsq.client.Client(nsqd_tcp_addresses=[address])
    name = topic.encode()
    client.pub(name, BODY)
    for _ in range(n):
        client.pub(name, BODY)
    client.close()


def nsqpy_consume(n: int, address: str, topic: str) -> None:
    import nsq.reader

    logging.getLogger("nsq").setLevel(logging.WARNING)
    reader = nsq.reader.Reader(
        topic.encode(), b"ch", nsqd_tcp_addresses=[address], max_in_flight=2500
    )
    for count, message in enumerate(reader, 1):
        message.fin()
        if count == n:
            break
    reader.close()


def raw_pub(n: int, address: str, topic: str) -> None:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    command = b"PUB %s\n" % topic.encode() + struct.pack(">l", len(BODY)) + BODY
    for _ in range(n + 1):
        sock.sendall(command)
        sock.recv(65536)  # the 10-byte OK frame
    sock.close()


def enable_prometheus() -> None:
    from nsq_sync import metrics

    metrics.enable_prometheus()


def enable_otel() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nsq_sync import metrics

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    metrics.enable_otel(meter_provider, tracer_provider)


SETUP = {"nsq_sync+prometheus": enable_prometheus, "nsq_sync+otel": enable_otel}

WORKERS = {
    ("nsq_sync", "pub"): nsq_sync_pub,
    ("nsq_sync", "consume"): nsq_sync_consume,
    ("nsq_sync-base", "pub"): nsq_sync_pub,
    ("nsq_sync-base", "consume"): nsq_sync_consume,
    ("nsq_sync+prometheus", "pub"): nsq_sync_pub,
    ("nsq_sync+prometheus", "consume"): nsq_sync_consume,
    ("nsq_sync+otel", "pub"): nsq_sync_pub,
    ("nsq_sync+otel", "consume"): nsq_sync_consume,
    ("nsq-py", "pub"): nsqpy_pub,
    ("nsq-py", "consume"): nsqpy_consume,
    ("raw", "pub"): raw_pub,
}


def main() -> None:
    client, op, n, address, topic = sys.argv[1:6]
    setup = SETUP.get(client)
    if setup is not None:
        setup()
    WORKERS[client, op](int(n), address, topic)


if __name__ == "__main__":
    main()
