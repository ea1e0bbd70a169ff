"""A unit's gradient reduction (framework-neutral), shared by both kinds of unit (see
[Note: FSDP adapters] in :mod:`._adapter`).

One pipeline for a unit's flat gradient buffer: the reduce-scatter over the shard mesh
dim (the mean, or the sum with the division after it), for HSDP the all-reduce over the
replicate dim (or, with ``set_requires_all_reduce(False)``, the reduced shard held for the
next reduction), the ``set_all_reduce_hook`` hook, a ``set_gradient_divide_factor``
division, the cast back to the parameters' dtype. Hook-driven units start it at their
post-backward (asynchronously where the platform can) and finish it when the next unit
reduces, storing the result as the sharded parameters' gradients; on-tape units run it
inside the backward of their all-gather node and return the result as the gradient of
this rank's flat chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..flight.context import UnitFrame, stack
from ._collectives import Pending, all_reduce_unit, reduce_scatter_unit, shard_views
from ._layout import FlatLayout
from ._param import FSDPParam

__all__ = ["UnitReduction"]


class UnitReduction:
    """The gradient-reduction half of :class:`~._group.FSDPParamGroup` (a mixin: the
    group's settings below are set by the ``FSDPModule`` methods)."""

    params: list[FSDPParam]
    info: Any
    plat: Any
    fw: Any
    comm: Any
    fqn: str
    offload: bool
    counts: dict[str, int]
    #: set_requires_gradient_sync: backward reduces (False: accumulate locally)
    reduce_grads: bool
    #: set_requires_all_reduce (HSDP): all-reduce over the replicate dim
    all_reduce_grads: bool
    #: set_gradient_divide_factor: divide the summed gradients by this (None: mean)
    gradient_divide_factor: float | None
    #: set_force_sum_reduction_for_comms: collectives reduce with "sum" only
    force_sum_reduction: bool
    #: set_all_reduce_hook: called with the reduced flat gradient buffer
    all_reduce_hook: Any
    _pending_reduce: tuple[list[FSDPParam], FlatLayout, Pending, Any] | None
    _partial_reduce: dict[Any, Any]
    _rs_layouts: dict[tuple[int, ...], FlatLayout]

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.comm.count(kind)

    def _reduce_op(self) -> str:
        """``"avg"`` (the mean over the data-parallel ranks, FSDP2's default), or ``"sum"``
        with the division after the reduction (a custom divide factor, or sum-only
        collectives asked for)."""
        if self.gradient_divide_factor is not None or self.force_sum_reduction:
            return "sum"
        return "avg"

    @contextmanager
    def _frame(self, what: str, params: Sequence[FSDPParam]) -> Iterator[None]:
        """Name the unit and its parameters to a collective's error, ``recent_ops()`` and
        the consistency mode's fingerprint (ranks reducing different parameters of a unit,
        or different units, then raise a DivergenceError naming both instead of mixing
        gradients of equal-sized buffers)."""
        frames = stack()
        frames.append(UnitFrame(self.fqn, what, [p.fqn for p in params]))
        try:
            yield
        finally:
            frames.pop()

    # ------------------------------------------------------------ buffer form
    def _reduce(self, params: list[FSDPParam], grads: list[Any]) -> None:
        """Start the reduce-scatter of ``grads``; the oldest reduce still in flight beyond
        the context's limit is completed first (and this unit's own earlier one)."""
        comm = self.comm
        if self._pending_reduce is not None:
            self.finish_reduce()
        while len(comm.pending_reduces) >= comm.max_pending_reduces:
            comm.pending_reduces.pop(0).finish_reduce()
        key = tuple(id(p) for p in params)
        layout = self._rs_layouts.get(key)
        if layout is None:
            layout = self._rs_layouts[key] = FlatLayout(
                [p.flat_shape for p in params], self.info.shard_size
            )
        grads = [p.to_flat_order(g) for p, g in zip(params, grads)]
        rd = params[0].reduce_dtype or self.plat.tensor_meta(grads[0]).dtype
        info = self.info
        group = info.shard_group() if info.shard_size > 1 else None
        with self._frame("gradient reduce-scatter", params), comm.record("FSDP::reduce_scatter"):
            pend = reduce_scatter_unit(
                self.plat, group, layout, grads, rd, grads[0], self._reduce_op(), comm.async_op
            )
        if layout.n > 1:
            self._count("reduce_scatter")
        self._pending_reduce = (params, layout, pend, rd)
        comm.pending_reduces.append(self)

    def finish_reduce(self) -> None:
        """Complete this unit's reduce-scatter (and HSDP all-reduce) and store the
        gradients on the sharded parameters."""
        if self._pending_reduce is None:
            return
        params, layout, pend, rd = self._pending_reduce
        self._pending_reduce = None
        if self in self.comm.pending_reduces:
            self.comm.pending_reduces.remove(self)
        with self.comm.record("FSDP::post_reduce"):
            flat = self._after_reduce_scatter(pend, tuple(id(p) for p in params), params)
            if flat is None:
                return
            orig = params[0].orig_dtype
            if rd != orig:
                flat = self.plat.cast(flat, orig)
            plat, fw, c = self.plat, self.fw, self.info.shard_coord
            views = shard_views(plat, layout, c, flat)
            with fw.no_grad():
                for p, v, slot in zip(params, views, layout.slots):
                    g = plat.reshape(v, slot.shard_shape(c))
                    if p.shard_dim:
                        g = plat.contiguous(p.from_flat_order(g))
                    if self.offload:
                        g = fw.to_host(g, p.pin)
                    self._store_grad(p, g)

    def _store_grad(self, p: FSDPParam, g: Any) -> None:
        fw, plat = self.fw, self.plat
        sp = p.sharded_param
        cur = fw.raw_grad(sp)
        if cur is None:
            fw.set_raw_grad(sp, plat.wrap(g, p.grad_spec))
            return
        from ..dtensor import DTensor

        if isinstance(cur, DTensor) and cur._spec == p.grad_spec:
            local = plat.local_of(cur)
        else:  # a gradient set by the user in another form: read it as its DTensor
            dt = sp.grad
            dt = dt.redistribute(dt.device_mesh, p.grad_spec.placements)
            local = plat.contiguous(plat.local_of(dt))
            fw.set_raw_grad(sp, plat.wrap(local, p.grad_spec))
        plat.copy_flat(local, local + g)

    # ------------------------------------------------------------ shared
    def _after_reduce_scatter(
        self, pend: Pending, key: Any, params: Sequence[FSDPParam], inplace: bool = True
    ) -> Any:
        """Wait for a reduce-scatter and finish the reduction (see the module docstring):
        the reduced flat shard in the reduce dtype, or None when HSDP holds it for a later
        all-reduce."""
        info, plat = self.info, self.plat
        flat = pend.wait()
        if info.replicate_size > 1:
            # HSDP without the all-reduce (set_requires_all_reduce(False)): the shard-reduced
            # sums wait here and join the next reduce that all-reduces (as FSDP2)
            held = self._partial_reduce.pop(key, None)
            if held is not None:
                flat = flat + held
            if not self.all_reduce_grads:
                self._partial_reduce[key] = flat
                return None
            with self._frame("gradient all-reduce", params), self.comm.record("FSDP::all_reduce"):
                flat = all_reduce_unit(
                    plat, info.replicate_group(), flat, self._reduce_op(), inplace=inplace
                ).wait()
            self._count("all_reduce")
        if self.all_reduce_hook is not None:
            self.all_reduce_hook(flat)
        if self._reduce_op() == "sum":
            factor = self.gradient_divide_factor
            if factor is None:
                factor = float(info.dp_size)
            if factor != 1:
                flat = plat.scale(flat, 1.0 / factor)
        return flat
