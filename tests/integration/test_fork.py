"""Fork safety under the worker models users run (issue 19): a Producer (and an HTTP client) made
before a fork and then used by several threads of each child at once.

Every test counts by message body against a real nsqd: every publish returns OK or raises an
NSQError, nsqd holds every acknowledged body exactly once and nothing else, and while the
processes are alive nsqd's /stats shows one producer connection per process.

The forked children and the checks are in tests/support/forking.py (which says why the tests
silence Python 3.12's fork DeprecationWarning); tests/integration/test_fork_c.py forks from C,
where none of Python's fork hooks run (as uWSGI does).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support.forking import (
    CHILD_TIMEOUT,
    PER_THREAD,
    THREADS,
    Child,
    check_bodies,
    check_results,
    os_fork,
    publish_from_threads,
    publishing_child,
    wait_for_connections,
)
from support.nsq import free_closed_port, read_bodies, wait_for, waitpid

from nsq_sync import Consumer, Message, NsqdHTTPClient, Producer
from nsq_sync.errors import NSQError, Stopped
from nsq_sync.testing import NsqdProcess

pytestmark = pytest.mark.integration

ROUNDS = 10  # x CHILDREN = the forks of the bare-fork test (50)
CHILDREN = 5


# ------------------------------------------------------------------ bare os.fork(), 50 children


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_bare_fork_children_publish_from_eight_threads(
    nsqd_factory: Any, nsq_topic: str, record_property: Any
) -> None:
    """nsqd flags: none (a fresh nsqd). 10 rounds: the parent publishes (so its connection is
    live at the fork), forks 5 children, and in each child 8 threads start at once and publish
    5 bodies each."""
    server: NsqdProcess = nsqd_factory()
    attempted: set[str] = set()
    results: list[dict[str, Any]] = []
    forks = 0
    with Producer(server.tcp_address) as producer:
        for r in range(ROUNDS):
            parent_body = f"parent-r{r}"
            producer.publish(nsq_topic, parent_body.encode())
            attempted.add(parent_body)
            results.append({"ok": [parent_body], "errors": [], "hung": 0})
            children = []
            for c in range(CHILDREN):
                prefix = f"r{r}-c{c}"
                children.append(publishing_child(producer, nsq_topic, prefix, attempted))
                forks += 1
            round_results = [child.result() for child in children]
            # One connection per process: the parent's and one per child (not shared, not two;
            # the last round's children may still be leaving nsqd's /stats).
            connections = wait_for_connections(server, nsq_topic, 1 + CHILDREN)
            exit_codes = [child.finish() for child in children]
            assert exit_codes == [0] * CHILDREN
            assert connections == 1 + CHILDREN
            results += round_results
            # the parent's connection survived every child (it was never shut down by one)
            assert producer._slots[0].conn is not None and not producer._slots[0].conn.closed
    acked, errors = check_results(results)
    held = check_bodies(server, nsq_topic, acked, attempted)
    record_property("fork_children", forks)
    record_property("fork_acked", len(acked))
    record_property("fork_errors", len(errors))
    print(
        f"bare fork: {forks} children x {THREADS} threads: {len(acked)} acked, "
        f"{len(errors)} errors, {sum(held.values())} held by nsqd, 0 duplicates"
    )
    assert forks >= 50
    assert not errors, errors[:5]


# ------------------------------------------------------------------ the parent keeps publishing


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_fork_while_the_parent_publishes_on_other_threads(
    nsqd_factory: Any, nsq_topic: str, runtime_mode: str
) -> None:
    """nsqd flags: none. The parent publishes from 4 threads without pause while it forks 5
    children one after another; each child publishes from 8 threads at once.

    Under gevent the 4 "threads" are greenlets, and fork() copies them into each child, where
    the ones waiting for nsqd's answer resume: their sockets are closed in the child, so each
    copied publish raises an NSQError there (it goes on in the parent) and no copy opens a
    connection (nsqd still lists one per process). The child then stops its copies (they are
    the test's, not the library's) before they start new publishes."""
    server: NsqdProcess = nsqd_factory()
    lock = threading.Lock()
    parent_ok: list[str] = []
    parent_errors: list[str] = []
    attempted: set[str] = set()
    stop = threading.Event()
    with Producer(server.tcp_address) as producer:

        def parent_loop(n: int) -> None:
            i = 0
            while not stop.is_set():
                body = f"parent-{n}-{i}"
                i += 1
                with lock:
                    attempted.add(body)
                try:
                    producer.publish(nsq_topic, body.encode())
                except NSQError as exc:
                    with lock:
                        parent_errors.append(repr(exc))
                except BaseException as exc:
                    with lock:
                        parent_errors.append(f"NOT AN NSQError: {exc!r}")
                else:
                    with lock:
                        parent_ok.append(body)

        threads = [threading.Thread(target=parent_loop, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        children = []
        try:
            wait_for(lambda: len(parent_ok) >= 100, "the parent publishing")
            for c in range(5):
                prefix = f"c{c}"
                children.append(
                    child_of_a_busy_parent(
                        producer, nsq_topic, prefix, attempted, stop, parent_errors
                    )
                )
                at = len(parent_ok)
                wait_for(lambda at=at: len(parent_ok) >= at + 20, "the parent still publishing")
            results = [child.result() for child in children]
            wait_for_connections(server, nsq_topic, 1 + len(children))
        finally:
            stop.set()
            for thread in threads:
                thread.join(30.0)
            codes = [child.finish() for child in children]
        assert codes == [0] * len(children)
    copies = [e for r in results for e in r.pop("copied_errors")]
    bad = [e for e in copies if e.startswith("NOT AN NSQError")]
    assert not bad, bad[:5]  # a parent's publish copied into a child raised an NSQError there
    if runtime_mode == "threads":
        assert not copies  # threads do not survive a fork
    acked, errors = check_results(results + [{"ok": parent_ok, "errors": parent_errors, "hung": 0}])
    check_bodies(server, nsq_topic, acked, attempted)
    assert not errors, errors[:5]
    print(
        f"busy parent: {len(parent_ok)} parent publishes, 5 children, "
        f"{len(copies)} parent publishes copied into children failed there with an NSQError"
    )


def child_of_a_busy_parent(
    producer: Producer,
    topic: str,
    prefix: str,
    attempted: set[str],
    stop: threading.Event,
    parent_errors: list[str],
) -> Child:
    """:func:`publishing_child` for a parent whose publishing threads loop until ``stop`` and
    record their errors in ``parent_errors``: the child first stops its copies of those threads
    (gevent copies greenlets; the child runs before they do) and reports what they raised in
    the child."""
    attempted.update(f"{prefix}-t{t}-{i}" for t in range(THREADS) for i in range(PER_THREAD))

    def work() -> dict[str, Any]:
        at_fork = len(parent_errors)  # nothing else ran in the child yet
        stop.set()  # (this process's copy of the event)
        result = publish_from_threads(producer, topic, prefix)
        result["copied_errors"] = parent_errors[at_fork:]
        return result

    return Child(work, producer.close)


# ------------------------------------------------------------------ multiprocessing pool

_POOL_PRODUCER: Producer | None = None
_POOL_TOPIC = ""


def _pool_task(task: int) -> dict[str, Any]:
    assert _POOL_PRODUCER is not None  # inherited through fork
    return publish_from_threads(_POOL_PRODUCER, _POOL_TOPIC, f"task{task}", threads=4)


def _process_worker(tasks: list[int], results: Any, go: Any) -> None:
    results.send([_pool_task(task) for task in tasks])
    results.close()
    go.wait(CHILD_TIMEOUT)  # alive (its connection listed by nsqd) until the parent looked


def _run_in_processes(context: Any, server: NsqdProcess, topic: str) -> list[dict[str, Any]]:
    """The pool's 12 tasks on 3 fork-start multiprocessing Processes (4 each)."""
    go = context.Event()
    workers = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
        for w in range(3):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_process_worker, args=(list(range(w, 12, 3)), send, go)
            )
            process.start()
            send.close()
            workers.append((process, receive))
    results: list[dict[str, Any]] = []
    try:
        for process, receive in workers:
            assert receive.poll(CHILD_TIMEOUT), f"no results from worker {process.pid}"
            results += receive.recv()
            receive.close()
        wait_for_connections(server, topic, 1 + len(workers))
    finally:
        go.set()
        for process, _ in workers:
            process.join(CHILD_TIMEOUT)
    assert [process.exitcode for process, _ in workers] == [0, 0, 0]
    return results


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_multiprocessing_fork_pool_tasks_publish_from_threads(
    nsqd_factory: Any, nsq_topic: str, runtime_mode: str
) -> None:
    """nsqd flags: none. A Producer made (and connected) in the parent; a 3-process pool with
    the fork start method runs 12 tasks, each publishing from 4 threads at once.

    Under gevent ``multiprocessing.Pool`` itself hangs (a pool mapping ``os.getpid`` over 12
    items, with no nsq_sync involved, never returns under ``monkey.patch_all()``: its
    result-handler thread, a greenlet there, blocks the hub in a non-cooperative pipe read), so
    there 3 fork-start ``multiprocessing.Process`` workers run the same 12 tasks."""
    global _POOL_PRODUCER, _POOL_TOPIC
    server: NsqdProcess = nsqd_factory()
    _POOL_TOPIC = nsq_topic
    _POOL_PRODUCER = producer = Producer(server.tcp_address)
    try:
        producer.publish(nsq_topic, b"parent")
        context = multiprocessing.get_context("fork")
        if runtime_mode == "gevent":
            results = _run_in_processes(context, server, nsq_topic)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
                pool = context.Pool(3)
            try:
                results = pool.map(_pool_task, range(12), chunksize=1)
                pids = {r["pid"] for r in results}
                # the parent's connection, and one per worker process that ran a task
                wait_for_connections(server, nsq_topic, 1 + len(pids))
            finally:
                pool.close()
                pool.join()
    finally:
        producer.close()
        _POOL_PRODUCER = None
    attempted = {"parent"} | {
        f"task{k}-t{t}-{i}" for k in range(12) for t in range(4) for i in range(5)
    }
    acked, errors = check_results(results + [{"ok": ["parent"], "errors": [], "hung": 0}])
    check_bodies(server, nsq_topic, acked, attempted)
    assert not errors, errors[:5]
    assert len(acked) == len(attempted)


