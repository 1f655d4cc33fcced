"""Each integration names the extra to install when its framework is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [("nsq_sync.contrib.django", "django", "django"), ("nsq_sync.contrib.flask", "flask", "flask")],
)
def test_missing_framework_names_the_extra(module: str, framework: str, extra: str) -> None:
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed
    script = f"import sys; sys.modules[{framework!r}] = None; import {module}"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert f"pip install 'nsq_sync[{extra}]'" in result.stderr


def test_importing_nsq_sync_imports_no_framework() -> None:
    script = (
        "import sys, nsq_sync, nsq_sync.contrib; "
        "print(sorted(m for m in ('django', 'flask', 'gunicorn') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
