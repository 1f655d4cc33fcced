"""Fork detection without a system call per check.

Objects holding sockets (Producer connections, HTTP sessions) must not reuse them in a forked
child. ``generation`` counts the forks in this process's lineage: ``os.register_at_fork`` bumps
it in every child, so comparing it with a copy taken earlier is an integer compare instead of a
``getpid()`` system call on every publish. :func:`install` registers the hook once; the objects
that need it call it when constructed (nothing happens at import). Where ``os.fork`` does not
exist (Windows) there is no hook, and no fork either.
"""

from __future__ import annotations

import os

#: forks since this interpreter started, as seen by this process
generation = 0
_installed = False


def _after_fork_in_child() -> None:
    global generation
    generation += 1


def install() -> None:
    """Register the fork counter (once). Thread-safe enough: a race registers it twice, and a
    child then sees two bumps instead of one, which still differs from its copy."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        _installed = True
        os.register_at_fork(after_in_child=_after_fork_in_child)
