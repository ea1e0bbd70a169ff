"""Matrix decompositions and distances: ``torch.linalg.eigh``/``eigvalsh``/``svd``/
``svdvals`` (``rule: decomposition``) and ``torch.dist`` (``rule: dist``); semantics as
torch's.

* A decomposition needs whole matrices: the two matrix dims are gathered (a ``Shard`` of
  them becomes ``Replicate``; ``Partial`` is reduced first), batch dims keep their shards,
  and every output is placed like the input's batch dims. On replicated inputs this is the
  plain op on every rank.
* ``torch.dist(input, other, p)``: ``||input - other||_p``. For inputs of one shape and a
  finite, non-zero ``p`` each rank sums ``|input - other|^p`` over its shards and one
  differentiable scalar all-reduce over the sharding mesh dims gives ``sum``; the result is
  ``sum^(1/p)``, ``Replicate`` (PyTorch DTensor returns a partial-norm placement instead;
  reading it costs that same all-reduce). ``Partial`` inputs are reduced first (a norm is
  not linear). Other ``p`` (``inf``, ``0``) or broadcasting shapes gather both inputs.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import R

__all__ = ["DecompositionOp", "DecompositionParams", "DistOp", "DiagOp"]

_SIGNATURES = {
    "eigh": ("input", "UPLO"),
    "eigvalsh": ("input", "UPLO"),
    "svd": ("input", "full_matrices", "driver"),
    "svdvals": ("input", "driver"),
}
_N_OUT = {"eigh": 2, "eigvalsh": 1, "svd": 3, "svdvals": 1}


class DecompositionParams(RuleParams):
    """``kind``: which decomposition (its outputs and their shapes)."""

    kind: Literal["eigh", "eigvalsh", "svd", "svdvals"]


@register_rule("decomposition")
class DecompositionOp(DistributedOp):
    """Matrix decompositions: matrix dims gathered, batch dims kept (module docstring).

    Raises:
        ShardingError: an input of rank < 2, or a non-square input for ``eigh``.
    """

    Params = DecompositionParams
    static_args = ("full_matrices",)

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        self.use_signature(_SIGNATURES[self.params.kind])
        self.n_outputs = _N_OUT[self.params.kind]  # type: ignore[misc]

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        x = call.specs[0]
        if x.ndim < 2:
            raise ShardingError(f"{call.describe()}: expected a tensor of at least 2 dims")
        *b, m, n = x.shape
        kind = self.params.kind
        if kind in ("eigh", "eigvalsh"):
            if m != n:
                raise ShardingError(f"{call.describe()}: A must be batches of square matrices")
            shapes: list[tuple[int, ...] | None] = [(*b, n), (*b, n, n)]
            return shapes[: self.n_outputs]
        k = min(m, n)
        if kind == "svdvals":
            return [(*b, k)]
        full = call.static.get("full_matrices", True)
        full = True if full is None else bool(full)
        return [(*b, m, m if full else k), (*b, k), (*b, n if full else k, n)]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        x = call.specs[0]
        if len(call.specs) != 1:
            raise ShardingError(f"{call.describe()}: only the matrix may be a DTensor")
        return [((Shard(d),) * self.n_outputs, (Shard(d),)) for d in range(x.ndim - 2)]


def _all_reduce_sum(plat: Any, t: Any, groups: tuple) -> Any:
    """Sum over the groups, differentiable (each rank holds an addend, every rank uses the
    sum: the backward all-reduces too)."""

    def reduce(x: Any) -> Any:
        for g in groups:
            x = plat.all_reduce(x, "sum", g)
        return x

    if not groups:
        return t
    if not plat.requires_grad(t):
        return reduce(t)
    return plat.custom_autograd(reduce, reduce, t)


class _ShardedDist:
    """The local ``torch.dist`` of two equally sharded inputs: the local ``sum |a - b|^p``,
    all-reduced over the sharding mesh dims, to the power ``1/p`` (the exact zero distance
    gets a zero gradient, as torch's)."""

    __slots__ = ("plat", "groups", "p")

    def __init__(self, plat: Any, groups: tuple, p: float) -> None:
        self.plat, self.groups, self.p = plat, groups, p

    def __call__(self, a: Any, b: Any, p: Any = 2.0) -> Any:
        d = (a - b).abs()
        s = _all_reduce_sum(self.plat, (d**self.p).sum(), self.groups)
        z = (s == 0).to(s.dtype)
        return (s + z) ** (1.0 / self.p) - z


@register_rule("dist")
class DistOp(DistributedOp):
    """``torch.dist(input, other, p=2)`` (see the module docstring)."""

    signature = ("input", "other", "p")
    static_args = ("p",)

    def infer_layout(self, call: OpCall) -> Layout:
        if len(call.specs) != 2:
            raise ShardingError(f"{call.describe()}: input and other must both be DTensors")
        a, b = call.specs
        p = call.static.get("p", 2.0)
        p = 2.0 if p is None else float(p)
        rep: tuple[Placement, ...] = (R,) * call.mesh.ndim
        if a.shape != b.shape or not math.isfinite(p) or p == 0:
            return Layout([rep, rep], [rep], [()])
        tgt = tuple(R if type(pl) is Partial else pl for pl in a.placements)
        layout = Layout([tgt, tgt], [rep], [()])
        mesh = call.mesh
        sharded = tuple(m for m, pl in enumerate(tgt) if type(pl) is Shard)
        if sharded and mesh.get_coordinate() is not None and not mesh.is_abstract:
            groups = tuple(mesh._group(m) for m in sharded)
            layout.impl = _ShardedDist(call.platform, groups, p)
        return layout


class DiagParams(RuleParams):
    """``max_ndim``: the largest input rank the entry takes (1 for an op that shares
    torch.diag's 1-D form only, as MindSpore's legacy ``Diag``, whose k-D form builds a
    2k-D tensor)."""

    max_ndim: Literal[1, 2] = 2


@register_rule("diag")
class DiagOp(DistributedOp):
    """``torch.diag(input, diagonal=0)``: a 1-D input becomes a square matrix with it on
    the ``diagonal``-th diagonal, a 2-D one gives that diagonal (as torch). The diagonal
    couples both dims, so they are gathered; ``Partial(sum|avg)`` passes (it is linear)."""

    Params = DiagParams
    signature = ("input", "diagonal")
    static_args = ("diagonal",)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        x = call.specs[0]
        if x.ndim > self.params.max_ndim:
            raise ShardingError(
                f"{call.describe()}: {call.platform_name} of a {x.ndim}-D input is not "
                f"torch.diag's (entry {self.name!r} takes 1-D inputs only); gather it "
                f"(x.full_tensor()) or use a diagonal op on its matrix dims"
            )
        k = int(call.static.get("diagonal") or 0)
        if x.ndim == 1:
            n = x.shape[0] + abs(k)
            return [(n, n)]
        if x.ndim == 2:
            m, n = x.shape
            length = min(m, n - k) if k >= 0 else min(m + k, n)
            return [(max(0, length),)]
        raise ShardingError(f"{call.describe()}: diag expects a 1-D or 2-D input")

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        from ._util import LINEAR_OPS

        return [((Partial(op),), (Partial(op),)) for op in LINEAR_OPS]
