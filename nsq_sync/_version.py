"""The nsq_sync distribution: its version (single source for setup.cfg) and how to install its
extras (what an extra's absence says)."""

__version__ = "0.1.0"


def install_hint(extra: str) -> str:
    """The pip lines that install ``extra``: the released distribution's, and a clone's."""
    return f'pip install "nsq_sync[{extra}]" (from a clone: pip install ".[{extra}]")'
