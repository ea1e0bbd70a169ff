"""Losses on logits: ``cross_entropy``/``nll_loss``, the ``loss_parallel()`` switch, and
``log_softmax`` along a sharded dim.

``cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
reduce=None, reduction='mean', label_smoothing=0.0)`` and ``nll_loss`` (torch's has no
smoothing; MindSpore's ``nll_loss(..., label_smoothing)`` smooths as ``cross_entropy`` does,
on the log-probabilities it is given).
Global shapes: ``input (N, C, d1...)`` or ``(C,)``; class dim ``1`` (``0`` for a 1-d
input); ``target`` class indices ``(N, d1...)`` (or ``()``), or class probabilities of
``input``'s shape; ``weight (C,)`` (a Replicate DTensor; it receives no gradient, as in
torch). Output: ``(N, d1...)`` for ``reduction='none'``, else ``()``.

Per mesh dim:

* **batch-sharded** (any non-class dim of ``input`` and the same dim of ``target``):
  ``'none'`` keeps the shard; ``'sum'`` gives ``Partial(sum)``; ``'mean'`` gives
  ``Partial(sum)`` of ``local sum / global denominator`` — the denominator (the number of
  non-ignored targets, or the sum of their class weights; the sample count for probability
  targets) is exact: one scalar all-reduce over the batch-sharding mesh dims (PyTorch's
  local mean would be wrong for uneven shards and ignored targets);
* **class-sharded** input (vocab parallel): inside :func:`hyper_shard.parallel.loss_parallel`
  the loss is computed without gathering the logits (max and sum-exp all-reduces, the
  target logit taken on the rank owning the class), ``label_smoothing``, ``ignore_index``
  and ``weight`` (sharded with the classes) included. ``cross_entropy`` with class-index
  targets and no weight packs the target logit (and the smoothing sum) into the sum-exp
  all-reduce, so its loss is ``Replicate`` over the class mesh dims (reading it costs no
  collective; PyTorch's loss_parallel gives a replicated loss too); weighted, probability
  targets and ``nll_loss`` give ``Partial(sum)`` there. Outside ``loss_parallel()`` the class
  dim is gathered first and the loss computed on whole rows, as PyTorch DTensor does, with a
  one-time warning that ``loss_parallel()`` avoids the gather (only a class dim the caller
  already sharded is kept so);
* ``nll_loss`` is linear in its input: a ``Partial(sum|avg)`` input stays Partial.

Anything else is gathered. The layout cache does not see the ``loss_parallel`` switch: a
class-sharded decision checks it each call (gathering outside the context), so one cached
decision serves both.

``log_softmax`` along a sharded dim (rule ``log_softmax``, an extension of
:mod:`hyper_shard.rules.softmax`) is computed in place, in and outside ``loss_parallel``:
max and sum-exp all-reduces, output sharded like the input, with the TRUE backward
``g - softmax(x) * sum(g)`` (PyTorch DTensor's ``loss_parallel`` backward assumes an
``nll_loss`` follows and is wrong for ``log_softmax`` used alone).

The local computations are the framework-neutral kernels of :mod:`hyper_shard.kernels.loss`
(the same on torch and MindSpore); the rule only decides layouts and picks a kernel.

Semantics follow ``torch.nn.functional.cross_entropy`` / ``nll_loss`` / ``log_softmax``
(MindSpore's ``ops``/``mint`` forms share them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..kernels import groups_of
from ..kernels.loss import (
    LOSS_PARALLEL,
    ClassParallelLoss,
    GlobalMeanLoss,
    ShardedLogSoftmax,
    loss_parallel_enabled,
)
from ..placement import Partial, Placement, Shard, normalize_placements
from ..registry.models import RuleParams
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._util import LINEAR_OPS, R
from .softmax import SoftmaxOp

__all__ = [
    "LossOp",
    "LossParams",
    "ShardedLogSoftmaxOp",
    "loss_parallel_enabled",
    "LOSS_PARALLEL",
    "legacy_reduction",
]


def legacy_reduction(size_average: Any, reduce: Any, reduction: Any) -> str:
    """The reduction string, honouring the deprecated ``size_average``/``reduce`` flags as
    ``torch.nn._reduction.legacy_get_string`` does.

    Raises:
        ValueError: an unknown reduction.
    """
    if size_average is not None or reduce is not None:
        sa = True if size_average is None else bool(size_average)
        rd = True if reduce is None else bool(reduce)
        reduction = "none" if not rd else "mean" if sa else "sum"
    reduction = "mean" if reduction is None else reduction
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")
    return str(reduction)


def _is_float(dtype: Any) -> bool:
    s = str(dtype).rsplit(".", 1)[-1].lower()
    return any(k in s for k in ("float", "half", "double"))


@dataclass(frozen=True)
class _Form:
    i_in: int
    i_t: int
    i_w: int | None
    class_dim: int
    prob: bool
    reduction: str


class LossParams(RuleParams):
    kind: Literal["cross_entropy", "nll_loss"] = "cross_entropy"


@register_rule("loss")
class LossOp(DistributedOp):
    """``cross_entropy``/``nll_loss`` (see the module docstring).

    Raises:
        ShardingError: input or target is not a DTensor, shapes that do not match, a
            DTensor argument other than input/target/weight, probability targets for
            ``nll_loss``.
    """

    Params = LossParams
    signature = (
        "input",
        "target",
        "weight",
        "size_average",
        "ignore_index",
        "reduce",
        "reduction",
        "label_smoothing",
    )
    static_args = ("size_average", "reduce", "reduction")

    def replicates_plain(self) -> bool:
        """Inside ``loss_parallel()`` a plain target / class weight is the global
        (Replicate) one, as in PyTorch's ``loss_parallel``."""
        return loss_parallel_enabled()

    def form(self, call: OpCall) -> _Form:
        roles = call.arg_roles
        for r in roles:
            if r not in ("input", "target", "weight"):
                raise ShardingError(
                    f"{call.describe()}: unexpected DTensor argument {r!r}; only input, target "
                    f"and weight may be DTensors"
                )
        for r in ("input", "target"):
            if r not in roles:
                raise ShardingError(
                    f"{call.describe()}: {r} must be a DTensor too when any input is one; "
                    f"distribute it (e.g. distribute_tensor(t, mesh, [Replicate()]))"
                )
        i_in, i_t = roles.index("input"), roles.index("target")
        i_w = roles.index("weight") if "weight" in roles else None
        x, t = call.specs[i_in], call.specs[i_t]
        if x.ndim == 0:
            raise ShardingError(f"{call.describe()}: input needs at least 1 dim (classes)")
        cd = 1 if x.ndim >= 2 else 0
        prob = _is_float(t.dtype)
        if prob and self.params.kind == "nll_loss":
            raise ShardingError(
                f"{call.describe()}: nll_loss expects class-index targets (an integer "
                f"DTensor), got {t.dtype}"
            )
        want = x.shape if prob else x.shape[:cd] + x.shape[cd + 1 :]
        if tuple(t.shape) != tuple(want):
            raise ShardingError(
                f"{call.describe()}: target of shape {list(t.shape)} does not fit input of "
                f"shape {list(x.shape)} (expected {list(want)}: "
                f"{'class probabilities' if prob else 'class indices'})"
            )
        if i_w is not None and tuple(call.specs[i_w].shape) != (x.shape[cd],):
            raise ShardingError(
                f"{call.describe()}: weight of shape {list(call.specs[i_w].shape)} must have "
                f"shape [{x.shape[cd]}] (one weight per class)"
            )
        st = call.static
        red = legacy_reduction(
            st.get("size_average", call.get("size_average")),
            st.get("reduce", call.get("reduce")),
            st.get("reduction", call.get("reduction", "mean")),
        )
        return _Form(i_in, i_t, i_w, cd, prob, red)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        f = self.form(call)
        x = call.specs[f.i_in]
        if f.reduction != "none":
            return [()]
        return [x.shape[: f.class_dim] + x.shape[f.class_dim + 1 :]]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        f = self.form(call)
        x = call.specs[f.i_in]
        n = len(call.specs)
        out: list[SingleDimStrategy] = []
        psum = Partial("sum")
        for d in range(x.ndim):
            if d == f.class_dim:
                continue
            od = d if d < f.class_dim else d - 1
            ins: list[Placement] = [R] * n
            ins[f.i_in] = Shard(d)
            ins[f.i_t] = Shard(d if f.prob else od)
            o = Shard(od) if f.reduction == "none" else psum
            out.append(((o,), tuple(ins)))
        ins = [R] * n
        ins[f.i_in] = Shard(f.class_dim)
        ins[f.i_t] = Shard(f.class_dim) if f.prob else R
        if f.i_w is not None:
            ins[f.i_w] = Shard(0)
        # class-sharded: cross_entropy with class-index targets and no weight fuses its
        # target pick into the log-sum-exp all-reduce, so the loss comes out Replicate
        # (read with no further collective); otherwise each rank holds a Partial(sum)
        # share (kernels/loss.py ClassParallelLoss.replicated_output)
        fused = self.params.kind == "cross_entropy" and not f.prob and f.i_w is None
        out.append(((R if fused else psum,), tuple(ins)))
        if self.params.kind == "nll_loss":
            for op in LINEAR_OPS:
                ins = [R] * n
                ins[f.i_in] = Partial(op)
                out.append(((Partial(op),), tuple(ins)))
        return out

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        """Keep the class dim sharded only where the caller sharded it (never shard it to
        fit the rule)."""
        f = self.form(call)
        x = call.specs[f.i_in]
        cls = Shard(f.class_dim)
        tgt = normalize_placements(inputs[f.i_in], call.mesh.ndim, x.ndim)
        return all(p != cls or x.placements[m] == cls for m, p in enumerate(tgt))

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        if call.mesh.get_coordinate() is None:
            return layout
        f = self.form(call)
        mesh = call.mesh
        x = call.specs[f.i_in]
        tin = layout.inputs[f.i_in]
        pl = normalize_placements(tin if tin is not None else x.placements, mesh.ndim, x.ndim)
        class_dims = [m for m, p in enumerate(pl) if type(p) is Shard and p.dim == f.class_dim]
        batch_dims = [m for m, p in enumerate(pl) if type(p) is Shard and p.dim != f.class_dim]
        prob_count = None
        if f.prob:
            prob_count = 1
            for d, s in enumerate(x.shape):
                prob_count *= s if d != f.class_dim else 1
        kind = self.params.kind
        if class_dims:
            _, off = compute_local_shape_and_offset(x.shape, mesh.shape, pl, mesh.get_coordinate())
            kernel = ClassParallelLoss(
                call.binder or self.binder,
                kind,
                call.platform,
                call.describe(),
                f.class_dim,
                off[f.class_dim],
                x.shape[f.class_dim],
                groups_of(mesh, class_dims),
                groups_of(mesh, batch_dims),
                f.reduction,
                prob_count,
            )
            # outside loss_parallel() the kernel gathers the class dim (loss_gather.py)
            for role, i in (("input", f.i_in), ("target", f.i_t), ("weight", f.i_w)):
                if i is not None:
                    spec, tgt = call.specs[i], layout.inputs[i]
                    kernel.gather_specs[role] = spec if tgt is None else spec.with_placements(tgt)
            coord = mesh.get_coordinate()
            kernel.class_coord0 = all(coord[m] == 0 for m in class_dims)
            layout.impl = kernel
        elif f.reduction == "mean" and batch_dims:
            layout.impl = GlobalMeanLoss(
                call.func,
                call.binder or self.binder,
                kind,
                call.platform,
                groups_of(mesh, batch_dims),
                prob_count,
            )
        return layout


