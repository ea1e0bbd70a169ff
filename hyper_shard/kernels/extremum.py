"""``amax``/``amin`` (and ``max(x)``/``min(x)``) over sharded dims with torch's gradient.

Over a sharded reduced dim each rank reduces its shard and the result is ``Partial(max)``
(``Partial(min)``); the values need no communication. Their gradient does: torch's
``amax`` splits the gradient evenly between *all* the elements equal to the maximum
(pytorch/pytorch#41779). Reducing to ``Replicate`` routes the gradient to the ranks
holding the maximum, split evenly between those ranks (``redistribute/executor.py``), and the
plain local ``amax`` then splits each rank's share between its own ties: right when the
ties sit on one rank, but ``1/(k * c_r)`` instead of ``1/C`` per element when ``k`` ranks
hold ``c_r`` ties each out of ``C`` in all.

This kernel computes the same values, and in backward re-weights each rank's share by
``k * mask / C``, with ``M`` (the global extremum), ``k`` and ``C`` from two small
all-reduces over the mesh dims that shard the reduced dims. Without ties across ranks it
gives exactly what the plain local op gives. An empty local shard is padded with the
reduction's identity first (the local kernel refuses an empty reduction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import all_reduce

if TYPE_CHECKING:
    from ..platform.base import LocalOps

__all__ = ["ExactExtremum"]


class ExactExtremum:
    """The local kernel: called like ``amax(input, dims, keepdim)``; arguments read through
    the call's binder. ``pad_dims``: reduced dims empty in this rank's shard; ``groups``:
    the process groups of the mesh dims that shard a reduced dim."""

    __slots__ = ("binder", "dims", "keepdim", "mode", "pad_dims", "fill", "mesh", "dtype", "groups")

    def __init__(
        self,
        binder: Any,
        dims: tuple[int, ...],
        keepdim: bool,
        mode: str,
        pad_dims: tuple[int, ...],
        fill: Any,
        mesh: Any,
        dtype: Any,
        groups: Sequence[Any],
    ) -> None:
        self.binder, self.dims, self.keepdim, self.mode = binder, dims, keepdim, mode
        self.pad_dims, self.fill, self.mesh, self.dtype = pad_dims, fill, mesh, dtype
        self.groups = tuple(groups)

    def _reduce(self, plat: LocalOps, x: Any, keepdim: bool) -> Any:
        for d in self.pad_dims:
            shape = list(plat.shape(x))
            shape[d] = 1
            pad = plat.new_tensor("full", shape, self.fill, self.dtype, self.mesh.device_type)
            x = plat.cat([x, pad], d)
        fn = plat.amax if self.mode == "max" else plat.amin
        return fn(x, self.dims, keepdim)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = self.binder.get(args, kwargs, "input")
        plat = self.mesh.platform
        if not plat.requires_grad(x) or not self.groups:
            return self._reduce(plat, x, self.keepdim)
        xd = plat.detach(x)
        kept = list(plat.shape(x))
        for d in self.dims:
            kept[d] = 1

        def fwd(t: Any) -> Any:
            return self._reduce(plat, t, self.keepdim)

        def bwd(g: Any) -> Any:
            m = self._reduce(plat, xd, True)  # this rank's extremum, reduced dims kept
            top = all_reduce(plat, m, self.mode, self.groups)  # the global one
            holds = plat.eq_mask(m, top)  # 1 where this rank holds it
            mask = plat.eq_mask(xd, top)  # this rank's elements equal to it
            counts = plat.stack([holds, plat.sum(mask, self.dims, True)], 0)
            counts = all_reduce(plat, counts, "sum", self.groups)  # k ranks, C elements
            k, c = plat.select(counts, 0, 0), plat.select(counts, 0, 1)
            gk = plat.reshape(g, kept)
            return plat.div(plat.mul(plat.mul(gk, k), mask), c)

        return plat.custom_autograd(fwd, bwd, x)
