"""Debugging aids: collectives per op, the layout cache, and where each shard lives.

* :func:`comm_counter` counts the redistribution steps run inside it, by kind
  (``all_gather``, ``all_reduce``, ``reduce_scatter``, ``all_to_all``, and the local
  ``chunk``/``pad``/``partition``), forward and backward.
* :func:`cache_info` / :func:`clear_cache`: the dispatcher's layout cache (hits, misses).
* :func:`visualize_sharding`: a text table of which mesh coordinate holds which slice.
* ``hyper-shard explain OP ...`` (the CLI) prints a rule's decision for given placements.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..dispatch.dispatcher import cache_info, clear_cache
from ..redistribute.planner import plan_cache_info
from ..redistribute.steps import COLLECTIVES, COUNTERS

__all__ = ["comm_counter", "cache_info", "clear_cache", "plan_cache_info", "visualize_sharding"]


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
    COUNTERS.append(counts)
    try:
        yield counts
    finally:
        COUNTERS.remove(counts)


def visualize_sharding(dt: Any) -> str:
    """A table: for every mesh coordinate, the global index ranges of its local shard
    (``[start, stop)`` per tensor dim) and whether the values are partial. Pure: needs no
    communication.
    """
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
    return "\n".join(rows)
