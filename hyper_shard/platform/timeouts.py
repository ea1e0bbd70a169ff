"""How long a collective may wait for its group before it fails: hyper_shard's default,
the launcher's ``HYPER_SHARD_TIMEOUT`` and ``init_device_mesh(..., timeout=)``.

Order: an explicit ``timeout`` argument (a ``datetime.timedelta``, or seconds); else
``HYPER_SHARD_TIMEOUT`` (seconds, e.g. ``HYPER_SHARD_TIMEOUT=120``); else
:data:`DEFAULT_TIMEOUT` (10 minutes: bounded, and shorter than gloo's 30-minute default, so
a stuck rank fails the others in minutes rather than half an hour; long enough for a slow
first step, checkpoint I/O or compilation between collectives).

The first two are *explicit*: a mesh built with one gets process groups with that timeout
even where it could reuse a default group created with another (see the platforms'
``new_group``). Framework-neutral.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

__all__ = ["DEFAULT_TIMEOUT", "ENV", "explicit_timeout", "resolve_timeout"]

#: hyper_shard's default collective timeout
DEFAULT_TIMEOUT = timedelta(minutes=10)
#: the launcher's environment variable (seconds)
ENV = "HYPER_SHARD_TIMEOUT"


def _as_timedelta(value: Any, where: str) -> timedelta:
    if isinstance(value, timedelta):
        td = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        td = timedelta(seconds=float(value))
    else:
        raise TypeError(
            f"{where}: timeout must be a datetime.timedelta or a number of seconds, got "
            f"{type(value).__name__} {value!r}"
        )
    if td.total_seconds() <= 0:
        raise ValueError(f"{where}: timeout must be positive, got {td}")
    return td


def explicit_timeout(timeout: timedelta | float | None) -> timedelta | None:
    """``timeout`` if given, else ``HYPER_SHARD_TIMEOUT``, else None.

    Raises:
        TypeError / ValueError: a timeout that is not a positive timedelta or number, or a
            ``HYPER_SHARD_TIMEOUT`` that is not a positive number of seconds.
    """
    if timeout is not None:
        return _as_timedelta(timeout, "timeout=")
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a number of seconds (e.g. {ENV}=600)") from None
    return _as_timedelta(seconds, ENV)


def resolve_timeout(timeout: timedelta | float | None) -> timedelta:
    """The timeout to use: explicit (argument or environment) or :data:`DEFAULT_TIMEOUT`."""
    return explicit_timeout(timeout) or DEFAULT_TIMEOUT
