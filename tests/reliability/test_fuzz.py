"""Fuzzing the connection-level handling with a scripted fake nsqd (tests/support/fake_nsqd.py).

The decoder alone is covered by tests/unit/protocol/test_properties.py. Here a real Consumer and a
real Producer talk to a loopback server that completes the handshake and then sends whatever
hypothesis scripted: valid messages, heartbeats, unsolicited responses, error frames, random
garbage, truncated frames, absurd frame sizes, unknown frame types, an HTTP reply. Then it closes.

The expected outcome is computed by feeding the same bytes to a :class:`FrameDecoder` (the
oracle: which event comes first, does decoding fail and with what). The properties:

* nothing hangs: every wait is bounded, and ``stop()``/``publish()`` return within their limits;
* no thread or greenlet dies with an unexpected exception (``threading.excepthook`` and gevent's
  ``Hub.handle_error`` are replaced by recorders);
* the fault surfaces: the consumer logs "connection lost: <the decoder's error>" (or that nsqd
  closed the connection), logs every error frame by its code, answers every heartbeat before the
  fault with NOP, and reconnects (the fake server sees a second SUB); the producer raises the
  error (or a PublishError whose ``reason`` is it) or, when the connection merely closed or the
  error is retriable, publishes on a fresh connection.

Plus, when atheris is installed, a short coverage-guided libFuzzer run over FrameDecoder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.fake_nsqd import EXPECT_NOP, FakeNsqd, frame, message_frame
from support.properties import examples

from nsq_sync import Consumer, Producer
from nsq_sync.errors import (
    ConnectionClosed,
    ConnectTimeout,
    NSQError,
    ProtocolError,
    PublishError,
    PublishOutcomeUnknown,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    error_from_frame,
)
from nsq_sync.protocol.decoder import FrameDecoder
from nsq_sync.protocol.events import ErrorFrame, Heartbeat, MessageFrame, Response

from .helpers import gevent_patched, wait_for

MAX_FRAME = 4096  # the clients' max_frame_size here, so that "oversized" is cheap to script
# Each example is a scripted server and a real client (~0.15 s): 40 under the thorough Hypothesis
# profile (CI's 3.11 envs, see tests/support/properties.py), 15 elsewhere; NSQ_SYNC_FUZZ_EXAMPLES
# overrides.
EXAMPLES = examples(ci=15, quick=15, thorough=40, override="NSQ_SYNC_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --------------------------------------------------------------------------- scripts

_CODES = [
    b"E_INVALID invalid command",
    b"E_BAD_TOPIC bad topic",
    b"E_PUB_FAILED pub failed",
    b"E_FIN_FAILED FIN failed",
    b"E_REQ_FAILED REQ failed",
    b"E_TOUCH_FAILED TOUCH failed",
    b"E_MADE_UP something new",
]

_ids = iter(range(10**9))


def _message(body: bytes, attempts: int) -> bytes:
    return message_frame(b"%016d" % next(_ids), b"fz-" + body, attempts)


elements = st.one_of(
    st.builds(_message, st.binary(max_size=40), st.integers(1, 3)).map(lambda b: ("message", b)),
    st.just(("heartbeat", frame(0, b"_heartbeat_"))),
    st.binary(max_size=24).map(lambda d: ("response", frame(0, d))),  # unsolicited/out of order
    st.sampled_from(_CODES).map(lambda d: ("error", frame(1, d))),
    st.binary(min_size=1, max_size=64).map(lambda b: ("garbage", b)),
    st.tuples(st.integers(10, 300), st.sampled_from([0, 1, 2]), st.binary(max_size=5)).map(
        lambda t: ("truncated", struct.pack(">ll", t[0], t[1]) + t[2])
    ),
    st.integers(MAX_FRAME + 1, 2**31 - 1).map(lambda s: ("oversized", struct.pack(">ll", s, 0))),
    st.integers(-(2**31), 3).map(lambda s: ("bad size", struct.pack(">ll", s, 0))),
    st.tuples(st.integers(3, 2**31 - 1) | st.integers(-(2**31), -1), st.binary(max_size=8)).map(
        lambda t: ("unknown type", frame(t[0], t[1]))
    ),
    st.just(("http", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")),
    st.binary(max_size=25).map(lambda d: ("short message", frame(2, d))),
)
scripts = st.lists(elements, min_size=1, max_size=6)


def _script(parts: list[tuple[str, bytes]]) -> bytes:
    return b"".join(data for _, data in parts)


def _consumer_script(parts: list[tuple[str, bytes]]) -> list[Any]:
    """The parts, with the server waiting for the NOP after every heartbeat the client can
    decode (one swallowed by an incomplete frame before it is never seen as a heartbeat)."""
    decoder = FrameDecoder(MAX_FRAME)
    script: list[Any] = []
    for _, data in parts:
        script.append(data)
        decoder.receive_data(data)
        try:
            if any(type(event) is Heartbeat for event in decoder.events()):
                script.append(EXPECT_NOP)
        except ProtocolError:
            break  # the client closes here; nothing after this is read
    return script


@dataclass
class Expected:
    """What the client should make of a script, per the decoder."""

    error: BaseException | None = None  # the decoder's exception, if decoding fails
    heartbeats: int = 0  # heartbeats decoded before the fault
    codes: list[str] = field(default_factory=list)  # error frames decoded before the fault
    bodies: list[bytes] = field(default_factory=list)  # messages decoded before the fault
    # For a publisher: the first event that answers the publish (heartbeats are answered with
    # NOP and non-fatal errors answer no request: both are skipped); None if the stream ends
    # first. ``error`` then only counts if decoding fails before that event.
    answer: Any = None


def oracle(script: bytes) -> Expected:
    decoder = FrameDecoder(MAX_FRAME)
    decoder.receive_data(script)
    expected = Expected()
    try:
        for event in decoder.events():
            if type(event) is Heartbeat:
                expected.heartbeats += 1
                continue
            if type(event) is ErrorFrame:
                expected.codes.append(event.code)
            elif type(event) is MessageFrame:
                expected.bodies.append(event.body)
            if expected.answer is None and not (
                type(event) is ErrorFrame and not event.to_exception().fatal
            ):
                expected.answer = event
    except ProtocolError as exc:
        expected.error = exc
    return expected


# --------------------------------------------------------------------------- watchers


@contextlib.contextmanager
def crash_recorder() -> Iterator[list[Any]]:
    """Record exceptions that end a thread (threading.excepthook) or a greenlet (the gevent
    hub's handle_error) instead of letting them print and vanish."""
    crashes: list[Any] = []
    previous = threading.excepthook

    def hook(args: Any) -> None:
        crashes.append((args.thread, args.exc_value))

    threading.excepthook = hook
    hub = None
    if gevent_patched():
        import gevent

        hub = gevent.get_hub()

        def handle_error(context: Any, type_: Any, value: Any, tb: Any) -> None:
            crashes.append((context, value))

        hub.handle_error = handle_error
    try:
        yield crashes
    finally:
        threading.excepthook = previous
        if hub is not None:
            del hub.handle_error  # back to the class's method


class LogRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.records.append(record)

    def messages(self, level: int = logging.WARNING) -> list[str]:
        with self._lock:
            return [r.getMessage() for r in self.records if r.levelno >= level]


@contextlib.contextmanager
def nsq_logs() -> Iterator[LogRecorder]:
    logger = logging.getLogger("nsq_sync")
    recorder = LogRecorder()
    previous = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(previous)


# --------------------------------------------------------------------------- consumer


@FUZZ
@given(parts=scripts)
@example(parts=[("garbage", b"\x00\x00\x00\x01\x00\x00\x00\x00")])
@example(parts=[("oversized", struct.pack(">ll", 2**31 - 1, 0))])
@example(parts=[("http", b"HTTP/1.1 400 Bad Request\r\n\r\n")])
@example(parts=[("unknown type", frame(7, b"x"))])
@example(parts=[("heartbeat", frame(0, b"_heartbeat_")), ("truncated", b"\x00\x00\x00\x20\x00")])
@example(parts=[("error", frame(1, b"E_INVALID nope")), ("response", frame(0, b"OK"))])
@example(parts=[("message", _message(b"a", 1)), ("short message", frame(2, b"short"))])
def test_consumer_survives_a_scripted_nsqd(parts: list[tuple[str, bytes]]) -> None:
    script = _consumer_script(parts)
    expected = oracle(_script(parts))
    handled: list[bytes] = []
    lock = threading.Lock()

    def handler(message: Any) -> None:
        with lock:
            handled.append(message.body)

    with crash_recorder() as crashes, nsq_logs() as logs:
        with FakeNsqd(lambda i: script if i == 0 else None, mode="consumer") as fake:
            consumer = Consumer(
                "fuzz",
                "ch",
                handler,
                nsqd_tcp_addresses=fake.address,
                max_in_flight=10,
                concurrency=2,
                max_frame_size=MAX_FRAME,
                reconnect_backoff_max=0.2,
            )
            consumer.start()
            try:
                wait_for(lambda: fake.subscribed >= 2, f"a reconnect after {parts!r}", 10.0)
                first = fake.connections[0]
                wait_for(first.closed.is_set, "the scripted connection closed", 10.0)
            finally:
                t0 = time.monotonic()
                consumer.stop(timeout=5.0)
                stop_s = time.monotonic() - t0
        assert fake.errors == []

    assert stop_s < 6.0, f"stop() took {stop_s:.1f} s"
    assert crashes == [], crashes
    warnings = logs.messages()
    # The fault is reported: the decoder's error, or the close.
    if expected.error is not None:
        wanted = f"connection lost: {expected.error}"
    else:
        wanted = "connection lost: nsqd closed the connection"
    assert any(wanted in m for m in warnings), (wanted, warnings)
    # Every error frame before the fault is logged by its code.
    for code in expected.codes:
        assert any(f": {code}" in m for m in warnings), (code, warnings)
    # Every heartbeat before the fault was answered (the server waited for each NOP).
    assert first.count(b"NOP") == expected.heartbeats
    # The handler only ever saw messages that were sent.
    assert set(handled) <= set(expected.bodies)


# --------------------------------------------------------------------------- producer


@FUZZ
@given(parts=scripts)
@example(parts=[("response", frame(0, b"OK"))])
@example(parts=[("response", frame(0, b"NOT OK"))])
@example(parts=[("error", frame(1, b"E_PUB_FAILED later"))])
@example(parts=[("error", frame(1, b"E_BAD_TOPIC no")), ("response", frame(0, b"OK"))])
@example(parts=[("error", frame(1, b"E_FIN_FAILED late")), ("response", frame(0, b"OK"))])
@example(parts=[("message", _message(b"a", 1))])
@example(parts=[("truncated", b"\x00\x00\x00\x20\x00")])
def test_producer_survives_a_scripted_nsqd(parts: list[tuple[str, bytes]]) -> None:
    script = _script(parts)
    expected = oracle(script)
    first = expected.answer
    publish_timeout = 3.0
    with crash_recorder() as crashes, nsq_logs():
        with FakeNsqd(lambda i: script if i == 0 else None, mode="producer") as fake:
            producer = Producer(
                fake.address, publish_timeout=publish_timeout, max_frame_size=MAX_FRAME
            )
            outcome: BaseException | None = None
            t0 = time.monotonic()
            try:
                producer.publish("fuzz", b"payload")
            except NSQError as exc:
                outcome = exc
            took = time.monotonic() - t0
            producer.close()
        assert fake.errors == []
    assert crashes == [], crashes
    assert took < publish_timeout + 1.0, f"publish took {took:.1f} s"

    if type(first) is Response and first.data == b"OK":
        assert outcome is None  # answered on the scripted connection
    elif type(first) is ErrorFrame and first.to_exception().retriable:
        assert outcome is None and fake.published == [b"payload"]  # retried on a fresh one
    elif type(first) is ErrorFrame:
        error = error_from_frame(first.data)
        assert type(outcome) is type(error) and isinstance(outcome, ServerError), outcome
        assert str(outcome) == str(error)
    elif type(first) in (Response, MessageFrame):
        # A message, or a response other than OK, answering a publish: the stream is out of
        # step with our requests. Reported as a protocol error, without retrying the address.
        assert isinstance(outcome, PublishError), outcome
        assert isinstance(outcome.reason, RemoteProtocolError), outcome.reason
    elif expected.error is not None:
        assert isinstance(outcome, PublishError), outcome
        assert type(outcome.reason) is type(expected.error), outcome.reason
        assert str(outcome.reason) == str(expected.error)
    else:
        # The connection closed before an answer (the script ended mid-frame or before one):
        # the outcome is unknown, so the producer says so and does not publish it again.
        assert first is None
        assert isinstance(outcome, PublishOutcomeUnknown), outcome
        assert fake.published == [], fake.published


def _publish_to_fake(
    script: Any, publish_timeout: float, retry_unknown: bool = False
) -> tuple[PublishError, float, FakeNsqd]:
    """Publish once through a FakeNsqd playing ``script`` on every connection; return the
    PublishError raised, how long publish took, and the fake (for its connections)."""
    # (not one parenthesised "with": Python 3.9 does not officially support that syntax)
    with FakeNsqd(lambda i: script, mode="producer") as fake:
        producer = Producer(
            fake.address, publish_timeout=publish_timeout, retry_unknown=retry_unknown
        )
        t0 = time.monotonic()
        try:
            with pytest.raises(PublishError) as info:
                producer.publish("fuzz", b"payload")
        finally:
            t1 = fake.returned_at = time.monotonic()
            producer.close()
        closing = time.monotonic() - t1
        # close() has nothing in progress to wait for: it must not add to the bound (a 12 s
        # case seen once in CI did not say which of the two took the time)
        assert closing < 1.5, f"close() took {closing:.2f} s after publish took {t1 - t0:.2f} s"
        return info.value, t1 - t0, fake


def _when(took: float, fake: FakeNsqd) -> str:
    """Where a publish's time went, for an assertion's message: when the fake accepted its
    first and last connections, counted back from when publish returned."""
    conns = fake.connections
    if not conns:
        return f"{took:.2f} s, no connection"
    end = fake.returned_at
    assert end is not None
    return (
        f"{took:.2f} s over {len(conns)} connections: the first accepted "
        f"{took - (end - conns[0].accepted_at):.2f} s after publish began, the last "
        f"{end - conns[-1].accepted_at:.2f} s before it returned"
    )


_ISOLATED = "NSQ_SYNC_TEST_ISOLATED"
_RUN_GEVENT = Path(__file__).resolve().parents[1] / "run_gevent.py"


def _in_a_fresh_gevent_process(test: str) -> None:
    """Run ``test`` (a test of this module, with its parameters) in a new process under
    gevent's monkey patching; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, str(_RUN_GEVENT), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"{__file__}::{test}"],
        env={**os.environ, _ISOLATED: "1"},
        capture_output=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout.decode()[-3000:]


@pytest.mark.parametrize("retry_unknown", [False, True])
def test_producer_reports_a_stream_closed_before_any_answer(retry_unknown: bool) -> None:
    """With a single nsqd that keeps closing the connection after PUB, publish raises
    PublishOutcomeUnknown about the closed connection within publish_timeout (it never hangs):
    at once by default (never resent), after resending it on fresh connections until the
    deadline with retry_unknown=True (then the last cause may also be the deadline cutting
    the last fresh attempt short)."""
    if "gevent.monkey" in sys.modules and not os.environ.get(_ISOLATED):
        # Under gevent a deadline is only as punctual as the process's other greenlets let it
        # be: late in a full gevent run this case took 3.8 s (py313) and 26 s (PyPy) for a 1 s
        # timeout, while alone it takes ~1.1 s (20 runs next to 3 busy processes). Something
        # an earlier test leaves running slows the hub (an open question): the timing is
        # checked in a fresh gevent process of its own.
        node = test_producer_reports_a_stream_closed_before_any_answer.__name__
        _in_a_fresh_gevent_process(f"{node}[{retry_unknown}]")
        return
    error, took, fake = _publish_to_fake(b"", publish_timeout=1.0, retry_unknown=retry_unknown)
    assert took < 2.5, _when(took, fake)
    assert isinstance(error, PublishOutcomeUnknown), error
    if retry_unknown:
        # The last cause: the connection closed again, or the deadline cut the last fresh
        # attempt short (its handshake's read: what a slow interpreter such as PyPy meets).
        assert isinstance(error.reason, (ConnectionClosed, ReadTimeout, ConnectTimeout)), (
            error.reason
        )
        assert len(fake.connections) >= 2, "it resent on fresh connections until the deadline"
    else:
        assert isinstance(error.reason, ConnectionClosed), error.reason
        assert len(fake.connections) == 1, "it resent a PUB whose outcome was unknown"


def test_gevent_publish_deadline_covers_name_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """gevent.socket.create_connection resolves every host (an IP literal too) on the hub's
    thread pool, and its timeout covers only connect(): a resolution that waited for a worker
    thread held a publish past its deadline (4.31 s for a 1 s timeout in CI). A resolver that
    takes 3 s must cost nothing for an IP literal and at most the deadline for a name."""
    if "gevent.monkey" not in sys.modules:  # the threads envs check the gevent runtime too
        _in_a_fresh_gevent_process(test_gevent_publish_deadline_covers_name_resolution.__name__)
        return
    import gevent

    def slow_getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        gevent.sleep(3.0)
        raise OSError("the slow resolver gave up")

    monkeypatch.setattr(gevent.get_hub().resolver, "getaddrinfo", slow_getaddrinfo)
    error, took, fake = _publish_to_fake(b"", publish_timeout=1.0, retry_unknown=True)
    assert took < 2.5, _when(took, fake)
    assert len(fake.connections) >= 2, "an IP literal is dialled without the resolver"
    with FakeNsqd(lambda i: None, mode="producer") as fake:
        port = fake.address.rsplit(":", 1)[1]
        producer = Producer(f"localhost:{port}", publish_timeout=0.5)
        t0 = time.monotonic()
        try:
            with pytest.raises(PublishError) as info:
                producer.publish("fuzz", b"payload")
            took = time.monotonic() - t0
        finally:
            producer.close()
    assert took < 1.5, f"publish took {took:.2f} s"
    assert isinstance(info.value.reason, ConnectTimeout), info.value.reason


def test_producer_times_out_on_an_nsqd_that_never_answers() -> None:
    """nsqd accepts the PUB and says nothing (the fake waits for a NOP that a producer never
    sends): the read times out (SO_RCVTIMEO under threads, gevent's timer under gevent) and
    publish raises within publish_timeout instead of waiting for the fake to give up."""
    error, took, _ = _publish_to_fake([EXPECT_NOP], publish_timeout=0.5)
    assert isinstance(error.reason, ReadTimeout), error.reason
    assert took < 3.0, f"publish took {took:.1f} s"  # the fake would have closed after 5 s


# --------------------------------------------------------------------------- atheris

ATHERIS_SCRIPT = textwrap.dedent(
    """
    import sys

    import atheris

    with atheris.instrument_imports():
        from nsq_sync.errors import ProtocolError
        from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        decoder = FrameDecoder(fdp.ConsumeIntInRange(1024, 1 << 20))
        try:
            while fdp.remaining_bytes():
                chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 64))
                decoder.receive_data(chunk)
                for _ in decoder.events():
                    pass
            decoder.receive_data(b"")
            event = decoder.next_event()
            assert event is EOF or event is NEED_DATA or event is not None
        except ProtocolError:
            pass  # the only exception garbage may raise

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
    """
)


@pytest.mark.slow  # ~20 s of fuzzing: once per CI run, on 3.11 (atheris has no 3.9/3.10 wheel)
def test_atheris_frame_decoder(tmp_path: Any, record_property: Any) -> None:
    """A bounded coverage-guided run (libFuzzer via atheris) over FrameDecoder: any exception
    other than ProtocolError is a crash and fails the test."""
    pytest.importorskip("atheris")
    runs = int(os.environ.get("NSQ_SYNC_ATHERIS_RUNS", "20000"))
    script = tmp_path / "fuzz_decoder.py"
    script.write_text(ATHERIS_SCRIPT)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), f"-runs={runs}", "-max_len=512", "-seed=6"],
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )
    record_property("atheris_runs", runs)
    record_property("atheris_s", round(time.monotonic() - t0, 1))
    output = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, output[-4000:]
    assert f"Done {runs} runs" in output, output[-2000:]