# ------------------------------------------------------------------ gunicorn --preload gthread


@pytest.fixture
def gunicorn_app(
    nsqd_factory: Any, nsq_topic: str
) -> Iterator[tuple[str, NsqdProcess, subprocess.Popen[bytes]]]:
    pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
    server: NsqdProcess = nsqd_factory()
    port = free_closed_port()
    env = dict(os.environ, NSQD_TCP_ADDRESS=server.tcp_address, NSQ_TOPIC=nsq_topic)
    env.pop("NSQ_SYNC_TEST_RUNTIME", None)  # the app runs on plain threads (gthread)
    support = Path(__file__).resolve().parent.parent / "support"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--preload",
            "-k",
            "gthread",
            "--threads",
            "8",
            "--workers",
            "2",
            # No --worker-connections: gthread with worker_connections <= the number of
            # connections it is offered can stop polling for good (gunicorn issues 3146, 3407;
            # seen on 3.9 as one worker's 8 clients timing out). Each request comes on a
            # connection of its own instead, which either worker may accept.
            "--bind",
            f"127.0.0.1:{port}",
            "--chdir",
            str(support),
            "--graceful-timeout",
            "5",
            "fork_app:app",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"

    answered: set[str] = set()  # pids of the workers that answered a probe
    probes = iter(range(10_000))  # a body of its own per probe (nsqd must hold each once)

    def both_up() -> bool:
        # Each probe on a new connection: the workers take turns accepting them, so both answer
        # once both have booted (a test that starts while only one has would see one worker).
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            response = requests.get(
                url, params={"body": f"probe-{next(probes)}"}, timeout=2,
                headers={"Connection": "close"},
            )  # fmt: skip
        except requests.RequestException:
            return False
        if response.status_code == 200:
            answered.add(response.text.split()[0])
        return len(answered) == 2

    try:
        wait_for(both_up, "both gunicorn workers answering", timeout=60.0)
        yield url, server, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
