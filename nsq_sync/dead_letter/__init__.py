"""Dead-letter topics: read what a consumer gave up on, and send it back.

A :class:`~nsq_sync.consumer.Consumer` made with ``dead_letter_topic=`` publishes each message it
gives up on there as an *envelope* (:func:`parse`; docs/consumer.md has its keys), then finishes
it; the topic's durable channel ``dead-letter`` keeps them for :func:`list_messages` and
:func:`replay` (``nsq-sync dead-letter list|replay``), which read with ``max_attempts=0``.
"""

from nsq_sync.consumer.dead_letters import CHANNEL
from nsq_sync.consumer.envelope import FORMAT_VERSION, DeadLetterRecord, parse
from nsq_sync.dead_letter.reader import Listed, Listing, ReplaySummary, list_messages, replay

__all__ = [
    "CHANNEL",
    "FORMAT_VERSION",
    "DeadLetterRecord",
    "Listed",
    "Listing",
    "ReplaySummary",
    "list_messages",
    "parse",
    "replay",
]
