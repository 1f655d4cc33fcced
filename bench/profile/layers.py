"""Profile target: where a synchronous PUB's time goes, layer by layer, and what 8 threads cost.

    .venv/bin/python bench/profile/layers.py [--n 5000] [--rounds 7]

Starts its own nsqd. Part 1 publishes one message at a time through each layer of the same
connection, in rounds that alternate the order, and prints the median user/system CPU and wall
time per publish:

* ``producer``  -- ``Producer.publish`` (validation, failover loop, the request);
* ``request``   -- ``NsqdConnection.request`` with a pre-encoded PUB (FIFO matching, reading role);
* ``transport`` -- ``Transport.send`` + ``Transport.recv`` (write combining, locks, recv_into);
* ``flat``      -- a PROTOTYPE of an uncontended fast path over the same objects: encode, one
  lock round trip, ``sendall``, ``recv_into``, compare with a lone OK frame (no error handling:
  it measures what a flat code path could reach, it is not a publish);
* ``raw``       -- a bare stdlib socket doing the same two system calls (the bench's ceiling).

Part 2 publishes from 8 threads through one Producer (one connection) and through one Producer
per thread (8 connections), and prints the rate, the process CPU per publish and the voluntary
and involuntary context switches per publish (getrusage): what the thread hand-offs cost.

It reads private attributes of nsq_sync's connection and transport (it is a profiling tool):
when they change, part 1 says so and skips the layers it cannot reach.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nsq_sync import Producer
from nsq_sync.protocol import commands
from nsq_sync.testing import NsqdProcess

BODY = b"x" * 200
TOPIC = "t"
_OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def _cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def _measure(loop: Callable[[int], None], n: int) -> tuple[float, float, float]:
    """(user µs, system µs, wall µs) per publish over n publishes."""
    loop(200)  # warm
    t0, (u0, s0) = time.perf_counter(), _cpu()
    loop(n)
    wall, (u1, s1) = time.perf_counter() - t0, _cpu()
    return 1e6 * (u1 - u0) / n, 1e6 * (s1 - s0) / n, 1e6 * wall / n


def _raw_socket(address: str) -> socket.socket:
    """The bench's raw-socket ceiling connection (bench/clients/raw_socket_client.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
    import raw_socket_client

    sock: socket.socket = raw_socket_client._connect(address)
    return sock


def layers(address: str, n: int, rounds: int) -> None:
    producer = Producer([address])
    producer.publish(TOPIC, BODY)
    command = commands.pub(TOPIC, BODY)
    loops: dict[str, Callable[[int], None]] = {}

    def producer_loop(k: int) -> None:
        publish = producer.publish
        for _ in range(k):
            publish(TOPIC, BODY)

    loops["producer"] = producer_loop
    try:
        conn = producer._slots[0].conn
        assert conn is not None
        transport = conn._transport
        lock, rsock, wsock = conn._request_lock, transport._rsock, transport._wsock
        rbuf = transport._rbuf
    except (AttributeError, AssertionError) as exc:
        print(f"(connection internals changed: {exc!r}; only producer and raw measured)")
    else:

        def request_loop(k: int) -> None:
            request = conn.request
            for _ in range(k):
                request(command, 5.0)

        def transport_loop(k: int) -> None:
            send, recv = transport.send, transport.recv
            for _ in range(k):
                send(command)
                recv(5.0)

        def flat_loop(k: int) -> None:
            encode, sendall, recv_into = commands.pub, wsock.sendall, rsock.recv_into
            for _ in range(k):
                data = encode(TOPIC, BODY)
                with lock:
                    if conn._reading or conn._waiters or conn.closed:
                        raise RuntimeError("contended")
                    conn._reading = True
                try:
                    sendall(data)
                    if recv_into(rbuf) != 10 or rbuf[:10] != _OK_FRAME:
                        raise RuntimeError("not a lone OK frame")
                finally:
                    conn._reading = False

        loops.update(request=request_loop, transport=transport_loop, flat=flat_loop)
    sock = _raw_socket(address)

    def raw_loop(k: int) -> None:
        sendall, recv = sock.sendall, sock.recv
        for _ in range(k):
            sendall(command)
            recv(65536)

    loops["raw"] = raw_loop
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name].append(_measure(loops[name], n))
    raw_wall = statistics.median(x[2] for x in results["raw"])
    print(f"one thread, PUB waiting for each OK: median of {rounds} rounds of {n}")
    for name, values in results.items():
        user = statistics.median(x[0] for x in values)
        system = statistics.median(x[1] for x in values)
        wall = statistics.median(x[2] for x in values)
        print(
            f"  {name:9}  user {user:5.1f} µs  system {system:5.1f} µs  wall {wall:5.1f} µs  "
            f"{1e6 / wall:8,.0f} msg/s  {raw_wall / wall:.2f}× raw"
        )
    sock.close()
    producer.close()


def threads(address: str, n: int, count: int = 8) -> None:
    print(f"\n{count} threads vs 1, {n} publishes per run")
    for label, per_thread in (
        ("1 thread", False),
        ("one Producer", False),
        ("Producer each", True),
    ):
        k = 1 if label == "1 thread" else count
        producers = [Producer([address]) for _ in range(k if per_thread else 1)]
        for p in producers:
            p.publish(TOPIC, BODY)
        barrier = threading.Barrier(k + 1)

        def work(
            i: int,
            producers: list[Producer] = producers,
            k: int = k,
            barrier: threading.Barrier = barrier,
        ) -> None:
            publish = producers[i % len(producers)].publish
            barrier.wait()
            for _ in range(n // k):
                publish(TOPIC, BODY)

        pool = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        for t in pool:
            t.start()
        barrier.wait()
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        for t in pool:
            t.join(120)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        done = n // k * k
        print(
            f"  {label:14} {done / wall:8,.0f} msg/s  CPU {1e6 * cpu / done:5.1f} µs/publish  "
            f"({cpu / wall:.2f} cores)  context switches per publish: voluntary "
            f"{(r1.ru_nvcsw - r0.ru_nvcsw) / done:.2f}, involuntary "
            f"{(r1.ru_nivcsw - r0.ru_nivcsw) / done:.2f}"
        )
        for p in producers:
            p.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="publishes per layer and round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads-n", type=int, default=40_000)
    args = parser.parse_args()
    with NsqdProcess(extra_args=["--mem-queue-size=10000000"]) as nsqd:
        layers(nsqd.tcp_address, args.n, args.rounds)
        threads(nsqd.tcp_address, args.threads_n)


if __name__ == "__main__":
    main()