@pytest.mark.parametrize(
    "clients_runtime",
    [
        # The app always runs on plain threads (gthread); in a gevent run of the suite only the
        # HTTP clients are greenlets.
        pytest.param("gevent", id="gevent-clients")
        if os.environ.get("NSQ_SYNC_TEST_RUNTIME", "").strip().lower() == "gevent"
        else pytest.param("threads", id="threads-clients"),
    ],
)
def test_gunicorn_preload_gthread_workers_publish(
    clients_runtime: str,
    gunicorn_app: tuple[str, NsqdProcess, subprocess.Popen[bytes]],
    nsq_topic: str,
) -> None:
    """nsqd flags: none. ``gunicorn --preload -k gthread --threads 8 --workers 2``: the app's
    Producer connects in the master at import; 16 clients send 20 requests each, every one
    publishing, each on a new connection (so the kernel hands them to both workers)."""
    url, server, proc = gunicorn_app
    clients, per_client = 16, 20
    lock = threading.Lock()
    outcomes: list[tuple[int, str, str]] = []
    barrier = threading.Barrier(clients)

    def client(n: int) -> None:
        with requests.Session() as session:
            barrier.wait(30)
            for i in range(per_client):
                body = f"req-{n}-{i}"
                response = session.get(
                    url, params={"body": body}, headers={"Connection": "close"}, timeout=30
                )
                with lock:
                    outcomes.append((response.status_code, body, response.text))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120.0)
    assert not any(t.is_alive() for t in threads)
    ok = [body for status, body, _ in outcomes if status == 200]
    failed = [(body, text) for status, body, text in outcomes if status != 200]
    pids = {text.split()[0] for _, _, text in outcomes}
    # the app reports only NSQErrors as 500 with the class name; anything else is a crash
    assert not failed, failed[:5]
    assert len(pids) == 2, f"requests were served by {len(pids)} worker(s), not 2"
    # master + 2 workers, one connection each (the probe requests published too)
    wait_for_connections(server, nsq_topic, 3)
    proc.terminate()
    proc.wait(15.0)
    held = read_bodies(server.tcp_address, server.http_address, nsq_topic, timeout=60.0)
    for body in ok:
        assert held[body.encode()] == 1, body
    assert max(held.values()) == 1
    assert sum(1 for b in held if b.startswith(b"master")) == 1
    print(f"gunicorn gthread: {len(ok)} requests published over 2 workers, 0 duplicates")


