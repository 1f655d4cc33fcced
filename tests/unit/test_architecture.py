"""ARCHITECTURE.md is true: its package table is the tree and test_layers' layers, every module
path it names exists, its task table names every task the code spawns, and its lock table
every lock the code creates."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .test_layers import LAYERS, MODULES, PACKAGE_DIR

#: the repository (tox runs the tests against the installed wheel: not PACKAGE_DIR's parent)
REPOSITORY = Path(__file__).resolve().parents[2]
DOC = (REPOSITORY / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text of the section headed ``title`` (up to the next heading of its level or
    higher)."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", DOC, re.M)
    assert match, f"ARCHITECTURE.md has no section {title!r}"
    level = len(match.group(1))
    rest = DOC[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def _table(section: str) -> list[list[str]]:
    """The rows of the first Markdown table of ``section`` (header and rule left out)."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _units(cell: str) -> list[str]:
    """``protocol/``, ``errors.py`` in a cell -> ["protocol", "errors"]."""
    return [name.rstrip("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cell)]


def test_the_package_table_is_the_layers_of_test_layers() -> None:
    rows = _table(_section("Packages and the import direction"))
    assert [(row[0], set(_units(row[1]))) for row in rows] == LAYERS


def test_the_package_table_names_every_package_and_top_level_module_once() -> None:
    rows = _table(_section("Packages and the import direction"))
    named = [unit for row in rows for unit in _units(row[1])]
    tree = {p.stem for p in PACKAGE_DIR.glob("*.py")} | {
        p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")
    }
    assert sorted(named) == sorted(tree)


def test_every_module_path_named_exists() -> None:
    paths = set(re.findall(r"`([a-z_/]+(?:\.py|/))`", DOC))
    missing = sorted(
        p for p in paths if not ((PACKAGE_DIR / p).exists() or (REPOSITORY / p).exists())
    )
    assert not missing, f"ARCHITECTURE.md names modules that do not exist: {missing}"


def _spawned_task_names() -> set[str]:
    """The fixed part of every task name the package gives (``nsq_sync-reader-``...)."""
    names = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "name":
                value = node.value
                if isinstance(value, ast.JoinedStr) and isinstance(value.values[0], ast.Constant):
                    names.add(str(value.values[0].value))
                elif isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.add(value.value)
    return {name for name in names if name.startswith("nsq_sync-")}


def test_the_task_table_names_every_task_the_code_spawns() -> None:
    section = _section("Tasks")
    named = set(re.findall(r"`(nsq_sync-[a-z-]+)", section))
    spawned = _spawned_task_names()
    assert spawned, "no task names found: the check itself is broken"
    missing = sorted(name for name in spawned if not any(n.startswith(name) for n in named))
    assert not missing, f"tasks missing from ARCHITECTURE.md's task table: {missing}"
    stale = sorted(n for n in named if not any(n.startswith(name) for name in spawned))
    assert not stale, f"ARCHITECTURE.md lists tasks the code no longer spawns: {stale}"


def _locks() -> set[str]:
    """``Class.attribute`` of every lock an object makes in ``__init__``-like code, and
    ``module.name`` of every module-level lock (``self.x = runtime.lock()``,
    ``threading.Lock()``...)."""
    found = set()
    for path in MODULES:
        module = path.stem
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and _makes_lock(inner.value):
                    for target in inner.targets:
                        if isinstance(target, ast.Attribute):
                            found.add(f"{node.name}.{target.attr}")
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _makes_lock(stmt.value):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found.add(f"{module}.{target.id}")
    return found


def _makes_lock(value: ast.expr | None) -> bool:
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in ("lock", "rlock", "Lock", "RLock")
    )


#: locks that are a runtime's own implementation, not a lock of the clients
_PRIMITIVES = {"_Signal._lock"}


def test_the_lock_table_names_every_lock_the_code_creates() -> None:
    rows = _table(_section("Locks and what they guard"))
    named = {name for row in rows for name in re.findall(r"`([A-Za-z_.]+)`", row[0])}
    locks = _locks() - _PRIMITIVES
    assert len(locks) > 5, "no locks found: the check itself is broken"
    # module-level locks are named module.name; a lock made by a mixin is named after it
    missing = sorted(lock for lock in locks if lock not in named)
    assert not missing, f"locks missing from ARCHITECTURE.md's lock table: {missing}"
