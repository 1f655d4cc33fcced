"""The output-buffer options reach nsqd as Config documents them: what nsqd answers to the
IDENTIFY a connection sends. Config once said ``output_buffer_size=None`` "leaves nsqd's default"
while the IDENTIFY sent -1, which turns nsqd's buffer off (found while measuring nsqd's SIGKILL
window for the soak, issue 40: the buffer is what a SIGKILL loses)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nsq_sync import Config
from nsq_sync.testing import NsqdProcess
from nsq_sync.wire.connection import NsqdConnection

pytestmark = pytest.mark.integration


def _nsqd_answer(nsqd: NsqdProcess, **options: Any) -> tuple[int, float | None]:
    conn = NsqdConnection(nsqd.tcp_address, Config().replace(**options), runtime="auto")
    try:
        identified = conn.connect()
    finally:
        conn.close()
    return identified.output_buffer_size, identified.output_buffer_timeout


def _documented(name: str) -> str:
    (field,) = [f for f in dataclasses.fields(Config) if f.name == name]
    return str(field.metadata["doc"])


def test_output_buffer_size_none_turns_nsqds_buffer_off(nsqd: NsqdProcess) -> None:
    assert _nsqd_answer(nsqd) == (16384, 0.25)  # nsq_sync's defaults, nsqd's too
    assert _nsqd_answer(nsqd, output_buffer_size=64) == (64, 0.25)
    # None: nsqd buffers nothing (a 1-byte buffer, no flush timer), as documented
    assert _nsqd_answer(nsqd, output_buffer_size=None) == (1, 0.0)
    assert "None: no buffer" in _documented("output_buffer_size")
    # None: no flush timer (nsqd writes when the buffer is full or the client's credit runs out)
    assert _nsqd_answer(nsqd, output_buffer_timeout=None) == (16384, 0.0)
    assert "None disables" in _documented("output_buffer_timeout")
