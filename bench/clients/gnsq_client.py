"""Benchmark worker for gnsq (gevent). Runs in .bench/venvs/gnsq, monkey-patched like a gevent app."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gnsq  # noqa: E402

CLIENT = "gnsq"


def identify_kwargs(job):
    ident = job.get("identify") or {}
    kw = {}
    if "output_buffer_size" in ident:
        kw["output_buffer_size"] = (
            -1 if ident["output_buffer_size"] is None else ident["output_buffer_size"]
        )
    if "output_buffer_timeout_ms" in ident:
        kw["output_buffer_timeout"] = int(ident["output_buffer_timeout_ms"])
    return kw


def _consumer(job, addresses, handler):
    consumer = gnsq.Consumer(
        job["topic"],
        job["channel"],
        nsqd_tcp_addresses=addresses,
        max_in_flight=job["max_in_flight"],
        **identify_kwargs(job),
    )
    consumer.on_message.connect(handler, weak=False)
    return consumer


def _close(consumer):
    consumer.close()
    consumer.join(timeout=5)


def run_consume(job, result):
    n = job["n"]
    state = {"count": 0}
    done = gevent.event.Event()

    def handler(consumer, message):
        state["count"] += 1
        c = state["count"]
        if c == 1:
            state["first"] = time.perf_counter()
        if c == n:
            state["last"] = time.perf_counter()
            state["cpu"] = _common.cpu_seconds()
            done.set()

    cpu0 = _common.cpu_seconds()
    start = time.perf_counter()
    consumer = _consumer(job, [job["nsqd"]], handler)
    consumer.start(block=False)
    done.wait(job["timeout_s"])
    gevent.sleep(0.2)  # gnsq finishes a message after the handler returns: let the last FINs out
    _close(consumer)
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


def _producer(job):
    producer = gnsq.Producer([job["nsqd"]], **identify_kwargs(job))
    producer.start()
    producer.publish(job["topic"], _common.body(job["body_size"]))  # waits for a connection
    return producer


def run_pub(job, result):
    n = job["n"]
    data = _common.body(job["body_size"])
    topic = job["topic"]
    deadline = _common.Deadline(job["timeout_s"])
    producer = _producer(job)
    start = time.perf_counter()
    sent = 0
    while sent < n and not (sent % 1000 == 0 and deadline.expired()):
        producer.publish(topic, data)
        sent += 1
    elapsed = time.perf_counter() - start
    producer.close()
    _common.rate_result(result, sent, elapsed)
    result.update(ok=sent == n, warmup_messages=1)


def run_mpub(job, result):
    batch_size = job["batch"]
    batches = job["n"] // batch_size
    batch = [_common.body(job["body_size"])] * batch_size
    topic = job["topic"]
    deadline = _common.Deadline(job["timeout_s"])
    producer = _producer(job)
    start = time.perf_counter()
    done = 0
    for _ in range(batches):
        if deadline.expired():
            break
        producer.multipublish(topic, batch)
        done += 1
    elapsed = time.perf_counter() - start
    producer.close()
    _common.rate_result(result, done * batch_size, elapsed)
    result.update(ok=done == batches, batch=batch_size, warmup_messages=1)


def run_latency(job, result):
    recorder = _common.LatencyRecorder(job["expect"], job.get("warmup", 0))
    done = gevent.event.Event()

    def handler(consumer, message):
        if recorder.add(message.body):
            done.set()

    consumer = _consumer(job, [job["nsqd"]], handler)
    consumer.start(block=False)
    done.wait(job["timeout_s"])
    gevent.sleep(0.05)
    _close(consumer)
    result.update(recorder.summary())
    result.update(ok=recorder.done)


def _connected(consumer):
    return len(consumer._connections)  # gnsq has no public accessor


def run_idle(job, result):
    consumer = _consumer(job, job["nsqds"], lambda consumer, message: None)
    consumer.start(block=False)
    gevent.sleep(job["settle_s"])
    conns = _connected(consumer)
    cpu0, t0 = _common.cpu_seconds(), time.monotonic()
    gevent.sleep(job["window_s"])
    cpu1, t1 = _common.cpu_seconds(), time.monotonic()
    conns_end = _connected(consumer)
    _close(consumer)
    n = len(job["nsqds"])
    result.update(
        ok=conns == n and conns_end == n,
        connections=conns,
        connections_at_end=conns_end,
        cpu_s=cpu1 - cpu0,
        window_s=t1 - t0,
        cpu_percent=100.0 * (cpu1 - cpu0) / (t1 - t0),
        threads=_common.thread_count(),
    )


def run_rss(job, result):
    rss0 = _common.rss_kb()
    n = len(job["nsqds"])
    consumer = _consumer(job, job["nsqds"], lambda consumer, message: None)
    consumer.start(block=False)
    deadline = _common.Deadline(job["timeout_s"])
    while _connected(consumer) < n and not deadline.expired():
        gevent.sleep(0.05)
    connect_s = job["timeout_s"] - deadline.remaining()
    gevent.sleep(job["settle_s"])
    rss1 = _common.rss_kb()
    conns = _connected(consumer)
    threads = _common.thread_count()
    gevent.sleep(job.get("hold_s", 0))
    _close(consumer)
    result.update(
        ok=conns == n,
        connections=conns,
        connect_s=connect_s,
        rss_baseline_kb=rss0,
        rss_kb=rss1,
        rss_per_connection_kb=(rss1 - rss0) / max(1, conns),
        threads=threads,
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
        raise NotImplementedError(f"gnsq worker has no {job['workload']!r} workload")
    result["gevent"] = gevent.__version__
    WORKLOADS[job["workload"]](job, result)


if __name__ == "__main__":
    _common.main(run, CLIENT, lambda: gnsq.__version__)
