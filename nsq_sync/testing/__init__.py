"""Real nsqd/nsqlookupd processes for tests, and the pytest plugin that manages them.

This package is public: applications that use nsq_sync can test against real servers too.

- :class:`NsqdProcess` and :class:`NsqlookupdProcess` start a server on free loopback ports,
  wait until it answers ``/ping``, and stop, kill or restart it (same ports, same data).
- :func:`find_nsq_binary` finds the executables (``NSQ_BIN``, ``.nsq/bin``, ``PATH``).
- The pytest plugin (:mod:`nsq_sync.testing.pytest_plugin`, loaded automatically once nsq_sync is
  installed) provides the ``nsqd``, ``nsqlookupd``, ``nsqd_factory``, ``nsq_cluster`` and
  ``nsq_topic`` fixtures and prints server logs when a test fails.

Importing this package starts nothing and does not import pytest.
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
