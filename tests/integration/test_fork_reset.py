"""The fork reset as a forked child's other threads see it: a thread that asks whether the
process forked while the reset is under way waits for it, and then finds everything done (the
generation bumped, every tracked object abandoned). A thread that did not wait could read the
old generation and use the parent's connections while the reset closes them (CI saw an
EBADF from a publish in a child forked from C).

The fork is simulated in a fresh interpreter (the reset abandons every tracked object of its
process): the canary page zeroed and the pid changed, as a fork from C leaves them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    from nsq_sync import process as _fork
    _fork.install()
    if sys.argv[1] == "pid":
        _fork._canary = None  # where MADV_WIPEONFORK is not available
    elif _fork._canary is None:
        print("no canary here"); sys.exit(0)
    before = _fork.generation
    seen = {}

    class Tracked:
        pass

    def abandon(obj):
        # the reset is under way: another thread of the "child" asks
        asker = threading.Thread(target=lambda: seen.update(answer=_fork.current(),
                                                            abandoned=seen.get("abandoned")))
        asker.start()
        asker.join(0.5)
        seen["waited"] = asker.is_alive()
        seen["abandoned"] = True
        seen["asker"] = asker

    obj = Tracked()
    _fork.track(obj, abandon)
    if _fork._canary is not None:
        _fork._canary[0] = 0  # what the kernel does to the page in a forked child
    _fork._pid = -2  # a pid that is not this process's
    assert _fork.current() == before + 1
    seen["asker"].join(10)
    print(seen["waited"], seen["answer"] == before + 1, seen["abandoned"])
    """
)


@pytest.mark.parametrize("check", ["canary", "pid"])
def test_a_thread_asking_during_the_reset_waits_for_it(check: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, check], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "no canary here":  # not Linux >= 4.14: the pid case covers it
        return
    assert result.stdout.split() == ["True", "True", "True"], result.stdout + result.stderr
