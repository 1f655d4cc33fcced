"""Sphinx directive ``nsq-config-options``: the configuration reference, generated from
:class:`nsq_sync.Config`'s own field metadata at build time (name, type, default, range or
choices, description), so the page cannot drift from the code. An option without a description
is a build warning, which fails the build (``-W``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from nsq_sync import Config

log = logging.getLogger(__name__)


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:  # pragma: no cover - every Config option has a default
        return "(required)"
    if value == ():
        return "none"
    return f"``{value!r}``"


def _range(f: dataclasses.Field[Any]) -> str:
    meta = f.metadata
    if meta.get("choices"):
        return ", ".join(f"``{c!r}``" for c in meta["choices"])
    lo, hi = meta.get("min"), meta.get("max")
    if lo is None and hi is None:
        return ""
    unit = " s" if meta["kind"].startswith("duration") else ""
    return f"{lo:g} – {hi:g}{unit}"


def _type(f: dataclasses.Field[Any]) -> str:
    kind = f.metadata["kind"]
    if kind.startswith("duration"):
        text = "seconds (float, timedelta or ``'250ms'``)"
        return text + " or None" if kind.endswith("?") else text
    if kind == "addresses":
        return "list of str, or one comma-separated str"
    if kind == "ssl":
        return "ssl.SSLContext or None"
    return f"``{f.type}``"


class ConfigOptions(SphinxDirective):
    """Render every Config option as a table row."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 18 18 14 14 36",
            "",
            "   * - option",
            "     - type",
            "     - default",
            "     - range / choices",
            "     - what it does",
        ]
        for f in dataclasses.fields(Config):
            doc = f.metadata.get("doc", "")
            if not doc:
                log.warning(
                    "Config option %s has no description (add doc= to its field)",
                    f.name,
                    location=self.get_location(),
                )
            cells = [f"``{f.name}``", _type(f), _default(f), _range(f), doc]
            lines.append(f"   * - {cells[0]}")
            lines.extend(f"     - {cell}" for cell in cells[1:])
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="nsq_sync.Config"), 0, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nsq-config-options", ConfigOptions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
