"""Accounting for every id of a soak run.

The ids a channel should have: every id answered 2xx (its publish acknowledged). The long-running
consumer's channel (``worker``) should have handled each of them, except the ids its handler
refuses (:func:`consumer_app.fails`), which it should have dead-lettered, and nothing else; the
cron drains' channel (``cron``) should have written each of them.

- **lost**: an acknowledged id a channel never had. The only loss allowed is nsqd's SIGKILL window:
  what an nsqd held in flight for its clients when it was killed (each client's RDY at most,
  ``max_in_flight``), plus the one message its topic was copying into its channels. A lost id is
  explained by a SIGKILL that came after the id was first sent, of the nsqd the other channel got
  the id from (when that is known), within that SIGKILL's bound for the channel; the bound is
  checked per kill, and every explained id is listed.
- **duplicates**: a channel's copies of an id beyond the first. A copy with the same nsqd message
  id is a redelivery: some fault broke the connection (or stopped the process) between the
  handling and the FIN, and that fault must have happened between the two copies. A copy with
  another nsqd message id is a second publish: the caller sent the id again after an answer that
  was not 2xx (an unknown outcome).
- **non-2xx**: every error page must be named in its server's log (an exception logged with its
  traceback), be a publish that failed (an ``nsq_sync.errors`` exception: the faults are NSQ's)
  and come during a fault; a request without an answer must come from a web worker killed under
  it.
- **dead letters**: every dead-lettered id is one the handler refuses, with its exception.
- **recovery**: per fault, from the server being back to the first 2xx publish sent after it, and
  to the first message the consumer handled after it (from the nsqd that came back, for nsqd
  faults; from the new process, for a consumer kill).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .consumer_app import fails
from .deployment import CONSUMER_MAX_IN_FLIGHT, Deployment
from .drains import MAX_IN_FLIGHT as DRAIN_MAX_IN_FLIGHT

DEAD_LETTER_MAX_IN_FLIGHT = 10  # consumer_app's dead-letter consumer
#: how much one SIGKILL of an nsqd may take from each channel: the clients' credit plus the one
#: message nsqd's topic pump holds, plus one in the channel's pump
SIGKILL_BOUND = {
    "worker": CONSUMER_MAX_IN_FLIGHT + 2 + DEAD_LETTER_MAX_IN_FLIGHT + 2,
    "cron": DRAIN_MAX_IN_FLIGHT + 2,
}
NSQD_FAULTS = ("nsqd_sigterm", "nsqd_sigkill", "nsqd_stall")
_HEADLINE = re.compile(r"Internal Server Error: |Exception on /")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(: .*)?$")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def named_errors(log: str) -> list[str]:
    """The exceptions a server's log names for its error pages (Django's "Internal Server Error:"
    and Flask's "Exception on /..." records), each the last exception of its traceback."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        if not _HEADLINE.search(line):
            continue
        name = None
        in_traceback = False
        for follow in lines[i + 1 : i + 400]:
            if _HEADLINE.search(follow):
                break
            if follow.startswith("Traceback (most recent call last)"):
                in_traceback = True
                continue
            if in_traceback and follow and not follow[0].isspace():
                match = _EXCEPTION.match(follow)
                if match and not follow.startswith(("During handling", "The above exception")):
                    name = match.group(1)
                    in_traceback = False
        found.append(name or "(no exception named)")
    return found


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _duplicates(
    copies: dict[str, list[dict[str, Any]]],
    faults: list[dict[str, Any]],
    resent: set[str],
) -> tuple[Counter[str], list[dict[str, Any]]]:
    """Causes of the copies beyond the first of each id; the copies no cause explains."""
    causes: Counter[str] = Counter()
    unexplained = []
    for ident, records in copies.items():
        if len(records) < 2:
            continue
        records = sorted(records, key=lambda r: r["t0"])
        seen_msgs: dict[str, dict[str, Any]] = {}
        for record in records:
            first = seen_msgs.get(record["msg"])
            if first is None and not seen_msgs:
                seen_msgs[record["msg"]] = record
                continue
            if first is None:  # another nsqd message: a second publish of the id
                seen_msgs[record["msg"]] = record
                if ident in resent:
                    causes["resent after an unknown outcome"] += 1
                else:
                    unexplained.append({"id": ident, "why": "published twice, never resent"})
                continue
            # the same message again: a fault between the two handlings
            between = [
                f for f in faults if f["t0"] <= record["t1"] and f["t_back"] >= first["t0"] - 1.0
            ]
            if between:
                causes[f"redelivered after {between[-1]['kind']}"] += 1
            else:
                unexplained.append({"id": ident, "why": "redelivered without a fault"})
    return causes, unexplained


