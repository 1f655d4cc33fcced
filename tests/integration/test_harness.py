"""Tests of the test harness itself (nsq_sync.testing) against real nsqd and nsqlookupd."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from nsq_sync.testing import (
    NsqBinaryNotFound,
    NsqdProcess,
    NsqlookupdProcess,
    NsqProcessError,
    find_nsq_binary,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def http() -> Any:
    with requests.Session() as session:
        session.trust_env = False  # loopback only, never through a proxy
        yield session


def _topic_stats(http: requests.Session, nsqd: NsqdProcess, topic: str) -> dict[str, Any] | None:
    response = http.get(
        f"{nsqd.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
    )
    response.raise_for_status()
    body = response.json()
    for entry in body.get("data", body).get("topics") or []:
        if entry["topic_name"] == topic:
            return dict(entry)
    return None


def test_shared_nsqd_listens_on_loopback(nsqd: NsqdProcess, http: requests.Session) -> None:
    assert nsqd.is_running
    for address in (nsqd.tcp_address, nsqd.http_address):
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) not in (0, 4150, 4151)
    assert nsqd.http_url == f"http://{nsqd.http_address}"
    assert http.get(f"{nsqd.http_url}/ping", timeout=5).text == "OK"
    # The TCP port speaks NSQ: after the magic, an unknown command gets an E_INVALID frame.
    with socket.create_connection(("127.0.0.1", nsqd.tcp_port), timeout=5) as sock:
        sock.sendall(b"  V2BOGUS\n")
        frame = sock.recv(1024)
    assert b"E_INVALID" in frame
    assert "TCP: listening on" in nsqd.log_text()


def test_nsqd_registers_with_lookupd(
    nsqd: NsqdProcess, nsqlookupd: NsqlookupdProcess, http: requests.Session
) -> None:
    deadline = time.monotonic() + 10
    while True:
        producers = http.get(f"{nsqlookupd.http_url}/nodes", timeout=5).json()["producers"]
        ports = {(p["broadcast_address"], p["tcp_port"]) for p in producers}
        if ("127.0.0.1", nsqd.tcp_port) in ports:
            break
        assert time.monotonic() < deadline, f"nsqd not in /nodes: {producers}"
        time.sleep(0.05)
    assert nsqd.lookupd_tcp_addresses == (nsqlookupd.tcp_address,)


def test_restart_keeps_ports_and_data(
    nsqd_factory: Any, nsq_topic: str, http: requests.Session
) -> None:
    assert re.fullmatch(r"[.a-zA-Z0-9_-]{1,64}", nsq_topic)
    nsqd = nsqd_factory()
    response = http.post(
        f"{nsqd.http_url}/pub", params={"topic": nsq_topic}, data=b"persist me", timeout=5
    )
    assert response.text == "OK"
    tcp, http_address, data_path, old_pid = (
        nsqd.tcp_address,
        nsqd.http_address,
        nsqd.data_path,
        nsqd.pid,
    )

    nsqd.restart()

    assert nsqd.pid != old_pid
    assert (nsqd.tcp_address, nsqd.http_address, nsqd.data_path) == (tcp, http_address, data_path)
    stats = _topic_stats(http, nsqd, nsq_topic)
    assert stats is not None and stats["depth"] == 1, stats


def test_stop_and_kill(nsqd_factory: Any, http: requests.Session, tmp_path: Path) -> None:
    nsqd = nsqd_factory("--max-rdy-count=10")
    assert "--max-rdy-count=10" in nsqd.extra_args
    nsqd.kill()
    assert not nsqd.is_running
    assert nsqd.returncode is not None
    with pytest.raises(requests.ConnectionError):
        http.get(f"{nsqd.http_url}/ping", timeout=2)
    nsqd.stop()  # idempotent
    nsqd.kill()
    with pytest.raises(NsqProcessError, match="restart"):
        NsqdProcess(binary=nsqd.binary, work_dir=tmp_path).restart()


def test_cluster_registers_every_nsqd(nsq_cluster: Any) -> None:
    cluster = nsq_cluster(2)
    assert len(set(cluster.nsqd_tcp_addresses)) == 2
    assert len({n.node_id for n in cluster.nsqds}) == 2  # distinct message-ID spaces
    listed = {f"{p['broadcast_address']}:{p['tcp_port']}" for p in cluster.lookupd.nodes()}
    assert listed == set(cluster.nsqd_tcp_addresses)
    assert cluster.lookupd_http_addresses == [cluster.lookupd.http_url]


def test_start_failure_and_missing_binary(
    nsq_bin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = NsqdProcess(binary=nsq_bin.nsqd, extra_args=["--no-such-flag"], work_dir=tmp_path)
    with pytest.raises(NsqProcessError, match="exited with status") as info:
        bad.start(timeout=10)
    assert "no-such-flag" in str(info.value)  # the log tail is in the message
    assert not bad.is_running

    monkeypatch.setenv("NSQ_BIN", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NsqBinaryNotFound, match="scripts/build-nsq"):
        find_nsq_binary("nsqd-that-does-not-exist")
    fake = tmp_path / "nsqd-that-does-not-exist"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_nsq_binary("nsqd-that-does-not-exist") == str(fake.resolve())


def _pytest_in(
    project: Path, pytestconfig: pytest.Config, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run pytest in a fresh process in ``project``, as a project using nsq_sync would."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    if not pytestconfig.pluginmanager.has_plugin("nsq_sync"):  # not installed: no entry point
        argv[3:3] = ["-p", "nsq_sync.testing.pytest_plugin"]
    env = {k: v for k, v in os.environ.items() if k != "NSQ_SYNC_TEST_RUNTIME"}
    return subprocess.run(
        argv, cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _passing_pytest_in(project: Path, pytestconfig: pytest.Config, *args: str) -> str:
    result = _pytest_in(project, pytestconfig, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_failure_report_includes_server_logs(
    tmp_path: Path, pytestconfig: pytest.Config, nsq_bin: Any
) -> None:
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(
            """
            def test_fails(nsqd_factory):
                nsqd_factory()
                assert False, "deliberate"
            """
        )
    )
    result = _pytest_in(tmp_path, pytestconfig, str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"-+ nsqd 127\.0\.0\.1:\d+ log \(last 100 lines", result.stdout), result.stdout
    assert "TCP: listening on 127.0.0.1:" in result.stdout


@pytest.mark.slow  # two pytest processes; the names depend on neither Python nor runtime
def test_the_plugin_takes_only_nsq_names_in_a_users_project(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    """The entry point loads the plugin into every project that installs nsq_sync: its fixtures
    are nsq-prefixed (a project's own ``topic`` fixture stays its own) and it registers none of
    this project's generic markers (``slow``, ``integration``...)."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef topic():\n    return 'the project topic'\n"
    )
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            def test_both(topic, nsq_topic, pytestconfig):
                assert topic == "the project topic"
                assert nsq_topic.startswith("t_test_both_")
                markers = [line.split(":")[0] for line in pytestconfig.getini("markers")]
                assert not {"slow", "integration", "gevent", "spark"} & set(markers), markers
            """
        )
    )
    assert "1 passed" in _passing_pytest_in(tmp_path, pytestconfig, "-q")

    listing = _passing_pytest_in(tmp_path, pytestconfig, "--fixtures")
    section = listing.split("fixtures defined from nsq_sync.testing.pytest_plugin", 1)[1]
    section = section.split("fixtures defined from", 1)[0]
    names = set(re.findall(r"^(\w+)(?: \[session scope\])? -- ", section, re.MULTILINE))
    assert names == {"nsq_bin", "nsqd", "nsqlookupd", "nsqd_factory", "nsq_cluster", "nsq_topic"}
