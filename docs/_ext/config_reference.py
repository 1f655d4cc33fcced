"""The configuration reference, from :class:`nsq_sync.Config`'s own field metadata (name, type,
default, range or choices, description), as the Markdown table docs/configuration.md holds
between its ``config-table`` markers (so it reads on the repository's web view too).
tests/docs checks that the page's table is this one; to update it after changing Config:

    python docs/_ext/config_reference.py    # rewrites the table in docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from nsq_sync import Config

PAGE = Path(__file__).resolve().parents[1] / "configuration.md"
BEGIN = "<!-- config-table: generated from Config by docs/_ext/config_reference.py -->"
END = "<!-- /config-table -->"

Cell = list[tuple[str, bool]]  # (text, shown as code)


def _default(f: dataclasses.Field[Any]) -> Cell:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:  # pragma: no cover - every Config option has a default
        return [("(required)", False)]
    if value == ():
        return [("none", False)]
    return [(repr(value), True)]


def _range(f: dataclasses.Field[Any]) -> Cell:
    meta = f.metadata
    if meta.get("choices"):
        cell: Cell = []
        for i, choice in enumerate(meta["choices"]):
            cell += [(", ", False)] if i else []
            cell.append((repr(choice), True))
        return cell
    lo, hi = meta.get("min"), meta.get("max")
    if lo is None and hi is None:
        return []
    unit = " s" if meta["kind"].startswith("duration") else ""
    return [(f"{_number(lo)} – {_number(hi)}{unit}", False)]


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _type(f: dataclasses.Field[Any]) -> Cell:
    kind = f.metadata["kind"]
    if kind.startswith("duration"):
        cell: Cell = [("seconds (float, timedelta or ", False), ("'250ms'", True), (")", False)]
        return cell + [(" or None", False)] if kind.endswith("?") else cell
    if kind == "addresses":
        return [("list of str, or one comma-separated str", False)]
    if kind == "ssl":
        return [("ssl.SSLContext or None", False)]
    return [(str(f.type), True)]


def config_rows() -> list[tuple[str, Cell, Cell, Cell, str]]:
    """One row per Config option: name, type, default, range or choices, description."""
    return [
        (f.name, _type(f), _default(f), _range(f), f.metadata.get("doc", ""))
        for f in dataclasses.fields(Config)
    ]


def _markdown(cell: Cell) -> str:
    text = "".join(f"`{t}`" if code else t for t, code in cell)
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The reference as a Markdown table (one row per option, in Config's order)."""
    lines = [
        "| option | type | default | range / choices | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, type_, default, range_, doc in config_rows():
        cells = [f"`{name}`", _markdown(type_), _markdown(default), _markdown(range_)]
        lines.append("| " + " | ".join([*cells, doc.replace("|", "\\|")]) + " |")
    return "\n".join(lines)


def page_table(text: str) -> str:
    """The table between the markers of docs/configuration.md's ``text``."""
    start = text.index(BEGIN) + len(BEGIN)
    return text[start : text.index(END, start)].strip("\n")


def main() -> int:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END, start)
    PAGE.write_text(text[:start] + "\n" + markdown_table() + "\n" + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
