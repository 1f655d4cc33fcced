"""The soak's table, as docs/reliability.md shows it (Markdown)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def table(result: dict[str, Any]) -> str:
    if "requests" not in result:
        return f"soak: no accounting (it failed before): {result}"
    req, con, loss, dup = (result[k] for k in ("requests", "consumed", "losses", "duplicates"))
    minutes = result["seconds"] / 60
    faults = Counter(f["kind"] for f in result["faults"])
    lines = [
        f"soak: seed {result['seed']}, {minutes:g} min of faults, runtime {result.get('runtime')}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| faults injected | {len(result['faults'])} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
        + ") |",
        f"| requests (ids; attempts) | {req['ids']}; {req['attempts']} "
        + "("
        + ", ".join(f"{k} {v}" for k, v in sorted(req["by_server"].items()))
        + ") |",
        f"| published (answered 2xx) | {req['acknowledged']} ({req['on_commit_ids']} ids sent "
        "to Django's on_commit view) |",
        f"| not 2xx | {req['error_pages']} error pages (named in the logs: "
        + "; ".join(
            f"{s}: " + ", ".join(f"{e} {n}" for e, n in sorted(c.items()))
            for s, c in sorted(req["named_in_logs"].items())
            if c
        )
        + f"), {req['no_answer']} without an answer (a worker killed); "
        f"{req['resent_ids']} ids resent, {req['never_acknowledged']} never 2xx |",
        f"| consumed: worker channel | {con['worker_unique']} ids handled "
        f"({con['worker_handled']} calls), {con['dead_lettered_unique']} dead-lettered "
        f"(the handler refuses {con['refused_acknowledged']} acknowledged ids) |",
        f"| consumed: cron channel | {con['cron_unique']} ids written ({con['cron_written']}) "
        f"by {con['drain_runs']} drain runs |",
    ]
    for channel in ("worker", "cron"):
        lo = loss[channel]
        lines.append(
            f"| lost: {channel} channel | {len(lo['unexplained'])} "
            f"(+ {lo['in_sigkill_window']} in nsqd's SIGKILL window, per kill "
            f"{lo['per_kill'] or '{}'}) |"
        )
    for channel in ("worker", "dead-letter", "cron"):
        du = dup[channel]
        causes = ", ".join(f"{k} {v}" for k, v in sorted(du["causes"].items())) or "none"
        lines.append(
            f"| duplicates: {channel} | {du['copies']} ({causes}; unexplained "
            f"{len(du['unexplained'])}) |"
        )
    flat = [p for p in result["processes"] if p["flat"]]
    lines.append(f"| processes flat (RSS, fds) | {len(flat)} of {len(result['processes'])} |")
    lines += [
        "",
        "| fault | injected | first publish p50 / p99 (s) | first consumed p50 / p99 (s) |",
        "|---|---|---|---|",
    ]
    for kind, r in sorted(result["recovery"].items()):
        none = f" ({r['consume_none']} with none)" if r["consume_none"] else ""
        lines.append(
            f"| {kind} | {r['injected']} | {_s(r['publish_p50_s'])} / {_s(r['publish_p99_s'])} "
            f"| {_s(r['consume_p50_s'])} / {_s(r['consume_p99_s'])}{none} |"
        )
    verdict = result["verdict"]
    lines += ["", "verdict: " + ("OK" if verdict["ok"] else "FAILED")]
    lines += [f"  - {p}" for p in verdict["problems"][:30]]
    return "\n".join(lines)
