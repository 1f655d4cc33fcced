"""A cron job: process what is waiting on a channel, then exit with a status cron can act on.

    */5 * * * * flock -n /tmp/reports-export.lock python /srv/app/examples/cron_drain.py

The run ends when nothing has arrived for ``IDLE_TIMEOUT`` seconds while nsqd could have sent
something (time in backoff after a failure, or reconnecting, does not count), after
``MAX_MESSAGES`` messages, after ``TIMEOUT`` seconds (so a run never overlaps the next one for
long), or on SIGTERM. Messages received but not handled by then go back to nsqd at once, for the
next run. Exit status 0 when every message was handled, 1 when some handler call failed (those
messages were requeued) so cron mails the log.

Environment: ``NSQD_TCP_ADDRESS`` (default 127.0.0.1:4150) or ``NSQLOOKUPD_HTTP_ADDRESS``,
``TOPIC`` (default "reports"), ``CHANNEL`` (default "export"), ``IDLE_TIMEOUT`` (seconds).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from nsq_sync import Consumer, Message

IDLE_TIMEOUT = float(os.environ.get("IDLE_TIMEOUT", "5"))
MAX_MESSAGES = 10_000
TIMEOUT = 240.0  # under the 5-minute cron interval

log = logging.getLogger("cron_drain")


def handle(message: Message) -> None:
    """Your work goes here: return to finish the message, raise to requeue it (with backoff)."""
    order = json.loads(message.body)
    log.info("exported order %s", order.get("id"))


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    lookupd = os.environ.get("NSQLOOKUPD_HTTP_ADDRESS")
    nsqd = os.environ.get("NSQD_TCP_ADDRESS", "" if lookupd else "127.0.0.1:4150")
    consumer = Consumer(
        os.environ.get("TOPIC", "reports"),
        os.environ.get("CHANNEL", "export"),
        handle,
        nsqd_tcp_addresses=[nsqd] if nsqd else [],
        lookupd_http_addresses=[lookupd] if lookupd else [],
        max_in_flight=50,
        concurrency=4,
        max_attempts=5,  # then the give-up handler (a WARNING in the log) and FIN
    )
    summary = consumer.run(idle_timeout=IDLE_TIMEOUT, max_messages=MAX_MESSAGES, timeout=TIMEOUT)
    log.info(
        "%s: handled %d, finished %d, requeued %d, failed %d, gave up %d in %.1f s",
        summary.reason,
        summary.handled,
        summary.finished,
        summary.requeued,
        summary.failed,
        summary.gave_up,
        summary.elapsed,
    )
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
