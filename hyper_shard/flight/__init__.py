"""What each rank communicates: context frames, the flight recorder, the guard, and the
consistency mode (the machinery behind :mod:`hyper_shard.debug`'s ``recent_ops``,
``dump_recent_ops`` and ``check_consistency``, and behind
:class:`~hyper_shard.errors.CollectiveError`).

* :mod:`.context`: the per-thread stack of frames the slow paths push (the op, the
  redistribution, the step) — never the cache-hit path of an op that moves nothing;
* :mod:`.recorder`: the ring buffer of the last collectives this rank ran;
* :mod:`.guard`: ``collective(...)``, which every platform collective runs in;
* :mod:`.consistency`: the cross-rank fingerprint check.

Framework-neutral (it imports only the value layer); see docs/troubleshooting.md.
"""

from __future__ import annotations

from .consistency import MODE, check
from .context import (
    BackwardFrame,
    Frame,
    OpFrame,
    RedistributeFrame,
    StepFrame,
    forward_context,
    stack,
)
from .guard import collective, guarded
from .recorder import RECENT, Record, recent

__all__ = [
    "MODE",
    "check",
    "Frame",
    "OpFrame",
    "RedistributeFrame",
    "StepFrame",
    "BackwardFrame",
    "forward_context",
    "stack",
    "collective",
    "guarded",
    "RECENT",
    "Record",
    "recent",
]
