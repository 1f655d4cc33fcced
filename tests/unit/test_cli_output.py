"""The command line's message writer: what reaches the output when a write fails."""

from __future__ import annotations

import errno
import io
from types import SimpleNamespace
from typing import Any

import pytest

from nsq_sync.cli.output import writer


class FlakyDisk(io.RawIOBase):
    """A raw file whose first ``failures`` writes fail with ENOSPC (a full disk, then space)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        self.data += bytes(b)
        return len(b)


def test_a_line_whose_write_failed_is_not_written_later() -> None:
    """The disk is full for the first message's write: the handler raises (the consumer
    requeues the message), and the next message's write, once there is space, writes only its
    own line. With a buffered write the failed line stayed in the buffer and went out with the
    next one: the requeued message was written twice once redelivered."""
    disk = FlakyDisk(failures=1)
    handle = writer(io.BufferedWriter(disk), "raw")
    with pytest.raises(OSError, match="No space"):
        handle(SimpleNamespace(body=b"A"))
    handle(SimpleNamespace(body=b"B"))
    assert bytes(disk.data) == b"B\n"
    handle(SimpleNamespace(body=b"A"))  # redelivered
    assert bytes(disk.data) == b"B\nA\n"
