"""Debugging aids: collectives per op, the layout cache, where each shard lives, the last
collectives this rank ran, and the cross-rank consistency mode.

* :func:`comm_counter` counts the redistribution steps run inside it, by kind
  (``all_gather``, ``all_reduce``, ``reduce_scatter``, ``all_to_all``, and the local
  ``chunk``/``pad``/``partition``), forward and backward. :class:`CommDebugMode` is the same
  count with PyTorch DTensor's ``torch.distributed.tensor.debug.CommDebugMode`` interface.
* :func:`cache_info` / :func:`clear_cache`: the dispatcher's layout cache (hits, misses).
* :func:`visualize_sharding`: a text table of which mesh coordinate holds which slice.
* ``hyper-shard explain OP ...`` (the CLI) prints a rule's decision for given placements.
* :func:`recent_ops` / :func:`dump_recent_ops`: the flight recorder — the last collectives
  this rank ran, with the step, the redistribution and the op each ran for.
* :func:`check_consistency` (or ``HYPER_SHARD_CHECK_CONSISTENCY=1``): before every
  collective, the ranks of its group compare what they are about to run and raise
  :class:`~hyper_shard.errors.DivergenceError` on every rank at the first difference.

docs/troubleshooting.md shows how to read a :class:`~hyper_shard.errors.CollectiveError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from ..dispatch.dispatcher import cache_info, clear_cache
from ..flight.consistency import MODE
from ..flight.recorder import RECENT, Record, recent
from ..mesh import this_rank
from ..redistribute.executor import COUNTERS
from ..redistribute.planner import plan_cache_info
from ..redistribute.steps import COLLECTIVES as _STEP_COLLECTIVES

#: the kinds counted as collectives: the redistribution steps' and ``distribute_tensor``'s
#: broadcast from ``src_data_rank``
COLLECTIVES = _STEP_COLLECTIVES | {"broadcast"}

__all__ = [
    "CommDebugMode",
    "comm_counter",
    "cache_info",
    "clear_cache",
    "plan_cache_info",
    "visualize_sharding",
    "recent_ops",
    "dump_recent_ops",
    "clear_recent_ops",
    "check_consistency",
    "Record",
]


class CommCounts(dict):
    """Step kind -> count; ``collectives`` sums the communicating kinds."""

    @property
    def collectives(self) -> int:
        return sum(self.get(k, 0) for k in COLLECTIVES)


@contextmanager
def comm_counter() -> Iterator[CommCounts]:
    """Count the redistribution steps this rank runs inside the block (forward and
    backward), by kind. Nestable.

    >>> with comm_counter() as c:
    ...     y = x.redistribute(mesh, [Replicate()])
    >>> c["all_gather"]
    1
    """
    counts = CommCounts()
    COUNTERS.append((this_rank(), counts))
    try:
        yield counts
    finally:
        _remove_counter(counts)


def _remove_counter(counts: CommCounts) -> None:
    """Drop ``counts`` from the active counters by identity (two nested counters with
    equal counts compare equal as dicts)."""
    for i, (_, c) in enumerate(COUNTERS):
        if c is counts:
            del COUNTERS[i]
            return


#: the last component of a framework collective's name (torch.ops.c10d_functional /
#: _c10d_functional / c10d ops, torch.distributed._functional_collectives functions) ->
#: hyper_shard's step kind
_KIND_OF_NAME = {
    "all_gather_into_tensor": "all_gather",
    "all_gather_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
}


def _kind_of(key: Any) -> Any:
    name = key if isinstance(key, str) else getattr(key, "__name__", None)
    if not isinstance(name, str):
        return key
    return _KIND_OF_NAME.get(name.rsplit(".", 1)[-1], name)


class CollectiveCounts(dict):
    """Collective kind (``all_gather``, ``all_reduce``, ``reduce_scatter``, ``all_to_all``)
    -> count. Looked up by kind or by the framework's collective (PyTorch DTensor's tests
    index it with ``torch.ops.c10d_functional.all_gather_into_tensor``,
    ``funcol.all_reduce``...); a kind that did not run counts 0, as PyTorch's
    ``defaultdict``."""

    def __getitem__(self, key: Any) -> int:
        return int(super().get(_kind_of(key), 0))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(_kind_of(key), default)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_kind_of(key))


class CommDebugMode:
    """Count the collectives hyper_shard runs inside the block, with PyTorch DTensor's
    ``torch.distributed.tensor.debug.CommDebugMode`` interface (``with CommDebugMode() as
    m: ...; m.get_total_counts(); m.get_comm_counts()[funcol.all_gather_into_tensor]``).

    Counted: every collective step of a redistribution this rank runs, forward and
    backward (those of ops, ``redistribute``, ``full_tensor``, optimizer steps...), and
    ``distribute_tensor``'s broadcast from ``src_data_rank`` (kind ``broadcast``), one per
    step as in PyTorch (an all-to-all composed of point-to-point or gather calls on a
    backend without one counts once). Not counted: collectives of the user's own code (a
    ``local_map`` body's ``all_reduce``: PyTorch, which intercepts at the aten level, counts
    those), fused kernels' internal reductions and metadata exchanges. Works on torch and
    MindSpore; the counts are live inside the block and kept after it. Re-entering resets
    them, as PyTorch.
    """

    def __init__(self) -> None:
        self._raw: CommCounts = CommCounts()
        self._active = False

    def __enter__(self) -> CommDebugMode:
        self._raw = CommCounts()
        COUNTERS.append((this_rank(), self._raw))
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            _remove_counter(self._raw)
            self._active = False

    def get_comm_counts(self) -> CollectiveCounts:
        """Collective kind -> count (look it up by kind or by the framework collective)."""
        return CollectiveCounts({k: v for k, v in self._raw.items() if k in COLLECTIVES and v})

    def get_total_counts(self) -> int:
        """Every collective counted so far."""
        return self._raw.collectives

    @property
    def comm_counts(self) -> CollectiveCounts:
        """The attribute PyTorch's ``CommDebugMode`` keeps its counts in
        (``comm_mode.comm_counts[funcol.all_gather_into_tensor]``): :meth:`get_comm_counts`."""
        return self.get_comm_counts()


def visualize_sharding(dt: Any, header: str = "", use_rich: bool = False) -> str:
    """A table: for every mesh coordinate, the global index ranges of its local shard
    (``[start, stop)`` per tensor dim) and whether the values are partial. Needs no
    communication.

    As PyTorch DTensor's ``torch.distributed.tensor.debug.visualize_sharding``, the table
    (after ``header``, if given) is printed once, by the rank at mesh coordinate 0 (ranks
    outside the mesh print nothing); it is also returned, on every rank. ``use_rich`` is
    accepted for PyTorch's signature; the table is plain text either way.
    """
    del use_rich
    import itertools

    spec = dt._spec
    mesh = spec.mesh
    rows = [f"DTensor {list(spec.shape)} on mesh {mesh.shape}, placements {list(spec.placements)}"]
    partial = any(type(p).__name__ == "Partial" for p in spec.placements)
    for coord in itertools.product(*[range(s) for s in mesh.shape]):
        shape, off = spec.local_shape_and_offset(coord)
        rng = ", ".join(f"{o}:{o + n}" for o, n in zip(off, shape))
        rank = mesh.ranks[sum(c * st for c, st in zip(coord, mesh._strides))]
        rows.append(f"  rank {rank} {coord}: [{rng}]{' (partial)' if partial else ''}")
    table = "\n".join(rows)
    here = mesh.get_coordinate()
    if here is not None and not any(here):
        print(f"{header}\n{table}" if header else table)
    return table


# ---------------------------------------------------------------------- flight recorder
def recent_ops(last: int | None = None) -> list[Record]:
    """The last collectives this rank ran, oldest first (as PyTorch's flight recorder).

    Each :class:`~hyper_shard.flight.recorder.Record` holds the collective
    (``all_gather``, ``all_reduce``...), the group's ranks, the local buffer's shape and
    dtype, the redistribution step, the redistribution and the dispatched op it ran for
    (``.step``, ``.redistribution``, ``.op``: text, or None), the wall time, the duration
    and the status (``ok``, ``running``: still in flight, ``failed``). Only collectives are
    recorded: an op that moves nothing leaves no trace. The buffer keeps the last
    ``HYPER_SHARD_RECENT_OPS`` records (default 256).

    Args:
        last: only the last ``last`` records.
    """
    return recent(last)


def dump_recent_ops(file: str | os.PathLike[str] | IO[str] | None = None) -> str:
    """Every recorded collective of this rank as text, one line each (oldest first);
    written to ``file`` too when given (a path, or an open text stream such as
    ``sys.stderr``). Returns the text.

    >>> hyper_shard.debug.dump_recent_ops(f"recent_ops.rank{rank}.txt")
    """
    records = recent()
    lines = [f"hyper_shard: the last {len(records)} collectives of this rank (oldest first)"]
    lines += [str(r) for r in records]
    text = "\n".join(lines) + "\n"
    if file is not None:
        if isinstance(file, (str, os.PathLike)):
            with open(file, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            file.write(text)
            file.flush()
    return text


def clear_recent_ops() -> None:
    """Forget the recorded collectives."""
    RECENT.clear()


# ---------------------------------------------------------------------- consistency mode
@contextmanager
def check_consistency(enabled: bool = True) -> Iterator[None]:
    """Inside the block, before every collective the ranks of its group exchange a small
    fingerprint of what they are about to run (the collective, its buffer's shape and
    dtype, the step, the op and its inputs' global layouts) and every rank raises
    :class:`~hyper_shard.errors.DivergenceError` (a CollectiveError) at the first
    disagreement, naming what each rank was doing — before the mismatched collective could
    hang, abort or return garbage. Costs one small extra all-gather per collective; off by
    default (``HYPER_SHARD_CHECK_CONSISTENCY=1`` turns it on for the whole run).

    Every rank must enter and leave the block at the same point of the program. Nestable;
    ``check_consistency(False)`` turns it off inside.
    """
    with MODE.block(enabled):  # per rank: ranks may be threads of one process
        yield
