"""The docs' snippets run in the ``docs`` tox env (``tox -e docs``: the Sphinx build, then these
tests), which sets NSQ_SYNC_TEST_DOCS=1; the interpreter x runtime envs leave them out, as each
snippet starts its own servers and interpreter and would add minutes to every env for no
coverage the docs env lacks (snippets run in a fresh interpreter on threads, or on gevent where
the snippet itself patches). Run them directly with NSQ_SYNC_TEST_DOCS=1 pytest tests/docs.
"""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("NSQ_SYNC_TEST_DOCS") == "1" else ["test_doc_snippets.py"]
