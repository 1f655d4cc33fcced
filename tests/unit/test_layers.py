"""The import graph reads as ARCHITECTURE.md draws it: protocol <- connection <- consumer/producer.

Every module of the package sits in one layer; a module may import (at run time, also inside a
function) only modules of its own layer or of a lower one. Imports under ``if TYPE_CHECKING:``
are annotations only and do not count. A new module must be placed in a layer here, so adding
one is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nsq_sync

PACKAGE_DIR = Path(nsq_sync.__file__).resolve().parent

CONSUMER_PARTS = {
    "connset",
    "responder",
    "dispatch",
    "flusher",
    "discovery",
    "message",
    "stats",
    "_parts",
}
PRODUCER_PARTS = {"_slots", "_pool"}

#: lowest first (the layers of ARCHITECTURE.md's module table); a module imports only from its own
#: layer and the ones before it
LAYERS: list[tuple[str, set[str]]] = [
    ("sans-IO", {"protocol", "errors", "_version"}),
    (
        "foundations",
        {"config", "durations", "_addresses", "_fork", "runtime", "_tls", "_envelope", "_observe"},
    ),
    ("policy", {"rdy", "rdy_budget", "rdy_rotation", "backoff"}),
    (
        "I/O",
        {"transport", "handshake", "connection", "_requests", "_http_base", "http", "lookupd"},
    ),
    ("parts", CONSUMER_PARTS | PRODUCER_PARTS),
    # _dead_letterer: the consumer's one use of a Producer (the dead-letter topic), by composition
    ("facades", {"consumer", "batch", "running", "producer", "_dead_letterer"}),
    (
        "integrations and tools",
        {
            "cli",
            "dead_letter",
            "_cli_dead_letter",
            "_cli_output",
            "_cli_metrics",
            "_cli_servers",
            "_progress",
            "__main__",
            "__init__",
            "contrib",
            "metrics",
            "spark",
            "testing",
        },
    ),
]

#: the producer and the consumer never use each other's parts
SEPARATE = {
    **{part: CONSUMER_PARTS | {"consumer", "batch", "running"} for part in PRODUCER_PARTS},
    "producer": CONSUMER_PARTS | {"consumer", "batch", "running"},
    **{part: PRODUCER_PARTS | {"producer"} for part in CONSUMER_PARTS},
    "consumer": PRODUCER_PARTS | {"producer"},
}


def _unit(path: Path) -> str:
    """The layer-table name of a module: its first path part below nsq_sync/."""
    return path.relative_to(PACKAGE_DIR).with_suffix("").parts[0]


def _layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"nsq_sync/{unit} is in no layer of tests/unit/test_layers.py")


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(source: str, package: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(line, first part below nsq_sync) of every first-party import outside TYPE_CHECKING in
    ``source``, a module of the subpackage ``package`` of nsq_sync (``()``: nsq_sync itself)."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's own package
                base = ["nsq_sync", *package[: len(package) - node.level + 1]]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "nsq_sync":
                names = [f"nsq_sync.{alias.name}" for alias in node.names]
            else:
                names = [module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "nsq_sync" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


MODULES = sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_each_module_imports_only_its_own_layer_or_lower(path: Path) -> None:
    unit = _unit(path)
    own = _layer_of(unit)
    bad = []
    source = path.read_text(encoding="utf-8")
    for line, imported in _runtime_imports(source, path.relative_to(PACKAGE_DIR).parent.parts):
        if imported == unit:
            continue
        theirs = _layer_of(imported)
        if theirs > own:
            bad.append(f"line {line}: {imported} ({LAYERS[theirs][0]})")
        if imported in SEPARATE.get(unit, set()):
            bad.append(f"line {line}: {imported} (kept apart from {unit})")
    assert not bad, f"nsq_sync/{path.relative_to(PACKAGE_DIR)} ({LAYERS[own][0]}) imports " + (
        "; ".join(bad)
    )


def test_the_layer_check_catches_an_upward_import() -> None:
    """The checker itself: the consumer imported by a connection-layer module is reported, a
    relative import resolves against its package, and TYPE_CHECKING imports do not count."""
    source = "from nsq_sync.consumer import Consumer\nfrom nsq_sync import errors\n"
    assert _runtime_imports(source) == [(1, "consumer"), (2, "errors")]
    assert _layer_of("consumer") > _layer_of("connection")
    assert _runtime_imports("from ..producer import Producer\n", ("contrib",)) == [(1, "producer")]
    guarded = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nsq_sync import consumer\n"
    )
    assert _runtime_imports(guarded) == []
    with pytest.raises(AssertionError, match="in no layer"):
        _layer_of("a_new_module")
