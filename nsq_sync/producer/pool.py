"""A Producer's pool in one process: its nsqds, the preferred one, and the failover of a publish,
by the rules of :mod:`nsq_sync.producer.producer`."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Protocol

from nsq_sync.config import Config
from nsq_sync.errors import (
    AuthError,
    NSQConnectionError,
    ProtocolError,
    PublishError,
    PublishOutcomeUnknown,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    Stopped,
    TLSError,
)
from nsq_sync.producer.slot import Slot, SlotBackingOff
from nsq_sync.protocol.constants import OK
from nsq_sync.runtime import AutoRuntime, Runtime
from nsq_sync.wire.connection import NotSent, NsqdConnection

if TYPE_CHECKING:
    from nsq_sync.process import PerProcess


class Owner(Protocol):
    """What a pool reads of its Producer, at each use (both may change)."""

    retry_unknown: bool

    @property
    def closed(self) -> bool: ...


def not_ok(answer: bytes) -> RemoteProtocolError:
    """The error for an answer to a publish that is neither OK nor an error frame."""
    return RemoteProtocolError(f"nsqd answered a publish with {answer[:100]!r} instead of OK")


class Attempts:
    """What the failed attempts of one publish have learned (the failover loop's state)."""

    __slots__ = ("timeout", "deadline", "last_error", "maybe_sent", "first_failure")

    def __init__(self, timeout: float, deadline: float) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self.last_error: BaseException | None = None
        # an earlier attempt wrote it and lost the answer (resent under retry_unknown)
        self.maybe_sent = False
        # an address that worked until this publish failed it (first failure, nothing sent):
        # worth one more try after its short first backoff, within the deadline
        self.first_failure = False


class Pool:
    """One process's slots, the preferred one, and a token per publish in progress (list append and
    pop are atomic: no lock on the publish path). ``holder``: a pool it no longer holds was copied
    into a forked child, where it must not connect again."""

    __slots__ = (
        "slots",
        "current",
        "active",
        "watch_patch",
        "addresses",
        "_config",
        "_runtime",
        "_owner",
        "_holder",
    )

    def __init__(
        self,
        addresses: list[str],
        config: Config,
        runtime: Runtime,
        rng: random.Random,
        owner: Owner,
        holder: PerProcess[Pool],
    ) -> None:
        self.slots = [Slot(a, config, runtime, rng) for a in addresses]  # decides an AutoRuntime
        self.current = 0
        self.active: list[None] = []
        # "auto" chose threads in this process: warn if gevent patches it later
        self.watch_patch = isinstance(runtime, AutoRuntime) and runtime.name == "threads"
        self.addresses = addresses
        self._config = config
        self._runtime = runtime
        self._owner = owner
        self._holder = holder

    def _closed(self) -> bool:
        return self._owner.closed

    def publish_with_failover(self, data: bytes, attempts: Attempts) -> str:
        """Send ``data`` (a whole command) to the first nsqd that takes it, from the preferred one
        on, before ``attempts.deadline``; the address of the nsqd that took it. Raises as
        :meth:`Producer.publish <nsq_sync.producer.producer.Producer.publish>`."""
        deadline = attempts.deadline
        retried = False
        slots = self.slots
        n = len(slots)
        while True:
            start = self.current
            # each nsqd, and once more for one whose connection was closed under us (NotSent)
            for k in range(2 * n):
                index = (start + k) % n
                slot = slots[index]
                if self._owner.closed or time.monotonic() >= deadline:
                    break
                if self._holder.peek() is not self:
                    # A publish of the parent copied into a forked child (gevent copies every
                    # greenlet): it goes on in the parent; here it must not connect again.
                    raise (PublishOutcomeUnknown if attempts.maybe_sent else PublishError)(
                        "the process forked during this publish; it continues in the parent "
                        "process only",
                        attempts.last_error,
                    )
                if slot.conn is None and slot.retry_at > time.monotonic():
                    continue  # backing off
                conn: NsqdConnection | None = None
                sent = False
                try:
                    conn = slot.conn
                    if conn is None or conn.closed:
                        conn = slot.connection(deadline, self._closed)
                    sent = True
                    answer = conn.request(data, max(0.001, deadline - time.monotonic()))
                    if answer != OK:
                        raise not_ok(answer)
                except Exception as exc:
                    self.attempt_failed(slot, conn, sent, exc, attempts)
                else:
                    self.current = index
                    return slot.address
            # Wait (within the deadline) for the first address to come back: under retry_unknown,
            # or once after an address that worked failed for the first time.
            maybe_sent = attempts.maybe_sent
            if self._owner.closed or not (
                (maybe_sent and self._owner.retry_unknown) or attempts.first_failure
            ):
                break
            if not maybe_sent:
                if retried:
                    break
                retried = True
            wait = min(s.retry_at for s in slots) - time.monotonic()
            if wait >= deadline - time.monotonic():
                break
            if wait > 0:
                self._runtime.sleep(wait)
        last_error = attempts.last_error
        if self._owner.closed:
            if attempts.maybe_sent:
                raise PublishOutcomeUnknown(
                    "producer closed before nsqd answered; the message may or may not have "
                    "been published",
                    last_error,
                )
            raise Stopped("producer closed before the message was sent")
        message = f"publish failed on every nsqd ({', '.join(self.addresses)})"
        if last_error is None:  # nothing tried: every address is backing off after a failure
            last_error = next((s.last_error for s in slots if s.last_error), None)
            wait = max(0.0, min(s.retry_at for s in slots) - time.monotonic())
            message += f"; all backing off after failures, next attempt in {wait:.2f} s"
        if attempts.maybe_sent:
            raise PublishOutcomeUnknown(
                message + "; an earlier attempt may have published it", last_error
            )
        raise PublishError(message, last_error)

    def attempt_failed(
        self,
        slot: Slot,
        conn: NsqdConnection | None,
        sent: bool,
        error: Exception,
        attempts: Attempts,
    ) -> None:
        """After a failed attempt: raise what the caller must see, or record it in ``attempts`` and
        return (the loop goes on). ``sent``: the command may have been written."""
        if isinstance(error, SlotBackingOff):
            return
        if isinstance(error, NotSent):
            # Closed by another thread after we took it: nothing was written. Try this
            # address again (it reconnects, or is backing off).
            if slot.conn is conn:
                slot.conn = None
            return
        if isinstance(error, ReadTimeout):
            if not sent:
                attempts.last_error = error
                slot.mark_failed(None, error)
                return
            # Our own deadline ran out waiting for the answer: only this request gives up; the
            # connection stays up for the others (its answer is matched and dropped).
            raise PublishOutcomeUnknown(
                f"no answer from nsqd {slot.address} within {attempts.timeout:g} s; the message "
                "may or may not have been published",
                error,
            ) from None
        if isinstance(error, ServerError):
            if not error.retriable:
                raise error
            attempts.last_error = error  # nsqd answered: it did not take the message
            slot.mark_failed(conn, error)
            attempts.first_failure = attempts.first_failure or slot.failures == 1
        elif isinstance(error, (ProtocolError, TLSError, AuthError)):
            # Garbage from the peer (typically nsqd's HTTP port given as its TCP port), a TLS
            # setup that cannot work (certificate not verified, nsqd requires TLS) or AUTH
            # required without a secret are configuration errors that a retry would only
            # repeat: do not hammer that address (fail over, or raise at once).
            attempts.last_error = error
            slot.mark_failed(conn, error, delay=self._config.reconnect_backoff_max)
            attempts.maybe_sent = self._unknown_if_sent(sent, slot, error) or attempts.maybe_sent
        elif isinstance(error, NSQConnectionError):
            attempts.last_error = error
            slot.mark_failed(conn if sent else None, error)
            attempts.maybe_sent = self._unknown_if_sent(sent, slot, error) or attempts.maybe_sent
            attempts.first_failure = attempts.first_failure or (not sent and slot.failures == 1)
        else:
            raise error

    def _unknown_if_sent(self, sent: bool, slot: Slot, error: BaseException) -> bool:
        """Raise PublishOutcomeUnknown if the command was written and may not be resent."""
        if not sent:
            return False
        if self._owner.closed:
            raise PublishOutcomeUnknown(
                f"producer closed before nsqd {slot.address} answered; the message may or may "
                "not have been published",
                error,
            ) from None
        if not self._owner.retry_unknown:
            raise PublishOutcomeUnknown(
                f"connection to nsqd {slot.address} lost before it answered; the message may "
                "or may not have been published (not resent: retry_unknown is off)",
                error,
            ) from None
        return True
