"""Placements: how one mesh dimension lays out a global tensor (as PyTorch DTensor).

* ``Shard(dim)``: the tensor is split along ``dim`` over the mesh dimension, with
  ``torch.chunk`` semantics (every chunk has ``ceil(n / k)`` rows except the last
  non-empty one; trailing chunks may be empty).
* ``Replicate()``: every rank of the mesh dimension holds the whole tensor.
* ``Partial(reduce_op)``: every rank holds a partial value; the global value is the
  reduction (``sum``, ``avg``, ``max``, ``min`` or ``prod``) of all of them.

Placements are small immutable values: hashable, comparable, with a readable repr.
This module imports no framework.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "Placement",
    "Shard",
    "Replicate",
    "Partial",
    "REDUCE_OPS",
    "normalize_placements",
    "grad_placement",
    "strided_shard_order",
]

REDUCE_OPS: Final = ("sum", "avg", "max", "min", "prod")
_REDUCE_ALIASES: Final = {
    "sum": "sum",
    "add": "sum",
    "avg": "avg",
    "mean": "avg",
    "max": "max",
    "min": "min",
    "prod": "prod",
    "product": "prod",
}


class Placement:
    """Base class of the three placement kinds. Instances are immutable."""

    __slots__ = ("_hash",)
    _hash: int

    def is_shard(self, dim: int | None = None) -> bool:
        """True for ``Shard`` (of ``dim`` when given)."""
        return False

    def is_replicate(self) -> bool:
        """True for ``Replicate``."""
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        """True for ``Partial`` (with ``reduce_op`` when given)."""
        return False

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __hash__(self) -> int:
        return self._hash


class Shard(Placement):
    """Split the tensor along ``dim`` (negative dims count from the end and are
    normalised once the tensor's rank is known, see :func:`normalize_placements`)."""

    __slots__ = ("dim",)
    dim: int

    def __init__(self, dim: int) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"Shard(dim): dim must be an int, got {dim!r}")
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "_hash", hash(("S", dim)))

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def normalized(self, ndim: int) -> Shard:
        """This placement with ``dim`` in ``[0, ndim)``.

        Raises:
            IndexError: ``dim`` is out of range for a tensor of rank ``ndim``.
        """
        d = self.dim
        if not -ndim <= d < ndim:
            raise IndexError(
                f"Shard({d}) is out of range for a tensor of rank {ndim}; "
                f"use a dim in [{-ndim}, {ndim - 1}]"
            )
        return self if d >= 0 else Shard(d + ndim)

    __hash__ = Placement.__hash__

    def __eq__(self, other: object) -> bool:
        return type(other) is Shard and other.dim == self.dim

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"

    def __reduce__(self):
        return (Shard, (self.dim,))


