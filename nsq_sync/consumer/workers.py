"""The dispatch queue and worker pool: runs handlers, answers for them, enforces max_attempts.

For each message a worker calls ``handler(message)``:

* the handler returns → FIN (unless it called ``message.enable_async()`` or already answered);
* it raises :class:`~nsq_sync.errors.RequeueMessage` → REQ with the delay and backoff it chose;
* it raises anything else → the error is logged with its traceback and the message is requeued
  with ``default_requeue_delay * attempts`` (capped at ``max_requeue_delay``) and counts as a
  failure for backoff, unless this was attempt ``max_attempts`` or the error is
  :class:`~nsq_sync.errors.DeadLetter`: then it is given up (``giving_up``, then FIN);
* it raises SystemExit or KeyboardInterrupt → the message is requeued at once (no backoff) and
  the consumer stops gracefully (``run()`` re-raises it).

The handler does not run for a message whose connection closed before it started (skipped:
nsqd redelivers it), one taken once the consumer is stopping or refused by ``run()``'s gate
(requeued at once), or one delivered with ``attempts > max_attempts`` (given up at once).
Nothing is discarded silently: every message is finished, requeued, or given up (and logged).

FINs are held and written in batches; the flusher writes them within ``FIN_HOLD`` seconds when
a long handler keeps the workers busy. The queues are deques (atomic append and popleft), so
workers share them without a lock.
"""

from __future__ import annotations

import logging
import operator
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from nsq_sync.errors import ConfigError, DeadLetter, RequeueMessage
from nsq_sync.message import Message
from nsq_sync.runtime import Runtime, Task

Handler = Callable[[Message], Any]
GiveUpHandler = Callable[[Message], Any]

_STOP = object()
_WAKE = object()
#: FINs held back before a worker writes them (one system call for all)
FIN_BATCH = 512
#: longest a FIN is held back while a handler runs, in seconds (enforced by the backstop)
FIN_HOLD = 0.002


class Backstop(Protocol):
    """Writes held FINs within ``FIN_HOLD`` seconds when no worker does (the flusher)."""

    #: True while armed. Workers read it before every handler that starts while FINs are held
    #: and call :meth:`watch` only when it is False: an attribute read per message, not a call.
    watching: bool

    def watch(self) -> None:
        """Arm: make sure the held FINs are written within ``FIN_HOLD`` seconds."""


class DeadLetterHook(Protocol):
    """Publishes given-up messages to the dead-letter topic (consumer/dead_letters.py)."""

    def __call__(self, message: Message, error: BaseException | None) -> bool:
        """True when nsqd acknowledged the envelope; False when the message was requeued
        instead (logged). Never raises an Exception."""

    def close(self, timeout: float) -> None:
        """Release its connections (the workers have stopped)."""


