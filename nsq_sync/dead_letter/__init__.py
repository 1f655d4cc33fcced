"""Dead-letter topics: read what a consumer gave up on, and send it back.

A :class:`~nsq_sync.consumer.Consumer` made with ``dead_letter_topic="orders.dead"`` publishes each
message it gives up on (``max_attempts`` used, or the handler raised
:class:`~nsq_sync.errors.DeadLetter`) to that topic, then finishes it. The dead-letter message's
body is an *envelope*: one line of UTF-8 JSON with the metadata, ``\\n``, then the original body
byte for byte (format version 1; the keys: ``topic``, ``channel``, ``id``, ``attempts``,
``timestamp`` in ns, ``dead_lettered_at`` in s, ``error`` {``type``, ``message``} or null,
``error_truncated`` when cut to fit, ``host``, ``pid``; ``nsq_sync.consumer.envelope`` has the
details). The topic keeps its messages in the durable channel ``dead-letter`` (made with the
topic), which the functions here read:

    from nsq_sync import dead_letter
    record = dead_letter.parse(body)            # .topic .channel .id .attempts .error_type ...
    listing = dead_letter.list_messages("orders.dead", lookupd_http_addresses="http://h:4161")
    summary = dead_letter.replay("orders.dead", lookupd_http_addresses="http://h:4161")

Both read with ``max_attempts=0``, so reading never pushes a message towards a give-up, and they
hold the messages they do not finish in flight until they end, then requeue them at once: each
message is seen once per call, and the call ends once it has seen every message nsqd had ready
(``idle_timeout`` seconds without a new one while credit was open).

:func:`replay` republishes each original body to its original topic (or ``to``) on the nsqd the
dead-letter message came from, and FINs the dead-letter message only after nsqd acknowledged the
republish. Stopped half way (SIGTERM/SIGINT, which end it gracefully; an nsqd restart, which it
rides out) it loses nothing; it duplicates at most the messages in flight when a connection
broke (republished, FIN lost: nsqd delivers them again), at most ``max_in_flight``.

The command line: ``nsq-sync dead-letter list TOPIC`` and ``nsq-sync dead-letter replay TOPIC
[--to TOPIC] [--max-messages N] [--where TEXT]``.
"""

from nsq_sync.dead_letter.reader import (
    CHANNEL,
    FORMAT_VERSION,
    DeadLetterRecord,
    Listed,
    Listing,
    ReplaySummary,
    list_messages,
    parse,
    replay,
)

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
