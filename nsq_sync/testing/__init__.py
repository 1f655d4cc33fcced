"""Real nsqd/nsqlookupd processes for tests, and the pytest plugin that manages them.

Public, so that applications can test against real servers too. Importing this package starts
nothing and does not import pytest.
"""

from __future__ import annotations

from nsq_sync.testing.process import (
    Cluster,
    NsqBinaryNotFound,
    NsqdProcess,
    NsqlookupdProcess,
    NsqProcess,
    NsqProcessError,
    find_nsq_binary,
    stop_all_running,
)

__all__ = [
    "Cluster",
    "NsqBinaryNotFound",
    "NsqProcess",
    "NsqProcessError",
    "NsqdProcess",
    "NsqlookupdProcess",
    "find_nsq_binary",
    "stop_all_running",
]
