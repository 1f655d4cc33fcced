"""Looking for the Django 500 once seen under uWSGI threads (issue 40):
``python -m support.soak.respawn_burst [--cycles N]`` (with ``tests`` on ``PYTHONPATH``).

The scene of that CI failure (tests/contrib/test_uwsgi.py, ``threads-8``): the Django example
under uWSGI, 2 workers x 8 threads, loaded in the master, which publishes before it forks.
Each cycle SIGKILLs a worker and, the moment uWSGI has forked its replacement, sends 16
requests at once (``/orders``: an Order saved, its message published on commit), so that a new
worker's first publishes race each other. Prints the answers' statuses and every exception
Django logged.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from nsq_sync.testing import NsqdProcess
from support.web import EXAMPLE, Uwsgi, migrated_shop

from .accounting import named_errors
from .deployment import children

APPS = Path(__file__).resolve().parents[1] / "uwsgi_apps"
BURST = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=200)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="nsq_sync-respawn-burst-"))
    statuses: collections.Counter[object] = collections.Counter()
    with NsqdProcess() as nsqd:
        _, env = migrated_shop(folder, NSQD_TCP_ADDRESSES=nsqd.tcp_address, ORDERS_TOPIC="orders")
        env = {k: v for k, v in env.items() if k != "NSQ_SYNC_TEST_RUNTIME"}
        server = Uwsgi(
            "django_warm:application", [APPS, EXAMPLE], env, folder / "uwsgi.log",
            ("--threads", "8"),
        )  # fmt: skip
        try:
            server.wait_ready()

            def order(i: int) -> object:
                try:
                    return requests.get(
                        server.url + "/orders", params={"item": f"burst {i}"},
                        headers={"Connection": "close"}, timeout=30,
                    ).status_code  # fmt: skip
                except requests.RequestException as exc:
                    return type(exc).__name__

            sent = 0
            with ThreadPoolExecutor(BURST) as pool:
                for cycle in range(args.cycles):
                    workers = children(server.proc.pid)
                    victim = workers[cycle % len(workers)]
                    os.kill(victim, signal.SIGKILL)
                    deadline = time.monotonic() + 30.0
                    while True:  # a poll for the replacement: bounded
                        now = children(server.proc.pid)
                        if len(now) >= 2 and victim not in now:
                            break
                        assert time.monotonic() < deadline, "uWSGI did not respawn its worker"
                        time.sleep(0.005)
                    statuses.update(pool.map(order, range(sent, sent + BURST)))
                    sent += BURST
        finally:
            server.stop()
    print(f"{sent} requests in {args.cycles} bursts: statuses {dict(statuses)}")
    print(f"exceptions Django logged: {named_errors(server.log_text()) or 'none'}")
    print(f"uWSGI's log: {folder / 'uwsgi.log'}")


if __name__ == "__main__":
    main()
