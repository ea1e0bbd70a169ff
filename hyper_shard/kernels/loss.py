"""Local kernels of the loss rules (see ``hyper_shard/rules/loss.py``).

* :class:`GlobalMeanLoss` — batch-sharded ``reduction='mean'``: the local ``'sum'`` loss
  (the op itself, called with ``reduction='sum'``) divided by the GLOBAL denominator
  (non-ignored targets, or their class weights), which costs one scalar all-reduce over the
  batch-sharding mesh dims. The output is ``Partial(sum)``: the ranks' quotients add up to
  the framework's mean.
* :func:`sharded_log_softmax` — ``log_softmax`` along a sharded dim without gathering:
  max all-reduce (no gradient needed: it only stabilises), local ``exp``-sum, sum
  all-reduce (differentiable), ``x - max - log(sum)``. Its backward is the true one,
  ``g - softmax(x) * sum(g)``, whether or not a loss follows.
* :class:`ClassParallelLoss` — ``cross_entropy``/``nll_loss`` on class-sharded input
  inside ``loss_parallel()``: log-probabilities as above; the target's log-probability is
  picked on the rank that owns the target class (zero elsewhere), label smoothing sums
  the local classes; the per-sample loss is ``Partial(sum)`` over the class-sharding mesh
  dims. ``'mean'`` divides by the global denominator (an all-reduce of a scalar). The
  common case (``cross_entropy``, class-index targets, no weight) is fused: one
  differentiable all-reduce of per-sample columns (sum-exp, the owner's target logit, the
  smoothing sum) after the max all-reduce, giving a ``Replicate`` loss.

The largest local tensor any of them creates has the local logits' shape: the class dim is
never gathered. Written against the Platform protocol (torch and MindSpore alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..dispatch.op import Binder
from . import all_reduce, all_reduce_sum, input_as_dtype, numel
from .loss_gather import gathered_loss

if TYPE_CHECKING:
    from ..platform.base import CommOps, LocalOps, Runtime

__all__ = [
    "GlobalMeanLoss",
    "ClassParallelLoss",
    "ShardedLogSoftmax",
    "sharded_log_softmax",
    "LOSS_PARALLEL",
    "loss_parallel_enabled",
]

#: depth of nested ``loss_parallel()`` contexts in the current thread/task
LOSS_PARALLEL: ContextVar[int] = ContextVar("hyper_shard_loss_parallel", default=0)


def loss_parallel_enabled() -> bool:
    """True inside :func:`hyper_shard.parallel.loss_parallel` (this thread/task only)."""
    return LOSS_PARALLEL.get() > 0


def _args(b: Binder, args: tuple, kwargs: dict) -> tuple:
    return (
        b.get(args, kwargs, "input"),
        b.get(args, kwargs, "target"),
        b.get(args, kwargs, "weight"),
        int(b.get(args, kwargs, "ignore_index", -100)),
        float(b.get(args, kwargs, "label_smoothing", 0.0) or 0.0),
    )


def _index_denominator(
    plat: LocalOps,
    target: Any,
    weight: Any | None,
    ignore_index: int,
    dtype: Any,
    local_classes: tuple[int, int] | None = None,
) -> Any:
    """This rank's share of the mean's denominator: the number of non-ignored targets, or
    the sum of their class weights (of the classes in ``local_classes = (offset, count)``
    when the weight is sharded with the classes)."""
    valid = target != ignore_index
    if weight is None:
        return plat.cast(plat.sum(valid), dtype)
    t = target
    if local_classes is not None:
        off, n = local_classes
        t = t - off
        valid = valid & (t >= 0) & (t < n)
    idx = plat.where(valid, t, 0)
    w = plat.detach(weight)
    if numel(plat, w):
        picked = plat.take_rows(w, idx)
    else:
        picked = plat.full(plat.shape(idx), 0, w)
    return plat.cast(plat.sum(plat.where(valid, picked, 0.0)), dtype)


def _stable_max(plat: CommOps, x: Any, dim: int, groups: Sequence[Any]) -> Any:
    """The max of ``x`` over ``dim`` across the groups (keepdim), with no gradient; an empty
    local dim contributes ``-inf``, an all ``-inf`` row gives 0 (the shift is arbitrary)."""
    with plat.no_grad():
        if plat.shape(x)[dim] > 0:
            m = plat.amax(x, dim, True)
        else:
            shape = list(plat.shape(x))
            shape[dim] = 1
            m = plat.full(shape, float("-inf"), x)
        m = all_reduce(plat, m, "max", groups)
        return plat.where(plat.isfinite(m), m, 0.0)


class GlobalMeanLoss:
    """``reduction='mean'`` of a batch-sharded loss: local sum / global denominator.

    Args:
        func: the loss function called (the platform's ``cross_entropy``/``nll_loss``); it
            runs on the local data with ``reduction='sum'``.
        binder: the call's binder; kind: ``cross_entropy`` or ``nll_loss``.
        plat: the Platform; groups: process groups of the batch-sharding mesh dims.
        prob_count: for class-probability targets, the global number of samples (the mean
            divides by it); None for class-index targets.
    """

    __slots__ = ("func", "binder", "kind", "plat", "groups", "prob_count")

    def __init__(
        self,
        func: Any,
        binder: Binder,
        kind: str,
        plat: Runtime,
        groups: Sequence[Any],
        prob_count: int | None,
    ) -> None:
        self.func, self.binder, self.kind, self.plat = func, binder, kind, plat
        self.groups, self.prob_count = tuple(groups), prob_count

    def __repr__(self) -> str:
        what = "sample count" if self.prob_count is not None else "non-ignored targets"
        return f"GlobalMeanLoss({self.kind}: local sum / global {what})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self.binder
        a2, k2 = b.replace(args, kwargs, "reduction", "sum")
        for legacy in ("size_average", "reduce"):  # torch's deprecated flags decide nothing now
            if legacy in b.pos and b.get(a2, k2, legacy) is not None:
                a2, k2 = b.replace(a2, k2, legacy, None)
        s = self.func(*a2, **k2)
        if self.prob_count is not None:
            return s / self.prob_count
        _, t, w, ii, _ = _args(b, args, kwargs)
        d = _index_denominator(self.plat, t, w, ii, self.plat.dtype_of(s))
        return s / all_reduce(self.plat, d, "sum", self.groups)


def sharded_log_softmax(plat: Runtime, x: Any, dim: int, groups: Sequence[Any]) -> Any:
    """``log_softmax(x, dim)`` of a tensor sharded along ``dim`` over ``groups`` (the local
    result is this rank's slice of the global one)."""
    z = x - _stable_max(plat, x, dim, groups)
    s = all_reduce_sum(plat, plat.sum(plat.exp(z), dim, True), groups)
    return z - plat.log(s)


class ShardedLogSoftmax:
    """``log_softmax(input, dim, ..., dtype=None)`` along a sharded dim (any calling
    convention whose binder names ``input``; a dtype argument, positional or ``dtype=``,
    casts the input first, as torch and ``mint`` do)."""

    __slots__ = ("binder", "plat", "dim", "groups")

    def __init__(self, binder: Binder, plat: Runtime, dim: int, groups: Sequence[Any]) -> None:
        self.binder, self.plat, self.dim, self.groups = binder, plat, dim, tuple(groups)

    def __repr__(self) -> str:
        return f"ShardedLogSoftmax(dim={self.dim}, over {len(self.groups)} mesh dim(s))"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = input_as_dtype(self.binder, self.plat, args, kwargs)
        return sharded_log_softmax(self.plat, x, self.dim, self.groups)


class ClassParallelLoss:
    """``cross_entropy``/``nll_loss`` on class-sharded input (vocab parallel), computed
    without gathering the input; runs only inside ``loss_parallel()``.

    Args:
        binder: the rule's binder; kind: ``cross_entropy`` or ``nll_loss``.
        plat: the Platform.
        describe: the call's description (for the error outside ``loss_parallel``).
        class_dim: the class dim of the input; class_offset: this rank's first class;
        n_classes: the global class count.
        class_groups / batch_groups: process groups of the mesh dims sharding the classes /
            a batch dim.
        reduction: ``none``, ``sum`` or ``mean``; prob_count: for class-probability targets
            the global number of samples, else None.
    """

    __slots__ = (
        "binder",
        "kind",
        "plat",
        "describe",
        "class_dim",
        "class_offset",
        "n_classes",
        "class_groups",
        "batch_groups",
        "reduction",
        "prob_count",
        "gather_specs",
        "class_coord0",
    )

    def __init__(
        self,
        binder: Binder,
        kind: str,
        plat: Runtime,
        describe: str,
        class_dim: int,
        class_offset: int,
        n_classes: int,
        class_groups: Sequence[Any],
        batch_groups: Sequence[Any],
        reduction: str,
        prob_count: int | None,
    ) -> None:
        self.binder, self.kind, self.plat, self.describe = binder, kind, plat, describe
        self.class_dim, self.class_offset, self.n_classes = class_dim, class_offset, n_classes
        self.class_groups, self.batch_groups = tuple(class_groups), tuple(batch_groups)
        self.reduction, self.prob_count = reduction, prob_count
        #: outside loss_parallel(): the decided specs of input/target/weight (to gather
        #: their class dim) and whether this rank is class coordinate 0 (loss_gather.py)
        self.gather_specs: dict[str, Any] = {}
        self.class_coord0 = True

    def __repr__(self) -> str:
        return (
            f"ClassParallelLoss({self.kind}, class dim {self.class_dim}, first class "
            f"{self.class_offset} of {self.n_classes}, reduction={self.reduction!r})"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not loss_parallel_enabled():  # as PyTorch: gather the classes (hint once)
            return gathered_loss(self, args, kwargs)
        return self.compute(args, kwargs)

    def compute(self, args: tuple, kwargs: dict) -> Any:
        """The loss from the (local) arguments, classes ``[class_offset, ...)`` local."""
        plat = self.plat
        x, t, w, ii, ls = _args(self.binder, args, kwargs)
        # autocast runs cross_entropy/nll_loss in float32 (torch's autocast op lists);
        # this kernel is made of other ops, so it applies that policy itself
        x = plat.loss_precision(x)
        w = plat.loss_precision(w) if w is not None else None
        cd = self.class_dim
        if self.replicated_output(w is not None):
            return self._reduce(self._fused_index_loss(x, t, ii, ls), t, None, ii)
        if self.kind == "nll_loss":
            # the input is log-probabilities; MindSpore's nll_loss has label_smoothing
            # (the same smoothing term as cross_entropy's), torch's has none (ls = 0)
            logp = x
        else:
            logp = sharded_log_softmax(plat, x, cd, self.class_groups)
        if self.prob_count is not None:
            per = self._prob_target(logp, t, w, ls)
        else:
            per = self._index_target(logp, t, w, ii, ls)
        return self._reduce(per, t, w, ii, plat.shape(x)[cd])

    def replicated_output(self, weighted: bool) -> bool:
        """Whether the per-sample loss comes out Replicate over the class-sharding mesh
        dims (the fused path: cross_entropy, class-index targets, no weight); else it is
        Partial(sum) there. The rule declares the same (rules/loss.py)."""
        return self.kind == "cross_entropy" and self.prob_count is None and not weighted

    def _pick(self, v: Any, own: Any, lt: Any) -> Any:
        """``v``'s entry at each sample's local target class (0 where this rank does not own
        it), as a per-sample tensor that stays connected to ``v``'s autograd graph."""
        plat, cd = self.plat, self.class_dim
        shape = plat.shape(v)
        if shape[cd] > 0 and cd % len(shape) == len(shape) - 1:
            # the class dim last: entries of the flattened input picked by flat index (the
            # backward keeps the index only; gather's keeps its whole input, a tensor of
            # the logits' size, alive until backward)
            idx = plat.reshape(plat.where(own, lt, 0), [-1])
            pos = plat.arange(0, numel(plat, idx), idx) * shape[cd] + idx
            picked = plat.reshape(plat.take_rows(plat.reshape(v, [-1]), pos), shape[:-1])
        elif shape[cd] > 0:
            idx = plat.where(own, lt, 0)
            picked = plat.squeeze(plat.gather(v, cd, plat.unsqueeze(idx, cd)), cd)
        else:  # no local class: zeros that keep the autograd graph connected
            picked = plat.sum(v, cd) * 0
        return plat.where(own, picked, 0.0)

    def _fused_index_loss(self, x: Any, t: Any, ignore_index: int, ls: float) -> Any:
        """Per-sample cross_entropy with one differentiable all-reduce over the class
        groups: each rank sums its classes' ``exp(x - max)``, its share of the target's
        shifted logit (the owner's value, 0 elsewhere) and, with label smoothing, of the
        shifted logits; the summed columns give ``log S - z_t`` (and the smoothing term)
        identical on every rank, so the loss is Replicate and reading it needs no further
        collective. The max all-reduce only stabilises (no gradient)."""
        plat, cd = self.plat, self.class_dim
        z = x - _stable_max(plat, x, cd, self.class_groups)
        n_local = plat.shape(x)[cd]
        valid = t != ignore_index
        lt = t - self.class_offset
        own = valid & (lt >= 0) & (lt < n_local)
        cols = [plat.sum(plat.exp(z), cd), self._pick(z, own, lt)]
        if ls > 0.0:
            cols.append(plat.sum(z, cd))
        tot = all_reduce_sum(plat, plat.stack(cols, -1), self.class_groups)
        log_s = plat.log(plat.select(tot, -1, 0))
        per = log_s - plat.select(tot, -1, 1)
        if ls > 0.0:
            smooth = self.n_classes * log_s - plat.select(tot, -1, 2)  # -(sum of logp)
            per = (1.0 - ls) * per + (ls / self.n_classes) * smooth
        return plat.where(valid, per, 0.0)

    def _reduce(self, per: Any, t: Any, w: Any | None, ii: int, n_local: int = 0) -> Any:
        if self.reduction == "none":
            return per
        plat = self.plat
        total = plat.sum(per)
        if self.reduction == "sum":
            return total
        if self.prob_count is not None:
            return total / self.prob_count
        dtype = plat.dtype_of(total)
        if w is None:
            d = _index_denominator(plat, t, None, ii, dtype)
            d = all_reduce(plat, d, "sum", self.batch_groups)
        else:
            local = (self.class_offset, n_local)
            d = _index_denominator(plat, t, w, ii, dtype, local)
            d = all_reduce(plat, d, "sum", self.class_groups + self.batch_groups)
        return total / d

    def _weight_view(self, w: Any, ndim: int) -> Any:
        shape = [1] * ndim
        shape[self.class_dim] = self.plat.shape(w)[0]
        return self.plat.reshape(w, shape)

    def _index_target(self, logp: Any, t: Any, w: Any | None, ignore_index: int, ls: float) -> Any:
        plat, cd = self.plat, self.class_dim
        n_local = plat.shape(logp)[cd]
        valid = t != ignore_index
        lt = t - self.class_offset
        own = valid & (lt >= 0) & (lt < n_local)
        picked = self._pick(logp, own, lt)
        if w is not None:
            if n_local > 0:
                wt = plat.take_rows(plat.detach(w), plat.where(own, lt, 0))
                nll = -plat.where(own, wt, 0.0) * picked
            else:
                nll = -picked
        else:
            nll = -picked
        if ls <= 0.0:
            return nll
        ndim = len(plat.shape(logp))
        if w is not None:
            smooth = -plat.sum(logp * self._weight_view(plat.detach(w), ndim), cd)
        else:
            smooth = -plat.sum(logp, cd)
        smooth = plat.where(valid, smooth, 0.0)
        return (1.0 - ls) * nll + (ls / self.n_classes) * smooth

    def _prob_target(self, logp: Any, t: Any, w: Any | None, ls: float) -> Any:
        if ls > 0.0:
            t = t * (1.0 - ls) + ls / self.n_classes
        prod = logp * t
        if w is not None:
            ndim = len(self.plat.shape(logp))
            prod = prod * self._weight_view(self.plat.detach(w), ndim)
        return -self.plat.sum(prod, self.class_dim)
