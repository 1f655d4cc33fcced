"""``scripts/soak``: run the deployment under faults, then account for every id.

    scripts/soak --seconds 90 --seed 40          # what CI runs (tests/reliability/test_stack_soak.py)
    scripts/soak --minutes 30 --seed 1           # the long one; its table is in docs/reliability.md

Writes ``soak.json`` (every figure, the faults, the verdict) in ``--workdir`` (and at ``--json``),
prints the table, exits 1 when the accounting finds a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nsq_sync.errors import NSQError
from nsq_sync.http import NsqdHTTPClient
from support.nsq import wait_for

from . import accounting, report
from .deployment import DEAD_LETTER_TOPIC, TOPIC, Deployment
from .drains import Drains
from .faults import FaultSchedule
from .load import LoadGenerator
from .probes import Probes

PREFIXES = {"flask-uwsgi": "fu", "django-uwsgi": "du", "django-gunicorn": "dg"}
SETTLE_TIMEOUT = 180.0


def _channel(nsqd: Any, topic: str, channel: str) -> dict[str, Any] | None:
    with NsqdHTTPClient(nsqd.http_url, timeout=5.0) as http:
        return http.channel_stats(topic, channel, include_clients=False)


def _drained(deployment: Deployment, topic: str, channel: str) -> bool:
    for nsqd in deployment.nsqds:
        try:
            stats = _channel(nsqd, topic, channel)
        except NSQError:
            return False
        if stats and (stats["depth"] or stats["in_flight_count"] or stats["deferred_count"]):
            return False
    return True


def settle(deployment: Deployment, drains: Drains) -> None:
    """After the faults: every nsqd up, the consumer's channel and the dead letters consumed,
    the cron channel drained by final drain runs."""
    for nsqd in deployment.nsqds:
        if not nsqd.is_running:
            nsqd.restart(timeout=30.0)
    assert deployment.consumer is not None
    if deployment.consumer.pid is None:
        deployment.consumer.start()
    wait_for(
        lambda: (
            _drained(deployment, TOPIC, "worker")
            and _drained(deployment, DEAD_LETTER_TOPIC, "dead-letter")
        ),
        "the consumer to empty its channel and the dead letters",
        timeout=SETTLE_TIMEOUT,
        interval=0.5,
    )
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while not _drained(deployment, TOPIC, "cron"):
        assert time.monotonic() < deadline, "the cron channel was not drained"
        drains.run_once(timeout=60.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nsq_sync-soak-"))
    deployment = Deployment(workdir, args.runtime)
    loads: list[LoadGenerator] = []
    drains: Drains | None = None
    faults: FaultSchedule | None = None
    probes: Probes | None = None
    result: dict[str, Any] = {
        "seed": args.seed,
        "seconds": args.seconds,
        "runtime": args.runtime,
        "workdir": str(workdir),
    }
    started = time.time()
    try:
        deployment.start()
        result["deployed_in_s"] = round(time.time() - started, 1)
        probes = Probes(deployment)
        probes.start()
        loads = [LoadGenerator(w, PREFIXES[w.name], args.rate) for w in deployment.webs]
        for load in loads:
            load.start()
        drains = Drains(deployment)
        drains.start()
        faults = FaultSchedule(deployment, loads, args.seed, gap=(args.gap_min, args.gap_max))
        t_start = time.time()
        faults.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end and not faults.errors:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        faults.stop()
        t_faults_end = time.time()
        for load in loads:
            load.stop()
        drains.stop()
        settle(deployment, drains)
        result["settled_in_s"] = round(time.time() - t_faults_end, 1)
        probes.stop()
        consumer_status = deployment.consumer.stop() if deployment.consumer else None
        result["consumer_exit"] = consumer_status
        result["window"] = [t_start, t_faults_end]
    finally:
        if faults is not None and faults._thread.is_alive():
            faults.stop()
        for load in loads:
            load.stop()
        if drains is not None and drains._thread.is_alive():
            drains.stop()
        if probes is not None and probes._thread.is_alive():
            probes.stop()
        result["close_problems"] = deployment.close()
    result.update(
        accounting.account(
            deployment=deployment,
            attempts=[a for load in loads for a in load.records()],
            consumed=accounting.read_jsonl(deployment.record),
            drained=drains.consumed() if drains else [],
            drain_runs=drains.records() if drains else [],
            faults=faults.records() if faults else [],
            fault_errors=faults.errors if faults else ["no fault schedule"],
            probes=probes.judge() if probes else [],
            logs={w.name: w.server.log_text() for w in deployment.webs},
        )
    )
    return result


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float, default=90.0)
    length.add_argument("--minutes", type=float)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument(
        "--runtime",
        choices=("threads", "gevent"),
        default=os.environ.get("NSQ_SYNC_TEST_RUNTIME") or "threads",
        help="the consumer process's runtime and gunicorn's worker class (gthread or gevent)",
    )
    parser.add_argument("--rate", type=float, default=6.0, help="requests per second per server")
    parser.add_argument(
        "--gap-min", type=float, default=3.0, help="seconds between faults, at least"
    )
    parser.add_argument("--gap-max", type=float, default=6.0, help="... at most")
    parser.add_argument("--workdir", help="where logs and records go (default: a new temp folder)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.minutes is not None:
        args.seconds = args.minutes * 60.0
    # SIGTERM (a test's timeout, a CI runner's cancel) unwinds run(): every process it started
    # is stopped by Deployment.close()
    signal.signal(signal.SIGTERM, _terminated)
    result = run(args)
    text = json.dumps(result, indent=2, default=str) + "\n"
    Path(result["workdir"], "soak.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print(report.table(result))
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
