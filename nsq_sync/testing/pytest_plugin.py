"""pytest plugin: real nsqd/nsqlookupd fixtures, and server logs in failure reports.

Installed nsq_sync registers this module under the ``pytest11`` entry point, so the fixtures are
available in any project that has nsq_sync installed; without installing, load it with
``pytest -p nsq_sync.testing.pytest_plugin`` (and switch it off with ``-p no:nsq_sync``). Since
it is loaded into other projects, every name it registers starts with ``nsq`` (no generic
``topic``), and it registers no markers.

Fixtures:

- ``nsq_bin`` (session): paths of the ``nsqd`` and ``nsqlookupd`` executables. When they can't be
  found, the tests that need them are skipped locally and fail in CI (``CI=true`` or ``CI=1``),
  so a CI run can't go green by skipping every integration test.
- ``nsqlookupd`` (session): one shared :class:`~nsq_sync.testing.NsqlookupdProcess`.
- ``nsqd`` (session): one shared :class:`~nsq_sync.testing.NsqdProcess` registered with
  ``nsqlookupd``. Tests share it, so give each test its own topic (the ``nsq_topic`` fixture) and
  don't stop it; use ``nsqd_factory`` for a server a test may stop, kill or reconfigure.
- ``nsqd_factory`` (function): ``nsqd_factory(*extra_args, lookupd=None)`` starts a fresh nsqd
  that is stopped when the test ends.
- ``nsq_cluster`` (function): ``nsq_cluster(n=2)`` starts a fresh nsqlookupd and ``n`` nsqds
  registered with it (waiting until ``/nodes`` lists them all), stopped when the test ends.
- ``nsq_topic`` (function): a unique valid topic name, ``t_<test name>_<8 hex digits>``.

When a test fails, the last 100 log lines of every server it started or used are added to its
report. Servers still running at the end of the session are stopped.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from typing_extensions import Self

from nsq_sync.testing._base import current_start_serial, processes_started_after
from nsq_sync.testing.process import (
    Cluster,
    NsqBinaryNotFound,
    NsqdProcess,
    NsqlookupdProcess,
    NsqProcess,
    NsqProcessError,
    close_all,
    find_nsq_binary,
    stop_all_running,
)

__all__ = [
    "ClusterFactory",
    "NsqBinaries",
    "NsqdFactory",
    "nsq_bin",
    "nsq_cluster",
    "nsqd",
    "nsqd_factory",
    "nsq_topic",
    "nsqlookupd",
]

_LOG_TAIL_LINES = 100
_TOPIC_MAX = 64
_INVALID_NAME_CHARS = re.compile(r"[^.a-zA-Z0-9_-]")
_START_SERIAL = pytest.StashKey[int]()


@dataclass(frozen=True)
class NsqBinaries:
    """Paths of the NSQ executables the fixtures use.

    Attributes:
        nsqd: Path of ``nsqd``.
        nsqlookupd: Path of ``nsqlookupd``.
    """

    nsqd: str
    nsqlookupd: str


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def nsq_bin() -> NsqBinaries:
    """The paths of the ``nsqd`` and ``nsqlookupd`` executables (session-scoped).

    Found with :func:`~nsq_sync.testing.find_nsq_binary` (``NSQ_BIN``, ``.nsq/bin``, ``PATH``).
    When they are missing, every test that needs them is skipped, except in CI (``CI=true`` or
    ``CI=1``), where it fails: a CI run can't go green by skipping its integration tests.
    """
    try:
        return NsqBinaries(nsqd=find_nsq_binary("nsqd"), nsqlookupd=find_nsq_binary("nsqlookupd"))
    except NsqBinaryNotFound as exc:
        if _in_ci():
            pytest.fail(f"CI run without NSQ binaries: {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def nsqlookupd(
    nsq_bin: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NsqlookupdProcess]:
    """One :class:`~nsq_sync.testing.NsqlookupdProcess` shared by the whole session.

    The shared ``nsqd`` is registered with it. Don't stop it; a test that needs a lookupd of its
    own takes one from ``nsq_cluster``.
    """
    proc = NsqlookupdProcess(
        binary=nsq_bin.nsqlookupd, work_dir=tmp_path_factory.mktemp("nsqlookupd")
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="session")
def nsqd(
    nsq_bin: NsqBinaries,
    nsqlookupd: NsqlookupdProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NsqdProcess]:
    """One :class:`~nsq_sync.testing.NsqdProcess` shared by the whole session.

    It is registered with the shared ``nsqlookupd`` (this waits until the lookupd lists it).
    Tests share it: give each test a topic of its own (``nsq_topic``), and don't stop, restart
    or reconfigure it; take a server of the test's own from ``nsqd_factory`` for that.
    """
    proc = NsqdProcess(
        lookupd_tcp_addresses=[nsqlookupd.tcp_address],
        binary=nsq_bin.nsqd,
        work_dir=tmp_path_factory.mktemp("nsqd"),
    )
    try:
        proc.start()
        nsqlookupd.wait_for_nodes([proc])
        yield proc
    finally:
        proc.close()


class _Factory:
    """What both factories share: the processes they started, stopped together at the end."""

    def __init__(self, binaries: NsqBinaries, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._binaries = binaries
        self._tmp = tmp_path_factory
        #: Every process this factory created, in creation order.
        self.processes: list[NsqProcess] = []

    def close(self) -> None:
        """Stop every process this factory started, latest first.

        Raises:
            NsqProcessError: Some process could not be stopped (the others still are).
        """
        close_all(reversed(self.processes))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NsqdFactory(_Factory):
    """Starts fresh nsqds for one test; the ``nsqd_factory`` fixture returns one.

    Every nsqd it started is stopped when the test ends. Not thread-safe.

    Args:
        binaries: The executables to run.
        tmp_path_factory: Where each nsqd gets its work folder (kept by pytest for post-mortems).
    """

    def __call__(
        self, *extra_args: str, lookupd: NsqlookupdProcess | str | None = None
    ) -> NsqdProcess:
        """Start an nsqd and wait until it answers ``/ping``.

        Args:
            *extra_args: Further nsqd flags, e.g. ``"--max-rdy-count=10"``.
            lookupd: An nsqlookupd (or its ``host:port`` TCP address) to register with. For a
                process, this also waits until its ``/nodes`` lists the new nsqd.

        Returns:
            The running nsqd.

        Raises:
            NsqProcessError: It did not start.
        """
        proc = NsqdProcess(
            lookupd_tcp_addresses=[] if lookupd is None else [lookupd],
            extra_args=extra_args,
            binary=self._binaries.nsqd,
            work_dir=self._tmp.mktemp("nsqd"),
        )
        self.processes.append(proc)
        proc.start()
        if isinstance(lookupd, NsqlookupdProcess):
            lookupd.wait_for_nodes([proc])
        return proc


class ClusterFactory(_Factory):
    """Starts fresh clusters for one test; the ``nsq_cluster`` fixture returns one.

    Every process it started is stopped when the test ends. Not thread-safe.

    Args:
        binaries: The executables to run.
        tmp_path_factory: Where each process gets its work folder.
    """

    def __call__(
        self,
        n: int = 2,
        *,
        nsqd_args: Iterable[str] = (),
        lookupd_args: Iterable[str] = (),
    ) -> Cluster:
        """Start an nsqlookupd and ``n`` nsqds registered with it.

        Args:
            n: How many nsqds.
            nsqd_args: Extra flags for every nsqd.
            lookupd_args: Extra flags for the nsqlookupd.

        Returns:
            The cluster, once the lookupd's ``/nodes`` lists every nsqd.

        Raises:
            ValueError: ``n`` is negative.
            NsqProcessError: Some process did not start.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        lookupd = NsqlookupdProcess(
            extra_args=tuple(lookupd_args),
            binary=self._binaries.nsqlookupd,
            work_dir=self._tmp.mktemp("nsqlookupd"),
        )
        self.processes.append(lookupd)
        lookupd.start()
        nsqds = []
        for _ in range(n):
            proc = NsqdProcess(
                lookupd_tcp_addresses=[lookupd],
                extra_args=tuple(nsqd_args),
                binary=self._binaries.nsqd,
                work_dir=self._tmp.mktemp("nsqd"),
            )
            self.processes.append(proc)
            proc.start()
            nsqds.append(proc)
        lookupd.wait_for_nodes(nsqds)
        return Cluster(lookupd=lookupd, nsqds=tuple(nsqds))


