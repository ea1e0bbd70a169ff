"""More ``rule: index`` kinds: writes through an index along one dim — ``index_add``,
``index_copy``, ``index_fill``, ``index_reduce`` and ``scatter_reduce`` (out of place and
in place; semantics as the torch functions of the same names, GLOBAL dims and indices).

The indexed dim of ``input`` is gathered (the index values are global row numbers) and
the index is Replicate; every other dim keeps its shard where ``input`` and ``source``
(``src``) hold it at the same size (``scatter_reduce``: where index and src match the
input's size too, as ``scatter``). ``Partial`` passes where the op commutes with the
reduction over ranks:

* ``index_add``, ``index_copy``, ``index_reduce``/``scatter_reduce`` with ``sum``/``mean``:
  linear in (input, source) together: both ``Partial(sum|avg)``;
* ``index_copy`` only selects elements: any ``Partial(op)`` of both;
* ``amax``/``amin`` reductions: ``Partial(max)``/``Partial(min)`` of both;
* ``index_fill`` writes a given value: ``Partial(avg|max|min)`` of the input (the value
  reduces to itself), never ``Partial(sum)``; ``prod`` keeps nothing Partial.

An in-place call keeps its target where it is; a target sharded on the indexed dim raises
(redistribute it first), as for ``scatter_``.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ..placement import Partial
from .indexing import _KINDS
from .planned import OpPlan, keep_strategies, partials_of

__all__: list[str] = []

#: reduce -> the Partial ops of (input, source) that pass through
_REDUCE_PARTIALS = {
    "sum": ("sum", "avg"),
    "mean": ("sum", "avg"),
    "amax": ("max",),
    "amin": ("min",),
    "prod": (),
}


def _partials(call: OpCall, specs: list, ops: tuple[str, ...] | None) -> list[Partial]:
    return [p for p in partials_of(specs) if ops is None or p.reduce_op in ops]


def _along(op: Any, call: OpCall, ops: tuple[str, ...] | None, source: str) -> OpPlan:
    x = op._index_spec(call, "input")
    if x is None:
        raise ShardingError(f"{call.describe()}: {op.name} needs its input as a DTensor")
    dim = op._dim(call, x.ndim)
    src = op._index_spec(call, source)
    if src is not None and src.ndim != x.ndim and not (x.ndim <= 1 and src.ndim <= 1):
        raise ValueError(
            f"{op.name}(): {source} ({src.ndim}-d) and input ({x.ndim}-d) must have the same "
            f"number of dimensions"
        )
    keep = {d: d for d in range(x.ndim) if d != dim and (src is None or src.shape[d] == x.shape[d])}
    maps = [keep if r in ("input", source) else None for r in call.arg_roles]
    flags = [r in ("input", source) for r in call.arg_roles]
    parts = _partials(call, [x] + ([src] if src is not None else []), ops)
    return OpPlan([x.shape], keep_strategies(maps, 1, parts, flags))


_SIG = ("input", "dim", "index", "source", "alpha")


@_KINDS.kind("index_add", _SIG, ("dim",))
def _plan_index_add(op: Any, call: OpCall) -> OpPlan:
    return _along(op, call, ("sum", "avg"), "source")


@_KINDS.kind("index_copy", ("input", "dim", "index", "source"), ("dim",))
def _plan_index_copy(op: Any, call: OpCall) -> OpPlan:
    return _along(op, call, None, "source")


@_KINDS.kind("index_fill", ("input", "dim", "index", "value"), ("dim",))
def _plan_index_fill(op: Any, call: OpCall) -> OpPlan:
    return _along(op, call, ("avg", "max", "min"), "value-is-not-a-source")


def _reduce_ops(call: OpCall) -> tuple[str, ...]:
    r = call.static.get("reduce")
    if r not in _REDUCE_PARTIALS:
        raise ValueError(f"reduce argument must be either sum, prod, mean, amax or amin, got {r!r}")
    return _REDUCE_PARTIALS[r]


@_KINDS.kind(
    "index_reduce",
    ("input", "dim", "index", "source", "reduce", "include_self"),
    ("dim", "reduce"),
)
def _plan_index_reduce(op: Any, call: OpCall) -> OpPlan:
    return _along(op, call, _reduce_ops(call), "source")


@_KINDS.kind(
    "scatter_reduce",
    ("input", "dim", "index", "src", "reduce", "include_self"),
    ("dim", "reduce"),
)
def _plan_scatter_reduce(op: Any, call: OpCall) -> OpPlan:
    x = op._index_spec(call, "input")
    idx, src = op._index_spec(call, "index"), op._index_spec(call, "src")
    if x is None or idx is None:
        raise ShardingError(f"{call.describe()}: scatter_reduce needs input and index as DTensors")
    dim = op._dim(call, x.ndim)
    others = [s for s in (idx, src) if s is not None]
    same = {
        k
        for k in range(x.ndim)
        if k != dim and all(s.ndim == x.ndim and s.shape[k] == x.shape[k] for s in others)
    }
    maps = [{k: k for k in same}] * len(call.specs)
    flags = [r in ("input", "src") for r in call.arg_roles]
    parts = _partials(call, [x] + ([src] if src is not None else []), _reduce_ops(call))
    return OpPlan([x.shape], keep_strategies(maps, 1, parts, flags))
