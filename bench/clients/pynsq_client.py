"""Benchmark worker for pynsq (tornado). Runs in .bench/venvs/pynsq.

Everything happens on one tornado IOLoop: pynsq's ``Writer.pub`` is asynchronous, so the
"synchronous" publish benchmarks chain each publish from the previous one's callback (one message
in flight at a time, like a blocking publish).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import nsq  # noqa: E402
import tornado.ioloop  # noqa: E402

CLIENT = "pynsq"
LOOP = tornado.ioloop.IOLoop.current()


def identify_kwargs(job):
    ident = job.get("identify") or {}
    kw = {}
    if "output_buffer_size" in ident:
        if ident["output_buffer_size"] is None:
            raise ValueError("pynsq cannot disable output buffering (output_buffer_size=-1)")
        kw["output_buffer_size"] = ident["output_buffer_size"]
    if "output_buffer_timeout_ms" in ident:
        kw["output_buffer_timeout"] = int(ident["output_buffer_timeout_ms"])
    return kw


def stop_after(seconds):
    LOOP.call_later(seconds, LOOP.stop)


def connected_conns(client):
    return [c for c in client.conns.values() if c.connected()]


def run_consume(job, result):
    n = job["n"]
    state = {"count": 0}

    def handler(message):
        state["count"] += 1
        c = state["count"]
        if c == 1:
            state["first"] = time.perf_counter()
        if c == n:
            state["last"] = time.perf_counter()
            state["cpu"] = _common.cpu_seconds()
            stop_after(0.2)  # let the last FINs go out
        return True

    cpu0 = _common.cpu_seconds()
    start = time.perf_counter()
    nsq.Reader(
        topic=job["topic"],
        channel=job["channel"],
        message_handler=handler,
        nsqd_tcp_addresses=[job["nsqd"]],
        max_in_flight=job["max_in_flight"],
        **identify_kwargs(job),
    )
    stop_after(job["timeout_s"])
    LOOP.start()
    end = state.get("last", time.perf_counter())
    reached = "last" in state
    _common.rate_result(result, n if reached else state["count"], end - start)
    if "cpu" in state:
        result["consume_cpu_s"] = state["cpu"] - cpu0
    result.update(
        ok=reached,
        handled_total=state["count"],  # includes messages handled after the clock stopped
        first_message_after_s=state.get("first", end) - start,
    )


def _chain(job, result, command, payload, batches, weight):
    """Send ``batches`` requests one after another, each from the previous one's callback."""
    writer = nsq.Writer([job["nsqd"]], **identify_kwargs(job))
    topic = job["topic"]
    state = {"done": 0, "error": None}

    def fail(why):
        state["error"] = why
        LOOP.stop()

    def on_response(conn, data):
        if isinstance(data, Exception):
            return fail(repr(data))
        state["done"] += 1
        if state["done"] == batches:
            state["end"] = time.perf_counter()
            LOOP.stop()
            return None
        getattr(writer, command)(topic, payload, callback=on_response)
        return None

    def on_warm(conn, data):
        if isinstance(data, Exception):
            return fail(f"warmup: {data!r}")
        state["start"] = time.perf_counter()
        getattr(writer, command)(topic, payload, callback=on_response)
        return None

    def wait_connected():
        if connected_conns(writer):
            writer.pub(topic, _common.body(job["body_size"]), callback=on_warm)
        else:
            LOOP.call_later(0.005, wait_connected)

    LOOP.add_callback(wait_connected)
    stop_after(job["timeout_s"])
    LOOP.start()
    start = state.get("start", time.perf_counter())
    end = state.get("end", time.perf_counter())
    _common.rate_result(result, state["done"] * weight, end - start)
    result.update(ok=state["done"] == batches and not state["error"], warmup_messages=1)
    if state["error"]:
        result["error"] = state["error"]


def run_pub(job, result):
    _chain(job, result, "pub", _common.body(job["body_size"]), job["n"], 1)


