"""Losses with one value per sample, each from a whole row (``rule: row_loss``):
``cosine_embedding_loss``, ``triplet_margin_loss``, ``multi_margin_loss``,
``multilabel_margin_loss`` (semantics and argument names as ``torch.nn.functional``).

Global shapes: the row inputs (``row_args``: ``input``, ``input1``/``input2``, ``anchor``/
``positive``/``negative``, a ``multilabel_margin_loss`` target) are ``(N, D)``, or ``(D,)``
unbatched; per-sample inputs (``sample_args``: a class-index or ±1 target) are ``(N,)`` or
``()``; anything else (``weight``) is Replicate. A row is reduced whole (a norm, a
cosine, a margin over classes), so ``D`` is gathered; the batch dim may stay sharded:

* ``reduction='none'``: the per-sample losses ``(N,)``, sharded like the batch;
* ``'sum'``: each rank sums its samples, a ``Partial(sum)`` scalar;
* ``'mean'``: that local sum divided by the GLOBAL ``N`` (exact for uneven shards);

an unbatched call is gathered. No Partial input (the losses are not linear). The local
call is the function itself with ``reduction='none'``; gradients are its local autograd.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import R
from .loss import legacy_reduction

__all__ = ["RowLossOp", "RowLossParams"]


class RowLossParams(RuleParams):
    """``row_args``: arguments of shape ``(N, D)``; ``sample_args``: of shape ``(N,)``."""

    row_args: list[str]
    sample_args: list[str] = []


@register_rule("row_loss")
class RowLossOp(DistributedOp):
    """A per-sample loss over whole rows (see the module docstring).

    Raises:
        ShardingError: a row input that is not a DTensor, inconsistent batch sizes, or an
            unknown reduction.
    """

    Params = RowLossParams
    static_args = ("size_average", "reduce", "reduction")

    def _form(self, call: OpCall) -> tuple[int | None, str]:
        """(the global batch size N, or None unbatched; the reduction)."""
        rows = self.params.row_args
        first = next((s for r, s in zip(call.arg_roles, call.specs) if r in rows), None)
        if first is None:
            raise ShardingError(
                f"{call.describe()}: {self.name} needs {', '.join(rows)} as DTensors on one mesh"
            )
        try:
            red = legacy_reduction(
                call.static.get("size_average"),
                call.static.get("reduce"),
                call.static.get("reduction"),
            )
        except ValueError as e:
            raise ShardingError(f"{call.describe()}: {e}") from e
        if first.ndim < 2:
            return None, red
        n = first.shape[0]
        for r, s in zip(call.arg_roles, call.specs):
            if (r in rows or r in self.params.sample_args) and (s.ndim == 0 or s.shape[0] != n):
                raise ShardingError(
                    f"{call.describe()}: {r} of shape {list(s.shape)} does not have the batch "
                    f"size {n} of the other inputs"
                )
        return n, red

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        n, red = self._form(call)
        return [(n,) if red == "none" and n is not None else ()]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        n, red = self._form(call)
        if n is None:
            return []
        batched = set(self.params.row_args) | set(self.params.sample_args)
        ins: tuple[Placement, ...] = tuple(Shard(0) if r in batched else R for r in call.arg_roles)
        out: Placement = Shard(0) if red == "none" else Partial("sum")
        return [((out,), ins)]

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        n, red = self._form(call)
        out = layout.outputs[0]
        if red == "none" or out is None or not any(type(p) is Partial for p in out):
            return layout  # unsharded: torch's own reduction on whole data
        func, binder = call.func, call.binder
        assert binder is not None and n is not None
        denom = n if red == "mean" else 1

        def local_loss(*args: Any, **kwargs: Any) -> Any:
            a, k = binder.replace(args, kwargs, "reduction", "none")
            for legacy in ("size_average", "reduce"):
                a, k = binder.replace(a, k, legacy, None)
            s = func(*a, **k).sum()
            return s / denom if denom != 1 else s

        layout.impl = local_loss
        return layout
