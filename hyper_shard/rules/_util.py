"""Small shape helpers shared by rule families (pure python)."""

from __future__ import annotations

from collections.abc import Sequence

from ..placement import Partial, Placement, Replicate, Shard

__all__ = ["broadcast_shapes", "normalize_dim", "R", "LINEAR_OPS", "partial_ops_of"]

R = Replicate()
LINEAR_OPS = ("sum", "avg")


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy/torch broadcasting of shapes.

    Raises:
        ValueError: shapes that do not broadcast.
    """
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s):
            j = n - len(s) + i
            if d != 1:
                if out[j] not in (1, d):
                    raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[j] = d
            elif out[j] == 0:
                pass
    return tuple(out)


def normalize_dim(d: int, ndim: int, what: str = "dim") -> int:
    """``d`` in ``[0, ndim)`` (a 0-d tensor accepts 0 and -1).

    Raises:
        IndexError: out of range.
    """
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"{what} {d} out of range for a tensor of rank {ndim}")
    return d % n


def partial_ops_of(placements: Sequence[Placement]) -> set[str]:
    return {p.reduce_op for p in placements if type(p) is Partial}


def shard(d: int) -> Shard:
    return Shard(d)
