"""runtime="auto" is decided in each process when a Producer first publishes there, and when a
Consumer starts, not when either is built: what makes a client created in a gunicorn master
(--preload) run on gevent in ``-k gevent`` workers, which gevent patches after the fork. Each case runs in a fresh
interpreter, since patching is for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from nsq_sync.testing.process import NsqdProcess

pytestmark = pytest.mark.integration

_PRELUDE = """
import json, os, sys, warnings
from nsq_sync import Consumer, Producer
address, topic = sys.argv[1], sys.argv[2]
caught = []
def record(message, category, *args, **kwargs):
    if category is RuntimeWarning:  # not gevent's MonkeyPatchWarning about ssl
        caught.append(f"{category.__name__}: {message}")
warnings.showwarning = record
warnings.simplefilter("always", RuntimeWarning)
"""


def _run(script: str, nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script), nsqd.tcp_address, topic],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_producer_built_before_patching_runs_on_gevent(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """Regression: the runtime used to be chosen in Producer() (threads, before the patch)."""
    report = _run(
        """
        producer = Producer(address)
        before = producer.runtime.name
        from gevent import monkey
        monkey.patch_all()
        producer.publish(topic, b"x")
        conn = producer._slots[0].conn
        print(json.dumps({"before": before, "after": producer.runtime.name,
                          "connection": conn.runtime.name, "warnings": caught}))
        """,
        nsqd,
        nsq_topic,
    )
    assert report == {
        "before": "threads",
        "after": "gevent",
        "connection": "gevent",
        "warnings": [],
    }


def test_forked_child_patched_by_gevent_decides_again(nsqd: NsqdProcess, nsq_topic: str) -> None:
    """A gunicorn master publishes on threads; its -k gevent worker forks, patches, publishes."""
    report = _run(
        """
        producer = Producer(address)
        producer.publish(topic, b"master")
        master = producer.runtime.name
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
            pid = os.fork()
        if pid == 0:
            from gevent import monkey
            monkey.patch_all()
            producer.publish(topic, b"worker")
            os.write(write_end, json.dumps([producer.runtime.name, caught]).encode())
            os._exit(0)
        os.close(write_end)
        child, child_warnings = json.loads(os.read(read_end, 10000))
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"master": master, "worker": child, "status": status,
                          "warnings": caught + child_warnings}))
        """,
        nsqd,
        nsq_topic,
    )
    assert report == {"master": "threads", "worker": "gevent", "status": 0, "warnings": []}


def test_patching_after_a_producer_started_on_threads_warns(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    report = _run(
        """
        producer = Producer(address)
        producer.publish(topic, b"on threads")
        from gevent import monkey
        monkey.patch_all()
        producer.publish(topic, b"after the patch")
        producer.publish(topic, b"once more")
        print(json.dumps({"runtime": producer.runtime.name, "warnings": caught}))
        """,
        nsqd,
        nsq_topic,
    )
    assert report["runtime"] == "threads"
    [warning] = report["warnings"]  # once, not per publish
    assert warning.startswith("RuntimeWarning: ")
    assert "gevent monkey-patched this process after" in warning


def test_consumer_built_before_patching_consumes_on_gevent(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    """Regression: a Consumer chose its runtime in Consumer() and start() raised ConfigError
    in a process gevent patched since (a gunicorn master's consumer in a -k gevent worker)."""
    report = _run(
        """
        seen = []
        def handler(message):
            import gevent
            seen.append([message.body.decode(), isinstance(gevent.getcurrent(), gevent.Greenlet)])
        consumer = Consumer(topic, "c", handler, nsqd_tcp_addresses=[address], concurrency=2)
        made = consumer.runtime.name
        consumer.set_max_in_flight(2)
        from gevent import monkey
        monkey.patch_all()
        patched = consumer.runtime.name
        before_start = [consumer.stats().max_in_flight, consumer.is_starved(),
                        consumer.wait_connected(0.01)]
        producer = Producer(address)
        producer.multi_publish(topic, [b"a", b"b", b"c"])
        summary = consumer.run(max_messages=3, timeout=30)
        stats = consumer.stats()
        print(json.dumps({"made": made, "patched": patched, "before_start": before_start,
                          "ran": consumer.runtime.name,
                          "reason": summary.reason, "finished": stats.finished,
                          "in_flight": stats.in_flight, "seen": sorted(seen),
                          "warnings": caught}))
        """,
        nsqd,
        nsq_topic,
    )
    assert report == {
        "made": "threads",
        "patched": "gevent",  # before start(): what "auto" would pick now
        "before_start": [2, False, False],  # queries work before start, on either runtime
        "ran": "gevent",
        "reason": "max_messages",
        "finished": 3,
        "in_flight": 0,
        "seen": [["a", True], ["b", True], ["c", True]],
        "warnings": [],
    }


def test_batch_consumer_built_before_patching_consumes_on_gevent(
    nsqd: NsqdProcess, nsq_topic: str
) -> None:
    report = _run(
        """
        from nsq_sync import BatchConsumer
        batches, bodies = [], []
        def handle(messages):
            import gevent
            batches.append([len(messages), isinstance(gevent.getcurrent(), gevent.Greenlet)])
            bodies.extend(m.body.decode() for m in messages)
        consumer = BatchConsumer(topic, "c", handle, batch_size=2, batch_timeout=30,
                                 nsqd_tcp_addresses=[address])
        made = consumer.runtime.name
        from gevent import monkey
        monkey.patch_all()
        Producer(address).multi_publish(topic, [b"a", b"b", b"c", b"d"])
        summary = consumer.run(max_messages=4, timeout=30)
        stats = consumer.stats()
        print(json.dumps({"made": made, "ran": consumer.runtime.name,
                          "batches": batches, "bodies": sorted(bodies), "finished": stats.finished,
                          "in_flight": stats.in_flight, "warnings": caught}))
        """,
        nsqd,
        nsq_topic,
    )
    assert report == {
        "made": "threads",
        "ran": "gevent",
        "batches": [[2, True], [2, True]],
        "bodies": ["a", "b", "c", "d"],
        "finished": 4,
        "in_flight": 0,
        "warnings": [],
    }