@register_rule("log_softmax")
class ShardedLogSoftmaxOp(SoftmaxOp):
    """``log_softmax``: the softmax rule, plus the normalised dim kept sharded (computed
    without gathering, exact forward and backward; see the module docstring)."""

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        out = super().single_dim_strategies(call)
        d = self._dim(call)
        out.append(((Shard(d),), (Shard(d),)))
        return out

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        """Keep the normalised dim sharded only where the caller sharded it (a free local
        chunk must not class-shard a Replicate input behind the caller's back)."""
        spec = call.specs[0]
        sd = Shard(self._dim(call))
        tgt = normalize_placements(inputs[0], call.mesh.ndim, spec.ndim)
        return all(p != sd or spec.placements[m] == sd for m, p in enumerate(tgt))

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        if call.mesh.get_coordinate() is None:
            return layout
        d = self._dim(call)
        spec = call.specs[0]
        tin = layout.inputs[0]
        pl = normalize_placements(
            tin if tin is not None else spec.placements, call.mesh.ndim, spec.ndim
        )
        dims = [m for m, p in enumerate(pl) if type(p) is Shard and p.dim == d]
        if dims:
            layout.impl = ShardedLogSoftmax(
                call.binder or self.binder, call.platform, d, groups_of(call.mesh, dims)
            )
        return layout
