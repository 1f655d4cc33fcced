"""No part of nsq_sync reads, writes or calls another object's underscored member: what one part
needs from another is a named interface (CONTRIBUTING.md). An attribute ``x._name`` counts
unless ``x`` is ``self``, ``cls`` or ``super()`` (``self._a._b`` counts: a reach into the object
held in ``self._a``); dunders and the stdlib's public underscored names do not count."""

from __future__ import annotations

import ast

from .test_layers import MODULES, PACKAGE_DIR

#: underscored names that are public API (namedtuple's, os._exit, sys._getframe)
PUBLIC = {"_replace", "_asdict", "_make", "_fields", "_field_defaults", "_exit", "_getframe"}

#: the reaches into other libraries' objects that nsq_sync cannot avoid, each with its reason
ALLOWED = {
    # a forked child closes its copy of a socket without shutdown(2): the stdlib socket's own
    # close path, marked closed first so that its later close() does nothing
    ("process.py", "sock._closed"),
    # Flask's documented way to get the application behind the current_app proxy
    ("contrib/flask/__init__.py", "current_app._get_current_object"),
}


def reaches(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__") or node.attr in PUBLIC:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reaches_into_another_objects_private_members() -> None:
    bad = []
    for path in MODULES:
        where = path.relative_to(PACKAGE_DIR).as_posix()
        for line, text in reaches(path.read_text("utf-8")):
            if (where, text) not in ALLOWED:
                bad.append(f"nsq_sync/{where}:{line}: {text}")
    assert not bad, "reaches into private members:\n" + "\n".join(bad)


def test_the_check_finds_a_reach() -> None:
    source = "self._ok = 1\nother._bad()\nself._held._inner\nsuper()._fine()\nx.__dict__\n"
    assert sorted(reaches(source)) == [(2, "other._bad"), (3, "self._held._inner")]