def log_giving_up(message: Message, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """The default give-up handler: a WARNING with the id, attempts and body size."""
    logger.warning(
        "giving up on message %s after %d attempts (%d bytes); finishing it",
        message.id.decode("ascii", "replace"),
        message.attempts,
        len(message.body),
    )


def ends_task(exc: BaseException) -> bool:
    """True for what ends the task it is raised in rather than failing one message: SystemExit,
    KeyboardInterrupt (the consumer stops; run() re-raises them) and gevent's GreenletExit."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return True
    greenlet = sys.modules.get("greenlet")  # (never imported here: gevent's, if loaded)
    return greenlet is not None and isinstance(exc, greenlet.GreenletExit)


_ATTEMPTS = operator.attrgetter("attempts")


def _take_all(queue: deque[Message]) -> list[Message]:
    """Pop every message of ``queue``, oldest first; each is taken once (popleft is atomic)."""
    popleft = queue.popleft
    taken: list[Message] = []
    while True:
        try:
            taken.append(popleft())
        except IndexError:
            return taken


def _requeue_unanswered(messages: list[Message]) -> None:
    """Requeue each message still unanswered at once (no delay, no backoff)."""
    for message in messages:
        if not message.has_responded:
            message.requeue(0.0, backoff=False)


class WorkerPool:
    """``concurrency`` tasks running handlers from one queue. ``submit``/``submit_many`` are
    thread-safe.

    Args:
        max_attempts: 0 for unlimited.
        is_stale: True for a message whose connection closed (default): skipped, not handled.
        finish_many: finishes claimed messages whose handler returned, in order; None
            finishes each with ``message.finish()`` at once.
        backstop: armed when a worker starts a handler while FINs are held; it must make
            sure :meth:`flush_held` runs within ``FIN_HOLD`` seconds.
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
        is_stale: Callable[[Message], bool] = operator.attrgetter("connection.closed"),
        on_skip: Callable[[Message], None],
        on_gave_up: Callable[[Message], None],
        finish_many: Callable[[list[Message]], None] | None = None,
        backstop: Backstop | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_failed: Callable[[Message], None] | None = None,
        dead_letter: DeadLetterHook | None = None,
        requeue_delay: Callable[[Message], float] | None = None,
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
        self.finish_many = finish_many
        self.backstop = backstop
        self.on_fatal = on_fatal
        self.on_failed = on_failed
        self.dead_letter = dead_letter
        #: the delay a plain requeue() of a message gets (for the log line that says when the
        #: retry comes); None: not said
        self.requeue_delay = requeue_delay
        #: called before each message is handled (handler call or give-up); False: it is not,
        #: and is requeued at once with no delay (``Consumer.run(max_messages=)`` sets it)
        self.admit: Callable[[Message], bool] | None = None
        #: set by BatchConsumer before the workers start: the messages a worker takes go to it
        #: in lists, after the same checks as a handler's (stale, refused, past max_attempts);
        #: the handler is not called (see :meth:`_collect_work`; in order with one worker, as
        #: BatchConsumer has)
        self.collect: Callable[[list[Message]], None] | None = None
        self.queue: Any = runtime.queue()  # wake-up tokens (and _STOP)
        # deques: append and popleft are atomic, so workers and the flusher share them lock-free
        self._messages: deque[Message] = deque()
        self.held: deque[Message] = deque()  # handled, FIN not written yet
        self.tasks: list[Task] = []
        #: set when the consumer stops: messages not started yet are requeued, not handled
        self.stopping = False
        #: the collecting worker took messages it has not handed to collect yet
        self._collecting = False

    def start(self, name: str) -> None:
        for i in range(self.concurrency):
            self.add_task(self.runtime.spawn(self._work, name=f"nsq_sync-worker-{name}-{i}"))

    def add_task(self, task: Task) -> None:
        """Count ``task`` among the pool's (BatchConsumer's batch task): :meth:`stop` joins it."""
        self.tasks.append(task)

    def flush_held(self) -> None:
        """Finish every held message (oldest first). Thread-safe."""
        batch = _take_all(self.held)
        if batch and self.finish_many is not None:
            try:
                self.finish_many(batch)
            except Exception:
                self.log.exception("finishing %d message(s) failed", len(batch))

    def submit(self, message: Message) -> None:
        self.submit_many([message])

    def submit_many(self, messages: list[Message]) -> None:
        """Queue messages in order; wakes as many workers as could share them.

        With :attr:`collect` set, a plain run (nothing stale or past max_attempts, nothing queued
        or being collected before it) is screened and collected on the calling task (a
        connection's reader) instead: it blocks on nothing, and a Spark partition's messages
        skip a thread hand-over. Anything else goes to the worker, which may wait on a give-up."""
        collect = self.collect
        if (
            collect is not None
            and not self._collecting
            and not self._messages
            and self._plain(messages)
        ):
            self._collect_plain(collect, messages)
            return
        self._messages.extend(messages)
        put = self.queue.put
        for _ in range(min(len(messages), self.concurrency)):
            put(_WAKE)

    def queued(self) -> int:
        """Messages queued and not started yet."""
        return len(self._messages)

    def drain(self) -> list[Message]:
        """Remove and return every message queued but not started. Thread-safe."""
        return _take_all(self._messages)

    def stop(self, timeout: float) -> bool:
        """Ask the workers to exit after their current message (True if all did in time), then
        close the dead-letter hook."""
        deadline = time.monotonic() + timeout
        for _ in self.tasks:
            self.queue.put(_STOP)
        alive = False
        for task in self.tasks:
            task.join(timeout)
            alive = alive or task.is_alive()
        if self.dead_letter is not None:
            self.dead_letter.close(max(0.1, deadline - time.monotonic()))
        return not alive

    def _taken(self) -> Iterator[Message | None]:
        """The messages this worker takes, one at a time (idle workers share a batch), until
        it is told to stop; None after each run of them, when the queue is empty for now."""
        get = self.queue.get
        popleft = self._messages.popleft
        while get() is not _STOP:
            while True:
                try:
                    message = popleft()
                except IndexError:
                    break
                yield message
            yield None

    def _work(self) -> None:
        if self.collect is not None:
            self._collect_work(self.collect)
            return
        process = self._process
        held = self.held
        backstop = self.backstop
        message: Message | None = None
        try:
            for taken in self._taken():
                if taken is None:  # out of messages: nothing waits for a batch to fill
                    if held:
                        self.flush_held()
                    continue
                message = taken
                if held and backstop is not None and not backstop.watching:
                    backstop.watch()  # FINs held while another handler runs: arm it
                try:
                    to_finish = process(message)
                except BaseException as exc:  # the message was answered (or requeued)
                    self._failed(exc, message)
                    continue
                if to_finish:
                    held.append(message)
                    if len(held) >= FIN_BATCH:
                        self.flush_held()
        except BaseException:  # what _failed let through: end this worker
            self._stopped_by(message)
        finally:
            self.flush_held()

    def _collect_work(self, collect: Callable[[list[Message]], None]) -> None:
        """A worker that hands screened messages, marked async, to ``collect`` (BatchConsumer's) in
        order, a list per wake-up; what it admitted goes first when a message past max_attempts is
        given up (that may wait on a dead-letter publish). None is left in flight.

        It takes every queued message at each wake-up and screens them in one loop: BatchConsumer
        has one worker, and a Spark partition reads hundreds of thousands of messages through it."""
        get = self.queue.get
        queued = self._messages
        taken: list[Message] = []
        try:
            while get() is not _STOP:
                # set before taking: submit_many collects on its own only when nothing is
                # queued and nothing taken is still on its way to collect (order is kept)
                self._collecting = True
                taken = _take_all(queued)
                if taken:
                    self._collect_run(collect, taken)
                taken = []
                self._collecting = False
        except BaseException:  # what _failed let through: end this worker
            self._stopped_by(taken[0] if taken else None)
        finally:
            _requeue_unanswered(taken)  # taken, never collected: not left in flight

    def _collect_run(self, collect: Callable[[list[Message]], None], run: list[Message]) -> None:
        """Screen ``run`` (as :meth:`_screen`) and hand what is admitted to ``collect``."""
        if self._plain(run):
            self._collect_plain(collect, run)
        else:
            self._collect_each(collect, run)

    def _plain(self, run: list[Message]) -> bool:
        """True when no message of ``run`` is stale or past max_attempts, and the pool is not
        stopping (checked at C speed): then only admission is asked per message."""
        max_attempts = self.max_attempts
        return not (
            self.stopping
            or any(map(self.is_stale, run))
            or (max_attempts > 0 and max(map(_ATTEMPTS, run)) > max_attempts)
        )

    def _collect_plain(self, collect: Callable[[list[Message]], None], run: list[Message]) -> None:
        """Hand the admitted messages of a plain ``run`` (see :meth:`_plain`) to ``collect``,
        marked async; requeue the refused ones at once."""
        admit = self.admit
        try:
            if admit is None:
                admitted = run
            else:
                admitted = []
                append = admitted.append
                for message in run:
                    if admit(message):
                        append(message)
                    else:
                        message.requeue(0.0, backoff=False)
            for message in admitted:
                message.is_async = True
        except BaseException as exc:
            _requeue_unanswered(run)  # none of it was collected
            self._failed(exc, f"a run of {len(run)} message(s), requeued")
            return
        if admitted:
            self._hand_over(collect, admitted)

    def _collect_each(self, collect: Callable[[list[Message]], None], run: list[Message]) -> None:
        """:meth:`_collect_run` one message at a time: stale ones skipped, refused ones requeued,
        those past max_attempts given up (after what was admitted before them is handed over)."""
        is_stale = self.is_stale
        admit = self.admit
        max_attempts = self.max_attempts
        admitted: list[Message] = []
        for message in run:
            try:
                if is_stale(message):
                    self.on_skip(message)
                elif self.stopping or (admit is not None and not admit(message)):
                    message.requeue(0.0, backoff=False)
                elif 0 < max_attempts < message.attempts:
                    if admitted:
                        admitted = self._hand_over(collect, admitted)
                    self.give_up(message)
                else:
                    message.is_async = True
                    admitted.append(message)
            except BaseException as exc:
                self._failed(exc, message)
        if admitted:
            self._hand_over(collect, admitted)

    def _hand_over(
        self, collect: Callable[[list[Message]], None], admitted: list[Message]
    ) -> list[Message]:
        """``collect(admitted)``; if it raises, requeue what is unanswered and handle the error."""
        try:
            collect(admitted)
        except BaseException as exc:
            _requeue_unanswered(admitted)
            self._failed(exc, f"a hand-over of {len(admitted)} message(s), requeued")
        return []

    def _failed(self, exc: BaseException, what: object) -> None:
        """Handle what a worker's step raised (from ``except``): log an Exception; give SystemExit
        or KeyboardInterrupt to ``on_fatal`` if set; raise anything else (it ends the worker)."""
        if isinstance(exc, Exception):  # never let a worker die silently
            self.log.exception("worker failed while processing %r", what)
        elif isinstance(exc, (SystemExit, KeyboardInterrupt)) and self.on_fatal is not None:
            self.on_fatal(exc)
        else:
            raise exc

    def _stopped_by(self, message: Message | None) -> None:
        """Log what ends a worker (from the ``except`` clause)."""
        self.log.error(
            "worker stopped by %r while processing %r", sys.exc_info()[1], message, exc_info=True
        )

    def _screen(self, message: Message) -> bool:
        """True when ``message`` is to be handled; else it was skipped, requeued or given up."""
        if self.is_stale(message):
            self.on_skip(message)
            return False
        if self.stopping or (self.admit is not None and not self.admit(message)):
            message.requeue(0.0, backoff=False)
            return False
        if 0 < self.max_attempts < message.attempts:
            self.give_up(message)
            return False
        return True

    def _process(self, message: Message) -> bool:
        """Run one message; True when the caller is to finish it (the handler returned)."""
        if not self._screen(message):
            return False
        try:
            self.handler(message)
        except RequeueMessage as req:
            if not message.has_responded:
                try:
                    message.requeue(req.delay, req.backoff)
                except ConfigError:
                    self.log.exception(
                        "RequeueMessage with a bad delay; requeueing %r%s",
                        message,
                        self.when_retried([message]),
                    )
                    message.requeue(None, req.backoff)
            return False
        except BaseException as exc:
            if ends_task(exc):
                # this worker ends (or the consumer stops), but the message must not be left
                # in flight until nsqd's timeout
                if not message.has_responded:
                    message.requeue(0.0, backoff=False)
                raise
            if self.on_failed is not None:
                self.on_failed(message)
            if message.has_responded:
                self.log.exception("handler failed after answering message %r", message)
                return False
            if isinstance(exc, DeadLetter):
                self.log.warning("handler gave up on message %r: %s", message, exc)
            elif self._last_attempt(message):
                self.log.exception(
                    "handler failed on message %r (attempt %d of %d)",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
            else:
                self.log.exception(
                    "handler failed on message %r (attempt %d); requeueing%s",
                    message,
                    message.attempts,
                    self.when_retried([message]),
                )
            self.requeue_or_give_up(message, exc)
            return False
        if message.is_async:
            return False
        if self.finish_many is None:
            message.finish()
            return False
        # An application thread may be answering it right now: the first answer wins; claimed,
        # it is finished with the worker's next batch.
        return message.claim(None)

    def when_retried(self, messages: list[Message]) -> str:
        """`` in 90 s`` (`` in 90-180 s`` for several): when a plain requeue() of ``messages``
        has nsqd deliver them again, for a log line; empty when unknown."""
        if self.requeue_delay is None or not messages:
            return ""
        delays = sorted({self.requeue_delay(m) for m in messages})
        low, high = delays[0], delays[-1]
        return f" in {low:g} s" if low == high else f" in {low:g}-{high:g} s"

    def _last_attempt(self, message: Message) -> bool:
        return 0 < self.max_attempts <= message.attempts

    def gives_up(self, message: Message, error: BaseException) -> bool:
        """True when :meth:`requeue_or_give_up` gives ``message`` up rather than requeue it."""
        return isinstance(error, DeadLetter) or self._last_attempt(message)

    def requeue_or_give_up(self, message: Message, error: BaseException) -> None:
        """The handler failed on ``message``: give it up after :class:`~nsq_sync.errors.DeadLetter`
        or on its last attempt, else requeue it with the delay policy and backoff."""
        if self.gives_up(message, error):
            self.give_up(message, error)
        else:
            message.requeue()

    def give_up(self, message: Message, error: BaseException | None = None) -> None:
        """Hand ``message`` to the give-up handler, then finish it (requeue it if the handler
        raised: nothing is lost). With a dead-letter topic, publish the envelope first, and only
        once nsqd acknowledged it run the handler and FIN (a failed publish requeues with backoff);
        a handler raising then is logged and the message still finished (no second envelope)."""
        if self.dead_letter is not None:
            self._dead_letter(message, error)
            return
        try:
            if self.giving_up is not None:
                self.giving_up(message)
            else:
                log_giving_up(message, self.log)
        except BaseException as exc:
            # The give-up handler failed: requeue rather than lose the message (and let what
            # ends the task end it: see ends_task).
            self.log.exception("giving_up handler failed for %r; requeueing it", message)
            if not message.has_responded:
                message.requeue(backoff=False)
            if ends_task(exc):
                raise
            return
        self.on_gave_up(message)
        if not message.has_responded:
            message.finish()

    def _dead_letter(self, message: Message, error: BaseException | None) -> None:
        assert self.dead_letter is not None
        if not self.dead_letter(message, error):
            return  # requeued with backoff (logged): given up again at its next delivery
        ending: BaseException | None = None
        if self.giving_up is not None:
            try:
                self.giving_up(message)
            except BaseException as exc:
                self.log.exception(
                    "giving_up handler failed for %r (it is in the dead-letter topic: "
                    "finishing it)",
                    message,
                )
                if ends_task(exc):
                    ending = exc
        self.on_gave_up(message)
        if not message.has_responded:
            message.finish()
        if ending is not None:
            raise ending
