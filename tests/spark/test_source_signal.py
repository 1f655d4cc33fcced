"""The driver-side source's process stopped by SIGTERM (as Spark stops it when a query stops) at
the two moments where an unwound main thread would strand messages: while ``commit`` FINs a
batch, and while ``read`` takes a batch from the buffer. A real nsqd; the reader runs in a child
Python process of its own, as on the driver, and the signal is sent from inside those steps."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from spark_helpers import channel, drain, preload
from support.nsq import wait_for

CHANNEL = "spark"

_CHILD = r"""
import collections, os, signal, sys
from nsq_sync.message import Message
from nsq_sync.spark._datasource import source_struct
from nsq_sync.spark._options import source_options
from nsq_sync.spark._source import NsqStreamReader

tcp, topic, channel, where = sys.argv[1:]
reader = NsqStreamReader(
    source_options({"nsqd_tcp_addresses": tcp, "topic": topic, "channel": channel,
                    "max_messages_per_batch": "100"}),
    source_struct(),
)

fired = []

def sigterm_once():
    if not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, inside the step

def trapped(step):
    def wrapped(*args):
        sigterm_once()
        return step(*args)
    return wrapped

def read_batch(seq):
    while True:
        rows, end = reader.read({"seq": seq})
        n = sum(batch.num_rows for batch in rows)
        if n:
            return end["seq"], n

seq, n = read_batch(0)
if where == "commit":
    read_batch(seq)  # a second batch pending, and more in the buffer
    print("committing", n, flush=True)
    Message.finish = trapped(Message.finish)
    reader.commit({"seq": seq})
else:
    class TrappedDeque(collections.deque):
        def popleft(self):
            message = super().popleft()
            sigterm_once()  # this message is no longer in the buffer
            return message
    while len(reader._buffer) < 10:  # the consumer keeps receiving: wait for a next batch
        reader._arrived.acquire(); reader._arrived.wait(0.05); reader._arrived.release()
    with reader._lock:
        reader._buffer = TrappedDeque(reader._buffer)
    read_batch(seq)
print("the main thread was not stopped", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("where", ["commit", "read"])
def test_sigterm_inside_a_step_strands_nothing(nsqd: Any, nsq_topic: str, where: str) -> None:
    bodies = preload(nsqd.tcp_address, nsq_topic, 1000)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, nsqd.tcp_address, nsq_topic, CHANNEL, where],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # SIGTERM ends the process (exit 0) once the interrupted step is complete.
    assert child.returncode == 0, child.stdout + child.stderr
    # nsqd's msg_timeout is 60 s: a stranded message would still be in flight long after this.
    wait_for(
        lambda: channel(nsqd.http_address, nsq_topic, CHANNEL).get("in_flight_count") == 0,
        "nothing in flight once the reader's process exited",
        timeout=15,
    )
    stats = channel(nsqd.http_address, nsq_topic, CHANNEL)
    assert stats["timeout_count"] == 0
    # The committed batch was FINed whole (and nothing else); nothing was FINed when the signal
    # came in read. Everything else is back in the channel, each body once.
    committed = int(child.stdout.split()[1]) if where == "commit" else 0
    assert stats["depth"] == 1000 - committed
    rest = drain(nsqd.tcp_address, nsq_topic, CHANNEL, 1000 - committed)
    assert set(rest.values()) == {1}
    assert len(rest) == 1000 - committed
    assert set(rest) <= set(bodies)
