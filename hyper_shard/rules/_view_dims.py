"""Pure dim mapping of the view ops (no framework, no mesh): global output shapes, which
input dims hold which output dims' elements, and when a shard survives.

A :class:`DimMap` partitions an op's input and output dims into :class:`DimGroup` s. A
group's input dims and output dims hold the same elements in the same row-major order:

* ``(i,) -> (j,)`` one dim kept (transpose, permute, squeeze/unsqueeze/expand's kept dims);
* ``(i, i+1...) -> (j,)`` a flatten, ``(i,) -> (j, j+1...)`` a split, or both at once
  (``(4, 6) -> (8, 3)`` is one group): the minimal groups whose products agree;
* ``(i,) -> ()`` a removed size-1 dim, ``() -> (j,)`` a new size-1 (or expand's new
  leading) dim;
* ``fixed`` groups no shard may cross: expand's broadcast dims (1 -> n), a reshape of a
  tensor with no element, the last dim of a dtype view that changes the element size.

A ``Shard(d)`` of the input survives as ``Shard(o)`` (:func:`shard_target`) only when
``d`` is its group's first input dim, ``o`` its first output dim, and, for every rank,
the ``torch.chunk`` piece of ``d`` times the extent of the group's other input dims equals
the piece of ``o`` times the extent of the group's other output dims: then every rank's
local data is exactly its ``torch.chunk`` shard of the output. A non-leading dim of a
group holds strided, non-contiguous data and never survives.

Every error is a ``ValueError`` or ``IndexError`` worded as torch's for the same call.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..spec import chunk_sizes

__all__ = [
    "DimGroup",
    "DimMap",
    "nested_chunks",
    "shard_target",
    "infer_shape",
    "flatten_shape",
    "unflatten_shape",
    "transpose_perm",
    "movedim_perm",
    "check_perm",
    "squeeze_dims",
    "unsqueeze_dim",
    "expand_shape",
    "reshape_map",
    "permute_map",
    "squeeze_map",
    "unsqueeze_map",
    "expand_map",
    "dtype_view_map",
    "wrap_dim",
]


@dataclass(frozen=True)
class DimGroup:
    """Input dims ``ins`` and output dims ``outs`` holding the same elements in the same
    order; ``fixed``: no shard may cross the group."""

    ins: tuple[int, ...]
    outs: tuple[int, ...]
    fixed: bool = False


@dataclass(frozen=True)
class DimMap:
    """An op's global input and output shapes and the groups partitioning their dims."""

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    groups: tuple[DimGroup, ...]

    def group_of(self, d: int) -> DimGroup:
        """The group holding input dim ``d``.

        Raises:
            KeyError: ``d`` is in no group.
        """
        for g in self.groups:
            if d in g.ins:
                return g
        raise KeyError(d)


def nested_chunks(extent: int, splits: Sequence[int]) -> list[int]:
    """Piece lengths of ``extent`` split by ``torch.chunk`` over ``splits[0]`` ranks, every
    piece again over ``splits[1]``, and so on (the pieces of nested shards, in mesh-coordinate
    order).

    >>> nested_chunks(6, [2, 2])
    [2, 1, 2, 1]
    """
    pieces = [extent]
    for n in splits:
        pieces = [c for p in pieces for c in chunk_sizes(p, n)]
    return pieces


def shard_target(dmap: DimMap, d: int, splits: Sequence[int] | None = None) -> int | None:
    """The output dim a ``Shard(d)`` input becomes, or None if it must be gathered.

    Args:
        dmap: the op's dim map.
        d: the sharded input dim.
        splits: the sizes of the mesh dims sharding ``d``, left to right (nested shards);
            None checks only the structure (``d`` leads a group with an output dim).
    """
    g = dmap.group_of(d)
    if g.fixed or not g.outs or g.ins[0] != d:
        return None
    o = g.outs[0]
    if splits is None:
        return o
    inner_in = math.prod(dmap.in_shape[k] for k in g.ins[1:])
    inner_out = math.prod(dmap.out_shape[k] for k in g.outs[1:])
    a = nested_chunks(dmap.in_shape[d], splits)
    b = nested_chunks(dmap.out_shape[o], splits)
    return o if all(x * inner_in == y * inner_out for x, y in zip(a, b)) else None


