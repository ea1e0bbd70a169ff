"""Ops that overwrite or copy whole tensors: ``fill_``/``zero_``, ``copy_``, ``clone`` (and
``conj``) and ``type_as``.

Rules (semantics as the torch functions of the same names, on the global tensor):

* ``fill`` (``kind: fill|zero``): in place, ``self`` keeps its placements. On a
  ``Partial(sum)`` mesh dim only coordinate 0 writes the value (the others write 0, or 1
  for ``Partial(prod)``), so the global value is the fill; ``avg``/``max``/``min`` write it
  everywhere. A 0-d DTensor value is moved to the matching placements by the planner
  (Replicate -> Partial(sum) keeps it on coordinate 0).
* ``copy``: ``self.copy_(src)`` keeps ``self``'s placements; ``src`` (broadcast as torch
  does) is redistributed to them: Shard where ``self`` is sharded on a dim ``src`` has at
  full size, Replicate where it broadcasts, ``Partial(op)`` where ``self`` is Partial (a
  python/0-d scalar source is written once on a ``Partial(sum)`` dim, as ``fill``).
* ``identity`` (clone, conj): the output is the input element for element: every
  placement passes through, Partial of any reduce op included; nothing moves.
* ``type_as``: ``x.type_as(other)``: a dtype change keeps Shard/Replicate and reduces a
  Partial first (rounding is not linear); no change is the identity. ``other`` only gives
  its dtype and is never moved (its shape may differ from ``x``'s).

(``Tensor.to`` and the ``*_like`` factories are in ``rules/misc.py``; ``rand_like`` in
``rules/random.py``.)
"""

from __future__ import annotations

from typing import Any, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import search_strategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..redistribute.planner import cost_model_for
from ..registry.models import RuleParams
from . import register_rule
from ._util import R, broadcast_shapes
from .planned import keep_strategies

__all__ = ["FillOp", "CopyOp", "IdentityOp", "TypeAsOp", "scalar_off_coordinate0"]


def _first_dtensor(call: OpCall, what: str) -> Any:
    first = call.binder.names[0] if call.binder is not None and call.binder.names else "input"
    if call.arg_roles[0] != first:
        raise ShardingError(
            f"{call.describe()}: {what} writes into or reads its first argument, which must be a "
            f"DTensor; convert it with distribute_tensor, or use plain tensors throughout"
        )
    return call.specs[0]


def scalar_off_coordinate0(call: OpCall, placements: tuple, value: Any) -> Any | None:
    """What a python/0-d scalar written into a Partial value must be on this rank so the
    reduction over ranks gives the value: 0 off coordinate 0 of a ``Partial(sum)`` mesh
    dim, 1 for ``Partial(prod)``; None where the value itself is right (value-independent,
    so a cached decision may hold it)."""
    coord = call.mesh.get_coordinate()
    if coord is None:
        return None
    for m, p in enumerate(placements):
        if type(p) is not Partial or coord[m] == 0:
            continue
        if p.reduce_op == "sum":
            return 0 * value
        if p.reduce_op == "prod":
            return 0 * value + 1
    return None


# ---------------------------------------------------------------------- fill_ / zero_
class FillParams(RuleParams):
    kind: Literal["fill", "zero"] = "fill"


@register_rule("fill")
class FillOp(DistributedOp):
    """``self.fill_(value)`` / ``self.zero_()`` in place; ``self`` keeps its placements (see
    the module docstring). Semantics as ``torch.Tensor.fill_``.

    Raises:
        ShardingError: a value DTensor with dimensions (torch wants a 0-d value).
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = FillParams
    signature = ("input", "value")

    def infer_layout(self, call: OpCall) -> Layout:
        spec = _first_dtensor(call, self.name)
        pl = spec.placements
        inputs: list[tuple[Placement, ...] | None] = [None]
        for s in call.specs[1:]:
            if s.ndim != 0:
                raise ShardingError(
                    f"{call.describe()}: fill_ only supports a 0-dimension value tensor, got "
                    f"{s.ndim} dimensions"
                )
            inputs.append(tuple(p if type(p) is Partial else R for p in pl))
        layout = Layout(inputs, [pl], [spec.shape])
        names = call.binder.names if call.binder is not None else ()
        vname = names[1] if len(names) > 1 else "value"  # "val" for nn.init.constant_
        if self.params.kind == "fill" and vname in call.scalars:
            v = scalar_off_coordinate0(call, pl, call.scalars[vname])
            if v is not None:
                layout.overrides = {vname: v}
        return layout


# ---------------------------------------------------------------------- copy_
@register_rule("copy")
class CopyOp(DistributedOp):
    """``self.copy_(src)``: ``src`` is redistributed to ``self``'s placements (broadcast as
    torch); ``self`` never moves. Semantics as ``torch.Tensor.copy_``.

    Raises:
        ShardingError: ``src``'s shape does not broadcast to ``self``'s.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "src", "non_blocking")

    def infer_layout(self, call: OpCall) -> Layout:
        spec = _first_dtensor(call, self.name)
        pl = spec.placements
        inputs: list[tuple[Placement, ...] | None] = [None]
        for s in call.specs[1:]:
            try:
                ok = broadcast_shapes(s.shape, spec.shape) == spec.shape
            except ValueError:
                ok = False
            if not ok:
                raise ShardingError(
                    f"{call.describe()}: the source's shape {list(s.shape)} does not broadcast to "
                    f"the destination's {list(spec.shape)}"
                )
            lead = spec.ndim - s.ndim
            tgt: list[Placement] = []
            for p in pl:
                if type(p) is Shard:
                    k = p.dim - lead
                    tgt.append(Shard(k) if k >= 0 and s.shape[k] == spec.shape[p.dim] else R)
                else:
                    tgt.append(p)
            inputs.append(tuple(tgt))
        layout = Layout(inputs, [pl], [spec.shape])
        if "src" in call.scalars:
            v = scalar_off_coordinate0(call, pl, call.scalars["src"])
            if v is not None:
                layout.overrides = {"src": v}
        return layout


# ---------------------------------------------------------------------- clone
@register_rule("identity")
class IdentityOp(DistributedOp):
    """An op whose output is its input element for element (``clone``, ``conj`` of a real
    tensor): every placement passes through and nothing moves."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        spec = _first_dtensor(call, self.name)
        return Layout([None] * len(call.specs), [spec.placements], [spec.shape])


# ---------------------------------------------------------------------- type_as
@register_rule("type_as")
class TypeAsOp(DistributedOp):
    """``x.type_as(other)`` (see the module docstring). Global shape: ``x``'s.

    Raises:
        ShardingError: ``x`` is not a DTensor.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "other")

    def infer_layout(self, call: OpCall) -> Layout:
        spec = _first_dtensor(call, self.name)
        if len(call.specs) > 1:
            dtype = call.specs[1].dtype
        else:  # a 0-d plain tensor (its dtype is in the cache key)
            dtype = getattr(call.get("other"), "dtype", None)
        rest: list[tuple[Placement, ...] | None] = [None] * (len(call.specs) - 1)
        if dtype is None or dtype == spec.dtype or not spec.has_partial():
            return Layout([None, *rest], [spec.placements], [spec.shape])
        keep = {d: d for d in range(spec.ndim)}
        res = search_strategy([spec], keep_strategies([keep], 1), 1, cost_model_for(call.mesh))
        return Layout([res.inputs[0], *rest], [res.outputs[0]], [spec.shape], cost=res.cost)