# ------------------------------------------------------------------ HTTP client across a fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_http_client_forked_child_threads_share_one_new_session(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """nsqd flags: none. An NsqdHTTPClient used in the parent (a pooled keep-alive connection),
    then by 8 threads of each of 3 children at once: each child makes one session of its own
    (not one per thread, never the parent's), and every HTTP publish lands exactly once."""
    server: NsqdProcess = nsqd_factory()
    client = NsqdHTTPClient(server.http_address)
    client.pub(nsq_topic, b"parent")
    parent_session = client._current_session()

    def work(c: int) -> dict[str, Any]:
        sessions: set[int] = set()
        created = [0]
        original_init = requests.Session.__init__

        def counting_init(self: requests.Session) -> None:
            created[0] += 1  # Sessions made in this child (by the client's fork reset)
            original_init(self)

        requests.Session.__init__ = counting_init  # type: ignore[method-assign]

        def publish(body: bytes) -> None:
            client.pub(nsq_topic, body)
            sessions.add(id(client._current_session()))

        result = publish_from_threads(publish, nsq_topic, f"http-c{c}")
        result["sessions"] = len(sessions)
        result["created"] = created[0]
        result["parent_session"] = id(parent_session) in sessions
        return result

    children = [Child(lambda c=c: work(c), client.close) for c in range(3)]
    results = [child.result() for child in children]
    assert [child.finish() for child in children] == [0, 0, 0]
    for result in results:
        assert result["created"] == 1, f"the fork reset ran {result['created']} times: {result}"
        assert result["sessions"] == 1 and not result["parent_session"], result
    client.pub(nsq_topic, b"parent again")  # the parent's session is intact
    assert client._current_session() is parent_session
    client.close()
    acked, errors = check_results(results)
    attempted = {"parent", "parent again"} | {
        f"http-c{c}-t{t}-{i}" for c in range(3) for t in range(THREADS) for i in range(PER_THREAD)
    }
    check_bodies(server, nsq_topic, acked + ["parent", "parent again"], attempted)
    assert not errors, errors[:5]


# ------------------------------------------------------------------ a message answer across a fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_a_message_answer_in_progress_at_the_fork_does_not_block_the_child() -> None:
    """A parent's thread is answering a message (it holds the lock that decides between the
    worker's auto-FIN and an application thread's answer) at the very moment another thread
    forks: in the child, answering a message must not block forever on the inherited lock."""

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def finish(self, message: Message) -> None:
            self.calls.append("finish")

        def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
            self.calls.append("requeue")

        def touch(self, message: Message) -> None:
            self.calls.append("touch")

    from nsq_sync import message as message_module
    from nsq_sync import process as fork_state

    fork_state.install()  # what a started Consumer or a Producer does
    with message_module.claim_lock:  # the answering thread, caught at the fork
        pid = os_fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                recorder = Recorder()
                message = Message(b"0" * 16, b"body", 0, 1, recorder)
                done = threading.Event()
                threading.Thread(target=lambda: (message.finish(), done.set()), daemon=True).start()
                code = 0 if done.wait(10.0) and recorder.calls == ["finish"] else 3
            finally:
                os._exit(code)
    assert waitpid(pid, 30.0) == 0, "finish() in the child blocked on the parent's claim lock"


# ------------------------------------------------------------------ a Consumer across a fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_started_consumer_in_a_forked_child_raises_naming_the_fix(
    nsqd_factory: Any, nsq_topic: str, runtime_mode: str
) -> None:
    """nsqd flags: none. A Consumer started before a fork: in the child, stop() and start()
    raise Stopped saying to create one per process (nothing is sent on the parent's
    connection), the child's copy never handles a message, and the parent's consumer receives
    every message published while the child lives.

    Under gevent fork() copies the consumer's greenlets (readers, workers...) into the child:
    there the fork hook closes the copied sockets and ends the copies, so none of them reads
    what nsqd sends the parent."""
    server: NsqdProcess = nsqd_factory()
    got: list[bytes] = []

    def handle(message: Message) -> None:
        got.append(message.body)

    consumer = Consumer(nsq_topic, "c", handle, nsqd_tcp_addresses=[server.tcp_address])
    consumer.start()
    try:
        assert consumer.wait_connected(15.0)

        def child_work() -> dict[str, Any]:
            messages = []
            for call in (consumer.stop, consumer.start, consumer.run):
                try:
                    call()
                except Stopped as exc:
                    messages.append(str(exc))
            # (under gevent) the copies of the consumer's tasks end, their sockets closed
            tasks = list(consumer._pool.tasks)
            wait_for(lambda: not any(t.is_alive() for t in tasks), "the copied tasks to end")
            conns = list(consumer._connections.conns.values())
            return {"messages": messages, "open": sum(not c.closed for c in conns)}

        def child_finish() -> None:
            handled = got[handled_at_fork[0] :]
            assert not handled, f"the child's copy handled {handled[:5]}"

        handled_at_fork = [len(got)]
        child = Child(child_work, child_finish)
        result = child.result()
        # while the child lives, the parent's consumer gets every message (the child reads none)
        bodies = [b"while the child lives %d" % i for i in range(20)]
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(nsq_topic, bodies)
            wait_for(lambda: all(b in got for b in bodies), "the parent receiving every message")
            assert child.finish() == 0  # (the child asserts it handled nothing)
            producer.publish(nsq_topic, b"after the child")
        wait_for(lambda: b"after the child" in got, "the parent's consumer still consuming")
        assert len(result["messages"]) == 3, result
        assert all("post_fork" in m and "new Consumer" in m for m in result["messages"]), result
        assert result["open"] == 0, result
    finally:
        assert consumer.stop(10.0)


