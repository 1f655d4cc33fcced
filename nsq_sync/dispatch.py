"""The dispatch queue and worker pool: runs handlers, answers for them, enforces max_attempts.

Reader tasks put ``(connection, message)`` on the queue; ``concurrency`` workers take them off and
call ``handler(message)``:

* the handler returns → FIN (unless it called ``message.enable_async()`` or already answered);
* it raises :class:`~nsq_sync.errors.RequeueMessage` → REQ with the delay and backoff it chose;
* it raises anything else → the error is logged with its traceback and the message is requeued
  with ``default_requeue_delay * attempts`` (capped at ``max_requeue_delay``) and counts as a
  failure for backoff — unless this was attempt ``max_attempts``: then it goes to the give-up
  handler and is finished.

A message delivered with ``attempts > max_attempts`` (max_attempts lowered, or requeued
explicitly by the application) goes straight to the give-up handler without running the handler.
Nothing is discarded silently: every message is finished, requeued, or given up (and logged).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from nsq_sync.errors import RequeueMessage
from nsq_sync.message import Message
from nsq_sync.runtime import Runtime, Task

Handler = Callable[[Message], Any]
GiveUpHandler = Callable[[Message], Any]

_STOP = object()


def log_giving_up(message: Message, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """The default give-up handler: a WARNING with the id, attempts and body size."""
    logger.warning(
        "giving up on message %s after %d attempts (%d bytes); finishing it",
        message.id.decode("ascii", "replace"),
        message.attempts,
        len(message.body),
    )


class WorkerPool:
    """``concurrency`` tasks running handlers from one queue. ``submit`` is thread-safe.

    Args:
        runtime: threads or gevent.
        handler: the user's message handler.
        concurrency: number of workers.
        max_attempts: 0 for unlimited.
        giving_up: called with a message that used up its attempts (before it is finished).
        requeue_delay: computes the default REQ delay for a failed message.
        log: logger (a per-subscription adapter).
        on_skip: called for a queued message whose connection closed before it started (nsqd
            redelivers it; running it would only produce a duplicate).
    """

    def __init__(
        self,
        runtime: Runtime,
        handler: Handler,
        *,
        concurrency: int,
        max_attempts: int,
        giving_up: GiveUpHandler | None,
        log: logging.Logger | logging.LoggerAdapter[Any],
        is_stale: Callable[[Message], bool],
        on_skip: Callable[[Message], None],
        on_gave_up: Callable[[Message], None],
    ) -> None:
        self.runtime = runtime
        self.handler = handler
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.giving_up = giving_up
        self.log = log
        self.is_stale = is_stale
        self.on_skip = on_skip
        self.on_gave_up = on_gave_up
        self.queue: Any = runtime.queue()
        self.tasks: list[Task] = []
        self.running = 0  # handlers executing now
        self._lock = runtime.lock()

    def start(self, name: str) -> None:
        for i in range(self.concurrency):
            self.tasks.append(self.runtime.spawn(self._work, name=f"nsq_sync-worker-{name}-{i}"))

    def submit(self, message: Message) -> None:
        self.queue.put(message)

    def drain(self) -> list[Message]:
        """Remove and return every message queued but not started."""
        drained: list[Message] = []
        while True:
            try:
                item = self.queue.get_nowait()
            except Exception:  # queue.Empty (threads) / gevent's, the same class
                return drained
            if item is _STOP:
                self.queue.put(item)
                return drained
            drained.append(item)

    def stop(self, timeout: float) -> bool:
        """Ask the workers to exit after their current message; True if all did in time."""
        for _ in self.tasks:
            self.queue.put(_STOP)
        alive = False
        for task in self.tasks:
            task.join(timeout)
            alive = alive or task.is_alive()
        return not alive

    def _work(self) -> None:
        get = self.queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            try:
                self._process(item)
            except Exception:  # never let a worker die silently
                self.log.exception("worker failed while processing %r", item)
            except BaseException:  # SystemExit, KeyboardInterrupt, GreenletExit: end this worker
                self.log.error(
                    "worker stopped by %r while processing %r",
                    sys.exc_info()[1],
                    item,
                    exc_info=True,
                )
                return

    def _process(self, message: Message) -> None:
        if self.is_stale(message):
            self.on_skip(message)
            return
        if 0 < self.max_attempts < message.attempts:
            self._give_up(message)
            return
        with self._lock:
            self.running += 1
        try:
            self.handler(message)
        except RequeueMessage as req:
            if not message.has_responded:
                message.requeue(req.delay, req.backoff)
            return
        except Exception:
            if message.has_responded:
                self.log.exception("handler failed after answering message %r", message)
                return
            if 0 < self.max_attempts <= message.attempts:
                self.log.exception(
                    "handler failed on message %r (attempt %d of %d)",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
                self._give_up(message)
            else:
                self.log.exception(
                    "handler failed on message %r (attempt %d); requeueing",
                    message,
                    message.attempts,
                )
                message.requeue()
            return
        except BaseException:
            # SystemExit, KeyboardInterrupt, GreenletExit: this worker ends, but the message
            # must not be left in flight until nsqd's timeout.
            if not message.has_responded:
                message.requeue(0.0, backoff=False)
            raise
        finally:
            with self._lock:
                self.running -= 1
        if not message.has_responded and not message.is_async:
            message.finish()

    def _give_up(self, message: Message) -> None:
        try:
            if self.giving_up is not None:
                self.giving_up(message)
            else:
                log_giving_up(message, self.log)
        except Exception:
            # The give-up handler failed: requeue rather than lose the message.
            self.log.exception("giving_up handler failed for %r; requeueing it", message)
            if not message.has_responded:
                message.requeue(backoff=False)
            return
        self.on_gave_up(message)
        if not message.has_responded:
            message.finish()
