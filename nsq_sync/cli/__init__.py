"""The ``nsq-sync`` command line (also ``python -m nsq_sync``)."""

from nsq_sync.cli.main import main, run

__all__ = ["main", "run"]
