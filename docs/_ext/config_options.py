"""Sphinx directive ``nsq-config-options``: the configuration reference, generated from
:class:`nsq_sync.Config`'s own field metadata at build time (name, type, default, range or
choices, description), so the page cannot drift from the code. An option without a description
is a build warning, which fails the build (``-W``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from nsq_sync import Config
log = logging.getLogger(__name__)


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


def _entry(cell: Cell) -> nodes.entry:
    para = nodes.paragraph()
    for text, code in cell:
        para += nodes.literal(text, text) if code else nodes.Text(text)
    return nodes.entry("", para)


def _row(cells: list[Cell]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        row += _entry(cell)
    return row


class ConfigOptions(SphinxDirective):
    """Render every Config option as a table row."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        headers = ["option", "type", "default", "range / choices", "what it does"]
        table = nodes.table(classes=["nsq-config-options"])
        group = nodes.tgroup(cols=len(headers))
        table += group
        for width in (18, 18, 14, 14, 36):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += _row([[(h, False)] for h in headers])
        body = nodes.tbody()
        for name, type_, default, range_, doc in config_rows():
            if not doc:
                log.warning(
                    "Config option %s has no description (add doc= to its field)",
                    name,
                    location=self.get_location(),
                )
            body += _row([[(name, True)], type_, default, range_, [(doc, False)]])
        group += head
        group += body
        return [table]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nsq-config-options", ConfigOptions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