# ---------------------------------------------------------------------- shapes
def _int(v: Any, what: str) -> int:
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__} {v!r}") from None


def wrap_dim(d: Any, ndim: int) -> int:
    """``d`` in ``[0, ndim)``; a 0-d tensor accepts 0 and -1 (as torch).

    Raises:
        IndexError: out of range.
    """
    d = _int(d, "dim")
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
        )
    return d % n


def _ints(seq: Any, what: str) -> tuple[int, ...]:
    if isinstance(seq, (list, tuple)):
        return tuple(_int(v, what) for v in seq)
    return (_int(seq, what),)


def infer_shape(sizes: Sequence[Any], numel: int) -> tuple[int, ...]:
    """``sizes`` with its ``-1`` resolved against ``numel`` (as ``torch.Tensor.view``).

    Raises:
        ValueError: two ``-1``, a negative size, a product that does not match ``numel``, or
            a ``-1`` that is ambiguous (no element).
    """
    shape = _ints(tuple(sizes), "a shape entry")
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ValueError(f"shape {list(shape)}: only one dimension can be inferred")
    bad = [s for s in shape if s < -1]
    if bad:
        raise ValueError(f"shape {list(shape)}: invalid shape dimension {bad[0]}")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if known == 0:
            if numel == 0:
                raise ValueError(
                    f"cannot reshape tensor of 0 elements into shape {list(shape)} because the "
                    f"unspecified dimension size -1 can be any value and is ambiguous"
                )
            raise ValueError(f"shape {list(shape)} is invalid for input of size {numel}")
        if numel % known:
            raise ValueError(f"shape {list(shape)} is invalid for input of size {numel}")
        i = unknown[0]
        return shape[:i] + (numel // known,) + shape[i + 1 :]
    if known != numel:
        raise ValueError(f"shape {list(shape)} is invalid for input of size {numel}")
    return shape


def flatten_shape(shape: Sequence[int], start_dim: Any = 0, end_dim: Any = -1) -> tuple[int, ...]:
    """The shape after ``torch.flatten(x, start_dim, end_dim)`` (a 0-d tensor gives ``(1,)``).

    Raises:
        IndexError: a dim out of range. ValueError: ``start_dim`` after ``end_dim``.
    """
    shape = tuple(shape)
    s, e = wrap_dim(start_dim, len(shape)), wrap_dim(end_dim, len(shape))
    if not shape:
        return (1,)
    if s > e:
        raise ValueError("flatten() has invalid args: start_dim cannot come after end_dim")
    return shape[:s] + (math.prod(shape[s : e + 1]),) + shape[e + 1 :]


def unflatten_shape(shape: Sequence[int], dim: Any, sizes: Sequence[Any]) -> tuple[int, ...]:
    """The shape after ``torch.unflatten(x, dim, sizes)`` (one ``-1`` allowed in ``sizes``).

    Raises:
        IndexError: ``dim`` out of range (or a 0-d input). ValueError: empty ``sizes`` or
            sizes whose product is not ``shape[dim]``.
    """
    shape = tuple(shape)
    if not shape:
        raise IndexError("unflatten: a 0-d tensor has no dim to unflatten")
    d = wrap_dim(dim, len(shape))
    sizes = _ints(sizes, "a size")
    if not sizes:
        raise ValueError("unflatten: sizes must be non-empty")
    try:
        new = infer_shape(sizes, shape[d])
    except ValueError:
        raise ValueError(
            f"unflatten: provided sizes {list(sizes)} don't multiply up to the size of dim "
            f"{d} ({shape[d]}) in the input tensor"
        ) from None
    return shape[:d] + new + shape[d + 1 :]


def check_perm(dims: Sequence[Any], ndim: int) -> tuple[int, ...]:
    """``dims`` normalised, checked to be a permutation of ``range(ndim)`` (as ``permute``).

    Raises:
        ValueError: wrong length or a repeated dim. IndexError: a dim out of range.
    """
    perm = tuple(wrap_dim(d, ndim) for d in _ints(tuple(dims), "a dim"))
    if ndim == 0 and not perm:
        return ()
    if len(perm) != ndim:
        raise ValueError(
            f"permute: the number of dims in the desired ordering ({len(perm)}) does not match "
            f"the tensor's rank ({ndim})"
        )
    if len(set(perm)) != len(perm):
        raise ValueError(f"permute(): duplicate dims are not allowed (got {list(perm)})")
    return perm


def transpose_perm(ndim: int, dim0: Any, dim1: Any) -> tuple[int, ...]:
    """Output dim ``j`` takes input dim ``perm[j]`` after ``transpose(dim0, dim1)``.

    Raises:
        IndexError: a dim out of range.
    """
    a, b = wrap_dim(dim0, ndim), wrap_dim(dim1, ndim)
    perm = list(range(ndim))
    if ndim:
        perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def movedim_perm(ndim: int, source: Any, destination: Any) -> tuple[int, ...]:
    """Output dim ``j`` takes input dim ``perm[j]`` after ``torch.movedim(source, dest)``.

    Raises:
        ValueError: source and destination of different lengths, or a repeated dim.
        IndexError: a dim out of range.
    """
    src = tuple(wrap_dim(d, ndim) for d in _ints(source, "a dim"))
    dst = tuple(wrap_dim(d, ndim) for d in _ints(destination, "a dim"))
    if len(src) != len(dst):
        raise ValueError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
            f"contain the same number of dims as destination ({list(dst)} dims)"
        )
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: repeated dim in source {list(src)} or destination {list(dst)}")
    if ndim == 0:
        return ()
    perm: list[int | None] = [None] * ndim
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(ndim) if d not in src)
    return tuple(p if p is not None else next(rest) for p in perm)


