"""The faults, on a seeded random schedule: one at a time, a random pause between them; the kinds
are dealt from a shuffled deck, so that every kind comes once before any comes twice.

Each fault is recorded with its kind, target, when it began (``t0``) and when the server was back
(``t_back``: restarted and answering, resumed, respawned); a SIGKILL of an nsqd also with what
that nsqd held for its clients just before (each channel's ``in_flight_count``,
``deferred_count`` and the clients' ``ready_count``), the bound of what it can lose.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from nsq_sync.errors import NSQError
from nsq_sync.http import NsqdHTTPClient
from support.nsq import wait_for

from .deployment import CHANNELS, TOPIC, Deployment
from .load import LoadGenerator

KINDS = (
    "nsqd_sigterm",
    "nsqd_sigkill",
    "nsqd_stall",
    "nsqlookupd_restart",
    "web_worker_kill",
    "consumer_kill",
    "proxy_cut",
)
STALL_SECONDS = 10.0


@dataclass
class Fault:
    kind: str
    target: str
    t0: float
    t_back: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def held_for_clients(http_url: str) -> dict[str, Any]:
    """What an nsqd holds for the soak topic's channels now (for a SIGKILL's window)."""
    held: dict[str, Any] = {}
    try:
        with NsqdHTTPClient(http_url, timeout=2.0) as http:
            topic = http.topic_stats(TOPIC)
    except NSQError as exc:
        return {"error": repr(exc)}
    if topic is None:
        return held
    for channel in topic["channels"]:
        if channel["channel_name"] in CHANNELS:
            held[channel["channel_name"]] = {
                "in_flight": int(channel["in_flight_count"]),
                "deferred": int(channel["deferred_count"]),
                "ready": sum(int(c["ready_count"]) for c in channel["clients"]),
                "clients": len(channel["clients"]),
            }
    return held


class FaultSchedule:
    """Injects faults into ``deployment`` until :meth:`stop`: a pause of ``gap`` seconds (a
    uniform draw between its bounds) before each."""

    def __init__(
        self,
        deployment: Deployment,
        loads: list[LoadGenerator],
        seed: int,
        gap: tuple[float, float] = (3.0, 6.0),
    ) -> None:
        self.deployment = deployment
        self.loads = loads
        self.rng = random.Random(seed)
        self.gap = gap
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._deck: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-faults")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _next_kind(self) -> str:
        if not self._deck:
            self._deck = list(KINDS)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def _loop(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.gap)):
            kind = self._next_kind()
            try:
                self.faults.append(getattr(self, kind)())
            except Exception as exc:  # noqa: BLE001 - reported, and the soak fails on it
                self.errors.append(f"{kind}: {exc!r}")
                return

    # ------------------------------------------------------------------ the faults

    def _nsqd(self) -> tuple[int, Any]:
        i = self.rng.randrange(len(self.deployment.nsqds))
        return i, self.deployment.nsqds[i]

    def _back(self, nsqd: Any) -> None:
        """Restart a stopped nsqd and wait until nsqlookupd lists it again."""
        nsqd.restart(timeout=30.0)
        assert self.deployment.lookupd is not None
        self.deployment.lookupd.wait_for_nodes([nsqd], timeout=30.0)

    def nsqd_sigterm(self) -> Fault:
        i, nsqd = self._nsqd()
        fault = Fault("nsqd_sigterm", f"nsqd{i}", time.time())
        nsqd.stop()
        self._back(nsqd)
        fault.t_back = time.time()
        return fault

    def nsqd_sigkill(self) -> Fault:
        i, nsqd = self._nsqd()
        held = held_for_clients(nsqd.http_url)
        fault = Fault("nsqd_sigkill", f"nsqd{i}", time.time(), details={"held": held})
        nsqd.kill()
        self._back(nsqd)
        fault.t_back = time.time()
        return fault

    def nsqd_stall(self) -> Fault:
        i, nsqd = self._nsqd()
        fault = Fault("nsqd_stall", f"nsqd{i}", time.time())
        os.kill(nsqd.pid, signal.SIGSTOP)
        try:
            self._stop.wait(STALL_SECONDS)  # the fault itself: 10 s without an answer
        finally:
            os.kill(nsqd.pid, signal.SIGCONT)
        fault.t_back = time.time()
        return fault

    def nsqlookupd_restart(self) -> Fault:
        lookupd = self.deployment.lookupd
        assert lookupd is not None
        fault = Fault("nsqlookupd_restart", "nsqlookupd", time.time())
        lookupd.restart(timeout=30.0)
        fault.t_back = time.time()
        # nsqd registers again at its next ping of nsqlookupd (every 15 s): until then the
        # restarted nsqlookupd lists no nsqd
        lookupd.wait_for_nodes([n for n in self.deployment.nsqds if n.is_running], timeout=40.0)
        fault.details["nsqds_listed_after_s"] = round(time.time() - fault.t_back, 2)
        return fault

    def web_worker_kill(self) -> Fault:
        """SIGKILL a worker of a web server while that server has a request under way."""
        i = self.rng.randrange(len(self.deployment.webs))
        web, load = self.deployment.webs[i], self.loads[i]
        workers = self.deployment.wait_web_workers(web)
        victim = self.rng.choice(sorted(workers))
        deadline = time.monotonic() + 10.0
        while load.in_flight == 0 and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.002)  # a poll: kill while the server has a request under way
        fault = Fault("web_worker_kill", f"{web.name} worker {victim}", time.time())
        fault.details["requests_under_way"] = load.in_flight
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in web.workers(), f"{web.name}'s worker {victim} to go")
        self.deployment.wait_web_workers(web)
        fault.t_back = time.time()
        return fault

    def consumer_kill(self) -> Fault:
        consumer = self.deployment.consumer
        assert consumer is not None
        fault = Fault("consumer_kill", f"consumer {consumer.pid}", time.time())
        consumer.kill()
        consumer.start()
        fault.t_back = time.time()
        fault.details["new_pid"] = consumer.pid
        return fault

    def proxy_cut(self) -> Fault:
        fault = Fault("proxy_cut", "every proxy", time.time())
        fault.details["connections_cut"] = sum(p.cut() for p in self.deployment.proxies)
        fault.t_back = time.time()
        return fault

    def records(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]
