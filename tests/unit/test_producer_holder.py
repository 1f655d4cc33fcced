"""The integrations' per-process Producer (contrib/_common.ProducerHolder): after close(), many
threads asking for it at once get one new Producer, not one each (the others would stay open,
never closed)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from nsq_sync import Config, Producer
from nsq_sync.contrib._common import NsqSettings, ProducerHolder


@pytest.fixture
def fast_switching() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between any two bytecodes
    yield
    sys.setswitchinterval(interval)


def test_threads_after_close_share_one_new_producer(fast_switching: None) -> None:
    # No publish: nothing connects (a Producer dials on its first publish).
    settings = NsqSettings(("127.0.0.1:4150",), (), Config())
    holder = ProducerHolder(lambda: settings, "NSQ settings")
    made: list[Producer] = []
    for _ in range(50):
        holder.get()
        holder.close()
        barrier = threading.Barrier(8)
        got: list[Producer] = []

        def ask(barrier: threading.Barrier, got: list[Producer]) -> None:
            barrier.wait()
            got.append(holder.get())

        threads = [threading.Thread(target=ask, args=(barrier, got)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10.0)
        assert len({id(p) for p in got}) == 1, "threads got different Producers after close()"
        assert not got[0].closed
        made.append(got[0])
    holder.close()
    assert all(p.closed for p in made)
