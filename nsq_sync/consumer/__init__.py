"""The consumer: :class:`Consumer`, :class:`BatchConsumer`, ``run()`` to an end, and their parts.

Consumer ── ConnectionSet (connections.py: nsqd connections, credit via nsq_sync.credit)
         ├─ WorkerPool (workers.py) ── handler(message)
         ├─ ConsumerResponder (responder.py: FIN/REQ/TOUCH) and Flusher (flusher.py)
         ├─ Discovery (discovery.py: lookupd polls, reconnects)
         └─ DeadLetterer (dead_letters.py, with dead_letter_topic=: envelope.py's format)
"""

from nsq_sync.consumer.batch import BatchConsumer, BatchHandler
from nsq_sync.consumer.consumer import Consumer
from nsq_sync.consumer.running import RunSummary
from nsq_sync.consumer.stats import ConnectionStats, ConsumerStats

__all__ = [
    "BatchConsumer",
    "BatchHandler",
    "ConnectionStats",
    "Consumer",
    "ConsumerStats",
    "RunSummary",
]
