"""Forks from C (issue 24): libc's ``fork()`` called through ``ctypes.PyDLL``, which keeps the GIL
held across the call as uWSGI's master does when it forks its workers. None of Python's fork
hooks run in such a child (no ``os.register_at_fork`` callback, no ``PyOS_AfterFork_Child``), so
nsq_sync must notice the fork by itself; these tests keep that guarantee tested where uWSGI is
not installed (tests/contrib/test_uwsgi.py runs the real thing).

Under gevent a fork that gevent did not make needs ``gevent.reinit()`` in the child (gevent's
documented rule; uWSGI's gevent loop starts its hub in the worker); the children below call it
first, and nothing else: nsq_sync's own state is left to nsq_sync.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.forking import (
    CHILD_TIMEOUT,
    PER_THREAD,
    THREADS,
    Child,
    check_bodies,
    check_results,
    publish_from_threads,
    publishing_child,
    wait_for_connections,
)
from support.nsq import settled_channel, wait_for

from nsq_sync import Consumer, Message, NsqdHTTPClient, Producer
from nsq_sync import message as message_module
from nsq_sync import process as fork_state
from nsq_sync.errors import Stopped
from nsq_sync.testing import NsqdProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() does not exist on Windows"),
]

ROUNDS = 3  # x 2 children: before issue 24, about one child in three hit errors


def libc_fork() -> int:
    """libc's fork(), holding the GIL, running no Python fork hook in the child. Under gevent the
    parent watches the child (gevent reaps every child on SIGCHLD: waitpid() on one it does not
    watch fails) and the child re-initialises gevent's hub, as gevent requires."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        import gevent.os

        pid = gevent.os.fork_and_watch(fork=_raw_libc_fork)
        if pid == 0:
            gevent.reinit()
        return pid  # type: ignore[no-any-return]
    return _raw_libc_fork()


def _raw_libc_fork() -> int:
    # CPython: PyDLL keeps the GIL across the call, as uWSGI's master does. PyPy has no PyDLL;
    # its CDLL releases the GIL around the call, and it has no hook-free fork of its own.
    dll = getattr(ctypes, "PyDLL", None) or ctypes.CDLL
    libc = dll(None, use_errno=True)
    libc.fork.restype = ctypes.c_int
    with warnings.catch_warnings(), _no_record_being_written():
        warnings.simplefilter("ignore", DeprecationWarning)  # see tests/support/forking.py
        pid = int(libc.fork())
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork() failed")
    return pid


@contextlib.contextmanager
def _no_record_being_written() -> Iterator[None]:
    """Hold every logging handler's lock across the fork, as the logging module's own at-fork
    hooks do for os.fork() and nothing does for a fork from C. Without it a parent's thread
    caught writing a record (a Consumer logs "connected" just after wait_connected() returns)
    leaves the child its handler's lock, or the stream's, held forever: the child blocks at its
    first write to stderr, before it can report. That is a hazard of forking a process whose
    threads log (uWSGI's advice for such apps is --lazy-apps), not what these tests check: the
    handlers' locks are released in both processes after the fork."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
    held: list[logging.Handler] = []
    try:
        for handler in handlers:
            handler.acquire()
            held.append(handler)
        yield
    finally:
        for handler in reversed(held):
            handler.release()


def counting_pool(producer: Producer) -> list[int]:
    """Count the connection pools ``producer`` builds (one per process, built by the fork reset
    in a child); returns the list the count goes into, one entry (a pid) per build."""
    built: list[int] = []
    factory = producer._pool._factory

    def build() -> Any:
        built.append(os.getpid())
        return factory()

    producer._pool._factory = build
    return built


def test_c_fork_children_publish_from_eight_threads(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: none. 3 rounds: the parent publishes (its connection is live at the fork),
    then forks 2 children from C, whose 8 threads start at once and publish 5 bodies each.
    While the children live, nsqd lists one connection per process (before issue 24: the
    children shared the parent's); every acknowledged body is held once; each child reset its
    state once, however many of its threads noticed the fork."""
    server: NsqdProcess = nsqd_factory()
    attempted: set[str] = set()
    results: list[dict[str, Any]] = []
    with Producer(server.tcp_address) as producer:
        built = counting_pool(producer)
        for r in range(ROUNDS):
            parent_body = f"parent-r{r}"
            producer.publish(nsq_topic, parent_body.encode())
            attempted.add(parent_body)
            results.append({"ok": [parent_body], "errors": [], "hung": 0})
            at_fork = fork_state.generation
            children = [
                publishing_child(
                    producer,
                    nsq_topic,
                    f"r{r}-c{c}",
                    attempted,
                    fork=libc_fork,
                    report=lambda at_fork=at_fork: {
                        "resets": fork_state.generation - at_fork,
                        "pools_built_here": built.count(os.getpid()),
                    },
                )
                for c in range(2)
            ]
            round_results = [child.result() for child in children]
            wait_for_connections(server, nsq_topic, 3)  # the parent's and one per child
            assert [child.finish() for child in children] == [0, 0]
            for result in round_results:
                assert result["resets"] == 1 and result["pools_built_here"] == 1, result
            results += round_results
            # the parent's connection survived (no child shut it down) and was never rebuilt
            assert producer._slots[0].conn is not None and not producer._slots[0].conn.closed
            assert fork_state.generation == at_fork
    acked, errors = check_results(results)
    check_bodies(server, nsq_topic, acked, attempted)
    assert not errors, errors[:5]
    assert len(acked) == ROUNDS * (1 + 2 * THREADS * PER_THREAD)


