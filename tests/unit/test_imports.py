"""Import hygiene: the sans-IO protocol layer stays dependency-free, and an optional extra's
absence names the extra. (That importing the package pulls in no optional backend and starts no
thread is checked in a fresh interpreter: tests/integration/test_import_side_effects.py.)
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

import pytest

import nsq_sync

PACKAGE_DIR = Path(nsq_sync.__file__).resolve().parent
PROTOCOL_FILES = sorted((PACKAGE_DIR / "protocol").glob("*.py"))

#: (nsq_sync._version: the distribution's version and its extras' pip lines, no I/O)
ALLOWED_FIRST_PARTY = {"nsq_sync.errors", "nsq_sync._version", "nsq_sync.protocol"}
#: optional backends a protocol module may import lazily, inside the function that needs them
#: (STYLE.md: codecs.py imports snappy only when snappy is negotiated)
LAZY_OPTIONAL = {"snappy", "cramjam"}


def _is_stdlib(top_level: str) -> bool:
    names = getattr(sys, "stdlib_module_names", None)  # Python >= 3.10
    if names is not None:
        return top_level in names
    if top_level in sys.builtin_module_names or top_level == "__future__":
        return True
    spec = importlib.util.find_spec(top_level)
    if spec is None or spec.origin is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    origin = os.path.realpath(spec.origin)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    return origin.startswith(stdlib + os.sep) and "site-packages" not in origin


class _ImportCollector(ast.NodeVisitor):
    """Collects ``(line, absolute module, lazy)`` for every import in a module; ``lazy`` means
    inside a function body (so it runs on call, not on import)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, bool]] = []
        self._depth = 0

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((node.lineno, alias.name, self._depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            # Relative: level 1 is a sibling inside nsq_sync.protocol, level 2 leaves it.
            base = "nsq_sync.protocol" if node.level == 1 else "nsq_sync"
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        if module == "nsq_sync":
            # `from nsq_sync import errors` imports the submodule
            for alias in node.names:
                self.found.append((node.lineno, f"nsq_sync.{alias.name}", self._depth > 0))
        else:
            self.found.append((node.lineno, module, self._depth > 0))


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """Every absolute module a file imports, TYPE_CHECKING and function-level ones included."""
    collector = _ImportCollector()
    collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return collector.found


def _allowed(module: str, lazy: bool) -> bool:
    top = module.split(".")[0]
    if top != "nsq_sync":
        return _is_stdlib(top) or (lazy and top in LAZY_OPTIONAL)
    return module in ALLOWED_FIRST_PARTY or module.startswith("nsq_sync.protocol.")


def test_protocol_package_has_the_expected_modules() -> None:
    names = {p.stem for p in PROTOCOL_FILES}
    assert {"__init__", "constants", "names", "events", "decoder", "commands"} <= names


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=lambda p: p.name)
def test_protocol_modules_import_only_stdlib_siblings_and_errors(path: Path) -> None:
    bad = [
        f"{path.name}:{line}: {module}"
        for line, module, lazy in _imports(path)
        if not _allowed(module, lazy)
    ]
    assert not bad, (
        "protocol/ must import only the stdlib, its siblings, nsq_sync.errors and _version"
    )


def test_the_import_checker_catches_violations(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import json\n"
        "from nsq_sync.errors import ProtocolError\n"
        "from . import names\n"
        "from nsq_sync import config\n"
        "import requests\n"
        "import snappy\n"
        "from .. import connection\n"
        "def f():\n"
        "    import gevent\n"
        "    import snappy\n"
        "    from nsq_sync.wire.transport import Transport\n",
        encoding="utf-8",
    )
    rejected = [module for _, module, lazy in _imports(sample) if not _allowed(module, lazy)]
    assert rejected == [
        "nsq_sync.config",
        "requests",
        "snappy",
        "nsq_sync.connection",
        "gevent",
        "nsq_sync.wire.transport",
    ]


def import_without(monkeypatch: pytest.MonkeyPatch, module: str, missing: str) -> str:
    """Import ``module`` afresh as if ``missing`` were not installed; return the ImportError.

    ``sys.modules[name] = None`` makes ``import name`` raise ImportError; monkeypatch puts every
    module back afterwards, so this runs in the test process (no interpreter to start).
    """
    monkeypatch.setitem(sys.modules, missing, None)
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as info:
        importlib.import_module(module)
    return str(info.value)


def test_nsq_sync_spark_without_pyspark_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    message = import_without(monkeypatch, "nsq_sync.spark", "pyspark")
    assert 'pip install "nsq_sync[spark]"' in message and 'pip install ".[spark]"' in message


#: the public names of every documented module path (README, docs/api.md, DESIGN's contract)
DOCUMENTED = {
    "nsq_sync": [
        "BatchConsumer",
        "Config",
        "Consumer",
        "ConsumerStats",
        "DeadLetter",
        "LookupdClient",
        "Message",
        "NSQError",
        "NsqdHTTPClient",
        "Producer",
        "RequeueMessage",
        "RunSummary",
    ],
    "nsq_sync.consumer": ["Consumer", "BatchConsumer", "ConsumerStats", "ConnectionStats"],
    "nsq_sync.producer": ["Producer"],
    "nsq_sync.http": ["NsqdHTTPClient", "LookupdClient", "ProducerInfo"],
    "nsq_sync.dead_letter": ["list_messages", "replay", "parse", "DeadLetterRecord", "CHANNEL"],
    "nsq_sync.metrics": ["enable_prometheus", "enable_otel", "disable", "serve_prometheus"],
    "nsq_sync.contrib.django": ["publish", "get_producer"],
    "nsq_sync.contrib.flask": ["NSQ"],
    "nsq_sync.testing": ["NsqdProcess", "NsqlookupdProcess"],
    "nsq_sync.testing.pytest_plugin": ["NsqdFactory", "ClusterFactory"],
    "nsq_sync.errors": ["NSQError", "ConfigError", "PublishError", "ServerError"],
    "nsq_sync.config": ["Config", "parse_duration", "to_seconds"],
    "nsq_sync.cli": ["main", "run"],
}


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_every_documented_module_path_imports_with_its_names(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in DOCUMENTED[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_every_name_in_all_imports() -> None:
    import nsq_sync

    assert sorted(nsq_sync.__all__) == sorted([*DOCUMENTED["nsq_sync"], "__version__"])
    for name in nsq_sync.__all__:
        assert getattr(nsq_sync, name) is not None
