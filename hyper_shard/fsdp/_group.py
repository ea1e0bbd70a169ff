"""One FSDP unit: the parameters of one ``fully_shard`` call, communicated together
(framework-neutral state machine).

Per unit and step: one all-gather before forward, a second before backward when
``reshard_after_forward``, one reduce-scatter of the gradients after backward (and, for
HSDP, one all-reduce of the reduced shard over the replicate dim). Each is a single
collective over a flat buffer (one per all-gather dtype, which is one in practice).

States: ``sharded`` (the sharded parameters are registered on the modules; the only
parameter memory) or ``unsharded`` (the unsharded parameters are registered); a training
state (``IDLE``, ``FORWARD``, ``PRE_BACKWARD``, ``POST_BACKWARD``) says which hook ran
last, so that hooks firing again in one pass (several outputs, a recomputed forward)
do nothing twice.

A unit called several times in one forward (``self.a(x) + self.a(2 * x)``) has one
post-backward hook per call whose inputs require grad: it reduces and reshards at the
last of them, so that the other calls' backward still finds the unsharded parameters
(autograd saved them) and the gradient is reduce-scattered once. Every pre-backward hook
(one per call) makes sure the unit is unsharded, so a unit resharded early (a call whose
inputs need no gradient has no post-backward hook, the count runs short) is gathered
again and the end-of-backward callback reduces the rest (as FSDP2: every call's
pre-backward unshards).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum, auto
from typing import Any

from ..flight.context import UnitFrame, stack
from ._collectives import (
    Pending,
    all_gather_unit,
    all_reduce_unit,
    copy_out,
    reduce_scatter_unit,
    shard_views,
)
from ._layout import FlatLayout
from ._mesh import MeshInfo
from ._param import FSDPParam
from ._policy import MixedPrecisionPolicy

__all__ = ["TrainingState", "FSDPParamGroup", "CommContext"]


class TrainingState(Enum):
    IDLE = auto()
    FORWARD = auto()
    PRE_BACKWARD = auto()
    POST_BACKWARD = auto()


class CommContext:
    """State shared by the units of one root: the order units ran in (for prefetch), the
    reduce-scatters still in flight, and counters of the collectives issued."""

    def __init__(self) -> None:
        self.post_forward_order: list[FSDPParamGroup] = []
        self.pre_forward_order: list[FSDPParamGroup] = []
        self.last_forward_order: list[FSDPParamGroup] = []
        self.pending_reduces: list[FSDPParamGroup] = []
        #: reduce-scatters allowed in flight before the oldest is completed
        self.max_pending_reduces = 1
        self.counts: dict[str, int] = {}

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1


class _Bucket:
    """The parameters of a unit that share an all-gather dtype, and their layout."""

    __slots__ = ("dtype", "indices", "layout")

    def __init__(self, dtype: Any, indices: list[int], layout: FlatLayout) -> None:
        self.dtype, self.indices, self.layout = dtype, indices, layout


class FSDPParamGroup:
    """One unit (see the module docstring).

    Args:
        params: its parameters.
        modules: the modules ``fully_shard`` was applied to (one).
        info: the data-parallel mesh.
        mp: the mixed-precision policy.
        fw: the framework adapter; plat: the Platform.
        offload: parameters and gradients live in host memory.
    """

    def __init__(
        self,
        params: list[FSDPParam],
        modules: tuple[Any, ...],
        info: MeshInfo,
        mp: MixedPrecisionPolicy,
        fw: Any,
        plat: Any,
        offload: bool = False,
    ) -> None:
        self.params = params
        self.modules = modules
        self.info = info
        self.mp = mp
        self.fw, self.plat = fw, plat
        self.offload = offload
        self.comm = CommContext()
        self.training_state = TrainingState.IDLE
        self.unsharded = False
        self.reshard_after_forward = True
        self.reshard_after_backward = True
        self.reduce_grads = True
        self.all_reduce_grads = True
        self.async_prefetch = True
        #: set_gradient_divide_factor: divide the summed gradients by this (None: mean)
        self.gradient_divide_factor: float | None = None
        #: set_force_sum_reduction_for_comms: collectives reduce with "sum" only
        self.force_sum_reduction = False
        #: set_all_reduce_hook: called with the reduced flat gradient buffer
        self.all_reduce_hook: Any = None
        #: set_unshard_in_backward(False): backward uses no parameter of the unit
        self.unshard_in_backward = True
        #: set_reduce_scatter_unused_params: zeros for parameters without a gradient
        self.reduce_scatter_unused_params = False
        self.fqn = ""
        self._buckets: list[_Bucket] | None = None
        self._pending_gather: list[tuple[_Bucket, Pending]] | None = None
        self._pending_reduce: tuple[list[FSDPParam], FlatLayout, Pending, Any] | None = None
        self._rs_layouts: dict[tuple[int, ...], FlatLayout] = {}
        self._post_forward_indices: list[int] = []
        self._gathered_versions: list[Any] = []
        self._partial_reduce: dict[tuple[int, ...], Any] = {}
        #: post-backward hooks placed in forward whose backward has not run yet
        self._hooked_calls = 0

    # ------------------------------------------------------------------ init
    def lazy_init(self) -> None:
        """Dtypes and flat layouts, once every ``fully_shard`` call is done (first forward).

        Raises:
            RuntimeError: a parameter is still on the meta device.
            ValueError: trainable parameters of several dtypes in one unit.
        """
        on_meta = [p.fqn for p in self.params if self.fw.device_type(p.shard_local()) == "meta"]
        if on_meta:
            raise RuntimeError(
                f"fully_shard: parameters {on_meta} are still on the meta device; materialize "
                f"them before the first forward: model.to_empty(device=...) and then the "
                f"model's own init (reset_parameters() / init_weights())"
            )
        for p in self.params:
            p.reset_sharded_param()
            p.init_dtypes(self.mp.param_dtype, self.mp.reduce_dtype)
        trainable = {str(p.orig_dtype) for p in self.params if p.requires_grad}
        if len(trainable) > 1:
            raise ValueError(
                f"fully_shard({self.fqn or 'root'}): trainable parameters of dtypes "
                f"{sorted(trainable)} in one unit; FSDP reduces a unit's gradients in one "
                f"dtype. Cast the module to one dtype, or fully_shard the parts separately"
            )
        self._build_buckets()

    def _build_buckets(self) -> None:
        by_dtype: dict[str, list[int]] = {}
        dtypes: dict[str, Any] = {}
        for i, p in enumerate(self.params):
            k = str(p.compute_dtype)
            by_dtype.setdefault(k, []).append(i)
            dtypes[k] = p.compute_dtype
        n = self.info.shard_size
        self._buckets = [
            _Bucket(dtypes[k], idx, FlatLayout([self.params[i].flat_shape for i in idx], n))
            for k, idx in by_dtype.items()
        ]

    # ------------------------------------------------------------------ unshard
    def unshard(self, async_op: bool = False) -> None:
        """Start the all-gather of the unit (no-op if already started, or unsharded and
        still current: unsharded parameters kept past backward are gathered again once
        the optimizer changed a shard)."""
        if self._pending_gather is not None:
            return
        if self.unsharded:
            if self._gathered_versions == self._shard_versions():
                return
            self.reshard()
        if self._buckets is None:
            self.lazy_init()
        assert self._buckets is not None
        plat, info = self.plat, self.info
        group = info.shard_group() if info.shard_size > 1 else None
        pend = []
        for b in self._buckets:
            locals_ = [
                self.params[i].to_flat_order(self.params[i].shard_local()) for i in b.indices
            ]
            like = locals_[0]
            if self.offload:
                locals_ = [self.fw.to_device(t, self._device_like()) for t in locals_]
                like = locals_[0]
            with self._frame("all-gather", [self.params[i] for i in b.indices]):
                res = all_gather_unit(
                    plat, group, info.shard_coord, b.layout, locals_, b.dtype, like, async_op
                )
            if b.layout.n > 1:
                self.comm.count("all_gather")
            pend.append((b, res))
        self._pending_gather = pend

    def _device_like(self) -> Any:
        dev = getattr(self, "_device_tensor", None)
        if dev is None:
            dev = self._device_tensor = self.plat.new_tensor(
                "empty", (0,), None, self.params[0].orig_dtype, self.info.mesh.device_type
            )
        return dev

    def wait_for_unshard(self) -> None:
        """Complete a started all-gather and register the unsharded parameters."""
        pend = self._pending_gather
        if pend is None:
            return
        self._pending_gather = None
        for b, res in pend:
            flat = res.wait()
            outs = [
                self.params[i].buffer_for(s.slot_numel, flat)
                for i, s in zip(b.indices, b.layout.slots)
            ]
            with self.fw.preserve_versions(outs):
                copy_out(self.plat, b.layout, flat, outs)
        for p in self.params:
            p.to_unsharded()
        self.unsharded = True
        self._gathered_versions = self._shard_versions()

    def _shard_versions(self) -> list[Any]:
        """Version counters of the shards (an in-place update moves them; None where the
        platform has none, which then never counts as stale)."""
        v = self.plat.version
        return [v(p.sharded_param) for p in self.params]

    def discard_pending_unshard(self) -> None:
        """Complete and drop a prefetched all-gather nobody used."""
        if self._pending_gather is not None:
            for _, res in self._pending_gather:
                res.wait()
            self._pending_gather = None

    def reshard(self) -> None:
        """Register the sharded parameters again and free the unsharded memory."""
        if not self.unsharded:
            return
        for p in self.params:
            p.to_sharded()
        self.unsharded = False

    # ------------------------------------------------------------------ hooks
    def pre_forward(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        first = self.training_state is not TrainingState.FORWARD
        self.training_state = TrainingState.FORWARD
        self.unshard(self.async_prefetch)
        self.wait_for_unshard()
        if first:
            args, kwargs, hooked = self.fw.hook_inputs(args, kwargs, self._post_backward_hook)
            if hooked:
                self._hooked_calls += 1
        return args, kwargs

    def reset_backward_count(self) -> None:
        """Forget the post-backward hooks of forwards whose backward never ran (a new
        iteration starts)."""
        self._hooked_calls = 0

    def post_forward(self) -> None:
        if not self.fw.in_backward():
            if self.reshard_after_forward:
                self.reshard()
            self._post_forward_indices.append(len(self.comm.post_forward_order))
            self.comm.post_forward_order.append(self)
        self.training_state = TrainingState.IDLE

    def pre_backward(self, prefetch: bool = True) -> None:
        """Before the backward of one call of the unit: unshard (a no-op while unsharded;
        again if an earlier call's post-backward resharded), and prefetch at the first."""
        first = self.training_state is not TrainingState.PRE_BACKWARD
        self.training_state = TrainingState.PRE_BACKWARD
        if not self.unshard_in_backward:
            return  # the user said backward needs none of the unit's parameters
        self.unshard()
        self.wait_for_unshard()
        if first and prefetch:
            self._backward_prefetch()

    def _backward_prefetch(self) -> None:
        if not self._post_forward_indices:
            return
        i = self._post_forward_indices.pop()
        if i > 0:
            target = self.comm.post_forward_order[i - 1]
            if target is not self:
                target.prefetch(TrainingState.PRE_BACKWARD)

    def prefetch(self, state: TrainingState) -> None:
        """Start this unit's all-gather ahead of its hook (asynchronously where the
        backend can)."""
        if self.unsharded or self._pending_gather is not None:
            return
        if state is TrainingState.PRE_BACKWARD and not self.unshard_in_backward:
            return
        self.unshard(self.async_prefetch)
        self.comm.count(
            "prefetch_forward" if state is TrainingState.FORWARD else "prefetch_backward"
        )

    # ------------------------------------------------------------------ backward
    def _post_backward_hook(self) -> None:
        """The backward of one call is done: reduce after the last call's."""
        self._hooked_calls -= 1
        if self._hooked_calls > 0:
            return  # other calls' backward still needs the unsharded parameters
        self.post_backward()

    def post_backward(self) -> None:
        """The unit's gradients are complete: reduce-scatter them into the sharded
        parameters' gradients (accumulating), and reshard."""
        self.training_state = TrainingState.POST_BACKWARD
        fw = self.fw
        with fw.no_grad():
            if not self.reduce_grads:
                for p in self.params:
                    self._accumulate_unsynced(p)
                if self.reshard_after_backward:
                    self.reshard()
                return
            with_grad: list[FSDPParam] = []
            grads: list[Any] = []
            for p in self.params:
                if p.unsharded is None:
                    continue
                g = fw.raw_grad(p.unsharded)
                if p.acc_grad is not None:
                    g = p.acc_grad if g is None else _add(p.acc_grad, g)
                    p.acc_grad = None
                if g is None:
                    if not (self.reduce_scatter_unused_params and p.requires_grad):
                        continue
                    # ranks that used it reduce a gradient: join with zeros (as FSDP2)
                    g = p.zero_grad()
                fw.set_raw_grad(p.unsharded, None)
                with_grad.append(p)
                grads.append(g)
            if self.reshard_after_backward:
                self.reshard()
            if not with_grad:
                return
            self._reduce(with_grad, grads)

    def _accumulate_unsynced(self, p: FSDPParam) -> None:
        """Without gradient sync, keep the unsharded gradient (in ``reduce_dtype`` when it
        differs from the compute dtype, as FSDP2)."""
        if p.unsharded is None or p.reduce_dtype is None:
            return
        g = self.fw.raw_grad(p.unsharded)
        if g is None or self.plat.tensor_meta(g).dtype == p.reduce_dtype:
            return
        self.fw.set_raw_grad(p.unsharded, None)
        g = self.plat.cast(g, p.reduce_dtype)
        p.acc_grad = g if p.acc_grad is None else _add(p.acc_grad, g)

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
        with self._frame("gradient reduce-scatter", params):
            pend = reduce_scatter_unit(
                self.plat,
                group,
                layout,
                grads,
                rd,
                grads[0],
                self._reduce_op(),
                self.async_prefetch,
            )
        if layout.n > 1:
            comm.count("reduce_scatter")
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
        plat, fw, info = self.plat, self.fw, self.info
        flat = pend.wait()
        if info.replicate_size > 1:
            # HSDP without the all-reduce (set_requires_all_reduce(False)): the shard-reduced
            # sums wait here and join the next reduce that all-reduces (as FSDP2)
            key = tuple(id(p) for p in params)
            held = self._partial_reduce.pop(key, None)
            if held is not None:
                flat = _add(flat, held)
            if not self.all_reduce_grads:
                self._partial_reduce[key] = flat
                return
            with self._frame("gradient all-reduce", params):
                all_reduce_unit(plat, info.replicate_group(), flat, self._reduce_op()).wait()
            self.comm.count("all_reduce")
        if self.all_reduce_hook is not None:
            self.all_reduce_hook(flat)
        if self._reduce_op() == "sum":
            factor = self.gradient_divide_factor
            if factor is None:
                factor = float(info.dp_size)
            if factor != 1:
                flat = plat.scale(flat, 1.0 / factor)
        orig = params[0].orig_dtype
        if rd != orig:
            flat = plat.cast(flat, orig)
        c = info.shard_coord
        views = shard_views(plat, layout, c, flat)
        with fw.no_grad():
            for p, v, slot in zip(params, views, layout.slots):
                g = plat.reshape(v, slot.shard_shape(c))
                if p.shard_dim:
                    g = plat.contiguous(p.from_flat_order(g))
                if self.offload:
                    g = fw.to_host(g, p.pin)
                self._store_grad(p, g)

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

    def _reduce_op(self) -> str:
        """``"avg"`` (the mean over the data-parallel ranks, FSDP2's default), or ``"sum"``
        with the division after the reduction (a custom divide factor, or sum-only
        collectives asked for)."""
        if self.gradient_divide_factor is not None or self.force_sum_reduction:
            return "sum"
        return "avg"

    def reset_iter_state(self) -> None:
        """Forget an iteration an exception aborted: finish and drop every collective in
        flight, drop the gradients not yet reduced (accumulated ones too), reshard."""
        self.discard_pending_unshard()
        if self._pending_reduce is not None:
            self._pending_reduce[2].wait()
            self._pending_reduce = None
        if self in self.comm.pending_reduces:
            self.comm.pending_reduces.remove(self)
        self._partial_reduce.clear()
        for p in self.params:
            p.acc_grad = None
            if p.unsharded is not None:
                self.fw.set_raw_grad(p.unsharded, None)
        self.reshard()
        self.training_state = TrainingState.IDLE
        self._post_forward_indices.clear()
        self._hooked_calls = 0

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
        plat.copy_flat(local, _add(local, g))

    def finalize_backward(self) -> None:
        """End of backward: complete every reduce, drop unused prefetches."""
        self.finish_reduce()
        self.discard_pending_unshard()
        self._post_forward_indices.clear()
        self._hooked_calls = 0

    def __repr__(self) -> str:
        return f"FSDPParamGroup({self.fqn or 'root'}: {len(self.params)} params)"


def _add(a: Any, b: Any) -> Any:
    return a + b