def test_c_fork_http_client_child_threads_share_one_new_session(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """nsqd flags: none. An NsqdHTTPClient with a pooled keep-alive connection in the parent,
    then 8 threads of a C-forked child publishing through it at once: the child makes one
    session of its own, never uses the parent's, and every body lands once."""
    server: NsqdProcess = nsqd_factory()
    client = NsqdHTTPClient(server.http_address)
    client.pub(nsq_topic, b"parent")
    parent_session = client._current_session()

    def work() -> dict[str, Any]:
        sessions: set[int] = set()

        def publish(body: bytes) -> None:
            client.pub(nsq_topic, body)
            sessions.add(id(client._current_session()))

        result = publish_from_threads(publish, nsq_topic, "http-c")
        result["sessions"] = len(sessions)
        result["parent_session"] = id(parent_session) in sessions
        return result

    child = Child(work, client.close, fork=libc_fork)
    result = child.result()
    assert child.finish() == 0
    assert result["sessions"] == 1 and not result["parent_session"], result
    client.pub(nsq_topic, b"parent again")
    assert client._current_session() is parent_session
    client.close()
    acked, errors = check_results([result])
    attempted = {"parent", "parent again"} | {
        f"http-c-t{t}-{i}" for t in range(THREADS) for i in range(PER_THREAD)
    }
    check_bodies(server, nsq_topic, acked + ["parent", "parent again"], attempted)
    assert not errors, errors[:5]


@pytest.mark.skipif(
    platform.python_implementation() == "PyPy",
    reason="PyPy has no ctypes.PyDLL: its fork() through ctypes releases the GIL, and with the "
    "consumer's threads running the child can wake up with the GIL held by a thread that does "
    "not exist there (a hang of the test's fork, not of nsq_sync; uWSGI forks CPython only)",
)
def test_c_fork_started_consumer_raises_naming_the_fix(nsqd_factory: Any, nsq_topic: str) -> None:
    """nsqd flags: none. A Consumer started before a fork from C, while one of its threads holds
    the connection set's lock (a reader counting messages, the RDY timer): in the child, start(),
    run() and stop() raise Stopped naming the fix, as after os.fork(), before anything waits on
    that lock (run() used to read stats() first and hang there); its copied connections are
    closed there; the parent's consumer goes on consuming."""
    server: NsqdProcess = nsqd_factory()
    got: list[bytes] = []
    consumer = Consumer(
        nsq_topic, "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[server.tcp_address]
    )
    consumer.start()
    try:
        assert consumer.wait_connected(15.0)

        def work() -> dict[str, Any]:
            messages = []
            for call in (consumer.start, consumer.run, consumer.stop):
                try:
                    call()
                except Stopped as exc:
                    messages.append(str(exc))
            conns = list(consumer._connections.conns.values())
            return {"messages": messages, "open": sum(not c.closed for c in conns)}

        # one of the consumer's threads, caught holding the lock
        child = _fork_while_held(consumer._connections.lock, work)
        result = child.result()
        assert child.finish() == 0
        assert len(result["messages"]) == 3, result
        assert all("new Consumer" in m for m in result["messages"]), result
        assert result["open"] == 0, result
        with Producer(server.tcp_address) as producer:
            producer.publish(nsq_topic, b"after the child")
        wait_for(lambda: b"after the child" in got, "the parent's consumer still consuming")
    finally:
        assert consumer.stop(10.0)


def _fork_while_held(lock: Any, work: Callable[[], dict[str, Any]]) -> Child:
    """Fork from C while another thread of this process holds ``lock``; the child runs
    ``work``."""
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        with lock:
            held.set()
            release.wait(CHILD_TIMEOUT)

    holder = threading.Thread(target=holding)
    holder.start()
    try:
        assert held.wait(10.0)
        return Child(work, lambda: None, fork=libc_fork)
    finally:
        release.set()
        holder.join(10.0)


def test_c_fork_consumer_made_in_the_child_answers_while_the_parent_held_the_claim_lock(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """nsqd flags: none. A parent's thread holds the lock that decides a message's first answer
    at the moment of a fork from C (a worker's FIN racing an application thread's). A Consumer
    made in the child consumes and finishes messages (the inherited lock is never used there),
    and nsqd ends with none in flight."""
    server: NsqdProcess = nsqd_factory()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(nsq_topic, [b"m%d" % i for i in range(10)])
    fork_state.install()  # what a Producer or a started Consumer does

    def work() -> dict[str, Any]:
        got: list[bytes] = []

        def handle(message: Message) -> None:
            got.append(message.body)

        consumer = Consumer(nsq_topic, "c", handle, nsqd_tcp_addresses=[server.tcp_address])
        summary = consumer.run(timeout=CHILD_TIMEOUT, max_messages=10)
        return {"got": len(got), "finished": summary.finished, "reason": summary.reason}

    # the parent's thread caught answering a message at the fork
    child = _fork_while_held(message_module.claim_lock, work)
    result = child.result()
    assert child.finish() == 0
    assert result == {"got": 10, "finished": 10, "reason": "max_messages"}, result
    with NsqdHTTPClient(server.http_address) as client:
        # nsqd reads the child's last FINs (then its close) a moment after the child exited
        channel = settled_channel(client, nsq_topic, "c")
    assert (channel["depth"], channel["in_flight_count"]) == (0, 0), channel
