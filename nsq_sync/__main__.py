"""``python -m nsq_sync``: the ``nsq-sync`` command line."""

from nsq_sync.cli import run

if __name__ == "__main__":
    run()
