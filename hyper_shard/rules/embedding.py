"""Embedding lookups: ``torch.nn.functional.embedding(input, weight, padding_idx, max_norm,
norm_type, scale_grad_by_freq, sparse)`` (``rule: embedding``).

Per mesh dim (semantics as ``torch.nn.functional.embedding`` on the global tensors):

* indices sharded on a dim ``j``, weight Replicate -> output sharded on ``j``;
* indices Replicate, weight column-sharded ``Shard(1)`` -> output sharded on its last dim;
* indices Replicate, weight row-sharded ``Shard(0)`` (vocab-parallel) -> output
  ``Partial(sum)``: each rank looks up the rows it holds; indices outside its range read
  local row 0 and are masked to zero (so they contribute neither a value nor a gradient);
  ``padding_idx`` is passed to the rank holding that row only, shifted to its local index;
* indices Replicate, weight ``Partial(op)`` -> output ``Partial(op)`` (a row selection
  commutes with every elementwise reduction).

The dense backward is local autograd: a row-sharded weight gets a row-sharded gradient, a
Replicate weight a Partial(sum) one (the sum of every rank's lookups), as single-device.
``scale_grad_by_freq`` needs every index on every rank (counts are global), so the indices
are gathered and the weight is not row-sharded. ``max_norm`` renormalises weight rows in
place, which only a whole, replicated weight can do identically on every rank: it needs a
Replicate weight (and gathers the indices).
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import Binder, Layout, OpCall
from ..errors import ShardingError
from ..placement import Partial, Shard
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._util import R
from .tensor_ops import OpPlan, PlannedOp, partials_of

__all__ = ["EmbeddingOp", "VocabParallelLookup"]

_PSUM = Partial("sum")


class VocabParallelLookup:
    """The local lookup of a row-sharded weight holding global rows ``[lo, lo + rows)``:
    indices shifted to local rows, those outside masked to row 0 and their output rows
    zeroed; ``padding_idx`` passed only where it is local. Called like the embedding
    function it replaces, with local tensors."""

    __slots__ = ("func", "binder", "lo", "rows", "vocab")

    def __init__(self, func: Any, binder: Binder, lo: int, rows: int, vocab: int) -> None:
        self.func, self.binder, self.lo, self.rows, self.vocab = func, binder, lo, rows, vocab

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self.binder
        ids = b.get(args, kwargs, "input")
        weight = b.get(args, kwargs, "weight")
        pad = b.get(args, kwargs, "padding_idx")
        if self.rows == 0:  # an empty shard: zeros, still connected to the (empty) weight
            out = weight.new_zeros((*ids.shape, weight.shape[1]))
            return out + weight.sum() * 0
        local = ids - self.lo
        outside = (local < 0) | (local >= self.rows)
        local = local.masked_fill(outside, 0)
        lpad = None
        if pad is not None:
            p = pad + self.vocab if pad < 0 else pad
            if self.lo <= p < self.lo + self.rows:
                lpad = p - self.lo
        out = self.func(
            local,
            weight,
            padding_idx=lpad,
            norm_type=b.get(args, kwargs, "norm_type", 2.0),
            sparse=b.get(args, kwargs, "sparse", False),
        )
        return out.masked_fill(outside.unsqueeze(-1), 0)


@register_rule("embedding")
class EmbeddingOp(PlannedOp):
    """``embedding(input, weight, ...)`` (see the module docstring). Global output shape:
    ``input.shape + (weight.shape[1],)``.

    Raises:
        ShardingError: indices or weight that are not DTensors, a weight that is not 2-D,
            indices that are not integers, or ``max_norm`` with a weight that is not
            Replicate.
    """

    signature = (
        "input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse",
    )  # fmt: skip
    static_args = ("padding_idx", "max_norm", "scale_grad_by_freq")

    def plan(self, call: OpCall) -> OpPlan:
        roles = call.arg_roles
        if roles[:2] != ["input", "weight"]:
            raise ShardingError(
                f"{call.describe()}: embedding needs both the indices and the weight as DTensors "
                f"on one mesh; distribute the plain one (e.g. distribute_tensor(ids, mesh, "
                f"[Replicate()]))"
            )
        ids, w = call.specs[0], call.specs[1]
        if w.ndim != 2:
            raise ShardingError(f"{call.describe()}: 'weight' must be 2-D, got {w.ndim}-D")
        name = str(ids.dtype).rsplit(".", 1)[-1]
        if not name.startswith(("int", "uint", "long")):
            raise ShardingError(
                f"{call.describe()}: Expected tensor for argument 'indices' to have one of the "
                f"following scalar types: Long, Int; but got {ids.dtype} instead"
            )
        k = ids.ndim
        out_shape = (*ids.shape, w.shape[1])
        max_norm = call.static.get("max_norm")
        by_freq = bool(call.static.get("scale_grad_by_freq"))
        if max_norm is not None:
            if any(type(p) is not type(R) for p in w.placements):
                raise ShardingError(
                    f"{call.describe()}: max_norm renormalises weight rows in place, which needs "
                    f"a Replicate weight; redistribute the weight to Replicate() or drop max_norm"
                )
            return OpPlan([out_shape], [], fixed=(1,))
        strategies: list = []
        if not by_freq:
            strategies += [((Shard(j),), (Shard(j), R)) for j in range(k)]
        strategies.append(((Shard(k),), (R, Shard(1))))
        torch_call = call.platform_name.startswith("torch.")
        if not by_freq and torch_call:
            strategies.append(((_PSUM,), (R, Shard(0))))
        strategies += [((p,), (R, p)) for p in partials_of([w])]
        mesh = call.mesh
        binder = call.binder or self.binder
        func = call.func

        def local(layout: Layout) -> Layout:
            wt = layout.inputs[1]
            coord = mesh.get_coordinate()
            if wt is None or coord is None or not any(p == Shard(0) for p in wt):
                return layout
            ls, off = compute_local_shape_and_offset(w.shape, mesh.shape, wt, coord)
            layout.impl = VocabParallelLookup(func, binder, off[0], ls[0], w.shape[0])
            return layout

        return OpPlan([out_shape], strategies, local=local)
