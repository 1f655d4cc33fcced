"""Turn bench/results/latest.json into the Markdown report, the target verdicts and the chart.

    python -m bench.report [bench/results/latest.json]   # re-render latest.md / latest.png

Only the chart needs matplotlib (imported lazily); the rest is the standard library.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

COLUMNS = ("nsq_sync", "nsq_sync-gevent", "pynsq", "gnsq", "nsq-py", "go-nsq bench")
PEERS = ("pynsq", "gnsq", "nsq-py")
NOISY_OTHER_PCT = 25.0  # CPU used by processes outside the benchmark, in % of one core


def _sizes(data: dict[str, Any]) -> dict[str, Any]:
    sizes: dict[str, Any] = data.get("meta", {}).get("sizes", {})
    return sizes


def _k(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:g}M"
    if n >= 1000:
        return f"{n / 1000:g}k"
    return f"{n:g}"


def row_titles(data: dict[str, Any]) -> dict[str, str]:
    s = _sizes(data)
    lat = data.get("meta", {}).get("latency_settings", {})

    def lat_title(name: str) -> str:
        ident = lat.get(name, {})
        return (
            f"latency publish → handler at {_k(s.get('latency_rate', 0))} msg/s, max_in_flight 100, "
            f"IDENTIFY output_buffer {ident.get('output_buffer_size')} B / "
            f"{ident.get('output_buffer_timeout_ms')} ms (p50 / p99)"
        )

    scaling: dict[str, str] = {}
    for k in sorted(
        int(w.rsplit("_", 1)[1])
        for w in data.get("results", {})
        if w.startswith("scaling_") and w.rsplit("_", 1)[1].isdigit() and "idle" not in w
    ):
        scaling[f"scaling_{k}"] = (
            f"consume {_k(s.get('scaling_n', 0))} messages spread over {k} nsqd(s) found through "
            "one nsqlookupd, FIN each, max_in_flight 2500"
        )
    for k in sorted(
        int(w.rsplit("_", 1)[1])
        for w in data.get("results", {})
        if w.startswith("scaling_idle_") and w.rsplit("_", 1)[1].isdigit()
    ):
        scaling[f"scaling_idle_{k}"] = (
            f"idle consumer, {k} nsqd(s) via nsqlookupd: CPU per connection over "
            f"{s.get('scaling_idle_window_s', 0):g} s"
        )
    return {
        "consume": f"consume {_k(s.get('consume_n', 0))} pre-filled messages, FIN each, max_in_flight 2500",
        "consume_cpu": (
            "CPU per consumed message (process CPU, all threads, from constructing the consumer "
            "to the N-th message / N)"
        ),
        "pub": f"publish {_k(s.get('pub_n', 0))} messages one at a time, waiting for each OK",
        "pub_threads": (
            f"publish {_k(s.get('pub_threads_n', 0))} messages from {s.get('threads')} threads "
            "through one Producer"
        ),
        "mpub": f"publish {_k(s.get('mpub_n', 0))} messages in MPUB batches of {s.get('batch')}",
        "latency_default": lat_title("default"),
        "latency_low": lat_title("low"),
        "idle_multi": (
            f"idle consumer, {s.get('idle_nsqds')} connections (one per nsqd), "
            f"CPU over {s.get('idle_window_s'):g} s"
        ),
        "idle_1": f"idle consumer, 1 connection, CPU over {s.get('idle_window_s'):g} s",
        "rss": (
            f"RSS of one consumer with {s.get('rss_nsqds')} connections (one per nsqd); "
            "growth per connection"
        ),
        **scaling,
    }


def _result(data: dict[str, Any], workload: str, client: str) -> dict[str, Any] | None:
    r = data.get("results", {}).get(workload, {}).get(client)
    return r if isinstance(r, dict) else None


def _ok(r: dict[str, Any] | None) -> bool:
    return bool(r and r.get("ok"))


def _number(data: dict[str, Any], workload: str, client: str, key: str) -> float | None:
    """A successful result's ``key`` as a float, else None."""
    r = _result(data, workload, client)
    if r is None or not r.get("ok") or r.get(key) is None:
        return None
    return float(r[key])


def _rate(data: dict[str, Any], workload: str, client: str) -> float | None:
    return _number(data, workload, client, "rate") or None


def _p99(data: dict[str, Any], workload: str, client: str) -> float | None:
    return _number(data, workload, client, "p99_ms")


