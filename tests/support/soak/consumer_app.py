"""The soak's long-running consumer process: ``python -m support.soak.consumer_app ...``.

One Consumer on the soak's topic (channel ``worker``, found through nsqlookupd, with a
dead-letter topic), whose handler fails every id of a known fraction (:func:`fails`), and one
Consumer on the dead-letter topic's ``dead-letter`` channel. Every handler call appends one JSON
line to the record file, written straight to the file (``O_APPEND``, one ``write`` per line) before
the handler returns, so a SIGKILL loses no line of a message that was handled:

    {"kind": "ok"|"fail"|"dead", "id": ..., "msg": nsqd message id, "attempts": n,
     "nsqd": address, "pid": pid, "t": wall-clock seconds}

SIGTERM stops both consumers gracefully. With ``--runtime gevent`` the process is patched by
gevent first.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and "--runtime=gevent" in sys.argv:  # before anything imports socket
    from gevent import monkey

    monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402

FAIL_ONE_IN = 20  # the handler fails every id whose CRC-32 is a multiple of this (5 %)


def fails(ident: str) -> bool:
    """Whether the soak's handler refuses ``ident`` (every time: it ends dead-lettered)."""
    return zlib.crc32(ident.encode()) % FAIL_ONE_IN == 0


def ident_of(body: bytes) -> str:
    """The soak id a body carries: the body itself (Flask), or JSON's ``item`` (Django)."""
    if body.startswith(b"{"):
        return str(json.loads(body)["item"])
    return body.decode()


class Record:
    """Appends JSON lines to a file, one ``os.write`` each (atomic with ``O_APPEND``)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **fields: object) -> None:
        os.write(self.fd, json.dumps(fields).encode() + b"\n")


class SoakHandlerError(Exception):
    """What the soak's handler raises for the ids it refuses."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lookupd", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", default="worker")
    parser.add_argument("--dead-letter-topic", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--max-in-flight", type=int, default=20)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--runtime", default="threads")
    args = parser.parse_args(argv)

    from nsq_sync import Consumer, Message
    from nsq_sync.dead_letter import CHANNEL, parse

    record = Record(args.record)
    pid = os.getpid()

    def handle(message: Message) -> None:
        ident = ident_of(message.body)
        fields = {
            "id": ident,
            "msg": message.id.decode(),
            "attempts": message.attempts,
            "nsqd": message.nsqd_address,
            "pid": pid,
        }
        if fails(ident):
            record.write(kind="fail", t=time.time(), **fields)
            raise SoakHandlerError(f"the soak's handler refuses {ident}")
        record.write(kind="ok", t=time.time(), **fields)

    def dead(message: Message) -> None:
        envelope = parse(message.body)
        record.write(
            kind="dead",
            id=ident_of(envelope.body),
            msg=envelope.id,
            attempts=envelope.attempts,
            error=envelope.error_type,
            nsqd=message.nsqd_address,
            pid=pid,
            t=time.time(),
        )

    common = {
        "lookupd_http_addresses": [args.lookupd],
        "lookupd_poll_interval": 1.0,
        "lookupd_poll_jitter": 0.2,
        "reconnect_backoff_max": 1.0,
    }
    worker = Consumer(
        args.topic,
        args.channel,
        handle,
        dead_letter_topic=args.dead_letter_topic,
        max_in_flight=args.max_in_flight,
        max_attempts=args.max_attempts,
        concurrency=4,
        # a refused id goes back to the channel's queue at once (REQ 0: on disk with
        # --mem-queue-size=0), not into nsqd's in-memory deferred queue; no backoff
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
        **common,
    )
    letters = Consumer(args.dead_letter_topic, CHANNEL, dead, max_in_flight=10, **common)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker.start()
    letters.start()
    print(f"soak consumer {pid} started", flush=True)
    while not stop.wait(0.5):
        pass
    ok = worker.stop(timeout=20.0) and letters.stop(timeout=20.0)
    print(f"soak consumer {pid} stopped ({'clean' if ok else 'timed out'})", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main([a for a in sys.argv[1:]])