class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor."""

    __slots__ = ()

    def __init__(self) -> None:
        object.__setattr__(self, "_hash", hash("R"))

    def is_replicate(self) -> bool:
        return True

    __hash__ = Placement.__hash__

    def __eq__(self, other: object) -> bool:
        return type(other) is Replicate

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"

    def __reduce__(self):
        return (Replicate, ())


class Partial(Placement):
    """Every rank holds a partial value; the global value is their reduction.

    Args:
        reduce_op: ``"sum"`` (default), ``"avg"``, ``"max"``, ``"min"`` or ``"prod"``
            (``"mean"``/``"product"``/``"add"`` are accepted aliases).

    Raises:
        ValueError: an unknown reduce op.
    """

    __slots__ = ("reduce_op",)
    reduce_op: str

    def __init__(self, reduce_op: str = "sum") -> None:
        op = _REDUCE_ALIASES.get(str(reduce_op).lower())
        if op is None:
            raise ValueError(
                f"Partial(reduce_op={reduce_op!r}) is not supported; use one of {REDUCE_OPS}"
            )
        object.__setattr__(self, "reduce_op", op)
        object.__setattr__(self, "_hash", hash(("P", op)))

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    __hash__ = Placement.__hash__

    def __eq__(self, other: object) -> bool:
        return type(other) is Partial and other.reduce_op == self.reduce_op

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return "P" if self.reduce_op == "sum" else f"P({self.reduce_op})"

    def __reduce__(self):
        return (Partial, (self.reduce_op,))


_REPLICATE = Replicate()
_PARTIAL_SUM = Partial("sum")


def normalize_placements(
    placements: Sequence[Placement], mesh_ndim: int, tensor_ndim: int
) -> tuple[Placement, ...]:
    """Validate placements for a mesh and tensor rank; normalise negative shard dims.

    Args:
        placements: one placement per mesh dimension.
        mesh_ndim: the DeviceMesh's number of dimensions.
        tensor_ndim: the global tensor's rank.

    Returns:
        A tuple of placements with every ``Shard.dim`` in ``[0, tensor_ndim)``.

    Raises:
        ValueError: the number of placements differs from ``mesh_ndim``.
        TypeError: an element is not a Placement.
        IndexError: a shard dim is out of range.
    """
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(
            f"`placements` must have the same length as `device_mesh.ndim`: got "
            f"{len(placements)} placements {list(placements)} for a {mesh_ndim}-D DeviceMesh; "
            f"give exactly one placement per mesh dimension"
        )
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            q = from_foreign(p)
            if q is None:
                raise TypeError(
                    f"placements must be Shard/Replicate/Partial instances, got {p!r} "
                    f"(did you write Replicate instead of Replicate()?)"
                )
            p = q
        if type(p) is Shard:
            p = p.normalized(tensor_ndim)
        out.append(p)
    return tuple(out)


def from_foreign(p: Any) -> Placement | None:
    """PyTorch DTensor's own ``Shard(d)`` / ``Replicate()`` / ``Partial(op)`` (from
    ``torch.distributed.tensor``) as hyper_shard's, so code that mixes the two imports (or
    torch's own utilities handing their placements to a hyper_shard DTensor, e.g. DCP's
    full state dict) works; None for anything else. Read by class name and attributes:
    this layer imports no framework."""
    name = type(p).__name__
    if name == "Replicate":
        return Replicate()
    if name == "Shard" and isinstance(getattr(p, "dim", None), int):
        return Shard(p.dim)
    if name == "Partial" and isinstance(getattr(p, "reduce_op", None), str):
        return Partial(p.reduce_op)
    return None


def grad_placement(p: Placement) -> Placement:
    """The placement of the *local-derivative* form of a gradient for a value placed ``p``.

    Local autograd computes, on every rank, the derivative of the global objective with
    respect to that rank's local data. For ``Shard(d)`` that is the shard of the
    gradient; for ``Replicate`` every rank holds its contribution, so the gradient is
    ``Partial(sum)``; for ``Partial(sum)`` every rank holds the whole gradient
    (``Replicate``); for the other partial ops the local derivatives sum to the gradient
    (``Partial(sum)``).
    """
    if type(p) is Shard:
        return p
    if type(p) is Replicate:
        return _PARTIAL_SUM
    assert isinstance(p, Partial)
    return _REPLICATE if p.reduce_op == "sum" else _PARTIAL_SUM


def _is_strided(p: Any) -> bool:
    """PyTorch's internal ``_StridedShard(dim, split_factor)`` (a ``Shard`` subclass that
    FSDP2 over tensor parallelism and some of PyTorch's tests construct)."""
    return type(p).__name__ == "_StridedShard" and hasattr(p, "split_factor")


def strided_shard_order(
    placements: Sequence[Any], mesh_shape: Sequence[int], tensor_ndim: int
) -> tuple[tuple[Any, ...], tuple[tuple[int, tuple[int, ...]], ...] | None]:
    """``placements`` with PyTorch's ``_StridedShard`` entries replaced by ``Shard``, and the
    split order they stand for (``None`` when there is none).

    ``_StridedShard(d, split_factor=f)`` on mesh dim ``i`` (PyTorch's semantics) splits dim
    ``d`` into ``f`` chunks and gives coordinate ``k`` piece ``k`` of every chunk. When the
    mesh dims after ``i`` that ``Shard(d)`` have sizes whose product is ``f`` (FSDP2 x TP:
    ``[_StridedShard(0, split_factor=tp), Shard(0)]`` on ``("dp", "tp")``), that is the
    layout in which those later mesh dims split ``d`` first: ``DTensorSpec.shard_order``
    entry ``(d, (later dims..., strided dims...))``. Placements without ``_StridedShard``
    are returned unchanged with ``None``.

    Raises:
        NotImplementedError: a ``_StridedShard`` whose ``split_factor`` is not that product
            (a layout no split order expresses).
    """
    placements = tuple(placements)
    if not any(_is_strided(p) for p in placements):
        return placements, None
    out: list[Any] = []
    for p in placements:
        out.append(Shard(p.dim) if _is_strided(p) else p)
    order = []
    for d in sorted({int(p.dim) % max(tensor_ndim, 1) for p in placements if _is_strided(p)}):
        strided = [
            i for i, p in enumerate(placements) if _is_strided(p) and p.dim % tensor_ndim == d
        ]
        plain = [
            i
            for i, p in enumerate(placements)
            if isinstance(p, Shard) and not _is_strided(p) and p.dim % tensor_ndim == d
        ]
        want = math.prod(int(mesh_shape[j]) for j in plain)
        for i in strided:
            f = int(placements[i].split_factor)
            if f != want or any(j < i for j in plain):
                raise NotImplementedError(
                    f"{placements[i]!r} on mesh dim {i} of placements {list(placements)}: "
                    f"hyper_shard expresses _StridedShard as a split order, which needs "
                    f"split_factor == the product of the sizes of the later mesh dims that "
                    f"Shard({d}) ({want}); pass Shard placements with shard_order= instead "
                    f"(distribute_tensor, docs/fsdp.md)"
                )
        order.append((d, tuple(plain + strided)))
    return tuple(out), tuple(order)
