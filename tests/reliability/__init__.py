"""Reliability suite (issue 6): faults, soak, fuzzing and bad input against real nsqd."""