def _explain_losses(
    channel: str,
    lost: Iterable[str],
    first_sent: dict[str, float],
    known_nsqd: dict[str, str],
    kills: list[dict[str, Any]],
    addresses: dict[str, str],
) -> tuple[list[dict[str, Any]], list[str], dict[int, int]]:
    """Assign each lost id to a SIGKILL after it was first sent (of its nsqd, when known),
    each kill taking at most its bound; the assignments and the ids left over."""
    taken: dict[int, int] = defaultdict(int)
    explained, unexplained = [], []
    for ident in sorted(lost, key=lambda i: first_sent[i]):
        for k, kill in enumerate(kills):
            if kill["t0"] < first_sent[ident] or taken[k] >= SIGKILL_BOUND[channel]:
                continue
            nsqd = known_nsqd.get(ident)
            if nsqd is not None and addresses.get(kill["target"]) != nsqd:
                continue
            taken[k] += 1
            explained.append(
                {"id": ident, "kill": k, "nsqd": kill["target"], "nsqd_known": nsqd is not None}
            )
            break
        else:
            unexplained.append(ident)
    return explained, unexplained, dict(taken)


def account(
    *,
    deployment: Deployment,
    attempts: list[dict[str, Any]],
    consumed: list[dict[str, Any]],
    drained: list[dict[str, Any]],
    drain_runs: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    fault_errors: list[str],
    probes: list[dict[str, Any]],
    logs: dict[str, str],
) -> dict[str, Any]:
    problems: list[str] = [f"fault injection failed: {e}" for e in fault_errors]
    addresses = {f"nsqd{i}": n.tcp_address for i, n in enumerate(deployment.nsqds)}

    # ---------------------------------------------------------------- requests
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in attempts:
        by_id[a["id"]].append(a)
    acked = {i for i, tries in by_id.items() if any(_ok(a) for a in tries)}
    resent = {i for i, tries in by_id.items() if len(tries) > 1}
    first_sent = {i: min(a["t0"] for a in tries) for i, tries in by_id.items()}
    error_pages = [a for a in attempts if a["status"] is not None and not _ok(a)]
    no_answer = [a for a in attempts if a["status"] is None]

    # non-2xx answers: each named in its server's log
    named: dict[str, Counter[str]] = {w: Counter(named_errors(t)) for w, t in logs.items()}
    pages_by_server = Counter(a["server"] for a in error_pages)
    for server, count in pages_by_server.items():
        logged = sum(named[server].values()) - named[server]["(no exception named)"]
        if logged < count:
            problems.append(f"{server}: {count} error pages, {logged} exceptions named in its log")
    # the faults are NSQ's: an error page for anything but a publish that failed is a defect
    # (the Django 500 seen once under uWSGI threads would show here, named)
    for server, exceptions in named.items():
        foreign = {e: n for e, n in exceptions.items() if not e.startswith("nsq_sync.errors.")}
        if foreign:
            problems.append(f"{server}: error pages for {foreign}")
    # ... and each during a fault: a publish under way when a fault began may end in an error
    # as late as its publish timeout (10 s) after the server is back
    outside = [
        a
        for a in error_pages
        if not any(f["t0"] - 1.0 <= a["t1"] and a["t0"] <= f["t_back"] + 11.0 for f in faults)
    ]
    if outside:
        problems.append(f"{len(outside)} error pages outside every fault (e.g. {outside[:2]})")
    kills = [f for f in faults if f["kind"] == "web_worker_kill"]
    unexplained_silence = [
        a
        for a in no_answer
        if not any(
            f["target"].startswith(a["server"] + " ")
            and a["t0"] <= f["t_back"]
            and a["t1"] >= f["t0"]
            for f in kills
        )
    ]
    if unexplained_silence:
        problems.append(
            f"{len(unexplained_silence)} requests without an answer and no worker killed under them"
            f" (e.g. {unexplained_silence[:2]})"
        )

    # ---------------------------------------------------------------- the worker channel
    ok_copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dead_copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    known_nsqd: dict[str, str] = {}
    for r in consumed:
        r = {**r, "t0": r["t"], "t1": r["t"]}
        if r["kind"] == "ok":
            ok_copies[r["id"]].append(r)
        elif r["kind"] == "dead":
            dead_copies[r["id"]].append(r)
        if r["kind"] in ("ok", "fail") and r.get("nsqd"):
            known_nsqd[r["id"]] = r["nsqd"]
    refused = {i for i in acked if fails(i)}
    refusals = {r["id"] for r in consumed if r["kind"] == "fail"}
    for ident, copies in dead_copies.items():
        # the handler's fault: it refuses the id, and refused it (a process that gets a message
        # already past max_attempts, after the consumer was killed, gives it up without calling
        # the handler, and the envelope then names no exception)
        errors = {c.get("error") for c in copies}
        if not fails(ident) or ident not in refusals:
            problems.append(f"{ident} dead-lettered but the handler never refused it")
        elif not errors <= {None, "__main__.SoakHandlerError"}:
            problems.append(f"{ident} dead-lettered with {sorted(map(str, errors))}")
    for ident in ok_copies:
        if fails(ident):
            problems.append(f"{ident} handled although the handler refuses it")
    worker_lost = {i for i in acked - refused if i not in ok_copies} | {
        i for i in refused if i not in dead_copies
    }

    # ---------------------------------------------------------------- the cron channel
    cron_copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    runs = {r["n"]: r for r in drain_runs}
    for r in drained:
        run = runs.get(r["run"], {})
        cron_copies[r["id"]].append({**r, "t0": run.get("t0", r["t"]), "t1": r["t"]})
    cron_lost = {i for i in acked if i not in cron_copies}

    # ---------------------------------------------------------------- losses and duplicates
    sigkills = [f for f in faults if f["kind"] == "nsqd_sigkill"]
    losses: dict[str, Any] = {}
    for channel, lost, other in (
        ("worker", worker_lost, {}),
        ("cron", cron_lost, known_nsqd),
    ):
        explained, left, per_kill = _explain_losses(
            channel, lost, first_sent, other if channel == "cron" else {}, sigkills, addresses
        )
        losses[channel] = {
            "lost": len(lost),
            "in_sigkill_window": len(explained),
            "per_kill": per_kill,
            "explained": explained,
            "unexplained": sorted(left),
        }
        if left:
            problems.append(
                f"{channel}: {len(left)} acknowledged ids lost (e.g. {sorted(left)[:5]})"
            )
    duplicates = {}
    for channel, copies in (
        ("worker", ok_copies),
        ("dead-letter", dead_copies),
        ("cron", cron_copies),
    ):
        causes, unexplained = _duplicates(copies, faults, resent)
        duplicates[channel] = {
            "copies": sum(len(c) - 1 for c in copies.values() if len(c) > 1),
            "causes": dict(causes),
            "unexplained": unexplained,
        }
        if unexplained:
            problems.append(
                f"{channel}: {len(unexplained)} unexplained duplicates: {unexplained[:3]}"
            )

    # ---------------------------------------------------------------- recovery
    ok_attempts = sorted((a for a in attempts if _ok(a)), key=lambda a: a["t0"])
    handled = sorted((r for r in consumed if r["kind"] == "ok"), key=lambda r: r["t"])
    recovery = []
    for f in faults:
        back = f["t_back"]
        publish = next((a["t1"] - back for a in ok_attempts if a["t0"] >= back), None)
        if f["kind"] in NSQD_FAULTS:
            address = addresses[f["target"]]
            consume = next(
                (r["t"] - back for r in handled if r["t"] >= back and r["nsqd"] == address), None
            )
        elif f["kind"] == "consumer_kill":
            pid = f["details"].get("new_pid")
            consume = next(
                (r["t"] - back for r in handled if r["t"] >= back and r["pid"] == pid), None
            )
        else:
            consume = next((r["t"] - back for r in handled if r["t"] >= back), None)
        recovery.append({"kind": f["kind"], "publish_s": publish, "consume_s": consume})
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({f["kind"] for f in faults}):
        rows = [r for r in recovery if r["kind"] == kind]
        pubs = [r["publish_s"] for r in rows if r["publish_s"] is not None]
        cons = [r["consume_s"] for r in rows if r["consume_s"] is not None]
        by_kind[kind] = {
            "injected": len(rows),
            "publish_p50_s": _percentile(pubs, 0.5),
            "publish_p99_s": _percentile(pubs, 0.99),
            "consume_p50_s": _percentile(cons, 0.5),
            "consume_p99_s": _percentile(cons, 0.99),
            "consume_none": len(rows) - len(cons),
        }

    # ---------------------------------------------------------------- processes
    for verdict in probes:
        if not verdict["flat"]:
            problems.append(f"{verdict['process']} did not stay flat: {verdict}")
    drain_failures = Counter(r["status"] for r in drain_runs)

    return {
        "requests": {
            "ids": len(by_id),
            "attempts": len(attempts),
            "acknowledged": len(acked),
            "never_acknowledged": len(by_id) - len(acked),
            "resent_ids": len(resent),
            "error_pages": len(error_pages),
            "error_pages_by_server": dict(pages_by_server),
            "named_in_logs": {s: dict(c) for s, c in named.items()},
            "no_answer": len(no_answer),
            "by_server": dict(Counter(a["server"] for a in attempts)),
            "on_commit_ids": sum(1 for i in by_id if i.split("-")[0].endswith("c")),
        },
        "consumed": {
            "worker_handled": sum(len(c) for c in ok_copies.values()),
            "worker_unique": len(ok_copies),
            "refused_acknowledged": len(refused),
            "dead_lettered_unique": len(dead_copies),
            "handler_failures": sum(1 for r in consumed if r["kind"] == "fail"),
            "cron_written": sum(len(c) for c in cron_copies.values()),
            "cron_unique": len(cron_copies),
            "drain_runs": len(drain_runs),
            "drain_exit_statuses": {str(k): v for k, v in drain_failures.items()},
        },
        "losses": losses,
        "duplicates": duplicates,
        "faults": faults,
        "recovery": by_kind,
        "processes": probes,
        "verdict": {"ok": not problems, "problems": problems},
    }


def _ok(attempt: dict[str, Any]) -> bool:
    status = attempt["status"]
    return status is not None and 200 <= status < 300
