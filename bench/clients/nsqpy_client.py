"""Benchmark worker for nsq-py (select-based). Runs in .bench/venvs/nsq-py.

nsq-py on Python 3 wants bytes topic and channel names. Its Reader is an iterator over
``Client.read()`` (a select() with a 0.1 s timeout); the loops here call ``read()`` directly so
that every loop is bounded in time, which is what ``Reader.__iter__`` does minus the reconnect
checker thread.
"""

import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
import nsq  # noqa: E402
from nsq.client import Client  # noqa: E402
from nsq.reader import Reader  # noqa: E402
from nsq.response import Error, Message  # noqa: E402

CLIENT = "nsq-py"
# nsq-py installs an INFO-level stream handler at import and logs every RDY it sends; a real
# application would turn that down, so the benchmark does too (the other libraries log nothing
# below WARNING by default).
logging.getLogger("nsq").setLevel(logging.WARNING)


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


def _reader(job, addresses):
    return Reader(
        job["topic"].encode(),
        job["channel"].encode(),
        nsqd_tcp_addresses=addresses,
        max_in_flight=job["max_in_flight"],
        **identify_kwargs(job),
    )


def _alive(client):
    return len([c for c in client.connections() if c.alive()])


def _drain_writes(client, seconds=1.0):
    """FIN commands are queued and written by read(); push the last ones out."""
    deadline = _common.Deadline(seconds)
    while any(c.pending() for c in client.connections() if c.alive()) and not deadline.expired():
        client.read()


def _close(client):
    for conn in client.connections():
        try:
            conn.close()
        except Exception:
            pass


def _stop(reader, seconds=0.3):
    """RDY 0, then FIN whatever still arrives, so that closing the socket loses nothing (a
    socket closed with unread data resets the connection, and nsqd may drop FINs it has not
    read yet)."""
    for conn in reader.connections():
        if conn.alive():
            conn.rdy(0)
    finished = 0
    deadline = _common.Deadline(seconds)
    while not deadline.expired():
        for message in reader.read():
            if isinstance(message, Message):
                message.fin()
                finished += 1
    _drain_writes(reader)
    _close(reader)
    return finished


def run_consume(job, result):
    n = job["n"]
    cpu0 = _common.cpu_seconds()
    start = time.perf_counter()
    reader = _reader(job, [job["nsqd"]])  # connects, SUB, RDY 1
    deadline = _common.Deadline(job["timeout_s"])
    count = 0
    first = None
    while count < n and not deadline.expired():
        for message in reader.read():
            if isinstance(message, Message):
                message.fin()
                count += 1
                if count == 1:
                    first = time.perf_counter()
    end = time.perf_counter()
    cpu1 = _common.cpu_seconds()
    after = _stop(reader)
    _common.rate_result(result, count, end - start)
    result["consume_cpu_s"] = cpu1 - cpu0
    result.update(
        ok=count >= n, first_message_after_s=(first or end) - start, finished_after_stop=after
    )


def _check(responses):
    for response in responses:
        if isinstance(response, Error):
            raise RuntimeError(f"nsqd answered {response!r}")


def _client(job):
    client = Client(nsqd_tcp_addresses=[job["nsqd"]], **identify_kwargs(job))
    _check(client.pub(job["topic"].encode(), _common.body(job["body_size"])))  # warmup
    return client


def run_pub(job, result):
    n = job["n"]
    data = _common.body(job["body_size"])
    topic = job["topic"].encode()
    deadline = _common.Deadline(job["timeout_s"])
    client = _client(job)
    start = time.perf_counter()
    sent = 0
    while sent < n and not (sent % 1000 == 0 and deadline.expired()):
        _check(client.pub(topic, data))
        sent += 1
    elapsed = time.perf_counter() - start
    _close(client)
    _common.rate_result(result, sent, elapsed)
    result.update(ok=sent == n, warmup_messages=1)


def run_mpub(job, result):
    batch_size = job["batch"]
    batches = job["n"] // batch_size
    batch = [_common.body(job["body_size"])] * batch_size
    topic = job["topic"].encode()
    deadline = _common.Deadline(job["timeout_s"])
    client = _client(job)
    start = time.perf_counter()
    done = 0
    for _ in range(batches):
        if deadline.expired():
            break
        _check(client.mpub(topic, *batch))
        done += 1
    elapsed = time.perf_counter() - start
    _close(client)
    _common.rate_result(result, done * batch_size, elapsed)
    result.update(ok=done == batches, batch=batch_size, warmup_messages=1)


def run_latency(job, result):
    recorder = _common.LatencyRecorder(job["expect"], job.get("warmup", 0))
    reader = _reader(job, [job["nsqd"]])
    deadline = _common.Deadline(job["timeout_s"])
    while not recorder.done and not deadline.expired():
        for message in reader.read():
            if isinstance(message, Message):
                recorder.add(message.body)
                message.fin()
    _stop(reader)
    result.update(recorder.summary())
    result.update(ok=recorder.done)


def _idle_loop(reader, seconds):
    deadline = _common.Deadline(seconds)
    while not deadline.expired():
        for message in reader.read():
            if isinstance(message, Message):
                message.fin()


def run_idle(job, result):
    reader = _reader(job, job["nsqds"])
    _idle_loop(reader, job["settle_s"])
    conns = _alive(reader)
    cpu0, t0 = _common.cpu_seconds(), time.monotonic()
    _idle_loop(reader, job["window_s"])
    cpu1, t1 = _common.cpu_seconds(), time.monotonic()
    conns_end = _alive(reader)
    _close(reader)
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
    start = time.monotonic()
    reader = _reader(job, job["nsqds"])  # connects to every nsqd before returning
    connect_s = time.monotonic() - start
    _idle_loop(reader, job["settle_s"])
    rss1 = _common.rss_kb()
    conns = _alive(reader)
    threads = _common.thread_count()
    _idle_loop(reader, job.get("hold_s", 0))
    _close(reader)
    n = len(job["nsqds"])
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
        raise NotImplementedError(f"nsq-py worker has no {job['workload']!r} workload")
    WORKLOADS[job["workload"]](job, result)


def _version():
    return getattr(nsq, "__version__", "?")


if __name__ == "__main__":
    _common.main(run, CLIENT, _version)
