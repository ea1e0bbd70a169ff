"""More ``rule: tensor_op`` kinds that join tensors: hstack, vstack (row_stack), dstack,
column_stack, block_diag, broadcast_tensors, meshgrid, cartesian_prod and kron.

Semantics (global shapes, errors) are those of the torch functions of the same names; the
local call is the op itself on the local shards. How a layout is decided:

* the ``*stack`` family is ``torch.cat`` of the inputs lifted to a common rank
  (``atleast_1d``/``2d``/``3d``, or a column for ``column_stack``): the joined dim is
  gathered, every other dim keeps its shard (moved to its lifted position, where the
  local lift puts it too), and all inputs ``Partial(op)`` with one op stay ``Partial(op)``;
* ``block_diag`` and ``cartesian_prod`` need whole inputs (their outputs interleave every
  input's elements) and pass a common ``Partial`` through (both are linear in the tuple
  of inputs: each output element is one input's element, or zero);
* ``broadcast_tensors``/``meshgrid`` keep a shard on every output dim some input holds at
  full size (all outputs sharded alike there, broadcast inputs Replicate);
* ``kron(a, b)`` (output dim ``d`` of size ``a_d * b_d``, index ``i * b_d + j``): a dim of
  ``a`` stays sharded where ``b`` is 1 there, or where the mesh dims sharding it divide
  it evenly (each rank's block is then exactly its ``torch.chunk`` piece of the output);
  a dim of ``b`` stays sharded where ``a`` is 1 there; exactly one ``Partial`` factor
  (the other Replicate) gives ``Partial`` (``kron`` is bilinear).

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..dispatch.op import OpCall
from ..dispatch.search import SingleDimStrategy
from ..placement import Partial, Shard
from ._util import LINEAR_OPS, R, broadcast_shapes
from .planned import OpPlan, keep_strategies, partials_of
from .tensor_ops import _KINDS

__all__ = ["lift_shape"]


def lift_shape(shape: Sequence[int], how: str) -> tuple[tuple[int, ...], dict[int, int]]:
    """``shape`` as ``torch.atleast_1d``/``atleast_2d``/``atleast_3d`` (``how`` = ``1d``,
    ``2d``, ``3d``) or ``column_stack``'s column (``col``) make it, and the map from the
    input's dims to the lifted shape's."""
    shape = tuple(shape)
    n = len(shape)
    ident = {d: d for d in range(n)}
    if how == "col":
        return ((shape[0] if n else 1, 1), {0: 0} if n else {}) if n <= 1 else (shape, ident)
    want = int(how[0])
    if n >= want:
        return shape, ident
    if n == 0:
        return (1,) * want, {}
    if n == 1:
        return ((1, shape[0]) if want == 2 else (1, shape[0], 1)), {0: 1}
    return (*shape, 1), ident  # 2-d to 3-d


def _stack_plan(op: Any, call: OpCall, how: str, dim_of: Any) -> OpPlan:
    op._no_plain_members(call)
    specs = call.specs
    if not specs:
        raise ValueError(f"{op.name} expects a non-empty TensorList")
    lifted = [lift_shape(s.shape, how) for s in specs]
    ndim = len(lifted[0][0])
    dim = dim_of(ndim)
    for shp, _ in lifted:
        if len(shp) != ndim or any(
            a != b for k, (a, b) in enumerate(zip(shp, lifted[0][0])) if k != dim
        ):
            raise ValueError(
                f"{op.name}: sizes of tensors must match except in dimension {dim}; got "
                f"{[list(s.shape) for s in specs]}"
            )
    shape = list(lifted[0][0])
    shape[dim] = sum(shp[dim] for shp, _ in lifted)
    # an output dim stays sharded only where every input has it (a dim the lift adds is
    # whole on every rank, so the inputs' local pieces would no longer line up)
    common = set.intersection(*(set(m.values()) for _, m in lifted)) - {dim}
    maps = [{d: o for d, o in m.items() if o in common} for _, m in lifted]
    return OpPlan([tuple(shape)], keep_strategies(maps, 1, partials_of(specs)))


@_KINDS.kind("hstack", ("tensors",), ())
def _plan_hstack(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.hstack: atleast_1d, then cat on dim 0 for 1-d tensors, else dim 1
    return _stack_plan(op, call, "1d", lambda n: 0 if n == 1 else 1)


@_KINDS.kind("vstack", ("tensors",), ())
def _plan_vstack(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _stack_plan(op, call, "2d", lambda n: 0)


@_KINDS.kind("dstack", ("tensors",), ())
def _plan_dstack(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _stack_plan(op, call, "3d", lambda n: 2)


@_KINDS.kind("column_stack", ("tensors",), ())
def _plan_column_stack(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _stack_plan(op, call, "col", lambda n: 1)


@_KINDS.kind("block_diag", ("*tensors",), ())
def _plan_block_diag(op: Any, call: OpCall, st: dict) -> OpPlan:
    op._no_plain_members(call)
    rows = cols = 0
    for s in call.specs:
        if s.ndim > 2:
            raise ValueError(
                f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input has "
                f"{s.ndim} dimensions"
            )
        shp = lift_shape(s.shape, "2d")[0]
        rows, cols = rows + shp[0], cols + shp[1]
    maps: list[dict[int, int] | None] = [None] * len(call.specs)
    return OpPlan([(rows, cols)], keep_strategies(maps, 1, partials_of(call.specs)))


@_KINDS.kind("broadcast_tensors", ("*tensors",), ())
def _plan_broadcast_tensors(op: Any, call: OpCall, st: dict) -> OpPlan:
    op._no_plain_members(call)
    specs = call.specs
    out = broadcast_shapes(*(s.shape for s in specs))
    n = len(out)
    maps: list[dict[int, int] | None] = []
    for s in specs:
        lead = n - s.ndim
        maps.append({k: k + lead for k in range(s.ndim) if s.shape[k] == out[k + lead]})
    return OpPlan([out] * len(specs), keep_strategies(maps, len(specs), partials_of(specs)))


@_KINDS.kind("meshgrid", ("*tensors", "indexing"), ("indexing",))
def _plan_meshgrid(op: Any, call: OpCall, st: dict) -> OpPlan:
    op._no_plain_members(call)
    specs = call.specs
    if not specs:
        raise ValueError("torch.meshgrid expects a non-empty TensorList")
    if any(s.ndim > 1 for s in specs):
        raise ValueError("torch.meshgrid: Expected 0D or 1D tensor in the tensor list")
    indexing = st.get("indexing") or "ij"
    if indexing not in ("ij", "xy"):
        raise ValueError(
            f"torch.meshgrid: indexing must be one of 'xy' or 'ij', but received: {indexing}"
        )
    sizes = [s.shape[0] if s.ndim else 1 for s in specs]
    pos = list(range(len(specs)))
    if indexing == "xy" and len(specs) >= 2:
        pos[0], pos[1] = 1, 0
    shape = [0] * len(specs)
    for i, p in enumerate(pos):
        shape[p] = sizes[i]
    maps = [{0: pos[i]} if s.ndim else None for i, s in enumerate(specs)]
    return OpPlan(
        [tuple(shape)] * len(specs), keep_strategies(maps, len(specs), partials_of(specs))
    )


@_KINDS.kind("cartesian_prod", ("*tensors",), ())
def _plan_cartesian_prod(op: Any, call: OpCall, st: dict) -> OpPlan:
    op._no_plain_members(call)
    specs = call.specs
    if any(s.ndim != 1 for s in specs):
        raise ValueError("torch.cartesian_prod: Expect a 1D vector")
    if len(specs) == 1:  # torch returns the input itself
        return OpPlan([specs[0].shape], keep_strategies([{0: 0}], 1, partials_of(specs)))
    shape = (math.prod(s.shape[0] for s in specs), len(specs))
    maps: list[dict[int, int] | None] = [None] * len(specs)
    return OpPlan([shape], keep_strategies(maps, 1, partials_of(specs)))


@_KINDS.kind("kron", ("input", "other"), ())
def _plan_kron(op: Any, call: OpCall, st: dict) -> OpPlan:
    if len(call.specs) != 2:
        raise TypeError("kron takes two tensors (both DTensors on one mesh)")
    a, b = call.specs
    n = max(a.ndim, b.ndim)
    sa = (1,) * (n - a.ndim) + tuple(a.shape)
    sb = (1,) * (n - b.ndim) + tuple(b.shape)
    shape = tuple(x * y for x, y in zip(sa, sb))
    la, lb = n - a.ndim, n - b.ndim
    strategies: list[SingleDimStrategy] = []
    even: dict[int, int] = {}  # a's dim -> its output dim, when b is not 1 there
    for d in range(n):
        if d >= la and sa[d] > 1:
            strategies.append(((Shard(d),), (Shard(d - la), R)))
            if sb[d] != 1:
                even[d - la] = sa[d]
        if d >= lb and sb[d] > 1 and sa[d] == 1:
            strategies.append(((Shard(d),), (R, Shard(d - lb))))
    for p in LINEAR_OPS:
        strategies.append(((Partial(p),), (Partial(p), R)))
        strategies.append(((Partial(p),), (R, Partial(p))))
    mesh_shape = call.mesh.shape

    def accept(ins: tuple, outs: tuple) -> bool:
        # a's dim sharded next to a b of size > 1: only when its shards are even
        split: dict[int, int] = {}
        for m, p in enumerate(ins[0]):
            if type(p) is Shard and p.dim in even:
                split[p.dim] = split.get(p.dim, 1) * mesh_shape[m]
        return all(even[d] % k == 0 for d, k in split.items())

    return OpPlan([shape], strategies, accept=accept)
