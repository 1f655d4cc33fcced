"""Benchmark worker for nsq_sync (threads, or gevent when the job says ``"gevent": true``).

Runs in the project's own virtualenv. See bench/clients/_common.py for the job/result protocol
and bench/README.md for what every workload measures.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

JOB = _common.read_job()
GEVENT = bool(JOB.get("gevent"))
if JOB.get("import_path"):  # a baseline source tree to compare with (BENCH_BASELINE)
    sys.path.insert(0, JOB["import_path"])
if GEVENT:
    from gevent import monkey

    monkey.patch_all()

import itertools  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import nsq_sync  # noqa: E402
from nsq_sync import Consumer, Producer  # noqa: E402

CLIENT = "nsq_sync-gevent" if GEVENT else "nsq_sync"
if JOB.get("import_path"):
    CLIENT = "nsq_sync-base"


def identify_options(job):
    """IDENTIFY output buffering as Config options (durations in seconds)."""
    ident = job.get("identify") or {}
    opts = {}
    if "output_buffer_size" in ident:
        opts["output_buffer_size"] = ident["output_buffer_size"]
    if "output_buffer_timeout_ms" in ident:
        opts["output_buffer_timeout"] = ident["output_buffer_timeout_ms"] / 1000.0
    return opts


def sources(job):
    """Where a consumer finds its nsqds: nsqlookupd when the job names one, else the nsqd(s)."""
    if job.get("lookupd"):
        return {"lookupd_http_addresses": [job["lookupd"]]}
    return {"nsqd_tcp_addresses": job.get("nsqds") or [job["nsqd"]]}


def runtime_name():
    return "gevent" if GEVENT else "threads"


def run_consume(job, result):
    n = job["n"]
    counter = itertools.count(1)
    done = threading.Event()
    marks = {}

    def handler(message):
        i = next(counter)
        if i == 1:
            marks["first"] = time.perf_counter()
        if i == n:
            marks["last"] = time.perf_counter()
            marks["cpu"] = _common.cpu_seconds()
            done.set()

    cpu0 = _common.cpu_seconds()
    start = time.perf_counter()
    consumer = Consumer(
        job["topic"],
        job["channel"],
        handler,
        max_in_flight=job["max_in_flight"],
        concurrency=job.get("concurrency", 1),
        **sources(job),
        **identify_options(job),
    )
    consumer.start()
    finished = done.wait(job["timeout_s"])
    stop_clean = consumer.stop(timeout=10.0)
    stats = consumer.stats()
    end = marks.get("last", time.perf_counter())
    _common.rate_result(result, n if finished else stats.finished, end - start)
    if "cpu" in marks:
        result["consume_cpu_s"] = marks["cpu"] - cpu0
    result.update(
        ok=finished,
        first_message_after_s=marks.get("first", end) - start,
        library_finished=stats.finished,
        stop_clean=stop_clean,
        concurrency=job.get("concurrency", 1),
        runtime=runtime_name(),
    )


def _warm(producer, job):
    producer.publish(job["topic"], _common.body(job["body_size"]))  # connects; counted as warmup


def run_pub(job, result):
    n = job["n"]
    data = _common.body(job["body_size"])
    topic = job["topic"]
    deadline = _common.Deadline(job["timeout_s"])
    with Producer([job["nsqd"]], **identify_options(job)) as producer:
        _warm(producer, job)
        start = time.perf_counter()
        sent = 0
        publish = producer.publish
        while sent < n and not (sent % 1000 == 0 and deadline.expired()):
            publish(topic, data)
            sent += 1
        elapsed = time.perf_counter() - start
    _common.rate_result(result, sent, elapsed)
    result.update(ok=sent == n, warmup_messages=1, runtime=runtime_name())


def run_pub_threads(job, result):
    n = job["n"]
    threads = job["threads"]
    per_thread = n // threads
    data = _common.body(job["body_size"])
    topic = job["topic"]
    deadline = _common.Deadline(job["timeout_s"])
    counts = [0] * threads
    errors = []
    barrier = threading.Barrier(threads + 1)

    with Producer([job["nsqd"]], **identify_options(job)) as producer:
        _warm(producer, job)

        def worker(k):
            try:
                barrier.wait(30)
                publish = producer.publish
                for i in range(per_thread):
                    if i % 1000 == 0 and deadline.expired():
                        return
                    publish(topic, data)
                    counts[k] += 1
            except BaseException as exc:  # reported below
                errors.append(repr(exc))

        pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
        for t in pool:
            t.start()
        barrier.wait(30)
        start = time.perf_counter()
        for t in pool:
            t.join(deadline.remaining() + 5)
        elapsed = time.perf_counter() - start
    sent = sum(counts)
    _common.rate_result(result, sent, elapsed)
    result.update(
        ok=sent == per_thread * threads and not errors,
        threads=threads,
        errors=errors[:5],
        warmup_messages=1,
        runtime=runtime_name(),
    )


def run_mpub(job, result):
    n = job["n"]
    batch_size = job["batch"]
    batches = n // batch_size
    batch = [_common.body(job["body_size"])] * batch_size
    topic = job["topic"]
    deadline = _common.Deadline(job["timeout_s"])
    with Producer([job["nsqd"]], **identify_options(job)) as producer:
        _warm(producer, job)
        start = time.perf_counter()
        done = 0
        for _ in range(batches):
            if deadline.expired():
                break
            producer.multi_publish(topic, batch)
            done += 1
        elapsed = time.perf_counter() - start
    _common.rate_result(result, done * batch_size, elapsed)
    result.update(ok=done == batches, batch=batch_size, warmup_messages=1, runtime=runtime_name())


def run_latency(job, result):
    recorder = _common.LatencyRecorder(job["expect"], job.get("warmup", 0))
    done = threading.Event()

    def handler(message):
        if recorder.add(message.body):
            done.set()

    consumer = Consumer(
        job["topic"],
        job["channel"],
        handler,
        nsqd_tcp_addresses=[job["nsqd"]],
        max_in_flight=job["max_in_flight"],
        concurrency=job.get("concurrency", 1),
        **identify_options(job),
    )
    consumer.start()
    done.wait(job["timeout_s"])
    consumer.stop(timeout=5.0)
    result.update(recorder.summary())
    result.update(ok=recorder.done, runtime=runtime_name())


def run_idle(job, result):
    nsqds = job["nsqds"]
    consumer = Consumer(
        job["topic"],
        job["channel"],
        lambda message: None,
        **sources(job),
        max_in_flight=job["max_in_flight"],
        **identify_options(job),
    )
    consumer.start()
    # wait for the connections (a busy machine takes longer), then let them settle
    deadline = time.monotonic() + 30.0
    while len(consumer.stats().connections) < len(nsqds) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(job["settle_s"])
    connected = len(consumer.stats().connections)
    cpu0, t0 = _common.cpu_seconds(), time.monotonic()
    time.sleep(job["window_s"])
    cpu1, t1 = _common.cpu_seconds(), time.monotonic()
    connected_end = len(consumer.stats().connections)
    consumer.stop(timeout=5.0)
    result.update(
        ok=connected == len(nsqds) and connected_end == len(nsqds),
        connections=connected,
        connections_at_end=connected_end,
        cpu_s=cpu1 - cpu0,
        window_s=t1 - t0,
        cpu_percent=100.0 * (cpu1 - cpu0) / (t1 - t0),
        threads=_common.thread_count(),
        runtime=runtime_name(),
    )


def run_rss(job, result):
    nsqds = job["nsqds"]
    rss0 = _common.rss_kb()
    consumer = Consumer(
        job["topic"],
        job["channel"],
        lambda message: None,
        nsqd_tcp_addresses=nsqds,
        max_in_flight=job["max_in_flight"],
        **identify_options(job),
    )
    consumer.start()
    deadline = _common.Deadline(job["timeout_s"])
    while len(consumer.stats().connections) < len(nsqds) and not deadline.expired():
        time.sleep(0.05)
    connected_after = job["timeout_s"] - deadline.remaining()
    time.sleep(job["settle_s"])
    rss1 = _common.rss_kb()
    connected = len(consumer.stats().connections)
    threads = _common.thread_count()
    time.sleep(job.get("hold_s", 0))
    consumer.stop(timeout=5.0)
    result.update(
        ok=connected == len(nsqds),
        connections=connected,
        connect_s=connected_after,
        rss_baseline_kb=rss0,
        rss_kb=rss1,
        rss_per_connection_kb=(rss1 - rss0) / max(1, connected),
        threads=threads,
        runtime=runtime_name(),
    )


WORKLOADS = {
    "consume": run_consume,
    "pub": run_pub,
    "pub_threads": run_pub_threads,
    "mpub": run_mpub,
    "latency": run_latency,
    "idle": run_idle,
    "rss": run_rss,
}


def run(job, result):
    WORKLOADS[job["workload"]](job, result)


def version():
    if JOB.get("import_path"):  # say which tree was measured
        return f"{nsq_sync.__version__} from {os.path.dirname(os.path.dirname(nsq_sync.__file__))}"
    return nsq_sync.__version__


if __name__ == "__main__":
    _common.main(run, CLIENT, version, job=JOB)
