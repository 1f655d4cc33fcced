"""Each integration names the extra to install when its framework is missing.

(That importing nsq_sync and nsq_sync.contrib imports no framework is checked, in a fresh
interpreter, by tests/integration/test_import_side_effects.py.)
"""

from __future__ import annotations

import pytest

from .test_imports import import_without


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [("nsq_sync.contrib.django", "django", "django"), ("nsq_sync.contrib.flask", "flask", "flask")],
)
def test_missing_framework_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, framework: str, extra: str
) -> None:
    assert f"pip install 'nsq_sync[{extra}]'" in import_without(monkeypatch, module, framework)
