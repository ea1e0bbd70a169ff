"""Small shape helpers shared by rule families (pure python)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..placement import Placement, Replicate, Shard

__all__ = [
    "broadcast_shapes",
    "normalize_dim",
    "R",
    "LINEAR_OPS",
    "split_sizes",
    "chunk_sizes_torch",
    "as_int",
]

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


def as_int(v: Any, what: str) -> int:
    """``v`` as a python int (ints, 0-d integer tensors, numpy ints).

    Raises:
        TypeError: not an integer.
    """
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__} {v!r}") from None


def split_sizes(extent: int, split: Any) -> list[int]:
    """Piece sizes of ``torch.split(x, split, dim)`` along a dim of ``extent`` elements.

    Raises:
        ValueError: sections that do not add up to ``extent``, or a non-positive size.
    """
    if isinstance(split, (list, tuple)):
        sizes = [as_int(s, "split size") for s in split]
        if sum(sizes) != extent or any(s < 0 for s in sizes):
            raise ValueError(
                f"split_with_sizes expects split_sizes to sum exactly to {extent}, got {sizes}"
            )
        return sizes
    s = as_int(split, "split_size")
    if s <= 0 and extent > 0:
        raise ValueError(f"split expects split_size to be positive, got {s}")
    if extent == 0:
        return [0]
    return [min(s, extent - i) for i in range(0, extent, s)]


def chunk_sizes_torch(extent: int, chunks: int) -> list[int]:
    """Piece sizes of ``torch.chunk(x, chunks, dim)`` (may be fewer than ``chunks``)."""
    if chunks <= 0:
        raise ValueError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    if extent == 0:
        return [0] * chunks
    c = -(-extent // chunks)
    return [min(c, extent - i) for i in range(0, extent, c)]


# ---------------------------------------------------------------------- the tensor_op rule


def window_shards_align(
    shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    steps: dict[int, int],
    first_spatial: int,
) -> bool:
    """Whether an input's spatial shards can be windowed locally: every dim at or after
    ``first_spatial`` that ``placements`` shard is one of ``steps`` (dim -> window length,
    the windows tiling the dim with no overlap), is sharded by one mesh dim only, each
    ``torch.chunk`` piece is a whole number of windows, and the output's pieces (the
    window counts) are the ``torch.chunk`` layout of the output size."""
    from ..spec import chunk_sizes

    by_dim: dict[int, list[int]] = {}
    for m, p in enumerate(placements):
        if type(p) is Shard and p.dim >= first_spatial:
            by_dim.setdefault(p.dim, []).append(m)
    for dim, ms in by_dim.items():
        step = steps.get(dim)
        if step is None or len(ms) > 1:
            return False
        n, size = mesh_shape[ms[0]], shape[dim]
        pieces = chunk_sizes(size, n)
        if any(c % step for c in pieces) or [c // step for c in pieces] != chunk_sizes(
            size // step, n
        ):
            return False
    return True


class ReplicatedResult:
    """A local implementation for ops whose output shape depends on the values
    (``nonzero``, ``unique``, ``x[mask]``...): it runs the op on the gathered (Replicate)
    inputs, so every rank computes the whole result, and wraps every tensor of the result
    as a Replicate DTensor of the shape it has (its global shape is its local one). The
    decision declares no output placements (the result arrives wrapped)."""

    __slots__ = ("func", "mesh", "platform")

    def __init__(self, func: Any, mesh: Any, platform: Any) -> None:
        self.func, self.mesh, self.platform = func, mesh, platform

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self.func(*args, **kwargs))

    def _wrap(self, out: Any) -> Any:
        from ..spec import DTensorSpec

        plat = self.platform
        if plat.is_tensor(out):
            spec = DTensorSpec(self.mesh, (Replicate(),) * self.mesh.ndim, plat.tensor_meta(out))
            return plat.wrap(out, spec)
        if isinstance(out, (tuple, list)):
            return type(out)([self._wrap(o) for o in out])
        return out


def replicated_result_layout(call: Any) -> Any:
    """The decision of an op whose output shape depends on the values: every input
    gathered to Replicate, the op run whole on every rank (:class:`ReplicatedResult`).
    Correct for any input; it costs the gather (a sharded input's memory on every rank)."""
    from ..dispatch.op import Layout

    rep = (Replicate(),) * call.mesh.ndim
    return Layout(
        [rep] * len(call.specs),
        [None],
        [None],
        impl=ReplicatedResult(call.func, call.mesh, call.platform),
    )
