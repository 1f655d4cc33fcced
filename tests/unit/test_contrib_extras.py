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
    message = import_without(monkeypatch, module, framework)
    # both forms of the pip line, as the README promises: the release's and a clone's
    assert f'pip install "nsq_sync[{extra}]"' in message
    assert f'pip install ".[{extra}]"' in message


def _both_forms(message: str, extra: str) -> bool:
    return f'pip install "nsq_sync[{extra}]"' in message and f'pip install ".[{extra}]"' in message


def test_every_missing_extra_names_both_pip_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """snappy, gevent, prometheus and otel name the release's and a clone's pip line too."""
    import importlib.util
    import sys

    from nsq_sync import Config, metrics
    from nsq_sync.errors import ConfigError
    from nsq_sync.runtime import resolve_runtime

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "snappy" else real_find_spec(name, *a),
    )
    with pytest.raises(ConfigError) as snappy:
        Config(snappy=True)
    assert _both_forms(str(snappy.value), "snappy")
    monkeypatch.setitem(sys.modules, "nsq_sync.runtime.gevent", None)
    with pytest.raises(ConfigError) as gevent:
        resolve_runtime("gevent")
    assert _both_forms(str(gevent.value), "gevent")
    for module, extra, enable in (
        ("prometheus_client", "prometheus", metrics.enable_prometheus),
        ("opentelemetry.trace", "otel", metrics.enable_otel),
    ):
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(ImportError) as missing:
            enable()
        assert _both_forms(str(missing.value), extra), missing.value
