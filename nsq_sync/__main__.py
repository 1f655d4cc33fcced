"""``python -m nsq_sync``: the ``nsq-sync`` command line."""

from nsq_sync.cli import run

run()
