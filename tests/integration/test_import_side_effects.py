"""Importing the package pulls in no optional backend and starts no thread, checked in a fresh
interpreter (this test process has imported everything already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nsq_sync

PACKAGE_DIR = Path(nsq_sync.__file__).resolve().parent
FORBIDDEN_AT_IMPORT = (
    "gevent",
    "snappy",
    "pyspark",
    "django",
    "flask",
    "gunicorn",
    "prometheus_client",
    "opentelemetry",
)


_PROBE = f"""
import json, sys, threading
import nsq_sync
import nsq_sync.config, nsq_sync.contrib, nsq_sync.errors, nsq_sync.protocol, nsq_sync.metrics
print(json.dumps({{
    "forbidden": [m for m in {FORBIDDEN_AT_IMPORT!r} if m in sys.modules],
    "threads": threading.active_count(),
    "thread_names": [t.name for t in threading.enumerate()],
}}))
"""


def _run_probe(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's nsq_sync."""
    env = dict(os.environ)
    root = str(PACKAGE_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_importing_the_package_is_side_effect_free() -> None:
    result = _run_probe(_PROBE)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["forbidden"] == []
    assert report["threads"] == 1, report["thread_names"]


def test_the_clients_are_imported_on_first_use() -> None:
    """``import nsq_sync`` imports no client module (a process that needs only the
    configuration, such as Spark's planner runners, does not pay for them); the public names
    still resolve, through ``from nsq_sync import X`` and ``nsq_sync.X`` alike."""
    probe = """
import json, sys
import nsq_sync
before = sorted(m for m in sys.modules if m.startswith("nsq_sync"))
from nsq_sync import Consumer, Producer
names = {name: getattr(nsq_sync, name).__module__ for name in nsq_sync.__all__ if name[0] != "_"}
try:
    nsq_sync.Consumr
except AttributeError as exc:
    missing = str(exc)
print(json.dumps({"before": before, "names": names, "missing": missing,
                  "dir": "Producer" in dir(nsq_sync), "same": Consumer is nsq_sync.Consumer}))
"""
    report = json.loads(_run_probe(probe).stdout.strip().splitlines()[-1])
    assert report["before"] == ["nsq_sync", "nsq_sync._version"]
    assert report["names"]["Consumer"] == "nsq_sync.consumer.consumer"
    assert report["names"]["Producer"] == "nsq_sync.producer.producer"
    assert report["names"]["Config"] == "nsq_sync.config"
    assert len(report["names"]) == 12
    assert report["missing"] == "module 'nsq_sync' has no attribute 'Consumr'"
    assert report["dir"] and report["same"]
