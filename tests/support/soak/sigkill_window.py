"""How many acknowledged messages an nsqd SIGKILL loses, and what bounds it:
``python -m support.soak.sigkill_window [--messages N] [--repeat R]`` (docs/reliability.md's table).

For each consumer setting: one nsqd with ``--mem-queue-size=0 --sync-every=1`` holds a backlog of
N messages (each acknowledged by nsqd, on disk); one Consumer handles them; once a third are
handled, nsqd gets SIGKILL and is restarted on its data, and the consumer handles what nsqd kept.
Lost: the messages never handled. Printed per setting: lost per run, and what nsqd reported in
flight just before the kill.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from nsq_sync import Consumer, Message, NsqdHTTPClient
from nsq_sync.testing import NsqdProcess

SETTINGS: dict[str, dict[str, Any]] = {
    "max_in_flight 50 (buffer 16 KiB / 250 ms)": {"max_in_flight": 50},
    "max_in_flight 50, output_buffer_timeout 25 ms": {
        "max_in_flight": 50,
        "output_buffer_timeout": 0.025,
    },
    "max_in_flight 50, output_buffer_size 64": {"max_in_flight": 50, "output_buffer_size": 64},
    "max_in_flight 50, output_buffer_size None (no buffer)": {
        "max_in_flight": 50,
        "output_buffer_size": None,
    },
    "max_in_flight 5": {"max_in_flight": 5},
    "max_in_flight 1": {"max_in_flight": 1},
    "max_in_flight 50, handler 2 ms (slower than the flow)": {
        "max_in_flight": 50,
        "handler_seconds": 0.002,
    },
    "max_in_flight 5, handler 2 ms (slower than the flow)": {
        "max_in_flight": 5,
        "handler_seconds": 0.002,
    },
}
TOPIC, CHANNEL = "window", "c"


def _channel(nsqd: NsqdProcess) -> dict[str, Any]:
    with NsqdHTTPClient(nsqd.http_url, timeout=10.0) as http:
        return http.channel_stats(TOPIC, CHANNEL, include_clients=False) or {}


def one_run(n: int, settings: dict[str, Any]) -> tuple[int, int]:
    """(lost, in flight at nsqd just before the kill)."""
    options = dict(settings)
    pause = options.pop("handler_seconds", 0.0)
    nsqd = NsqdProcess(extra_args=("--mem-queue-size=0", "--sync-every=1")).start()
    consumer = None
    try:
        with NsqdHTTPClient(nsqd.http_url, timeout=120.0) as http:
            http.create_topic(TOPIC)
            http.create_channel(TOPIC, CHANNEL)
            bodies = [b"m-%d" % i for i in range(n)]
            for i in range(0, n, 500):
                http.mpub(TOPIC, bodies[i : i + 500])
        seen: set[bytes] = set()
        lock = threading.Lock()

        def handle(message: Message) -> None:
            if pause:
                time.sleep(pause)
            with lock:
                seen.add(message.body)

        consumer = Consumer(
            TOPIC, CHANNEL, handle, nsqd_tcp_addresses=[nsqd.tcp_address],
            reconnect_backoff_max=0.5, **options,
        )  # fmt: skip
        consumer.start()
        deadline = time.monotonic() + 120.0
        while len(seen) < n // 3:
            assert time.monotonic() < deadline, "the consumer made no progress"
            time.sleep(0.001)
        in_flight = int(_channel(nsqd).get("in_flight_count", 0))
        nsqd.kill()
        nsqd.restart()
        deadline = time.monotonic() + 120.0
        while True:
            channel = _channel(nsqd)
            if channel and channel["depth"] == 0 and channel["in_flight_count"] == 0:
                break
            assert time.monotonic() < deadline, f"nsqd kept {channel} after its restart"
            time.sleep(0.1)
        assert consumer.stop(timeout=10.0)
        consumer = None
        return n - len(seen), in_flight
    finally:
        if consumer is not None:
            consumer.stop(timeout=10.0)
        nsqd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", help="the settings whose label contains this")
    args = parser.parse_args()
    print(f"| consumer setting | lost per run ({args.messages:,} messages, SIGKILL after a third) "
          "| in flight at nsqd just before |")  # fmt: skip
    print("|---|---|---|")
    for label, settings in SETTINGS.items():
        if args.only and args.only not in label:
            continue
        runs = [one_run(args.messages, settings) for _ in range(args.repeat)]
        lost = ", ".join(str(r[0]) for r in runs)
        held = ", ".join(str(r[1]) for r in runs)
        print(f"| {label} | {lost} | {held} |", flush=True)


if __name__ == "__main__":
    main()
