"""Benchmark harness: see bench/README.md and bench/run.py."""
