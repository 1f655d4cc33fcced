"""Run pytest with gevent's monkey patching active, as a gevent application would.

Patching has to happen before anything imports socket, ssl, threading or time, so this module
patches first and only then imports pytest (and, through it, the code under test).

Usage: ``python tests/run_gevent.py [pytest args...]`` (what the tox ``*-gevent`` envs run).
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

import pytest  # noqa: E402

if __name__ == "__main__":
    sys.exit(pytest.main(sys.argv[1:]))
