"""Helpers shared by the integration tests: certificates, an auth server, nsqd stats polling.

Importable as ``support`` (pytest puts ``tests/`` on ``sys.path`` for ``tests/conftest.py``).
"""
