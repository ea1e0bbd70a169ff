"""More ``rule: tensor_op`` kinds: lookups of values in other tensors — ``take``,
``take_along_dim``, ``searchsorted``, ``bucketize``, ``isin`` (semantics as the torch
functions of the same names; the local call is the op itself on the local shards).

* ``take(input, index)`` reads the flattened input: ``input`` is gathered, ``index`` keeps
  its shards (the output has its shape); a ``Partial`` input passes through (selection);
* ``take_along_dim(input, indices, dim)``: ``input`` is gathered along ``dim``; the other
  dims keep their shards where input and indices hold them at full size (broadcast ones
  Replicate); ``indices`` may stay sharded along ``dim`` (the output follows it); without
  ``dim`` both are flattened and gathered;
* ``searchsorted(sorted_sequence, input)``, ``bucketize(input, boundaries)``,
  ``isin(elements, test_elements)`` are elementwise in the values looked up (they keep
  every shard) with the table Replicate; an N-D ``sorted_sequence`` (and its ``sorter``)
  shares its leading dims with ``input``, which may stay sharded on both. The outputs are
  integers or bools: no ``Partial``.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ._util import normalize_dim
from .planned import OpPlan, as_int, keep_strategies, partials_of
from .tensor_ops import _KINDS

__all__: list[str] = []


def _role(call: OpCall, name: str) -> Any:
    for r, s in zip(call.arg_roles, call.specs):
        if r == name:
            return s
    return None


@_KINDS.kind("take", ("input", "index"), ())
def _plan_take(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, idx = _role(call, "input"), _role(call, "index")
    if x is None or idx is None:
        raise ShardingError(f"{call.describe()}: take needs input and index as DTensors")
    maps = [None if r == "input" else {d: d for d in range(idx.ndim)} for r in call.arg_roles]
    flags = [r == "input" for r in call.arg_roles]
    return OpPlan([idx.shape], keep_strategies(maps, 1, partials_of([x]), flags))


@_KINDS.kind("take_along_dim", ("input", "indices", "dim"), ("dim",))
def _plan_take_along_dim(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, idx = _role(call, "input"), _role(call, "indices")
    if x is None or idx is None:
        raise ShardingError(
            f"{call.describe()}: take_along_dim needs input and indices as DTensors"
        )
    flags = [r == "input" for r in call.arg_roles]
    parts = partials_of([x])
    if st.get("dim") is None:
        maps: list[dict[int, int] | None] = [None] * len(call.specs)
        return OpPlan([(math.prod(idx.shape),)], keep_strategies(maps, 1, parts, flags))
    if x.ndim != idx.ndim:
        raise ValueError(
            f"torch.take_along_dim(): input and indices should have the same number of "
            f"dimensions, but got {x.ndim} dimensions for input, and {idx.ndim} dimensions for "
            f"indices"
        )
    dim = normalize_dim(as_int(st["dim"], "dim"), x.ndim, "dim")
    out = []
    for d, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if d == dim:
            out.append(b)
        elif a != b and 1 not in (a, b):
            raise ValueError(
                f"take_along_dim: shapes {list(x.shape)} and {list(idx.shape)} do not broadcast"
            )
        else:
            out.append(b if a == 1 else a)
    mx = {d: d for d in range(x.ndim) if d != dim and x.shape[d] == out[d]}
    mi = {d: d for d in range(idx.ndim) if idx.shape[d] == out[d]}
    maps = [mx if r == "input" else mi for r in call.arg_roles]
    return OpPlan([tuple(out)], keep_strategies(maps, 1, parts, flags))


def _elementwise_lookup(call: OpCall, values: str) -> OpPlan:
    v = _role(call, values)
    if v is None:  # a python-scalar value: a 0-d result
        return OpPlan([()], [])
    maps = [{d: d for d in range(v.ndim)} if r == values else None for r in call.arg_roles]
    return OpPlan([v.shape], keep_strategies(maps, 1))


@_KINDS.kind(
    "searchsorted", ("sorted_sequence", "input", "out_int32", "right", "side", "sorter"), ()
)
def _plan_searchsorted(op: Any, call: OpCall, st: dict) -> OpPlan:
    seq, v = _role(call, "sorted_sequence"), _role(call, "input")
    if seq is None:
        raise ShardingError(f"{call.describe()}: searchsorted needs sorted_sequence as a DTensor")
    if v is None or seq.ndim <= 1:
        return _elementwise_lookup(call, "input")
    if v.ndim != seq.ndim or tuple(v.shape[:-1]) != tuple(seq.shape[:-1]):
        raise ValueError(
            f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
            f"dimensions of boundaries tensor and input value tensor must match, but we got "
            f"boundaries tensor {list(seq.shape)} and input value tensor {list(v.shape)}"
        )
    lead = {d: d for d in range(seq.ndim - 1)}
    maps = [{**lead, v.ndim - 1: v.ndim - 1} if r == "input" else lead for r in call.arg_roles]
    return OpPlan([v.shape], keep_strategies(maps, 1))


@_KINDS.kind("bucketize", ("input", "boundaries", "out_int32", "right"), ())
def _plan_bucketize(op: Any, call: OpCall, st: dict) -> OpPlan:
    b = _role(call, "boundaries")
    if b is not None and b.ndim != 1:
        raise ValueError(f"boundaries tensor must be 1 dimension, but got dim({b.ndim})")
    return _elementwise_lookup(call, "input")


@_KINDS.kind("isin", ("elements", "test_elements", "assume_unique", "invert"), ())
def _plan_isin(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _elementwise_lookup(call, "elements")
