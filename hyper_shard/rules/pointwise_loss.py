"""Elementwise losses with a ``reduction`` argument (``rule: pointwise_loss``): mse_loss,
l1_loss, smooth_l1_loss, huber_loss, binary_cross_entropy(_with_logits), kl_div...

The elementwise part is the pointwise rule (broadcasting; no Partial input: a Partial value
is reduced first, these losses are not linear). The reduction is exact for uneven shards:

* ``reduction="none"``: the elementwise loss, sharded like a pointwise op;
* ``"sum"``: each rank sums its local elementwise loss; the scalar is ``Partial(sum)`` on
  every mesh dim where the elementwise loss was sharded (``Replicate`` elsewhere);
* ``"mean"``: the same local sum divided by the GLOBAL element count, so the ranks' values
  add up to the true mean whatever the shard sizes (a mean of local means would not);
* ``"batchmean"`` (``kl_div``): the local sum divided by the global size of dim 0.

The local call is the framework's own function with ``reduction="none"``; gradients are
local autograd through it (the local derivative of the global loss). Semantics and
argument names follow ``torch.nn.functional``; the legacy ``size_average``/``reduce``
arguments raise (pass ``reduction=``).
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch.op import Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from . import register_rule
from .pointwise import PointwiseOp, PointwiseParams

__all__ = ["PointwiseLossOp", "PointwiseLossParams"]

_REDUCTIONS = ("none", "mean", "sum", "batchmean")


class PointwiseLossParams(PointwiseParams):
    #: the argument naming the reduction, and its default when the call omits it
    reduction_arg: str = "reduction"
    default_reduction: str = "mean"
    #: an argument (``weight`` of mse/l1/huber) whose presence makes torch's "mean" divide
    #: by its sum instead of the element count: refused with a hint
    weight_mean_arg: str | None = None


@register_rule("pointwise_loss")
class PointwiseLossOp(PointwiseOp):
    """An elementwise loss with ``reduction`` (see the module docstring).

    Raises:
        ShardingError: an unknown reduction, or the legacy ``size_average``/``reduce``
            arguments.
    """

    Params = PointwiseLossParams
    signature = ("input", "target", "size_average", "reduce", "reduction")  # type: ignore[assignment]

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            self.static_names = (self.params.reduction_arg, "size_average", "reduce")

    def _reduction(self, call: OpCall) -> str:
        for legacy in ("size_average", "reduce"):
            if call.static.get(legacy) is not None:
                raise ShardingError(
                    f"{call.describe()}: the legacy argument {legacy!r} is not supported on "
                    f"DTensors; pass reduction='mean'|'sum'|'none' instead"
                )
        r = call.static.get(self.params.reduction_arg)
        r = self.params.default_reduction if r is None else r
        if r not in _REDUCTIONS:
            raise ShardingError(
                f"{call.describe()}: reduction={r!r} is not one of {list(_REDUCTIONS)}"
            )
        w = self.params.weight_mean_arg
        if r == "mean" and w is not None and call.get(w) is not None:
            raise ShardingError(
                f"{call.describe()}: reduction='mean' with {w}= divides by {w}.sum(), which this "
                f"rule does not compute; call it with reduction='sum' and divide by "
                f"{w}.sum() (both DTensor ops)"
            )
        return str(r)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        shape = super().output_shapes(call)
        return shape if self._reduction(call) == "none" else [()]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        strategies = super().single_dim_strategies(call)
        if self._reduction(call) == "none":
            return strategies
        out: list[SingleDimStrategy] = []
        for outs, ins in strategies:
            mapped: tuple[Placement, ...] = tuple(
                Partial("sum") if type(p) is Shard else p for p in outs
            )
            out.append((mapped, ins))
        return out

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        red = self._reduction(call)
        if red == "none":
            return layout
        full = PointwiseOp.output_shapes(self, call)[0]
        assert full is not None
        denom = {
            "sum": 1,
            "mean": math.prod(full),
            "batchmean": full[0] if full else 1,
        }[red]
        func, binder, rname = call.func, call.binder, self.params.reduction_arg
        assert binder is not None

        def local_loss(*args: Any, **kwargs: Any) -> Any:
            a, k = binder.replace(args, kwargs, rname, "none")
            s = func(*a, **k).sum()
            return s / denom if denom != 1 else s

        layout.impl = local_loss
        return layout


class PairwiseReduceParams(PointwiseParams):
    #: the reduced dim of the broadcast shape: an argument name, or ``last`` (pairwise
    #: distance reduces the last dim)
    dim_arg: str = "dim"
    default_dim: int = 1
    keepdim_arg: str | None = None


@register_rule("pairwise_reduce")
class PairwiseReduceOp(PointwiseOp):
    """Two broadcastable inputs combined elementwise and reduced along one dim of the
    broadcast shape (``cosine_similarity(x1, x2, dim)``, ``pairwise_distance(x1, x2)``,
    which reduces the last dim): the reduced dim is gathered, every other dim keeps its
    shard (moved past the removed dim); no Partial input (not linear). Semantics as
    ``torch.nn.functional``.

    Raises:
        IndexError: the dim is out of range for the broadcast shape.
    """

    Params = PairwiseReduceParams
    signature = ("x1", "x2", "dim", "eps")  # type: ignore[assignment]

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            names = [self.params.dim_arg]
            if self.params.keepdim_arg:
                names.append(self.params.keepdim_arg)
            self.static_names = tuple(n for n in names if n != "last")

    def _dims(self, call: OpCall) -> tuple[tuple[int, ...], int, bool]:
        full = PointwiseOp.output_shapes(self, call)[0]
        assert full is not None
        n = len(full)
        if self.params.dim_arg == "last":
            d = n - 1
        else:
            v = call.static.get(self.params.dim_arg)
            d = self.params.default_dim if v is None else int(v)
            if not -max(n, 1) <= d < max(n, 1):
                raise IndexError(
                    f"{call.describe()}: dim {d} is out of range for the broadcast shape {full}"
                )
            d %= max(n, 1)
        keep = bool(call.static.get(self.params.keepdim_arg)) if self.params.keepdim_arg else False
        return full, d, keep

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        full, d, keep = self._dims(call)
        if not full:
            return [()]
        shape = list(full)
        if keep:
            shape[d] = 1
        else:
            del shape[d]
        return [tuple(shape)]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        full, d, keep = self._dims(call)
        out: list[SingleDimStrategy] = []
        for outs, ins in super().single_dim_strategies(call):
            p = outs[0]
            if type(p) is not Shard or p.dim == d:
                continue  # the reduced dim is gathered; no Partial (mode none)
            od = p.dim if (keep or p.dim < d) else p.dim - 1
            out.append(((Shard(od),), ins))
        return out
