"""pytest plugin: real nsqd/nsqlookupd fixtures, and server logs in failure reports.

Registered under the ``pytest11`` entry point (else ``-p nsq_sync.testing.pytest_plugin``; off:
``-p no:nsq_sync``). It is loaded into other projects, so every name it registers starts with
``nsq``, and it registers no markers.

Fixtures: ``nsq_bin`` (the executables; without them a test is skipped, but fails in CI), the
session's shared ``nsqlookupd`` and ``nsqd`` (don't stop them; take a topic of the test's own
from ``nsq_topic``), and ``nsqd_factory`` and ``nsq_cluster``, which start fresh servers stopped
when the test ends. A failed test's report gets the last 100 log lines of every server it used.
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
    """Paths of the NSQ executables the fixtures use (``nsqd`` and ``nsqlookupd``)."""

    nsqd: str
    nsqlookupd: str


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def nsq_bin() -> NsqBinaries:
    """Paths of ``nsqd`` and ``nsqlookupd``. Without them the test is skipped, except in CI
    (``CI=true`` or ``CI=1``), where it fails: CI can't go green by skipping."""
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
    """One nsqlookupd for the whole session; don't stop it (``nsq_cluster`` makes fresh ones)."""
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
    """One nsqd for the whole session, registered with ``nsqlookupd``; don't stop or reconfigure
    it (``nsqd_factory`` makes fresh ones), and give each test a topic of its own."""
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
        """Stop every process this factory started, latest first (raises as :func:`close_all`)."""
        close_all(reversed(self.processes))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NsqdFactory(_Factory):
    """Starts fresh nsqds for one test (``nsqd_factory``), stopped at its end. Not thread-safe."""

    def __call__(
        self, *extra_args: str, lookupd: NsqlookupdProcess | str | None = None
    ) -> NsqdProcess:
        """Start an nsqd and return it once it answers ``/ping``.

        Args:
            *extra_args: Further nsqd flags, e.g. ``"--max-rdy-count=10"``.
            lookupd: An nsqlookupd (or its ``host:port`` TCP address) to register with. For a
                process, this also waits until its ``/nodes`` lists the new nsqd.

        Raises:
            NsqProcessError: It did not start (or register in time).
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
    """Starts fresh clusters for a test (``nsq_cluster``), stopped at its end. Not thread-safe."""

    def __call__(
        self,
        n: int = 2,
        *,
        nsqd_args: Iterable[str] = (),
        lookupd_args: Iterable[str] = (),
    ) -> Cluster:
        """Start an nsqlookupd and ``n`` nsqds, each with its extra flags (``lookupd_args``,
        ``nsqd_args``); return once the lookupd's ``/nodes`` lists every nsqd.

        Raises:
            ValueError: ``n`` is negative.
            NsqProcessError: Some process did not start (or register in time).
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
    """Fresh nsqds, stopped when the test ends: ``nsqd_factory(*extra_args, lookupd=None)``."""
    with NsqdFactory(nsq_bin, tmp_path_factory) as factory:
        yield factory


@pytest.fixture
def nsq_cluster(
    nsq_bin: NsqBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterFactory]:
    """Fresh clusters, stopped when the test ends: ``nsq_cluster(n=2) -> Cluster``."""
    with ClusterFactory(nsq_bin, tmp_path_factory) as factory:
        yield factory


@pytest.fixture
def nsq_topic(request: pytest.FixtureRequest) -> str:
    """A valid topic name of this test's own, new on every call: ``t_<test name>_<8 hex>``."""
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