def _cpu(data: dict[str, Any], workload: str, client: str) -> float | None:
    return _number(data, workload, client, "cpu_s")


# ---------------------------------------------------------------------------------------------
# targets (BENCHMARKS.md, "Targets for nsq_sync")


def _rounds(data: dict[str, Any], workload: str, client: str, key: str) -> list[float | None]:
    """Every round's ``key`` for a successful result (None where that round failed); a result
    without rounds (an older json, or a single run) gives its one value."""
    r = _result(data, workload, client)
    if r is None or not r.get("ok"):
        return []
    # median_run keeps the rounds of the key it ranked by (rate, p99_ms) as "rounds", and
    # those of the CPU per message as "rounds_cpu_us_per_msg"
    rounds = r.get("rounds_cpu_us_per_msg" if key == "cpu_us_per_msg" else "rounds")
    if rounds:
        return [None if v is None else float(v) for v in rounds]
    return [] if r.get(key) is None else [float(r[key])]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _paired(a: list[float | None], b: list[float | None]) -> list[float]:
    """Per-round ratios a/b of the rounds where both were measured; when the lists are not
    aligned by round (one of them a single value), the ratio of the medians."""
    if len(a) == len(b):
        return [x / y for x, y in zip(a, b) if x is not None and y]
    xa = [x for x in a if x is not None]
    xb = [y for y in b if y]
    return [_median(xa) / _median(xb)] if xa and xb else []


def _spread(ratios: list[float]) -> str:
    if len(ratios) < 2:
        return "one round"
    return f"median of {len(ratios)} rounds, range {min(ratios):.2f}–{max(ratios):.2f}"


def _ratio_target(
    tid: str,
    text: str,
    a: list[float | None],
    b: list[float | None],
    threshold: float,
    a_name: str,
    b_name: str,
    fmt: str,
    lower_is_better: bool = False,
) -> dict[str, Any]:
    ratios = _paired(a, b)
    if not ratios:
        missing = " and ".join(
            name for name, v in ((a_name, a), (b_name, b)) if not [x for x in v if x]
        )
        return {"id": tid, "text": text, "met": None, "detail": f"not measured ({missing} missing)"}
    ratio = _median(ratios)
    am = _median([x for x in a if x is not None])
    bm = _median([x for x in b if x is not None])
    return {
        "id": tid,
        "text": text,
        "value": ratio,
        "ratios": ratios,
        "threshold": threshold,
        "met": ratio <= threshold if lower_is_better else ratio >= threshold,
        "detail": (
            f"{ratio:.2f}× ({_spread(ratios)}; {a_name} {fmt.format(am)} vs {b_name} "
            f"{fmt.format(bm)}{', medians' if len(ratios) > 1 else ''})"
        ),
    }


