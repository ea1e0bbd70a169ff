"""Vector norms (``rule: vector_norm``): ``torch.linalg.vector_norm``, ``torch.norm``'s
vector forms; semantics as torch's (global shapes in and out).

A reduced dim that a mesh dim shards is never gathered: each rank reduces its shard
(as PyTorch DTensor, whose partial-norm placement does the same):

===================  =========================================  ========================
``ord``              the local value                             output on that mesh dim
===================  =========================================  ========================
``inf`` / ``-inf``   ``max |x|`` / ``min |x|`` of the shard      ``Partial(max)`` /
                     (an empty shard: the identity)              ``Partial(min)``
``1``                ``sum |x|``                                 ``Partial(sum)``
``0``                the count of non-zeros                      ``Partial(sum)``
other finite ``p``   ``sum |x|^p``, all-reduced (one collective  ``Replicate``
                     of the output's size), then ``^(1/p)``
===================  =========================================  ========================

Kept dims keep their shards; a ``Partial`` input is reduced first (a norm is not linear);
the ``+-inf`` norms' gradients split evenly between the elements equal to the extremum on
whichever ranks, as torch (:mod:`hyper_shard.kernels.extremum`); a zero ``p``-norm gets a
zero gradient. ``ord`` strings other than ``'fro'`` (``'nuc'``: a matrix norm) and complex
inputs take the reduction rule's path (the reduced dims gathered).

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch.op import Layout, OpCall
from ..kernels import groups_of
from ..kernels.extremum import ExactExtremum
from ..kernels.vector_norm import AbsInput, ShardedPNorm
from ..placement import Partial, Placement, Shard
from . import register_rule
from ._util import R
from .reduction import (
    ReduceKind,
    ReductionOp,
    ReductionParams,
    identity_value,
    kept_dim_map,
)

__all__ = ["VectorNormOp", "VectorNormParams", "norm_order"]


class VectorNormParams(ReductionParams):
    """``norm_arg``: the argument holding the order (``ord``; ``p`` for ``torch.norm``)."""

    reduce_op: ReduceKind = "norm"
    norm_arg: str = "ord"


def norm_order(value: Any) -> float | None:
    """The order a vector norm's ``ord``/``p`` argument asks for (None: 2, ``'fro'``: 2),
    or None for one this rule does not compute shard-wise (``'nuc'``, other strings)."""
    if value is None:
        return 2.0
    if isinstance(value, str):
        return 2.0 if value == "fro" else None
    if isinstance(value, bool):
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(p) else p


@register_rule("vector_norm")
class VectorNormOp(ReductionOp):
    """A vector norm over dims of one DTensor (see the module docstring)."""

    Params = VectorNormParams
    signature = ("input", "ord", "dim", "keepdim")  # type: ignore[assignment]

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            self.static_names = (*self.static_names, self.params.norm_arg)

    def infer_layout(self, call: OpCall) -> Layout:
        f = self.form(call)
        spec = call.specs[0]
        p = norm_order(self._arg(call, self.params.norm_arg))
        dtype = spec.tensor_meta.dtype
        if f.elementwise or p is None or "complex" in str(dtype):
            return super().infer_layout(call)
        tgt = tuple(R if type(pl) is Partial else pl for pl in spec.placements)
        reduced = set(f.dims)
        sharded = [m for m, pl in enumerate(tgt) if type(pl) is Shard and pl.dim in reduced]
        if not sharded:
            return super().infer_layout(call)
        kept = kept_dim_map(spec.ndim, f.dims, f.keepdim)
        part: Placement
        if p == math.inf:
            part = Partial("max")
        elif p == -math.inf:
            part = Partial("min")
        elif p in (0.0, 1.0):
            part = Partial("sum")
        else:
            part = R
        outs = tuple(
            part if m in sharded else Shard(kept[pl.dim]) if type(pl) is Shard else R
            for m, pl in enumerate(tgt)
        )
        layout = Layout([tgt], [outs], self.output_shapes(call))
        mesh, plat = call.mesh, call.platform
        if mesh.is_abstract or mesh.get_coordinate() is None:
            return layout
        binder = call.binder or self.binder
        groups = groups_of(mesh, sharded)
        if p in (math.inf, -math.inf):
            mode = "max" if p > 0 else "min"
            local = spec.with_placements(tgt).local_shape()
            empty = tuple(d for d in f.dims if local[d] == 0)
            meta = spec.tensor_meta
            layout.impl = ExactExtremum(
                AbsInput(binder, plat),
                f.dims,
                f.keepdim,
                mode,
                empty,
                identity_value(mode, meta.dtype, meta.itemsize),
                mesh,
                meta.dtype,
                groups,
            )
        elif part is R:
            layout.impl = ShardedPNorm(binder, plat, p, f.dims, f.keepdim, groups)
        return layout
