"""The import graph reads as ARCHITECTURE.md draws it, and has no cycle.

Every package and top-level module of nsq_sync sits in one layer (``LAYERS``, lowest first); it
may import only its own layer and the layers below. Every import counts: inside a function, and
under ``if TYPE_CHECKING:`` too (a type-level import that goes up the layers hides a cycle, it
does not remove it). A new package or top-level module must be placed in a layer here, so adding
one is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nsq_sync

PACKAGE_DIR = Path(nsq_sync.__file__).resolve().parent

#: lowest first: ARCHITECTURE.md's package table (tests/unit/test_architecture.py holds the two
#: together). A package or top-level module imports only its own layer and the ones before it.
LAYERS: list[tuple[str, set[str]]] = [
    ("sans-IO", {"protocol", "errors", "_version"}),
    (
        "foundations",
        {"config", "durations", "addresses", "process", "backoff", "runtime", "metrics"},
    ),
    ("credit and the wire", {"credit", "wire", "message"}),
    ("clients", {"http", "producer"}),
    ("consumer", {"consumer"}),
    (
        "built on the clients",
        {"dead_letter", "cli", "contrib", "spark", "testing", "__init__", "__main__"},
    ),
]

MODULES = sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    """``nsq_sync.wire.connection`` for ``nsq_sync/wire/connection.py`` (a package: its name)."""
    parts = ("nsq_sync", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The layer-table name of a module: its first part below nsq_sync."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"nsq_sync/{unit} is in no layer of tests/unit/test_layers.py")


def imports(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every first-party import of ``source`` (the module ``module``), wherever
    it is: at the top, in a function, under TYPE_CHECKING. ``from X import y`` names ``X.y`` when
    that is a module of the package, else ``X``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                parts = module.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((node.lineno, candidate if candidate in KNOWN else base))
    return [(line, name) for line, name in found if name.split(".")[0] == "nsq_sync"]


KNOWN = {module_name(p) for p in MODULES}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (a name below a module counts as that module)."""
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        name = module_name(path)
        edges = set()
        for _, target in imports(path.read_text("utf-8"), name, path.name == "__init__.py"):
            while target and target not in KNOWN:
                target = target.rpartition(".")[0]
            # a package's submodule does not depend on its package's __init__
            if target and target != name and not name.startswith(target + "."):
                edges.add(target)
        graph[name] = edges
    return graph


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_each_module_imports_only_its_own_layer_or_lower(path: Path) -> None:
    name = module_name(path)
    unit = _unit(name)
    own = _layer_of(unit)
    bad = []
    for line, imported in imports(path.read_text("utf-8"), name, path.name == "__init__.py"):
        theirs = _layer_of(_unit(imported))
        if theirs > own:
            bad.append(f"line {line}: {imported} ({LAYERS[theirs][0]})")
    where = path.relative_to(PACKAGE_DIR)
    assert not bad, f"nsq_sync/{where} ({LAYERS[own][0]}) imports " + "; ".join(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    assert cycles(_graph()) == []


def test_the_checks_catch_what_they_are_for() -> None:
    """An upward import is found wherever it is (TYPE_CHECKING included), a relative import
    resolves against its package, and a cycle is reported."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from nsq_sync import errors\n"
        "if TYPE_CHECKING:\n"
        "    from nsq_sync.consumer.consumer import Consumer\n"
    )
    assert imports(source, "nsq_sync.wire.connection", False) == [
        (2, "nsq_sync.errors"),
        (4, "nsq_sync.consumer.consumer"),
    ]
    assert _layer_of("consumer") > _layer_of("wire")
    assert imports("from ..producer import Producer\n", "nsq_sync.contrib._common", False) == [
        (1, "nsq_sync.producer")
    ]
    assert imports("from . import slot\n", "nsq_sync.producer", True) == [
        (1, "nsq_sync.producer.slot")
    ]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    with pytest.raises(AssertionError, match="in no layer"):
        _layer_of("a_new_module")
