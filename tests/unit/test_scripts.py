"""The development scripts as a newcomer meets them: ``scripts/test --help`` prints how to use it
and runs nothing; no script installs system packages unless asked (``BOOTSTRAP_SYSTEM=1``); the
README's list of extras is setup.cfg's."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_test_help_prints_the_usage_and_runs_nothing(tmp_path: Path) -> None:
    # no tox, no bootstrap on PATH: --help must not need them (it used to start the matrix)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test"), "--help"],
        capture_output=True,
        text=True,
        timeout=10,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "TOX_ENVS=" in done.stdout and "BOOTSTRAP_SYSTEM=1" in done.stdout
    assert "bootstrap:" not in done.stderr  # nothing was prepared


@pytest.mark.parametrize(("asked", "installs"), [("", False), ("1", True)])
def test_bootstrap_installs_system_packages_only_when_asked(
    tmp_path: Path, asked: str, installs: bool
) -> None:
    """bootstrap's apt_install, run with an apt-get that records its calls."""
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    function = re.search(r"^apt_install\(\) \{\n.*?^\}\n", bootstrap, re.S | re.M)
    assert function is not None
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls"
    (stub / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (stub / "apt-get").chmod(0o755)
    (stub / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (stub / "sudo").chmod(0o755)
    script = function.group(0) + 'apt_install "PyPy for the pypy3-* tox envs" pypy3 pypy3-dev\n'
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PATH": f"{stub}:/usr/bin:/bin", "BOOTSTRAP_SYSTEM": asked},
    )
    assert done.returncode == 0, done.stderr
    if installs:
        assert "install -y -qq --no-install-recommends pypy3 pypy3-dev" in calls.read_text()
    else:
        assert not calls.exists()
        assert "install pypy3 pypy3-dev" in done.stderr and "BOOTSTRAP_SYSTEM=1" in done.stderr


def test_ci_is_the_one_place_that_asks_for_system_packages() -> None:
    assert "BOOTSTRAP_SYSTEM=1 exec scripts/test" in (ROOT / ".ci" / "run").read_text()
    for script in (ROOT / "scripts").iterdir():
        if script.is_file():
            text = script.read_text(errors="replace")
            assert "BOOTSTRAP_SYSTEM=1\n" not in text.replace("export ", ""), script


def test_the_readme_and_the_quick_start_list_every_extra() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"]) - {"dev", "docs", "test"}  # development
    readme = (ROOT / "README.md").read_text()
    assert set(re.findall(r'^"\.\[([a-z-]+)\]"', readme, re.M)) == extras
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    assert set(re.findall(r'^pip install "\.\[([a-z-]+)\]"', quickstart, re.M)) == extras


@pytest.mark.parametrize("holds", [True, False])
def test_build_nsq_builds_nothing_when_nsq_bin_holds_the_binaries(
    tmp_path: Path, holds: bool
) -> None:
    """NSQ_BIN pointing at nsqd and nsqlookupd (what the README offers instead of Go): no build,
    no Go needed; a folder without them still asks for Go, naming NSQ_BIN."""
    given = tmp_path / "given"
    given.mkdir()
    if holds:
        for name in ("nsqd", "nsqlookupd"):
            (given / name).write_text("#!/bin/sh\n")
            (given / name).chmod(0o755)
    build_dir = tmp_path / "build"
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",  # no go
        "NSQ_BIN": str(given),
        "NSQ_BUILD_DIR": str(build_dir),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-nsq")],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    if holds:
        assert done.returncode == 0, done.stderr
        assert not build_dir.exists()
    else:
        assert done.returncode == 1
        assert "set NSQ_BIN to a folder that holds nsqd nsqlookupd" in done.stderr
