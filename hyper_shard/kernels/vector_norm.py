"""Vector norms of sharded tensors without gathering them: each rank reduces its shard and
only the reduced values travel (PyTorch DTensor does the same with its partial-norm
placement).

* :class:`ShardedPNorm`: ``||x||_p`` over reduced dims some mesh dims shard, for a finite
  ``p`` other than 0 and 1: each rank sums ``|x|^p`` over its shard, one differentiable
  all-reduce (sum) over the sharding mesh dims gives the global sums, and the result is
  their ``1/p``-th power (``Replicate``). A zero norm gets a zero gradient, as torch's.
* :class:`AbsInput`: a binder that reads a call's ``input`` as ``|input|`` (cast to the
  call's ``dtype=``), so :class:`~hyper_shard.kernels.extremum.ExactExtremum` computes the
  ``+-inf`` norms (``Partial(max)``/``Partial(min)``, ties across ranks get torch's
  gradient).
* :class:`ForeachNorms`: ``torch._foreach_norm`` of a list whose elements are sharded:
  every element's local part (``max |x|``, ``min |x|``, the count of non-zeros or
  ``sum |x|^p``) and one all-reduce per set of sharding groups for all of them, then the
  root (``Replicate`` elements). The norms of gradients (``clip_grad_norm_``) thus cost a
  few scalar all-reduces, never the gradients' bytes.

Framework-neutral: local math through the platform and the tensors' own operators.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import all_reduce, all_reduce_sum

__all__ = ["ShardedPNorm", "AbsInput", "ForeachNorms"]


def _cast(plat: Any, x: Any, dtype: Any) -> Any:
    return x if dtype is None else plat.cast(x, dtype)


class AbsInput:
    """Reads a call's ``input`` through ``binder`` as ``|input|``, cast to the call's
    ``dtype`` keyword (vector_norm's); every other argument as ``binder`` does."""

    __slots__ = ("binder", "plat")

    def __init__(self, binder: Any, plat: Any) -> None:
        self.binder, self.plat = binder, plat

    def get(self, args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
        v = self.binder.get(args, kwargs, name, default)
        if name != "input":
            return v
        return abs(_cast(self.plat, v, kwargs.get("dtype")))


class ShardedPNorm:
    """The local kernel of ``vector_norm(x, p, dims, keepdim)`` (see the module
    docstring): called like the op, arguments read through the call's binder."""

    __slots__ = ("binder", "plat", "p", "dims", "keepdim", "groups")

    def __init__(
        self,
        binder: Any,
        plat: Any,
        p: float,
        dims: tuple[int, ...],
        keepdim: bool,
        groups: Sequence[Any],
    ) -> None:
        self.binder, self.plat, self.p = binder, plat, p
        self.dims, self.keepdim, self.groups = dims, keepdim, tuple(groups)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plat = self.plat
        x = _cast(plat, self.binder.get(args, kwargs, "input"), kwargs.get("dtype"))
        s = plat.sum(abs(x) ** self.p, self.dims, self.keepdim)
        s = all_reduce_sum(plat, s, self.groups)
        zero = plat.cast(s == 0, plat.dtype_of(s))  # d/ds s^(1/p) at 0: torch gives 0
        return (s + zero) ** (1.0 / self.p) - zero


def _local_part(plat: Any, x: Any, p: float) -> Any:
    """This rank's part of ``||x||_p`` over every dim (0-d): what all-reduces to it."""
    a = abs(x)
    dims = tuple(range(len(plat.shape(x))))
    empty = any(s == 0 for s in plat.shape(x))
    if p == math.inf:
        return plat.sum(a, dims) * 0 if empty else plat.amax(a, dims)
    if p == -math.inf:
        if empty:
            return plat.sum(a, dims) * 0 + math.inf
        return plat.amin(a, dims)
    if p == 0:
        return plat.sum(plat.cast(x != 0, plat.dtype_of(a)), dims)
    if p == 1:
        return plat.sum(a, dims)
    return plat.sum(a**p, dims)


class ForeachNorms:
    """The local kernel of ``torch._foreach_norm(tensors, ord, dtype)`` (see the module
    docstring). ``groups[i]``: the process groups of the mesh dims sharding element ``i``
    (empty: the element is whole here and ``func``, the op itself, computes its norm)."""

    __slots__ = ("binder", "plat", "func", "groups")

    def __init__(self, binder: Any, plat: Any, func: Any, groups: Sequence[tuple]) -> None:
        self.binder, self.plat, self.func, self.groups = binder, plat, func, list(groups)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plat = self.plat
        xs = list(self.binder.get(args, kwargs, "self"))
        ord_ = self.binder.get(args, kwargs, "ord", 2)
        p = 2.0 if ord_ is None else float(ord_)
        dtype = self.binder.get(args, kwargs, "dtype", None)
        out: list[Any] = [None] * len(xs)
        whole = [i for i, g in enumerate(self.groups) if not g]
        if whole:
            res = self.func([xs[i] for i in whole], ord_, dtype=dtype)
            for i, r in zip(whole, res):
                out[i] = r
        op = "max" if p == math.inf else "min" if p == -math.inf else "sum"
        buckets: dict[tuple, list[int]] = {}
        for i, g in enumerate(self.groups):
            if g:
                buckets.setdefault(tuple(id(x) for x in g), []).append(i)
        for idx in buckets.values():
            parts = [_local_part(plat, _cast(plat, xs[i], dtype), p) for i in idx]
            dt = plat.dtype_of(parts[0])
            stacked = plat.stack([plat.cast(t, dt) for t in parts], 0)
            groups = self.groups[idx[0]]
            if not plat.requires_grad(stacked):
                total = all_reduce(plat, stacked, op, groups)
            elif op == "sum":  # differentiable: every rank uses every rank's addends
                total = all_reduce_sum(plat, stacked, groups)
            else:
                raise NotImplementedError(
                    f"_foreach_norm(ord={ord_}) of sharded tensors that require grad: call "
                    f"torch.linalg.vector_norm on each (its +-inf norms are differentiable)"
                )
            for j, i in enumerate(idx):
                v = plat.select(total, 0, j)
                v = v if op != "sum" or p in (0.0, 1.0) else v ** (1.0 / p)
                out[i] = plat.cast(v, plat.dtype_of(parts[j]))
        return out
