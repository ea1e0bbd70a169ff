"""``torch.histc(input, bins=100, min=0, max=0)`` on DTensors (``rule: histc``); semantics
as torch's (elements outside ``[min, max]`` are ignored; ``min == max`` means the data's own
range).

With a range given, every element falls in one bin whichever rank holds it: a sharded input
gives a ``Partial(sum)`` histogram of the local counts (no communication; reading it is one
all-reduce of ``bins`` values, where gathering the input would move all of it). Without a
range the bin edges depend on the global minimum and maximum, so the input is gathered (as
PyTorch DTensor). A ``Partial`` input is reduced first (counting is not linear).
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy
from ..placement import Partial, Shard
from . import register_rule

__all__ = ["HistcOp"]


@register_rule("histc")
class HistcOp(DistributedOp):
    """See the module docstring."""

    signature = ("input", "bins", "min", "max")
    static_args = ("bins", "min", "max")

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        bins = call.static.get("bins")
        return [(100 if bins is None else int(bins),)]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        lo, hi = call.static.get("min") or 0, call.static.get("max") or 0
        if lo == hi:
            return []
        x = call.specs[0]
        return [((Partial("sum"),), (Shard(d),)) for d in range(x.ndim)]
