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