# ------------------------------------------------------------------ the fork hook itself


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() does not exist on Windows")
def test_fork_closes_the_childs_copies_of_inherited_sockets_at_once(
    nsqd_factory: Any, nsq_topic: str
) -> None:
    """nsqd flags: none. Right at the fork, before the child uses anything, the child's copies
    of a Producer's connection and of an HTTP client's pooled keep-alive connection are closed
    (so nothing copied into the child can read them), and the parent's keep working."""
    server: NsqdProcess = nsqd_factory()
    producer = Producer(server.tcp_address)
    producer.publish(nsq_topic, b"parent")
    client = NsqdHTTPClient(server.http_address)
    client.pub(nsq_topic, b"parent http")
    conn = producer._slots[0].conn
    assert conn is not None
    pools = client._current_session().get_adapter("http://").poolmanager.pools
    keys = pools.keys()  # noqa: SIM118 (urllib3's container refuses iteration)
    http_conns = [c for key in keys for c in list(pools[key].pool.queue) if c is not None]
    assert http_conns and all(c.sock is not None for c in http_conns)

    def work() -> dict[str, Any]:
        closed = conn.closed and conn._transport.closed  # type: ignore[union-attr]

        def http_closed() -> list[bool]:
            return [getattr(c.sock, "_closed", True) for c in http_conns]

        # (gevent closes a socket nobody waits on from the hub's first callback in the child:
        # before that, the loop is not re-initialised yet. A sleep runs the hub; on PyPy it
        # may take more than one, so wait for it, within a deadline.)
        deadline = time.monotonic() + 5.0
        while not all(http_closed()) and time.monotonic() < deadline:
            time.sleep(0.001)
        return {"producer_conn_closed": closed, "http_socks_closed": http_closed()}

    child = Child(work, lambda: None)
    result = child.result()
    assert child.finish() == 0
    assert result == {"producer_conn_closed": True, "http_socks_closed": [True] * len(http_conns)}
    assert not conn.closed and all(not getattr(c.sock, "_closed", True) for c in http_conns)
    producer.publish(nsq_topic, b"parent again")
    client.pub(nsq_topic, b"parent http again")
    assert producer._slots[0].conn is conn  # the same connection: the child left it alone
    producer.close()
    client.close()
    bodies = ["parent", "parent http", "parent again", "parent http again"]
    check_bodies(server, nsq_topic, bodies, set(bodies))
