"""Local kernels of the loss rules (see ``hyper_shard/rules/loss.py``).

* :class:`GlobalMeanLoss` — batch-sharded ``reduction='mean'``: the local ``'sum'`` loss
  divided by the GLOBAL denominator (non-ignored targets, or their class weights), which
  costs one scalar all-reduce over the batch-sharding mesh dims. The output is
  ``Partial(sum)``: the ranks' quotients add up to torch's mean.
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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ....dispatch.op import Binder
from . import all_reduce, all_reduce_sum

__all__ = ["GlobalMeanLoss", "ClassParallelLoss", "ShardedLogSoftmax", "sharded_log_softmax"]


def _args(b: Binder, args: tuple, kwargs: dict) -> tuple:
    return (
        b.get(args, kwargs, "input"),
        b.get(args, kwargs, "target"),
        b.get(args, kwargs, "weight"),
        int(b.get(args, kwargs, "ignore_index", -100)),
        float(b.get(args, kwargs, "label_smoothing", 0.0) or 0.0),
    )


def _autocast_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if autocast is on for its device and ``x`` is a lower-precision
    float (as autocast treats its float32 ops), else ``x``."""
    if x.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(x.device.type):
        return x.float()
    return x


def _index_denominator(
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    dtype: torch.dtype,
    local_classes: tuple[int, int] | None = None,
) -> torch.Tensor:
    """This rank's share of the mean's denominator: the number of non-ignored targets, or
    the sum of their class weights (of the classes in ``local_classes = (offset, count)``
    when the weight is sharded with the classes)."""
    valid = target != ignore_index
    if weight is None:
        return valid.sum().to(dtype)
    t = target
    if local_classes is not None:
        off, n = local_classes
        t = t - off
        valid = valid & (t >= 0) & (t < n)
    idx = torch.where(valid, t, torch.zeros_like(t))
    w = weight.detach()
    picked = w[idx] if w.numel() else torch.zeros(idx.shape, dtype=w.dtype, device=w.device)
    return torch.where(valid, picked, torch.zeros_like(picked)).sum().to(dtype)


class GlobalMeanLoss:
    """``reduction='mean'`` of a batch-sharded loss: local sum / global denominator.

    Args:
        binder: the rule's binder; kind: ``cross_entropy`` or ``nll_loss``.
        plat: the torch Platform; groups: process groups of the batch-sharding mesh dims.
        prob_count: for class-probability targets, the global number of samples (torch
            divides by it); None for class-index targets.
    """

    __slots__ = ("binder", "kind", "plat", "groups", "prob_count")

    def __init__(
        self, binder: Binder, kind: str, plat: Any, groups: Sequence[Any], prob_count: int | None
    ) -> None:
        self.binder, self.kind, self.plat = binder, kind, plat
        self.groups, self.prob_count = tuple(groups), prob_count

    def __repr__(self) -> str:
        what = "sample count" if self.prob_count is not None else "non-ignored targets"
        return f"GlobalMeanLoss({self.kind}: local sum / global {what})"

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        x, t, w, ii, ls = _args(self.binder, args, kwargs)
        if self.kind == "cross_entropy":
            s = F.cross_entropy(x, t, w, ignore_index=ii, reduction="sum", label_smoothing=ls)
        else:
            s = F.nll_loss(x, t, w, ignore_index=ii, reduction="sum")
        if self.prob_count is not None:
            return s / self.prob_count
        d = _index_denominator(t, w, ii, s.dtype)
        return s / all_reduce(self.plat, d, "sum", self.groups)


def sharded_log_softmax(
    plat: Any, x: torch.Tensor, dim: int, groups: Sequence[Any]
) -> torch.Tensor:
    """``log_softmax(x, dim)`` of a tensor sharded along ``dim`` over ``groups`` (the local
    result is this rank's slice of the global one)."""
    with torch.no_grad():
        if x.shape[dim] > 0:
            m = x.amax(dim, keepdim=True)
        else:
            shape = list(x.shape)
            shape[dim] = 1
            m = torch.full(shape, float("-inf"), dtype=x.dtype, device=x.device)
        m = all_reduce(plat, m, "max", groups)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = x - m
    s = all_reduce_sum(plat, z.exp().sum(dim, keepdim=True), groups)
    return z - s.log()