def squeeze_dims(shape: Sequence[int], dim: Any = None) -> tuple[int, ...]:
    """The dims ``squeeze(dim)`` removes: the named (or, with None, every) size-1 dims.

    Raises:
        IndexError: a dim out of range.
    """
    shape = tuple(shape)
    if dim is None:
        cand: tuple[int, ...] = tuple(range(len(shape)))
    else:
        cand = tuple(wrap_dim(d, len(shape)) for d in _ints(dim, "a dim"))
    if not shape:
        return ()
    return tuple(sorted({d for d in cand if shape[d] == 1}))


def unsqueeze_dim(ndim: int, dim: Any) -> int:
    """Where ``unsqueeze(dim)`` inserts the new dim (``dim`` in ``[-ndim-1, ndim]``).

    Raises:
        IndexError: out of range.
    """
    return wrap_dim(dim, ndim + 1)


def expand_shape(shape: Sequence[int], sizes: Sequence[Any]) -> tuple[int, ...]:
    """The shape after ``expand(*sizes)`` (``-1`` keeps a dim; new dims lead).

    Raises:
        ValueError: fewer sizes than dims, ``-1`` for a new dim, or a size that differs
            from a non-singleton dim.
    """
    shape = tuple(shape)
    sizes = _ints(tuple(sizes), "a size")
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise ValueError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
            f"the number of dimensions in the tensor ({len(shape)})"
        )
    out = []
    for j, s in enumerate(sizes):
        if j < lead:
            if s < 0:
                raise ValueError(
                    f"expand: the expanded size of the tensor ({s}) isn't allowed in a leading, "
                    f"non-existing dimension {j}"
                )
            out.append(s)
            continue
        have = shape[j - lead]
        if s == -1 or s == have:
            out.append(have)
        elif have == 1 and s >= 0:
            out.append(s)
        else:
            raise ValueError(
                f"expand: the expanded size of the tensor ({s}) must match the existing size "
                f"({have}) at non-singleton dimension {j}. Target sizes: {list(sizes)}. "
                f"Tensor sizes: {list(shape)}"
            )
    return tuple(out)