@pytest.fixture
def nsqd_factory(
    nsq_bin: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NsqdFactory]:
    """Start fresh nsqds for this test: ``nsqd_factory(*extra_args, lookupd=None) -> NsqdProcess``.

    ``extra_args`` are nsqd flags (``"--msg-timeout=1s"``); ``lookupd`` an nsqlookupd (or its
    TCP address) to register with. Each nsqd has its own ports and data path, waits until it
    answers ``/ping``, and is stopped when the test ends. See :class:`NsqdFactory`.
    """
    with NsqdFactory(nsq_bin, tmp_path_factory) as factory:
        yield factory


@pytest.fixture
def nsq_cluster(
    nsq_bin: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterFactory]:
    """Start a fresh nsqlookupd and nsqds for this test: ``nsq_cluster(n=2) -> Cluster``.

    Also takes ``nsqd_args=`` and ``lookupd_args=`` (flags). Returns once the lookupd's
    ``/nodes`` lists every nsqd; everything is stopped when the test ends. See
    :class:`ClusterFactory`.
    """
    with ClusterFactory(nsq_bin, tmp_path_factory) as factory:
        yield factory


@pytest.fixture
def nsq_topic(request: pytest.FixtureRequest) -> str:
    """A topic name of this test's own: ``t_<test name>_<8 hex digits>``.

    Valid for nsqd (at most 64 characters of ``[.a-zA-Z0-9_-]``) and different on every call, so
    tests that share the session's ``nsqd`` never see each other's messages.
    """
    suffix = uuid.uuid4().hex[:8]
    room = _TOPIC_MAX - len("t_") - len("_") - len(suffix)
    name = _INVALID_NAME_CHARS.sub("_", request.node.name)[:room]
    return f"t_{name}_{suffix}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remember which processes already existed, to find the ones this test starts."""
    item.stash[_START_SERIAL] = current_start_serial()


def _processes_of(item: pytest.Item) -> list[NsqProcess]:
    found: dict[int, NsqProcess] = {}
    serial = item.stash.get(_START_SERIAL, None)
    if serial is not None:
        for proc in processes_started_after(serial):
            found.setdefault(id(proc), proc)
    funcargs: dict[str, Any] = getattr(item, "funcargs", None) or {}
    for value in funcargs.values():
        procs: Iterable[NsqProcess] = ()
        if isinstance(value, NsqProcess):
            procs = (value,)
        elif isinstance(value, Cluster):
            procs = value.processes()
        elif isinstance(value, _Factory):
            procs = value.processes
        for proc in procs:
            found.setdefault(id(proc), proc)
    return list(found.values())


def _section_title(proc: NsqProcess) -> str:
    try:
        where = f" {proc.tcp_address}"
    except NsqProcessError:
        where = ""
    return f"{proc.name}{where} log (last {_LOG_TAIL_LINES} lines of {proc.log_path})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Append the log tail of every server the test started or used when it fails."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    for proc in _processes_of(item):
        report.sections.append((_section_title(proc), proc.log_tail(_LOG_TAIL_LINES)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop servers that tests started and left running."""
    stop_all_running()