class ShardedLogSoftmax:
    """``log_softmax(input, dim, ..., dtype=None)`` along a sharded dim (torch calling
    convention: ``torch.log_softmax``, ``Tensor.log_softmax``, ``F.log_softmax``)."""

    __slots__ = ("binder", "plat", "dim", "groups")

    def __init__(self, binder: Binder, plat: Any, dim: int, groups: Sequence[Any]) -> None:
        self.binder, self.plat, self.dim, self.groups = binder, plat, dim, tuple(groups)

    def __repr__(self) -> str:
        return f"ShardedLogSoftmax(dim={self.dim}, over {len(self.groups)} mesh dim(s))"

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        x = self.binder.get(args, kwargs, "input")
        dtype = kwargs.get("dtype")
        if dtype is None:
            dtype = next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
        if dtype is not None:
            x = x.to(dtype)
        return sharded_log_softmax(self.plat, x, self.dim, self.groups)


class ClassParallelLoss:
    """``cross_entropy``/``nll_loss`` on class-sharded input (vocab parallel), computed
    without gathering the input; runs only inside ``loss_parallel()``.

    Args:
        binder: the rule's binder; kind: ``cross_entropy`` or ``nll_loss``.
        plat: the torch Platform.
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
        plat: Any,
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

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        from ....rules.loss import loss_parallel_enabled

        if not loss_parallel_enabled():  # as PyTorch: gather the classes (hint once)
            from .loss_gather import gathered_loss

            return gathered_loss(self, args, kwargs)
        return self.compute(args, kwargs)

    def compute(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """The loss from the (local) arguments, classes ``[class_offset, ...)`` local."""
        x, t, w, ii, ls = _args(self.binder, args, kwargs)
        # autocast runs cross_entropy/nll_loss in float32 (torch's autocast op lists);
        # this kernel is made of other ops, so it applies that policy itself
        x, w = _autocast_fp32(x), (_autocast_fp32(w) if w is not None else None)
        cd = self.class_dim
        if self.replicated_output(w is not None):
            return self._reduce(self._fused_index_loss(x, t, ii, ls), t, None, ii)
        if self.kind == "nll_loss":
            logp, ls = x, 0.0
        else:
            logp = sharded_log_softmax(self.plat, x, cd, self.class_groups)
        if self.prob_count is not None:
            per = self._prob_target(logp, t, w, ls)
        else:
            per = self._index_target(logp, t, w, ii, ls)
        return self._reduce(per, t, w, ii, x.shape[cd])

    def replicated_output(self, weighted: bool) -> bool:
        """Whether the per-sample loss comes out Replicate over the class-sharding mesh
        dims (the fused path: cross_entropy, class-index targets, no weight); else it is
        Partial(sum) there. The rule declares the same (rules/loss.py)."""
        return self.kind == "cross_entropy" and self.prob_count is None and not weighted

    def _fused_index_loss(
        self, x: torch.Tensor, t: torch.Tensor, ignore_index: int, ls: float
    ) -> torch.Tensor:
        """Per-sample cross_entropy with one differentiable all-reduce over the class
        groups: each rank sums its classes' ``exp(x - max)``, its share of the target's
        shifted logit (the owner's value, 0 elsewhere) and, with label smoothing, of the
        shifted logits; the summed columns give ``log S - z_t`` (and the smoothing term)
        identical on every rank, so the loss is Replicate and reading it needs no further
        collective. The max all-reduce only stabilises (no gradient)."""
        cd = self.class_dim
        with torch.no_grad():
            if x.shape[cd] > 0:
                m = x.amax(cd, keepdim=True)
            else:
                shape = list(x.shape)
                shape[cd] = 1
                m = torch.full(shape, float("-inf"), dtype=x.dtype, device=x.device)
            m = all_reduce(self.plat, m, "max", self.class_groups)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        z = x - m
        n_local = x.shape[cd]
        valid = t != ignore_index
        lt = t - self.class_offset
        own = valid & (lt >= 0) & (lt < n_local)
        if n_local > 0:
            idx = torch.where(own, lt, torch.zeros_like(lt))
            zt = z.gather(cd, idx.unsqueeze(cd)).squeeze(cd)
        else:  # no local class: zeros that keep the autograd graph connected
            zt = z.sum(cd) * 0
        cols = [z.exp().sum(cd), torch.where(own, zt, torch.zeros_like(zt))]
        if ls > 0.0:
            cols.append(z.sum(cd))
        tot = all_reduce_sum(self.plat, torch.stack(cols, -1), self.class_groups)
        log_s = tot[..., 0].log()
        per = log_s - tot[..., 1]
        if ls > 0.0:
            smooth = self.n_classes * log_s - tot[..., 2]  # -(sum over classes of logp)
            per = (1.0 - ls) * per + (ls / self.n_classes) * smooth
        return torch.where(valid, per, torch.zeros_like(per))

    def _reduce(
        self,
        per: torch.Tensor,
        t: torch.Tensor,
        w: torch.Tensor | None,
        ii: int,
        n_local: int = 0,
    ) -> torch.Tensor:
        if self.reduction == "none":
            return per
        total = per.sum()
        if self.reduction == "sum":
            return total
        if self.prob_count is not None:
            return total / self.prob_count
        if w is None:
            d = _index_denominator(t, None, ii, total.dtype)
            d = all_reduce(self.plat, d, "sum", self.batch_groups)
        else:
            local = (self.class_offset, n_local)
            d = _index_denominator(t, w, ii, total.dtype, local)
            d = all_reduce(self.plat, d, "sum", self.class_groups + self.batch_groups)
        return total / d

    def _weight_view(self, w: torch.Tensor, ndim: int) -> torch.Tensor:
        shape = [1] * ndim
        shape[self.class_dim] = w.shape[0]
        return w.view(shape)

    def _index_target(
        self,
        logp: torch.Tensor,
        t: torch.Tensor,
        w: torch.Tensor | None,
        ignore_index: int,
        ls: float,
    ) -> torch.Tensor:
        cd = self.class_dim
        n_local = logp.shape[cd]
        valid = t != ignore_index
        lt = t - self.class_offset
        own = valid & (lt >= 0) & (lt < n_local)
        idx = torch.where(own, lt, torch.zeros_like(lt))
        if n_local > 0:
            picked = logp.gather(cd, idx.unsqueeze(cd)).squeeze(cd)
        else:  # no local class: a zero that keeps the autograd graph connected
            picked = logp.sum(cd) * 0
        zero = torch.zeros_like(picked)
        picked = torch.where(own, picked, zero)
        if w is not None:
            wt = w.detach()[idx] if n_local > 0 else zero.detach()
            nll = -torch.where(own, wt, torch.zeros_like(wt)) * picked
        else:
            nll = -picked
        if ls <= 0.0:
            return nll
        if w is not None:
            smooth = -(logp * self._weight_view(w.detach(), logp.dim())).sum(cd)
        else:
            smooth = -logp.sum(cd)
        smooth = torch.where(valid, smooth, torch.zeros_like(smooth))
        return (1.0 - ls) * nll + (ls / self.n_classes) * smooth

    def _prob_target(
        self, logp: torch.Tensor, t: torch.Tensor, w: torch.Tensor | None, ls: float
    ) -> torch.Tensor:
        if ls > 0.0:
            t = t * (1.0 - ls) + ls / self.n_classes
        prod = logp * t
        if w is not None:
            prod = prod * self._weight_view(w.detach(), logp.dim())
        return -prod.sum(self.class_dim)
