"""MindSpore's collective timeout: process-wide, fixed when communication starts.

MindSpore has no per-group timeout (``mint.distributed.new_group(timeout=)`` is a
reserved parameter). On CPU, mccl's collectives fail after ``MS_CPU_COMM_OP_TIMEOUT``
seconds (30 s by default, measured on MindSpore 2.10), read when communication starts: a
value set later has no effect. hyper_shard sets it from
:func:`~hyper_shard.platform.timeouts.resolve_timeout` before it starts communication
(:func:`hyper_shard.platform.mindspore.launch.init_process`, or ``init()`` under msrun),
unless the user exported it.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

from ..timeouts import explicit_timeout, resolve_timeout

__all__ = ["CPU_TIMEOUT_ENV", "set_collective_timeout", "collective_timeout", "check_group_timeout"]

#: MindSpore's CPU (mccl) collective timeout, seconds, read when communication starts
CPU_TIMEOUT_ENV = "MS_CPU_COMM_OP_TIMEOUT"
_MS_CPU_DEFAULT = timedelta(seconds=30)  # mccl's own default (measured, MindSpore 2.10)


def set_collective_timeout(device: str, timeout: timedelta | float | None = None) -> None:
    """Before MindSpore's communication starts: make its collectives on ``device`` fail
    after ``timeout`` (:func:`~hyper_shard.platform.timeouts.resolve_timeout`: default
    ``HYPER_SHARD_TIMEOUT`` or 10 minutes). On CPU (mccl) that is ``MS_CPU_COMM_OP_TIMEOUT``
    (seconds; a value the user exported wins). Other devices: their own variables
    (``HCCL_EXEC_TIMEOUT`` on Ascend) are left to the user.
    """
    td = resolve_timeout(timeout)
    if device == "CPU":
        os.environ.setdefault(CPU_TIMEOUT_ENV, str(max(1, round(td.total_seconds()))))


def collective_timeout(device: str) -> timedelta | None:
    """The collective timeout MindSpore uses on ``device`` (CPU: ``MS_CPU_COMM_OP_TIMEOUT``
    or mccl's 30 s default), or None when unknown."""
    if device != "CPU":
        return None
    raw = os.environ.get(CPU_TIMEOUT_ENV, "")
    try:
        return timedelta(seconds=float(raw)) if raw else _MS_CPU_DEFAULT
    except ValueError:
        return _MS_CPU_DEFAULT


def check_group_timeout(timeout: timedelta | float | None, have: timedelta | None) -> None:
    """A mesh's ``timeout`` once communication has started: validated, and a warning if an
    explicit one differs from the process-wide ``have`` (it cannot apply any more).

    Raises:
        TypeError / ValueError: a timeout that is not a positive timedelta or number.
    """
    want = explicit_timeout(timeout)
    if want is not None and have is not None and want != have:
        warnings.warn(
            f"hyper_shard: MindSpore's collective timeout is process-wide and was fixed at "
            f"{have} when communication started ({CPU_TIMEOUT_ENV}); the mesh's timeout "
            f"{want} cannot apply. Export {CPU_TIMEOUT_ENV}={round(want.total_seconds())} "
            f"(or HYPER_SHARD_TIMEOUT) before starting",
            stacklevel=4,
        )