def run_mpub(job, result):
    batch = job["batch"]
    _chain(job, result, "mpub", [_common.body(job["body_size"])] * batch, job["n"] // batch, batch)
    result["batch"] = batch


def run_latency(job, result):
    recorder = _common.LatencyRecorder(job["expect"], job.get("warmup", 0))
    state = {"stopping": False}

    def handler(message):
        if recorder.add(message.body) and not state["stopping"]:
            state["stopping"] = True
            stop_after(0.05)
        return True

    nsq.Reader(
        topic=job["topic"],
        channel=job["channel"],
        message_handler=handler,
        nsqd_tcp_addresses=[job["nsqd"]],
        max_in_flight=job["max_in_flight"],
        **identify_kwargs(job),
    )
    stop_after(job["timeout_s"])
    LOOP.start()
    result.update(recorder.summary())
    result.update(ok=recorder.done)


def _reader(job):
    return nsq.Reader(
        topic=job["topic"],
        channel=job["channel"],
        message_handler=lambda message: True,
        nsqd_tcp_addresses=job["nsqds"],
        max_in_flight=job["max_in_flight"],
        **identify_kwargs(job),
    )


def run_idle(job, result):
    reader = _reader(job)
    marks = {}

    def begin():
        marks["conns"] = len(connected_conns(reader))
        marks["cpu0"], marks["t0"] = _common.cpu_seconds(), time.monotonic()

    def end():
        marks["cpu1"], marks["t1"] = _common.cpu_seconds(), time.monotonic()
        marks["conns_end"] = len(connected_conns(reader))
        LOOP.stop()

    LOOP.call_later(job["settle_s"], begin)
    LOOP.call_later(job["settle_s"] + job["window_s"], end)
    LOOP.start()
    n = len(job["nsqds"])
    cpu = marks["cpu1"] - marks["cpu0"]
    wall = marks["t1"] - marks["t0"]
    result.update(
        ok=marks["conns"] == n and marks["conns_end"] == n,
        connections=marks["conns"],
        connections_at_end=marks["conns_end"],
        cpu_s=cpu,
        window_s=wall,
        cpu_percent=100.0 * cpu / wall,
        threads=_common.thread_count(),
    )


def run_rss(job, result):
    rss0 = _common.rss_kb()
    reader = _reader(job)
    n = len(job["nsqds"])
    marks = {"start": time.monotonic()}

    def measure():
        marks["rss"] = _common.rss_kb()
        marks["conns"] = len(connected_conns(reader))
        marks["threads"] = _common.thread_count()
        stop_after(job.get("hold_s", 0))

    def poll():
        waited = time.monotonic() - marks["start"]
        if len(connected_conns(reader)) >= n or waited >= job["timeout_s"]:
            marks["connect_s"] = waited
            LOOP.call_later(job["settle_s"], measure)
        else:
            LOOP.call_later(0.05, poll)

    LOOP.add_callback(poll)
    stop_after(job["timeout_s"] + job["settle_s"] + job.get("hold_s", 0) + 5)
    LOOP.start()
    rss1 = marks.get("rss")
    result.update(
        ok=marks.get("conns") == n,
        connections=marks.get("conns"),
        connect_s=marks.get("connect_s"),
        rss_baseline_kb=rss0,
        rss_kb=rss1,
        rss_per_connection_kb=(rss1 - rss0) / max(1, marks.get("conns") or 1) if rss1 else None,
        threads=marks.get("threads"),
    )


WORKLOADS = {
    "consume": run_consume,
    "pub": run_pub,
    "mpub": run_mpub,
    "latency": run_latency,
    "idle": run_idle,
    "rss": run_rss,
}


def run(job, result):
    if job["workload"] not in WORKLOADS:
        raise NotImplementedError(f"pynsq worker has no {job['workload']!r} workload")
    result["tornado"] = tornado.version
    WORKLOADS[job["workload"]](job, result)


if __name__ == "__main__":
    _common.main(run, CLIENT, lambda: nsq.__version__)
