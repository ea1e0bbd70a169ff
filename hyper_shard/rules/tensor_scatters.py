"""More ``rule: tensor_op`` kinds: the functional inverses of views —
``select_scatter``, ``slice_scatter``, ``diagonal_scatter`` and ``as_strided_scatter``
(``input`` with the view's elements replaced by ``src``; semantics as the torch functions of
the same names, GLOBAL dims and indices; the local call is the op itself).

The dims the view touches are gathered in ``input`` and ``src``; every other dim keeps its
shard in both (``src``'s dims are the view's: ``select_scatter``'s ``src`` lacks ``dim``,
``diagonal_scatter``'s has the diagonal last). The op is linear in ``(input, src)``
together, and only moves elements: both ``Partial(op)`` with one op stay ``Partial(op)``.
``as_strided_scatter`` addresses raw storage, which only the whole tensor has: everything
is gathered (a common ``Partial`` passes).

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ._util import normalize_dim
from .planned import OpPlan, as_int, keep_strategies, partials_of
from .tensor_ops import _KINDS, _pick

__all__: list[str] = []


def _pair(op: Any, call: OpCall) -> tuple[Any, Any]:
    if call.arg_roles != ["input", "src"]:
        raise ShardingError(
            f"{call.describe()}: {op.name} takes input and src as DTensors on one mesh"
        )
    return call.specs[0], call.specs[1]


def _plan(call: OpCall, x: Any, keep_x: dict[int, int], keep_src: dict[int, int]) -> OpPlan:
    # a src dim k stays sharded with the input dim it lands on: as {src dim: output dim}
    return OpPlan([x.shape], keep_strategies([keep_x, keep_src], 1, partials_of(call.specs)))


@_KINDS.kind("select_scatter", ("input", "src", "dim", "index"), ("dim", "index"))
def _plan_select_scatter(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, src = _pair(op, call)
    dim = normalize_dim(as_int(st.get("dim"), "dim"), x.ndim, "dim")
    rest = [d for d in range(x.ndim) if d != dim]
    if tuple(src.shape) != tuple(x.shape[d] for d in rest):
        raise ValueError(
            f"select_scatter: expected src to have a size equal to the slice of self, src size "
            f"= {list(src.shape)}, slice size = {[x.shape[d] for d in rest]}"
        )
    return _plan(call, x, {d: d for d in rest}, {k: d for k, d in enumerate(rest)})


@_KINDS.kind(
    "slice_scatter",
    ("input", "src", "dim", "start", "end", "step"),
    ("dim", "start", "end", "step"),
)
def _plan_slice_scatter(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, src = _pair(op, call)
    dim = normalize_dim(as_int(_pick(st, "dim", None, 0), "dim"), x.ndim, "dim")
    n = len(range(x.shape[dim])[slice(st.get("start"), st.get("end"), st.get("step") or 1)])
    want = tuple(n if d == dim else s for d, s in enumerate(x.shape))
    if tuple(src.shape) != want:
        raise ValueError(
            f"slice_scatter: expected src to have a size equal to the slice of self, src size = "
            f"{list(src.shape)}, slice size = {list(want)}"
        )
    keep = {d: d for d in range(x.ndim) if d != dim}
    return _plan(call, x, keep, keep)


@_KINDS.kind(
    "diagonal_scatter", ("input", "src", "offset", "dim1", "dim2"), ("offset", "dim1", "dim2")
)
def _plan_diagonal_scatter(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, src = _pair(op, call)
    if x.ndim < 2:
        raise ValueError("diagonal_scatter: the input needs at least 2 dimensions")
    d1 = normalize_dim(as_int(_pick(st, "dim1", None, 0), "dim1"), x.ndim, "dim1")
    d2 = normalize_dim(as_int(_pick(st, "dim2", None, 1), "dim2"), x.ndim, "dim2")
    if d1 == d2:
        raise ValueError(f"diagonal dimensions cannot be identical {d1}, {d2}")
    off = as_int(st.get("offset") or 0, "offset")
    n1, n2 = x.shape[d1], x.shape[d2]
    n = max(0, min(n1, n2 - off) if off >= 0 else min(n1 + off, n2))
    rest = [d for d in range(x.ndim) if d not in (d1, d2)]
    want = (*(x.shape[d] for d in rest), n)
    if tuple(src.shape) != want:
        raise ValueError(
            f"diagonal_scatter: expected src to have a size equal to the diagonal of self, src "
            f"size = {list(src.shape)}, diagonal size = {list(want)}"
        )
    return _plan(call, x, {d: d for d in rest}, {k: d for k, d in enumerate(rest)})


@_KINDS.kind(
    "as_strided_scatter",
    ("input", "src", "size", "stride", "storage_offset"),
    ("size", "stride", "storage_offset"),
)
def _plan_as_strided_scatter(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, _ = _pair(op, call)
    return OpPlan([x.shape], keep_strategies([None, None], 1, partials_of(call.specs)))
