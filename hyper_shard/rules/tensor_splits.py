"""More ``rule: tensor_op`` kinds that split a tensor: ``tensor_split`` and ``hsplit`` /
``vsplit`` / ``dsplit`` (sections or indices).

Semantics (piece sizes, errors) are those of the torch functions of the same names on the
GLOBAL tensor; as for ``split``, the split dim is gathered, every other dim keeps its
shard, ``Partial`` values pass through, and the pieces are views of the input. The
indices are python ints: a tensor of indices (``tensor_split(x, torch.tensor([1, 3]))``)
would make the piece sizes depend on its values, so a DTensor there raises, naming the
fix.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import OpCall
from ._util import as_int, normalize_dim
from .planned import OpPlan, ValueDependentShape
from .tensor_ops import _KINDS

__all__ = ["tensor_split_pieces"]

_ARGS = ("indices_or_sections", "sections", "indices", "tensor_indices_or_sections")


def tensor_split_pieces(extent: int, arg: Any) -> tuple[list[int], list[int]]:
    """(starts, sizes) of ``torch.tensor_split`` along a dim of ``extent`` elements: an int
    gives that many near-equal pieces (the first ``extent % n`` one longer), a list of
    indices the slices between them (python slicing: clamped, possibly empty).

    Raises:
        ValueError: a number of sections below 1.
        TypeError: neither an int nor a sequence of ints.
    """
    if isinstance(arg, (list, tuple)):
        bounds = [as_int(i, "indices") for i in arg]
        starts, sizes = [], []
        for lo, hi in zip([0, *bounds], [*bounds, extent]):
            r = range(extent)[lo:hi]
            starts.append(
                r.start if len(r) else min(max(lo if lo >= 0 else lo + extent, 0), extent)
            )
            sizes.append(len(r))
        return starts, sizes
    n = as_int(arg, "sections")
    if n <= 0:
        raise ValueError(f"number of sections must be larger than 0, got {n}")
    q, rem = divmod(extent, n)
    even = [q + 1] * rem + [q] * (n - rem)
    return [sum(even[:i]) for i in range(n)], even


def _pieces_arg(op: Any, call: OpCall, st: dict) -> Any:
    if any(r in _ARGS for r in call.arg_roles):  # pieces sized by the values: run it whole
        raise ValueDependentShape
    for name in _ARGS:
        if st.get(name) is not None:
            return st[name]
    raise TypeError(f"{op.name} needs indices_or_sections")


@_KINDS.kind(
    "tensor_split",
    ("input", "indices_or_sections", "dim"),
    ("indices_or_sections", "sections", "indices", "dim"),
)
def _plan_tensor_split(op: Any, call: OpCall, st: dict) -> OpPlan:
    arg = _pieces_arg(op, call, st)
    spec = op._one(call)
    if spec.ndim == 0:
        raise ValueError("tensor_split expected at least a 1-dimensional tensor")
    dim = normalize_dim(as_int(st.get("dim") or 0, "dim"), spec.ndim, "dim")
    starts, sizes = tensor_split_pieces(spec.shape[dim], arg)
    return op._split_plan(spec, dim, sizes, starts=starts)


def _directional(op: Any, call: OpCall, st: dict, dim: int, min_ndim: int) -> OpPlan:
    name = op.params.kind
    arg = _pieces_arg(op, call, st)
    spec = op._one(call)
    if spec.ndim < min_ndim:
        raise ValueError(
            f"torch.{name} requires a tensor with at least {min_ndim} dimension, but got a "
            f"tensor with {spec.ndim} dimensions!"
        )
    n = spec.shape[dim]
    if not isinstance(arg, (list, tuple)):
        k = as_int(arg, "sections")
        if k == 0 or n % k:
            raise ValueError(
                f"torch.{name} attempted to split along dimension {dim}, but the size of the "
                f"dimension {n} is not divisible by the split_size {k}!"
            )
    starts, sizes = tensor_split_pieces(n, arg)
    return op._split_plan(spec, dim, sizes, starts=starts)


_DIR_SIG = ("input", "indices_or_sections")
_DIR_STATIC = ("indices_or_sections", "sections", "indices")


@_KINDS.kind("hsplit", _DIR_SIG, _DIR_STATIC)
def _plan_hsplit(op: Any, call: OpCall, st: dict) -> OpPlan:
    nd = call.specs[0].ndim if call.specs else 0
    return _directional(op, call, st, 1 if nd > 1 else 0, 1)


@_KINDS.kind("vsplit", _DIR_SIG, _DIR_STATIC)
def _plan_vsplit(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _directional(op, call, st, 0, 2)


@_KINDS.kind("dsplit", _DIR_SIG, _DIR_STATIC)
def _plan_dsplit(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _directional(op, call, st, 2, 3)
