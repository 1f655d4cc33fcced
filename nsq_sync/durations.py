"""Durations: float seconds in every public API; :class:`datetime.timedelta` and strings such as
``"250ms"``, ``"1.5s"``, ``"2m"`` or ``"1h"`` are accepted. :func:`to_seconds` is the one check
of every duration a public method takes, so a bad one raises the same ConfigError anywhere.
These names are also importable from :mod:`nsq_sync.config`."""

from __future__ import annotations

import datetime
import math
import re
from typing import Union

from nsq_sync.errors import ConfigError

__all__ = ["Duration", "parse_duration", "positive_seconds", "to_seconds"]

#: What every public duration argument takes (a timeout, a delay): seconds, a
#: :class:`datetime.timedelta`, or a string such as ``"250ms"`` (see :func:`to_seconds`).
Duration = Union[float, datetime.timedelta, str]

_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d*)?|-?\.\d+)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object, name: str = "duration") -> float:
    """``value`` as float seconds: a number, a :class:`datetime.timedelta`, or ``"250ms"``,
    ``"2s"``, ``"1m"``, ``"1h"``; anything else raises :class:`~nsq_sync.errors.ConfigError`."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected seconds, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ConfigError(f"{name}: expected seconds or a duration like '250ms', '5s', got {value!r}")


def to_seconds(
    value: object,
    name: str,
    *,
    positive: bool = False,
    maximum: float | None = None,
    maximum_name: str | None = None,
) -> float:
    """Validate a duration passed to a public method (a timeout, a delay): a number of seconds, a
    :class:`datetime.timedelta` or a string such as ``"250ms"``; returned as float seconds.

    Args:
        name: what it is, for the message (``"timeout"``, ``"requeue delay"``...).
        positive: reject 0 too (timeouts); otherwise 0 is allowed (delays).
        maximum: the largest value allowed, if any, from the option ``maximum_name`` (errors then
            state the range).

    Raises:
        ConfigError: not a duration, not finite, negative (or 0 when ``positive``), or above
            ``maximum``; the message names ``name``.
    """
    if maximum is not None:
        bound = f"{maximum_name} ({maximum} s)" if maximum_name else f"{maximum} s"
        problem = f"{name} must be between 0 and {bound}, got {value!r}"
    try:
        seconds = parse_duration(value, name)
    except ConfigError:
        if maximum is None:
            raise
        raise ConfigError(problem) from None
    if maximum is not None:
        if not (0 <= seconds <= maximum) or (positive and seconds == 0):
            raise ConfigError(problem)
        return seconds
    if not math.isfinite(seconds):
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        raise ConfigError(f"{name} must be seconds {'> 0' if positive else '>= 0'}, got {value!r}")
    return seconds


def positive_seconds(name: str, value: object) -> float | None:
    """None, or seconds > 0 from a number or a timedelta (not a string): the check of optional
    durations that must be > 0 (``run(timeout=)``, ``batch_timeout``...).

    Raises:
        ConfigError: anything else; the message names ``name``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        raise ConfigError(f"{name} must be seconds > 0 (or a timedelta), got {value!r}")
    return to_seconds(value, name, positive=True)
