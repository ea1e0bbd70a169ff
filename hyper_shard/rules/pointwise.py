"""Pointwise ops (elementwise, with broadcasting and python scalars).

Per mesh dim, the output may be sharded on any dim ``d`` where every DTensor input whose
aligned dim has the output's size is sharded on that dim (broadcast inputs stay
Replicate). Partial values follow the op's linearity (``partial:``):

* ``none`` (default): no Partial input; a Partial value is reduced first.
* ``linear`` (add, sub, neg...): all inputs ``Partial(op)`` -> ``Partial(op)`` for sum/avg.
  A python scalar *term* (``x + 2``) would be added once per rank: with a ``Partial(sum)``
  output it is kept on coordinate 0 of each partial mesh dim and zeroed elsewhere, so it is
  counted once. A Replicate tensor term is partitioned the same way by the search.
* ``bilinear`` (mul): exactly one ``Partial(op)`` input, the others Replicate or scalars.
* ``first`` (div): only the first operand (the numerator) may be ``Partial(op)``.
* ``max_preserving`` (monotone non-decreasing ops: relu, clamp-free max): ``Partial(max)``
  -> ``Partial(max)`` and ``Partial(min)`` -> ``Partial(min)`` for one-input ops.
* ``max`` / ``min`` (maximum / minimum): ``Partial(max)`` (``Partial(min)``) inputs, or one
  of them next to Replicate ones, give ``Partial(max)`` (``Partial(min)``) with no
  communication, as PyTorch DTensor (``max(max_i a_i, b) = max_i max(a_i, b)``).

``rule: where`` is ``torch.where(condition, input, other)``: this rule; the one-argument
form, whose result shape depends on the values, runs whole on the gathered condition.

Semantics follow PyTorch's elementwise ops and broadcasting.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import LINEAR_OPS, R, broadcast_shapes, replicated_result_layout

__all__ = ["PointwiseOp", "PointwiseParams", "WhereOp"]

_PSUM = Partial("sum")


class PointwiseParams(RuleParams):
    partial: Literal["none", "linear", "bilinear", "first", "max_preserving", "max", "min"] = "none"
    #: canonical names whose python-scalar values are additive terms (zeroed off coordinate 0)
    scalar_terms: list[str] = ["input", "other"]
    #: tensors the op returns, all of the broadcast shape and placed alike (frexp: 2)
    outputs: int = Field(default=1, ge=1)


@register_rule("pointwise")
class PointwiseOp(DistributedOp):
    """Elementwise op with broadcasting; see the module docstring for Partial handling."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = PointwiseParams
    signature = ("input", "other", "*args")

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.outputs != 1:
            self.n_outputs = self.params.outputs  # type: ignore[misc]

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        return [broadcast_shapes(*(s.shape for s in call.specs))] * self.n_outputs

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        strategies = self._strategies(call)
        if self.n_outputs == 1:
            return strategies
        return [(outs * self.n_outputs, ins) for outs, ins in strategies]

    def _strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        specs = call.specs
        out_shape = broadcast_shapes(*(s.shape for s in specs))
        n = len(out_shape)
        strategies: list[SingleDimStrategy] = []
        for d in range(n):
            ins: list[Placement] = []
            for s in specs:
                k = d - (n - s.ndim)
                if k < 0 or (s.shape[k] == 1 and out_shape[d] != 1):
                    ins.append(R)
                else:
                    ins.append(Shard(k))
            strategies.append(((Shard(d),), tuple(ins)))
        mode = self.params.partial
        nin = len(specs)
        if mode == "linear":
            for op in LINEAR_OPS:
                strategies.append(((Partial(op),), (Partial(op),) * nin))
        elif mode == "bilinear":
            for op in LINEAR_OPS:
                for j in range(nin):
                    strategies.append(
                        ((Partial(op),), tuple(Partial(op) if i == j else R for i in range(nin)))
                    )
        elif mode == "first":
            # floor/trunc division is not linear in the numerator: reduce a Partial first
            rounding = call.kwargs.get("rounding_mode")
            if (
                call.arg_roles
                and call.arg_roles[0] == "input"
                and not call.reflected
                and rounding is None
            ):
                for op in LINEAR_OPS:
                    strategies.append(((Partial(op),), (Partial(op),) + (R,) * (nin - 1)))
        elif mode == "max_preserving" and nin == 1:
            for op in ("max", "min"):
                strategies.append(((Partial(op),), (Partial(op),)))
        elif mode in ("max", "min"):
            p = Partial(mode)
            strategies.append(((p,), (p,) * nin))
            if nin > 1:
                for j in range(nin):
                    strategies.append(((p,), tuple(p if i == j else R for i in range(nin))))
        return strategies

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        if self.params.partial != "linear" or not call.scalars:
            return layout
        out = layout.outputs[0]
        if out is None:
            return layout
        coord = call.mesh.get_coordinate()
        if coord is None:
            return layout
        counted_once = all(c == 0 for m, c in enumerate(coord) if out[m] == _PSUM)
        if counted_once:
            return layout
        terms = set(self.params.scalar_terms)
        overrides = {name: 0 * v for name, v in call.scalars.items() if name in terms}
        layout.overrides = (
            {**(layout.overrides or {}), **overrides} if overrides else layout.overrides
        )
        return layout


# ---------------------------------------------------------------------- where
@register_rule("where")
class WhereOp(PointwiseOp):
    """``torch.where(condition, input, other)``: elementwise with broadcasting, as the
    pointwise rule (a Partial value is reduced first). ``torch.where(condition)`` alone is
    ``nonzero(as_tuple=True)``, whose result size depends on the values: it runs whole on
    the gathered condition (Replicate results, as ``rule: data_dependent``)."""

    signature = ("condition", "input", "other")

    def infer_layout(self, call: OpCall) -> Layout:
        if call.get("input") is None and call.get("other") is None:
            return replicated_result_layout(call)
        return super().infer_layout(call)