def evaluate_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    rate = "{:,.0f} msg/s"

    def rates(workload: str, client: str) -> list[float | None]:
        return _rounds(data, workload, client, "rate")

    def cpu(client: str) -> list[float | None]:
        return _rounds(data, "consume", client, "cpu_us_per_msg")

    t: list[dict[str, Any]] = [
        _ratio_target(
            "consume_vs_nsqpy",
            "consume (threads, FIN each, max_in_flight 2500) ≥ 1.5× nsq-py",
            rates("consume", "nsq_sync"),
            rates("consume", "nsq-py"),
            1.5,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
        _ratio_target(
            "consume_vs_bench_reader",
            "consume (threads) ≥ 0.9× go-nsq bench_reader",
            rates("consume", "nsq_sync"),
            rates("consume", "go-nsq bench"),
            0.9,
            "nsq_sync",
            "bench_reader",
            rate,
        ),
        _ratio_target(
            "consume_cpu_vs_nsqpy",
            "CPU per consumed message (process CPU s / messages) ≤ 0.6× nsq-py's",
            cpu("nsq_sync"),
            cpu("nsq-py"),
            0.6,
            "nsq_sync",
            "nsq-py",
            "{:.1f} µs/msg",
            lower_is_better=True,
        ),
        _ratio_target(
            "gevent_vs_gnsq",
            "consume under gevent ≥ 5× gnsq",
            rates("consume", "nsq_sync-gevent"),
            rates("consume", "gnsq"),
            5.0,
            "nsq_sync (gevent)",
            "gnsq",
            rate,
        ),
        _ratio_target(
            "pub_vs_nsqpy",
            "single-thread synchronous PUB ≥ 1.5× nsq-py",
            rates("pub", "nsq_sync"),
            rates("pub", "nsq-py"),
            1.5,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
        _ratio_target(
            "pub_vs_raw_socket",
            "single-thread synchronous PUB ≥ 0.9× a raw-socket PUB loop",
            rates("pub", "nsq_sync"),
            rates("pub", "go-nsq bench"),
            0.9,
            "nsq_sync",
            "raw socket",
            rate,
        ),
        _ratio_target(
            "threads_vs_single",
            "8 threads publishing through one Producer ≥ 3× one thread of nsq_sync",
            rates("pub_threads", "nsq_sync"),
            rates("pub", "nsq_sync"),
            3.0,
            "8 threads",
            "1 thread",
            rate,
        ),
        _ratio_target(
            "mpub_vs_nsqpy",
            "MPUB × 200 ≥ 1.0× nsq-py",
            rates("mpub", "nsq_sync"),
            rates("mpub", "nsq-py"),
            1.0,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
    ]
    # idle: lower is better; met when nsq_sync with N connections used no more CPU than pynsq with 1
    mine = _cpu(data, "idle_multi", "nsq_sync")
    theirs = _cpu(data, "idle_1", "pynsq")
    n = _sizes(data).get("idle_nsqds")
    text = f"an idle consumer with {n} connections uses no more CPU than pynsq's with 1"
    if mine is None or theirs is None:
        t.append({"id": "idle", "text": text, "met": None, "detail": "not measured"})
    else:
        window = _result(data, "idle_multi", "nsq_sync") or {}
        t.append(
            {
                "id": "idle",
                "text": text,
                "value": mine,
                "threshold": theirs,
                "met": mine <= theirs,
                "detail": (
                    f"nsq_sync {mine * 1000:.1f} ms CPU vs pynsq {theirs * 1000:.1f} ms over "
                    f"{window.get('window_s', 0):.0f} s"
                ),
            }
        )
    for setting in ("default", "low"):
        workload = f"latency_{setting}"
        mine = _rounds(data, workload, "nsq_sync", "p99_ms")
        peers = {p: _rounds(data, workload, p, "p99_ms") for p in PEERS}
        peers = {p: v for p, v in peers.items() if v}
        ident = data.get("meta", {}).get("latency_settings", {}).get(setting, {})
        text = (
            f"latency p99 ≤ 0.8× the best peer's (IDENTIFY {ident.get('output_buffer_size')} B / "
            f"{ident.get('output_buffer_timeout_ms')} ms)"
        )
        if not mine or not peers:
            t.append({"id": workload, "text": text, "met": None, "detail": "not measured"})
            continue
        # the best peer of each round (the lowest p99 measured in that round)
        best: list[float | None] = []
        for i in range(len(mine)):
            values = [v[i] for v in peers.values() if len(v) == len(mine) and v[i] is not None]
            best.append(min(values) if values else None)
        if not [b for b in best if b]:
            best = [min(_median([x for x in v if x is not None]) for v in peers.values())]
        medians = {p: _median([x for x in v if x is not None] or [0.0]) for p, v in peers.items()}
        best_peer = min(medians, key=lambda p: medians[p])
        t.append(
            _ratio_target(
                workload,
                text,
                mine,
                best,
                0.8,
                "nsq_sync p99",
                f"best peer's p99 (by median: {best_peer})",
                "{:.2f} ms",
                lower_is_better=True,
            )
        )
    t += _scaling_targets(data)
    if any("nsq_sync-base" in per for per in data.get("results", {}).values()):
        for workload in ("consume", "pub", "pub_threads", "mpub"):
            t.append(
                _ratio_target(
                    f"{workload}_vs_baseline",
                    f"{workload}: this tree vs the baseline tree (BENCH_BASELINE), same rounds",
                    rates(workload, "nsq_sync"),
                    rates(workload, "nsq_sync-base"),
                    1.0,
                    "nsq_sync",
                    "baseline",
                    rate,
                )
            )
        t.append(
            _ratio_target(
                "consume_cpu_vs_baseline",
                "CPU per consumed message: this tree vs the baseline tree",
                cpu("nsq_sync"),
                cpu("nsq_sync-base"),
                1.0,
                "nsq_sync",
                "baseline",
                "{:.1f} µs/msg",
                lower_is_better=True,
            )
        )
    return t


def _scaling_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """1 → most nsqds behind one lookupd: idle CPU per connection flat (no more per connection
    with many nsqds than with one), and the throughput for context."""
    ks = sorted(
        int(w.rsplit("_", 1)[1])
        for w in data.get("results", {})
        if w.startswith("scaling_idle_") and w.rsplit("_", 1)[1].isdigit()
    )
    if len(ks) < 2:
        return []
    low, high = ks[0], ks[-1]
    out = []
    for client in ("nsq_sync", "nsq_sync-gevent"):
        one = _number(data, f"scaling_idle_{low}", client, "cpu_ms_per_connection")
        many = _number(data, f"scaling_idle_{high}", client, "cpu_ms_per_connection")
        text = (
            f"{client}: idle CPU per connection with {high} nsqds (via lookupd) no more than with "
            f"{low}"
        )
        if one is None or many is None:
            out.append(
                {
                    "id": f"scaling_idle_{client}",
                    "text": text,
                    "met": None,
                    "detail": "not measured",
                }
            )
            continue
        detail = f"{many:.2f} vs {one:.2f} ms CPU per connection over the window"
        rate_low = _rate(data, f"scaling_{low}", client)
        rate_high = _rate(data, f"scaling_{high}", client)
        if rate_low and rate_high:
            detail += (
                f"; consume through lookupd: {rate_high:,.0f} msg/s from {high} nsqds vs "
                f"{rate_low:,.0f} from {low} ({rate_high / rate_low:.2f}×)"
            )
        out.append(
            {
                "id": f"scaling_idle_{client}",
                "text": text,
                "value": many / one if one else None,
                "threshold": 1.0,
                "met": many <= one * 1.1,  # 10 % for measuring noise
                "detail": detail,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Markdown


def _range(r: dict[str, Any], fmt: str, scale: float = 1.0) -> str:
    """`` (lo–hi)`` over the rounds of a result, when there were several."""
    values = [float(v) / scale for v in r.get("rounds") or [] if v is not None]
    if len(values) < 2:
        return ""
    return f" ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _cell(workload: str, r: dict[str, Any] | None, notes: list[str], client: str) -> str:
    if r is None:
        return "—"
    if not r.get("ok"):
        notes.append(
            f"{client} / {workload}: {r.get('error', 'failed')} (log: {r.get('log', '-')})"
        )
        return f"failed [{len(notes)}]"
    mark = ""
    other = (r.get("cpu_window") or {}).get("other_pct")
    if other is not None and other > NOISY_OTHER_PCT and not workload.startswith(("idle", "rss")):
        mark = " †"
    if workload.startswith("latency"):
        spread = _range(r, "{:.2f}")
        spread = f" (p99 {spread[2:]}" if spread else ""
        return f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms{spread}{mark}"
    if workload == "consume_cpu":
        if r.get("cpu_us_per_msg") is None:
            return "—"
        values = [v for v in r.get("rounds_cpu_us_per_msg") or [] if v is not None]
        spread = f" ({min(values):.1f}–{max(values):.1f})" if len(values) > 1 else ""
        return f"{_median(values or [r['cpu_us_per_msg']]):.1f} µs{spread}"
    if workload.startswith("scaling_idle"):
        return f"{r['cpu_ms_per_connection']:.2f} ms/conn ({r['cpu_percent']:.3f} % in all)"
    if workload.startswith("idle"):
        return f"{r['cpu_percent']:.3f} % ({r['cpu_s'] * 1000:.0f} ms)"
    if workload == "rss":
        per = r.get("rss_per_connection_kb")
        per_s = f", {per:.0f} KiB/conn" if per is not None else ""
        return f"{r['rss_kb'] / 1024:.1f} MiB{per_s}"
    if r.get("rate") is not None:
        rate = float(r["rate"])
        text = f"{rate / 1000:.1f}k msg/s" if rate >= 1000 else f"{rate:.0f} msg/s"
        if r.get("drained"):
            text += " (≥)"
        return text + _range(r, "{:.1f}k", 1000) + mark
    return "ok"


def render_table(data: dict[str, Any], notes: list[str]) -> list[str]:
    """The results table's Markdown lines; failures add their explanation to ``notes``."""
    results = data.get("results", {})
    clients = data.get("meta", {}).get("clients", {})
    titles = row_titles(data)
    lines: list[str] = []
    columns = COLUMNS
    if any("nsq_sync-base" in per for per in results.values()):  # an A/B run (BENCH_BASELINE)
        columns = ("nsq_sync", "nsq_sync-base", *COLUMNS[1:])
    header = ["workload"]
    for c in columns:
        info = clients.get(c, {})
        if c == "go-nsq bench":
            header.append("ceilings: go-nsq bench tools, raw socket")
        else:
            version = info.get("version")
            header.append(f"{c} {version}" if version and c in PEERS else c)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for workload, title in titles.items():
        per = results.get("consume" if workload == "consume_cpu" else workload)
        if not per:
            continue
        cells = [title]
        for c in columns:
            r = per.get(c)
            if r is None and c in clients and not clients[c].get("available", True):
                cells.append("not installed")
            else:
                cells.append(_cell(workload, r, notes, c))
        if workload == "consume" and per.get("go-nsq bench", {}).get("ok"):
            cells[-1] = "bench_reader: " + cells[-1]
        if workload == "mpub" and per.get("go-nsq bench", {}).get("ok"):
            cells[-1] = "bench_writer: " + cells[-1]
        if workload == "pub" and per.get("go-nsq bench", {}).get("ok"):
            cells[-1] = "raw Python socket: " + cells[-1]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


TABLE_START = "<!-- bench-table: generated by bench/report.py (scripts/bench --publish) -->"
TABLE_END = "<!-- /bench-table -->"


def update_table(data: dict[str, Any], page: Path) -> bool:
    """Replace the table between a page's bench-table markers (docs/performance.md); False if
    it has none."""
    text = page.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        return False
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    notes: list[str] = []
    table = render_table(data, notes)
    table += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    page.write_text(head + TABLE_START + "\n" + "\n".join(table) + "\n" + TABLE_END + tail)
    return True


#: the README's comparison table: its measured rows, by the label they start with
README_ROWS = {
    "consume": "| consume, msg/s (×nsq_sync) |",
    "pub": "| one-at-a-time publish, msg/s (×nsq_sync) |",
}
README_PEERS = ("pynsq", "gnsq", "nsq-py")


def update_readme_rows(data: dict[str, Any], readme: Path) -> bool:
    """Rewrite the measured rows of README.md's comparison table (consume, one-at-a-time
    publish) from this run's medians: nsq_sync's rate, then each peer's with its ratio to
    nsq_sync. False if the README has no such row or a rate is missing."""
    lines = readme.read_text().splitlines(keepends=True)
    changed = False
    for workload, label in README_ROWS.items():
        ours = _rate(data, workload, "nsq_sync")
        peers = [_rate(data, workload, peer) for peer in README_PEERS]
        if ours is None or any(rate is None for rate in peers):
            return False
        cells = [f"{ours / 1000:.1f}k"]
        cells += [f"{rate / 1000:.1f}k ({rate / ours:.2f}×)" for rate in peers if rate is not None]
        for i, line in enumerate(lines):
            if line.startswith(label):
                lines[i] = label + " " + " | ".join(cells) + " |\n"
                changed = True
    if changed:
        readme.write_text("".join(lines))
    return changed


def render_markdown(data: dict[str, Any], png_name: str | None) -> str:
    meta = data.get("meta", {})
    clients = meta.get("clients", {})
    lines: list[str] = []
    lines.append("# nsq_sync benchmarks")
    lines.append("")
    machine = meta.get("machine", {})
    lines.append(
        f"Run {meta.get('date', '?')} ({meta.get('mode', '?')} mode, {meta.get('total_s', 0):.0f} s in "
        f"all) on {machine.get('cpus')} × {machine.get('cpu_model') or 'CPU'}, "
        f"{machine.get('mem_gib')} GiB, Linux {machine.get('kernel')}; one nsqd "
        f"{meta.get('nsqd_version')} on 127.0.0.1 ({' '.join(meta.get('nsqd_args', []))}), "
        f"{meta.get('body_size')}-byte bodies, every client in its own process and virtualenv, "
        f"all in the same run (git {meta.get('git', {}).get('commit', '?')}"
        f"{', dirty tree' if meta.get('git', {}).get('dirty') else ''})."
        " Absolute numbers drift from run to run; compare the ratios."
    )
    lines.append("")
    if png_name:
        lines.append(f"![benchmark chart]({png_name})")
        lines.append("")
    notes: list[str] = []
    lines += render_table(data, notes)
    lines.append("")
    lines.append("## Targets for nsq_sync (ratios in this run)")
    lines.append("")
    for t in data.get("targets") or evaluate_targets(data):
        verdict = {True: "**met**", False: "**not met**", None: "not evaluated"}[t.get("met")]
        lines.append(f"- {t['text']}: {t['detail']} — {verdict}")
    lines.append("")
    lines.append("## Clients")
    lines.append("")
    for name, info in clients.items():
        if not info.get("selected", True):
            lines.append(f"- {info.get('label', name)}: not selected for this run")
        elif info.get("available"):
            extra = ", ".join(f"{k} {info[k]}" for k in ("tornado", "gevent") if info.get(k))
            lines.append(
                f"- {info.get('label', name)}: version {info.get('version', '?')} on Python "
                f"{info.get('python', '?')}{' (' + extra + ')' if extra else ''}"
            )
        else:
            lines.append(f"- {name}: {info.get('why_not')}")
    lines.append("")
    lines.append("## Notes")
    lines.append("")
    lines.append(
        "- consume: every client gets its own topic, pre-filled through nsqd's HTTP `/mpub` "
        "(binary) into an existing channel with N + 5000 messages (so that nsqd still has "
        "traffic to send when the N-th arrives), and FINs each one; afterwards nsqd's channel "
        "must have lost at least N messages (whatever was not FINished is requeued on "
        "disconnect). The rate is N / (time from constructing the consumer to the N-th handler "
        "call), connection set-up included."
    )
    lines.append(
        "- publish: one warm-up PUB opens the connection before the clock starts; nsqd's "
        "`message_count` is checked against what the client says it sent."
    )
    lines.append(
        "- latency: a neutral publisher (raw TCP PUB, pipelined, in the harness process) stamps "
        "each body with CLOCK_MONOTONIC and paces it; the handler subtracts. The first "
        f"{_sizes(data).get('latency_warmup_s', 0):g} s of messages are discarded and 0.2 s of "
        "extra traffic follows the measured messages (so none waits for nsqd's flush timer "
        "when the publisher stops). nsqd is "
        "started with --min-output-buffer-timeout=1ms (v1.3.0 refuses < 25 ms otherwise); with "
        "a 64-byte output buffer every 200-byte message frame is written out at once. All four "
        "clients can set both IDENTIFY fields."
    )
    lines.append(
        "- idle: every idle consumer runs at the same time, max_in_flight 100, each measuring its "
        "own CPU (getrusage) over the same window after connecting; nsqd's /stats confirms the "
        "connection counts."
    )
    lines.append(
        "- memory: one consumer per client connected to every one of the extra nsqds (one "
        "connection each), RSS read from /proc/self/status after all connections are up; "
        "per-connection = (RSS − RSS before the consumer was created) / connections."
    )
    lines.append(
        "- go-nsq bench tools are the ceiling: raw protocol, one connection per core, no "
        'per-message work (bench_reader reads an over-filled topic for a fixed time, "(≥)" if '
        "it ran dry; bench_writer publishes MPUB batches for a fixed time). For the one-thread "
        "PUB the ceiling is a bare stdlib socket loop (bench/clients/raw_socket_client.py: "
        "write PUB, block in recv for OK, no library): the loopback round trip through nsqd "
        "that bounds every synchronous publish."
    )
    lines.append(
        f"- † marks a run during which processes outside the benchmark used more than "
        f"{NOISY_OTHER_PCT:g} % of a core (the machine is shared); see cpu_window in latest.json."
    )
    for i, note in enumerate(notes, 1):
        lines.append(f"- [{i}] {note}")
    lines.append("")
    lines.append("Method and how to run: bench/README.md. Raw numbers: bench/results/latest.json.")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# chart


def write_chart(data: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = data.get("results", {})
    colors = {
        "nsq_sync": "#1f77b4",
        "nsq_sync-gevent": "#17becf",
        "pynsq": "#ff7f0e",
        "gnsq": "#2ca02c",
        "nsq-py": "#d62728",
        "go-nsq bench": "#7f7f7f",
    }
    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))

    def grouped(
        ax: Any, groups: list[tuple[str, dict[str, float | None]]], log: bool, ylabel: str
    ) -> None:
        width = 0.8 / len(COLUMNS)
        for j, client in enumerate(COLUMNS):
            xs, ys = [], []
            for i, (_, values) in enumerate(groups):
                v = values.get(client)
                if v is not None and v > 0:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(v)
            if xs:
                ax.bar(xs, ys, width, label=client, color=colors[client])
        if not groups:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
            ax.set_xticks([])
            return
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([g[0] for g in groups], fontsize=9)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3, which="both")

    def value(workload: str, client: str, key: str) -> float | None:
        r = results.get(workload, {}).get(client)
        if not r or not r.get("ok") or r.get(key) is None:
            return None
        return float(r[key])

    s = _sizes(data)
    ax = axes[0][0]
    groups = []
    for workload, label in (
        ("consume", "consume\nFIN each"),
        ("pub", "PUB\n1 thread"),
        ("pub_threads", f"PUB\n{s.get('threads')} threads"),
        ("mpub", f"MPUB\n×{s.get('batch')}"),
    ):
        if workload in results:
            groups.append((label, {c: value(workload, c, "rate") for c in COLUMNS}))
    grouped(ax, groups, True, "messages / s (log)")
    ax.set_title("Throughput (higher is better)")

    ax = axes[0][1]
    groups = []
    for workload, label in (("latency_default", "16 KB / 250 ms"), ("latency_low", "64 B / 5 ms")):
        if workload in results:
            groups.append((f"p50 {label}", {c: value(workload, c, "p50_ms") for c in COLUMNS}))
            groups.append((f"p99 {label}", {c: value(workload, c, "p99_ms") for c in COLUMNS}))
    grouped(ax, groups, True, "ms (log)")
    ax.set_title(
        f"Latency publish → handler at {_k(s.get('latency_rate', 0))} msg/s (lower is better)"
    )

    ax = axes[1][0]
    groups = []
    for workload, label in (
        ("idle_multi", f"{s.get('idle_nsqds')} connections"),
        ("idle_1", "1 connection"),
    ):
        if workload in results:
            groups.append((label, {c: value(workload, c, "cpu_percent") for c in COLUMNS}))
    grouped(ax, groups, False, "% of one core")
    ax.set_title(f"Idle consumer CPU over {s.get('idle_window_s', 0):g} s (lower is better)")

    ax = axes[1][1]
    groups = []
    if "rss" in results:
        groups.append(
            (
                f"RSS, {s.get('rss_nsqds')} connections",
                {c: (value("rss", c, "rss_kb") or 0) / 1024 or None for c in COLUMNS},
            )
        )
        growth = {}
        for c in COLUMNS:
            after, before = value("rss", c, "rss_kb"), value("rss", c, "rss_baseline_kb")
            growth[c] = (
                (after - before) / 1024 if after is not None and before is not None else None
            )
        groups.append((f"growth for {s.get('rss_nsqds')} connections", growth))
    grouped(ax, groups, False, "MiB")
    ax.set_title("Consumer memory (lower is better)")

    from matplotlib.patches import Patch

    fig.legend(
        handles=[Patch(color=colors[c], label=c) for c in COLUMNS],
        loc="lower center",
        ncol=len(COLUMNS),
        fontsize=10,
        frameon=False,
    )
    meta = data.get("meta", {})
    fig.suptitle(
        f"nsq_sync vs peers — nsqd {meta.get('nsqd_version')}, {meta.get('body_size')}-byte bodies, "
        f"{meta.get('machine', {}).get('cpus')} cores, {meta.get('date', '')}",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report [--publish] [latest.json]``: re-render the md/png next to the
    json (and, with --publish, docs/benchmarks.{md,png})."""
    argv = list(sys.argv[1:] if argv is None else argv)
    publish = "--publish" in argv
    argv = [a for a in argv if a != "--publish"]
    src = Path(argv[0]) if argv else Path(__file__).resolve().parent / "results" / "latest.json"
    data = json.loads(src.read_text())
    data["targets"] = evaluate_targets(data)
    png = None
    try:
        png = write_chart(data, src.with_suffix(".png"))
    except ImportError as exc:
        print(f"no chart: {exc}", file=sys.stderr)
    src.with_suffix(".md").write_text(render_markdown(data, png.name if png else None))
    print(src.with_suffix(".md"))
    if publish:
        docs = Path(__file__).resolve().parent.parent / "docs"
        docs.mkdir(exist_ok=True)
        (docs / "benchmarks.md").write_text(
            render_markdown(data, "benchmarks.png" if png else None)
        )
        if png:
            shutil.copyfile(png, docs / "benchmarks.png")
        print(docs / "benchmarks.md")
        if update_table(data, docs / "performance.md"):
            print(docs / "performance.md")
        if update_readme_rows(data, docs.parent / "README.md"):
            print(docs.parent / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
