"""Views that map input dims one to one onto output dims and add or merge only unsharded
unit dims (``rule: dim_map``, ``kind:`` picks the op): ``torch.view_as_complex`` (the last
dim of size 2 becomes the complex dtype), ``torch.view_as_real`` (a last dim of size 2 is
added), ``torch.atleast_1d/2d/3d`` (size-1 dims added where torch adds them). Semantics as
torch's.

Every kept input dim keeps its shard at its output position, ``Partial(sum|avg)`` stays
Partial (these views are linear), and the merged dim (``view_as_complex``'s last) is
gathered; no communication otherwise. A single tensor argument only (``atleast_2d(a, b)``
returns a tuple in torch: call it per tensor).
"""

from __future__ import annotations

from typing import Literal

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import LINEAR_OPS

__all__ = ["DimMapOp", "DimMapParams", "dim_map"]

Kind = Literal["view_as_complex", "view_as_real", "atleast_1d", "atleast_2d", "atleast_3d"]


class DimMapParams(RuleParams):
    kind: Kind


def dim_map(kind: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, int]]:
    """(the output shape, ``{input dim: output dim}`` of the dims that may stay sharded).

    Raises:
        ValueError: a ``view_as_complex`` input whose last dim is not of size 2.
    """
    n = len(shape)
    if kind == "view_as_complex":
        if n == 0 or shape[-1] != 2:
            raise ValueError("Tensor must have a last dimension of size 2")
        return shape[:-1], {d: d for d in range(n - 1)}
    if kind == "view_as_real":
        return (*shape, 2), {d: d for d in range(n)}
    want = int(kind[-2])
    if n >= want:
        return shape, {d: d for d in range(n)}
    if want == 1 or n == 0:
        return (1,) * want, {}
    if want == 2:  # (n,) -> (1, n)
        return (1, *shape), {0: 1}
    if n == 1:  # atleast_3d: (n,) -> (1, n, 1)
        return (1, shape[0], 1), {0: 1}
    return (*shape, 1), {0: 0, 1: 1}  # (m, n) -> (m, n, 1)


@register_rule("dim_map")
class DimMapOp(DistributedOp):
    """See the module docstring.

    Raises:
        ShardingError: more than one tensor argument, or an input torch rejects.
    """

    Params = DimMapParams
    signature = ("input",)

    def _map(self, call: OpCall) -> tuple[tuple[int, ...], dict[int, int]]:
        if len(call.specs) != 1 or call.arg_roles != ["input"]:
            raise ShardingError(
                f"{call.describe()}: one tensor argument only; call it once per tensor"
            )
        try:
            return dim_map(self.params.kind, tuple(call.specs[0].shape))
        except ValueError as e:
            raise ShardingError(f"{call.describe()}: {e}") from None

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        return [self._map(call)[0]]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        shape, m = self._map(call)
        out: list[SingleDimStrategy] = [((Shard(o),), (Shard(d),)) for d, o in m.items()]
        out += [((Partial(op),), (Partial(op),)) for op in LINEAR_OPS]
        return out
