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

    return {
        "consume": f"consume {_k(s.get('consume_n', 0))} pre-filled messages, FIN each, max_in_flight 2500",
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


def _ratio_target(
    tid: str,
    text: str,
    a: float | None,
    b: float | None,
    threshold: float,
    a_name: str,
    b_name: str,
    fmt: str,
) -> dict[str, Any]:
    if a is None or b is None or b == 0:
        missing = " and ".join(name for name, v in ((a_name, a), (b_name, b)) if not v)
        return {"id": tid, "text": text, "met": None, "detail": f"not measured ({missing} missing)"}
    ratio = a / b
    return {
        "id": tid,
        "text": text,
        "value": ratio,
        "threshold": threshold,
        "met": ratio >= threshold,
        "detail": f"{ratio:.2f}× ({a_name} {fmt.format(a)} vs {b_name} {fmt.format(b)})",
    }


def evaluate_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    rate = "{:,.0f} msg/s"
    t: list[dict[str, Any]] = [
        _ratio_target(
            "consume_vs_nsqpy",
            "consume (threads, FIN each, max_in_flight 2500) ≥ 1.5× nsq-py",
            _rate(data, "consume", "nsq_sync"),
            _rate(data, "consume", "nsq-py"),
            1.5,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
        _ratio_target(
            "consume_vs_bench_reader",
            "consume (threads) ≥ 0.7× go-nsq bench_reader",
            _rate(data, "consume", "nsq_sync"),
            _rate(data, "consume", "go-nsq bench"),
            0.7,
            "nsq_sync",
            "bench_reader",
            rate,
        ),
        _ratio_target(
            "gevent_vs_gnsq",
            "consume under gevent ≥ 5× gnsq",
            _rate(data, "consume", "nsq_sync-gevent"),
            _rate(data, "consume", "gnsq"),
            5.0,
            "nsq_sync (gevent)",
            "gnsq",
            rate,
        ),
        _ratio_target(
            "pub_vs_nsqpy",
            "single-thread synchronous PUB ≥ 1.5× nsq-py",
            _rate(data, "pub", "nsq_sync"),
            _rate(data, "pub", "nsq-py"),
            1.5,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
        _ratio_target(
            "threads_vs_single",
            "8 threads publishing through one Producer ≥ 3× one thread of nsq_sync",
            _rate(data, "pub_threads", "nsq_sync"),
            _rate(data, "pub", "nsq_sync"),
            3.0,
            "8 threads",
            "1 thread",
            rate,
        ),
        _ratio_target(
            "mpub_vs_nsqpy",
            "MPUB × 200 ≥ 1.0× nsq-py",
            _rate(data, "mpub", "nsq_sync"),
            _rate(data, "mpub", "nsq-py"),
            1.0,
            "nsq_sync",
            "nsq-py",
            rate,
        ),
    ]
    raw = _rate(data, "pub", "go-nsq bench")
    mine, nsqpy = _rate(data, "pub", "nsq_sync"), _rate(data, "pub", "nsq-py")
    if raw and mine and nsqpy:
        for target in t:
            if target["id"] == "pub_vs_nsqpy":
                target["detail"] += (
                    f"; the round-trip ceiling, a bare socket loop, did {raw:,.0f} msg/s: nsq_sync"
                    f" at {mine / raw:.2f}× of it, nsq-py at {nsqpy / raw:.2f}×"
                )
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
        mine = _p99(data, workload, "nsq_sync")
        peers = {p: _p99(data, workload, p) for p in PEERS}
        measured = {p: v for p, v in peers.items() if v is not None}
        ident = data.get("meta", {}).get("latency_settings", {}).get(setting, {})
        text = (
            f"latency p99 ≤ 0.8× the best peer's (IDENTIFY {ident.get('output_buffer_size')} B / "
            f"{ident.get('output_buffer_timeout_ms')} ms)"
        )
        if mine is None or not measured:
            t.append({"id": workload, "text": text, "met": None, "detail": "not measured"})
            continue
        best = min(measured, key=lambda p: measured[p])
        ratio = mine / measured[best]
        t.append(
            {
                "id": workload,
                "text": text,
                "value": ratio,
                "threshold": 0.8,
                "met": ratio <= 0.8,
                "detail": (
                    f"{ratio:.2f}× (nsq_sync p99 {mine:.2f} ms vs best peer {best} "
                    f"{measured[best]:.2f} ms)"
                ),
            }
        )
    return t


# ---------------------------------------------------------------------------------------------
# Markdown


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
        return f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms{mark}"
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
        return text + mark
    return "ok"


def render_markdown(data: dict[str, Any], png_name: str | None) -> str:
    meta = data.get("meta", {})
    results = data.get("results", {})
    titles = row_titles(data)
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
    header = ["workload"]
    for c in COLUMNS:
        info = clients.get(c, {})
        if c == "go-nsq bench":
            header.append("ceilings: go-nsq bench tools, raw socket")
        else:
            version = info.get("version")
            header.append(f"{c} {version}" if version and c in PEERS else c)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    notes: list[str] = []
    for workload, title in titles.items():
        per = results.get(workload)
        if not per:
            continue
        cells = [title]
        for c in COLUMNS:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
