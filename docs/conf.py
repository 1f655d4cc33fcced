"""Sphinx configuration: Markdown pages (MyST), the API reference from the Google-style
docstrings (autodoc + napoleon) and mermaid diagrams. The configuration reference is a Markdown
table in configuration.md, generated from Config's field metadata by _ext/config_reference.py
and checked against Config by tests/docs.

Built in CI by ``tox -e docs`` as ``sphinx-build -W --keep-going -n``: any warning (a broken
cross-reference, a renamed class, an option without a description) fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

from nsq_sync import __version__  # noqa: E402
project = "nsq_sync"
author = "nsq_sync contributors"
copyright = "nsq_sync contributors, MIT licence"
release = version = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
    "sphinxcontrib.mermaid",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]
# ```mermaid fences render as diagrams here, as they do on GitHub.
myst_fence_as_directive = ["mermaid"]
myst_heading_anchors = 3
# Snippet markers (<!-- no-run ... -->) are HTML comments: keep them out of the output quietly.
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# The build is offline (no intersphinx inventories are fetched in CI), so names from the standard
# library and third-party packages cannot resolve; everything of nsq_sync's own must.
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(ssl|datetime|collections|typing|typing_extensions|types|threading|logging"
        r"|socket|pathlib|os|subprocess|argparse|requests|pytest|_pytest|flask|django|gevent"
        r"|pyspark|Path|Self|T|Any|Callable|Iterable|Iterator|Mapping|Sequence|Generator"
        r"|timedelta|SSLContext|Event|Lock)(\..*)?",
    ),
    (
        r"py:class",
        r"(int|float|str|bytes|bool|object|None|list|dict|tuple|set|type|frozenset"
        r"|BaseException|Exception|ValueError|TypeError|RuntimeError|TimeoutError"
        r"|FileNotFoundError|ImportError|OSError)",
    ),
    # Type aliases and internal classes that appear in signatures, and private names (a private base class, a private
    # module): nothing public to link to.
    (
        r"py:class",
        r"(Handler|GiveUpHandler|BatchHandler|Responder|NsqdConnection|StrPath|Flask|Duration)",
    ),
    (r"py:class", r"nsq_sync(\.\w+)*\._\w+(\.\w+)*"),
    # The HTTP clients' shared base (show-inheritance names it): not for direct use; its methods
    # are documented on NsqdHTTPClient and LookupdClient (:inherited-members:).
    (r"py:class", r"nsq_sync\.http\.base\.HTTPClientBase"),
    # napoleon reads a Raises entry such as "HTTPAPIError (404 ``TOPIC_NOT_FOUND``)" or an Args
    # entry such as "runtime and any Config option" as a name; a target with a space in it is
    # never a Python name, and the text renders as written.
    (r"py:(exc|class|obj)", r".*\s.*"),
    (r"py:exc", r"404"),
    # Internal names the consumer.workers and consumer.running module docstrings mention.
    (r"py:(meth|func)", r"(WorkerPool\.submit_many|run_to_end)"),
]

html_theme = "alabaster"
html_title = f"nsq_sync {release}"
html_static_path: list[str] = []

_log = logging.getLogger(__name__)


_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?!https?:|#|mailto:)([^)#\s]+)(#[^)\s]*)?\)")


def _repository_links(text: str) -> str:
    # ARCHITECTURE.md links files relative to the repository root, as GitHub shows them. Here a
    # link into docs/ becomes a link to that page; a link to any other repository file (a
    # module, a test) becomes its path in code, since the site does not hold the source.
    def fix(m: re.Match[str]) -> str:
        label, path, anchor = m.group(1), m.group(2), m.group(3) or ""
        if path.startswith("docs/") and path.endswith(".md"):
            return f"[{label}]({path[len('docs/') :]}{anchor})"
        if label.strip("`") == path:
            return f"`{path}`"
        return f"{label} (`{path}`)"

    return _LINK.sub(fix, text)


def _architecture(app: Sphinx, docname: str, source: list[str]) -> None:
    # docs/architecture.md is the repository's ARCHITECTURE.md (its mermaid diagrams render
    # here as on GitHub); until that file exists the page says so instead of failing the build.
    if docname != "architecture":
        return
    path = ROOT / "ARCHITECTURE.md"
    if path.exists():
        source[0] = _repository_links(path.read_text(encoding="utf-8"))
    else:
        _log.info("ARCHITECTURE.md not found: docs/architecture.md shows a placeholder")
        source[0] = "# Architecture\n\nARCHITECTURE.md is not in this checkout yet.\n"


def _resolve_by_suffix(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    # Docstrings name objects by the module that defines them (nsq_sync.consumer.Consumer.run),
    # pages by where users import them from (nsq_sync.Consumer); each object is documented once.
    # A missing Python reference resolves to the one documented object whose dotted name ends
    # with the reference's last two components ("Consumer.run"; only the last one after a
    # module: "nsq_sync.RequeueMessage"), when exactly one object does. A renamed object matches nothing and still
    # fails the build.
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    parts = node["reftarget"].split(".")
    # "nsq_sync.RequeueMessage": the component before the name is a module, not a class
    keep = 1 if len(parts) < 2 or parts[-2][:1].islower() else 2
    suffix = "." + ".".join(parts[-keep:])
    matches = {
        entry.node_id: name
        for name, entry in domain.objects.items()
        if ("." + name).endswith(suffix)
    }
    if len(matches) != 1:
        return None
    (name,) = matches.values()
    found = domain.resolve_any_xref(env, node["refdoc"], app.builder, name, node, contnode)
    return found[0][1] if found else None


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _architecture)
    app.connect("missing-reference", _resolve_by_suffix)
    return {"parallel_read_safe": True}
