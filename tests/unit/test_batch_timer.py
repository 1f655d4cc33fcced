"""BatchConsumer's batch timer: each batch closes ``batch_timeout`` after its own first message
arrived. Only the arrival of every ``batch_size``-th collected message is kept (batches are taken
from the front, ``batch_size`` at a time or all that is open), so this checks that the kept
times stay those of the batches still to be taken, whatever the mix of hand-overs and of full
and partial takes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from nsq_sync import BatchConsumer
from nsq_sync.message import Message


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _message(n: int) -> Message:
    return Message(b"%016d" % n, b"body", 0, 1)


@given(
    batch_size=st.integers(1, 6),
    steps=st.lists(st.one_of(st.integers(1, 15), st.just("take")), max_size=25),
)
def test_the_open_batch_is_timed_from_its_own_first_message(
    batch_size: int, steps: list[Any]
) -> None:
    """The worker hands over runs of messages, one per clock tick, between takes of the batch
    task; at every point the next batch's timer starts when its first message arrived."""
    clock = _Clock()
    consumer = BatchConsumer(
        "t", "c", lambda batch: None, batch_size=batch_size, nsqd_tcp_addresses=["127.0.0.1:1"]
    )
    batcher = consumer._batcher  # the open batch and its timer
    with mock.patch("nsq_sync.consumer.batch.time", SimpleNamespace(monotonic=clock.monotonic)):
        arrived: list[float] = []  # the model: each open message's arrival, in order
        sent = 0
        for step in steps:
            if step == "take":
                with batcher._lock:
                    taken = batcher._take()
                assert len(taken) == min(batch_size, len(arrived))
                del arrived[:batch_size]
            else:
                # one hand-over from the worker: what it took at one wake-up
                clock.now += 1.0
                batcher.collect_many([_message(sent + i) for i in range(step)])
                arrived.extend([clock.now] * step)
                sent += step
            assert len(batcher._open) == len(arrived)
            # the open batch's timer, then each later batch's (batch_size messages apart)
            assert batcher._arrived == arrived[::batch_size]