# ---------------------------------------------------------------------- dim maps
def reshape_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> DimMap:
    """The minimal groups of a row-major reshape (view, reshape, flatten, unflatten).

    Size-1 dims form their own groups (paired 1:1 when both sides have one at the same
    point); a tensor with no element is one ``fixed`` group.

    Raises:
        ValueError: the shapes hold different numbers of elements.
    """
    a, b = tuple(in_shape), tuple(out_shape)
    if math.prod(a) != math.prod(b):
        raise ValueError(f"shape {list(b)} is invalid for input of size {math.prod(a)}")
    if math.prod(a) == 0:
        return DimMap(a, b, (DimGroup(tuple(range(len(a))), tuple(range(len(b))), fixed=True),))
    groups: list[DimGroup] = []
    i = j = 0
    while i < len(a) or j < len(b):
        x = a[i] if i < len(a) else None
        y = b[j] if j < len(b) else None
        if x == 1 and y == 1:
            groups.append(DimGroup((i,), (j,)))
            i, j = i + 1, j + 1
        elif x == 1:
            groups.append(DimGroup((i,), ()))
            i += 1
        elif y == 1:
            groups.append(DimGroup((), (j,)))
            j += 1
        else:  # both > 1: equal products leave non-1 dims on both sides
            assert x is not None and y is not None
            gi, go, px, py = [i], [j], x, y
            i, j = i + 1, j + 1
            while px != py:
                if px < py:
                    px *= a[i]
                    gi.append(i)
                    i += 1
                else:
                    py *= b[j]
                    go.append(j)
                    j += 1
            groups.append(DimGroup(tuple(gi), tuple(go)))
    return DimMap(a, b, tuple(groups))


def permute_map(in_shape: Sequence[int], perm: Sequence[int]) -> DimMap:
    """Output dim ``j`` is input dim ``perm[j]`` (transpose, permute, movedim, t, T, mT)."""
    a = tuple(in_shape)
    return DimMap(
        a, tuple(a[p] for p in perm), tuple(DimGroup((p,), (j,)) for j, p in enumerate(perm))
    )


def squeeze_map(in_shape: Sequence[int], dims: Sequence[int]) -> DimMap:
    """``dims`` (size 1) removed; the others kept in order."""
    a = tuple(in_shape)
    groups, j = [], 0
    for i in range(len(a)):
        if i in dims:
            groups.append(DimGroup((i,), ()))
        else:
            groups.append(DimGroup((i,), (j,)))
            j += 1
    return DimMap(a, tuple(s for i, s in enumerate(a) if i not in dims), tuple(groups))


def unsqueeze_map(in_shape: Sequence[int], dim: int) -> DimMap:
    """A new size-1 output dim at ``dim``; the others kept in order."""
    a = tuple(in_shape)
    groups = [DimGroup((i,), (i if i < dim else i + 1,)) for i in range(len(a))]
    groups.append(DimGroup((), (dim,)))
    return DimMap(a, a[:dim] + (1,) + a[dim:], tuple(groups))


def expand_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> DimMap:
    """New leading output dims, kept dims, and ``fixed`` broadcast dims (1 -> n)."""
    a, b = tuple(in_shape), tuple(out_shape)
    lead = len(b) - len(a)
    groups = [DimGroup((), (j,)) for j in range(lead)]
    for i, s in enumerate(a):
        groups.append(DimGroup((i,), (i + lead,), fixed=s != b[i + lead]))
    return DimMap(a, b, tuple(groups))


def dtype_view_map(in_shape: Sequence[int], in_itemsize: int, out_itemsize: int) -> DimMap:
    """``view(dtype)``: same shape for equal element sizes, else the last dim rescaled (and
    ``fixed``).

    Raises:
        ValueError: a 0-d tensor or a last dim that does not rescale to whole elements.
    """
    a = tuple(in_shape)
    if in_itemsize == out_itemsize:
        return permute_map(a, range(len(a)))
    if not a:
        raise ValueError(
            "view(dtype): a 0-d tensor cannot be viewed as a dtype of another element size"
        )
    nbytes = a[-1] * in_itemsize
    if nbytes % out_itemsize:
        raise ValueError(
            f"view(dtype): the last dim's {nbytes} bytes are not a whole number of "
            f"{out_itemsize}-byte elements"
        )
    n = len(a)
    groups = [DimGroup((i,), (i,)) for i in range(n - 1)]
    groups.append(DimGroup((n - 1,), (n - 1,), fixed=True))
    return DimMap(a, a[:-1] + (nbytes // out_itemsize,), tuple(groups))
