"""One FSDP unit: the parameters of one ``fully_shard`` call, communicated together
(framework-neutral state machine; both kinds of unit, see [Note: FSDP adapters]).

Per unit and step: one all-gather before forward, a second before backward when
``reshard_after_forward`` (hook-driven units), one reduce-scatter of the gradients after
backward (and, for HSDP, one all-reduce of the reduced shard over the replicate dim).
Each is a single collective over a flat buffer (one per all-gather dtype, which is one in
practice), issued through the root's :class:`~._comm.CommContext`.

States: ``sharded`` (the sharded parameters are registered on the modules; the only
parameter memory) or ``unsharded`` (the unsharded parameters are registered); a training
state (``IDLE``, ``FORWARD``, ``PRE_BACKWARD``, ``POST_BACKWARD``) says which hook ran
last, so that hooks firing again in one pass (several outputs, a recomputed forward)
do nothing twice.

[Note: FSDP unit lifetime]
A hook-driven unit frees its unsharded parameters in backward only once no gradient of
it is still pending. Every forward call of one of its modules whose outputs need a
gradient is a *call* (:class:`_Call`): a hook on its outputs (pre-backward: unshard
again if resharded) and, where its inputs require grad, an autograd node on its inputs
(post-backward: this call's gradients have arrived). The unit reduces and reshards when
its last pending call completes; a call whose inputs need no gradient completes at the
end of the backward pass that ran it (the engine's final callback). So a unit called
several times in one forward reduce-scatters once, and a unit whose backward runs in
pieces (the chunked loss: ``fully_shard([norm, head])``, the head called per chunk with
each chunk's loss backpropagated at once, then the norm's backward from the saved
gradient; two backward passes through one unit) stays unsharded until the last piece:
at the end of a pass that leaves calls pending, the gradients that arrived are reduced
and the unit stays unsharded. A call made inside a backward pass (activation
checkpointing recomputing a unit whose own backward has not begun, e.g.
``checkpoint(root, x)``) ends with that pass: its outputs only refill saved tensors,
or a nested backward (the reentrant form) has run through them by then. Calls are held weakly: a forward whose graph is dropped
without backward leaves nothing pending.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from enum import Enum, auto
from typing import Any

from ._collectives import Pending, all_gather_unit, copy_out
from ._comm import CommContext
from ._layout import FlatLayout
from ._mesh import MeshInfo
from ._param import FSDPParam
from ._policy import MixedPrecisionPolicy
from ._tape import OnTapeUnit

__all__ = ["TrainingState", "FSDPParamGroup", "check_one_dtype"]


class TrainingState(Enum):
    IDLE = auto()
    FORWARD = auto()
    PRE_BACKWARD = auto()
    POST_BACKWARD = auto()


class _Call:
    """One forward call of a module of a unit whose backward is still to come (see
    [Note: FSDP unit lifetime])."""

    __slots__ = ("hooked", "started", "recomputed", "__weakref__")

    def __init__(self, recomputed: bool = False) -> None:
        self.hooked = False  # an autograd node on its inputs reports its completion
        self.started = False  # its pre-backward hook ran
        #: made inside a backward pass: activation checkpointing's recomputed forward,
        #: whose outputs only refill saved tensors unless a nested backward (the
        #: reentrant form) runs through them in this pass
        self.recomputed = recomputed


class _Bucket:
    """The parameters of a unit that share an all-gather dtype, and their layout."""

    __slots__ = ("dtype", "indices", "layout")

    def __init__(self, dtype: Any, indices: list[int], layout: FlatLayout) -> None:
        self.dtype, self.indices, self.layout = dtype, indices, layout


def check_one_dtype(params: list[FSDPParam], dtype_of: Any, where: str) -> None:
    """Raises ValueError if the trainable parameters have several dtypes (a unit reduces
    its gradients in one dtype)."""
    trainable = {str(dtype_of(p)) for p in params if p.requires_grad}
    if len(trainable) > 1:
        raise ValueError(
            f"fully_shard({where}): trainable parameters of several dtypes in one unit "
            f"({sorted(trainable)}); FSDP reduces a unit's gradients in one dtype. Cast the "
            f"module to one dtype first, or fully_shard the parts separately"
        )


class FSDPParamGroup(OnTapeUnit):
    """One unit (see the module docstring).

    Args:
        params: its parameters.
        modules: the modules ``fully_shard`` was applied to.
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
        self.on_tape = bool(fw.gather_on_tape)
        self.comm = CommContext(fw, plat, info.mesh.device_type)
        self.counts: dict[str, int] = {}
        self.training_state = TrainingState.IDLE
        self.unsharded = False
        self.reshard_after_forward = True
        self.reshard_after_backward = True
        self.reduce_grads = True
        self.all_reduce_grads = True
        self.gradient_divide_factor: float | None = None
        self.force_sum_reduction = False
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
        self._partial_reduce: dict[Any, Any] = {}
        #: on-tape units: the current forward cycle's unsharded values
        self._tape_values: list[tuple[FSDPParam, Any]] | None = None
        #: calls whose gradients are still pending (weakly held: see the module note)
        self._calls: weakref.WeakSet[_Call] = weakref.WeakSet()

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
        check_one_dtype(self.params, lambda p: p.orig_dtype, self.fqn or "root")
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

    def reset_sharded_params(self) -> None:
        """After a module operation replaced parameters or their dtype (``to_empty``,
        ``.to(dtype)``...): adopt them; a new dtype re-derives the dtypes and flat layouts
        at the next all-gather."""
        changed = [p.reset_sharded_param() for p in self.params]
        if any(changed) and self._buckets is not None:
            self.reshard()
            self._buckets = None

    # ------------------------------------------------------------------ unshard
    def unshard(self, async_op: bool = False) -> None:
        """Start the all-gather of the unit (no-op if already started, or unsharded and
        still current: unsharded parameters kept past backward are gathered again once
        the optimizer changed a shard). On-tape units gather synchronously, afresh."""
        if self._pending_gather is not None:
            return
        if self.unsharded:
            if not self.on_tape and self._gathered_versions == self._shard_versions():
                return
            self.reshard()
        if self._buckets is None:
            self.lazy_init()
        assert self._buckets is not None
        if self.on_tape:
            self._unshard_on_tape()
            return
        plat, info, comm = self.plat, self.info, self.comm
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
                with comm.record("FSDP::all_gather"):
                    res = all_gather_unit(
                        plat, group, info.shard_coord, b.layout, locals_, b.dtype, like,
                        async_op and comm.async_op,
                    )  # fmt: skip
            if b.layout.n > 1:
                self._count("all_gather")
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
        with self.comm.record("FSDP::all_gather_copy_out"):
            for b, res in pend:
                flat = res.wait()
                outs = [
                    self.params[i].buffer_for(s.slot_numel, flat)
                    for i, s in zip(b.indices, b.layout.slots)
                ]
                with self.fw.preserve_versions(outs):
                    copy_out(self.plat, b.layout, flat, outs)
                del flat, res
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

    def reshard(self, keep_tape_values: bool = False) -> None:
        """Register the sharded parameters again and free the unsharded memory (on-tape
        units: forget the cycle's gathered values unless ``keep_tape_values``)."""
        if not keep_tape_values:
            self._tape_values = None
        if not self.unsharded:
            return
        for p in self.params:
            p.to_sharded()
        self.unsharded = False

    # ------------------------------------------------------------------ forward
    def pre_forward(self, prefetch: Callable[[], None] | None = None) -> None:
        """Before a forward cycle: all-gather (waiting for a prefetched one); ``prefetch``
        issues the next unit's all-gather between issuing this one and waiting for it."""
        self.training_state = TrainingState.FORWARD
        self.unshard(True)
        if prefetch is not None:
            prefetch()
        self.wait_for_unshard()

    def continue_forward(self) -> None:
        """Before a later module of the current forward cycle: its gathered values (an
        on-tape unit's), or an all-gather if the unit was resharded since."""
        if self.on_tape and self._tape_values is not None:
            self.show_tape_values()
        elif not self.unsharded:
            self.pre_forward()

    def after_call(self) -> None:
        """After each module call of the unit: an on-tape unit shows its sharded
        parameters again (its values live on the tape; the cycle keeps them)."""
        if self.on_tape:
            self.reshard(keep_tape_values=True)

    def track_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, _Call | None]:
        """A forward call of one of the unit's modules (hook-driven units): the call to
        pass to :meth:`hook_call_outputs`, its inputs rebuilt with the post-backward
        node (see [Note: FSDP unit lifetime])."""
        if self.on_tape or not self.fw.grad_enabled():
            return args, kwargs, None
        call = _Call(recomputed=self.fw.in_backward())
        args, kwargs, call.hooked = self.fw.hook_inputs(args, kwargs, lambda: self._call_done(call))
        self._calls.add(call)
        return args, kwargs, call

    def post_forward(self, keep: bool = False) -> None:
        """After a forward cycle: reshard (``reshard_after_forward`` unless ``keep``; on-tape
        units always: their tape holds the gathered values), and note the order for
        backward prefetch."""
        if not self.fw.in_backward():
            if (self.reshard_after_forward and not keep) or self.on_tape:
                self.reshard()
            self._post_forward_indices.append(len(self.comm.post_forward_order))
            self.comm.post_forward_order.append(self)
        self.training_state = TrainingState.IDLE

    # ------------------------------------------------------------------ backward
    def pre_backward(self, call: _Call | None, prefetch: bool = True) -> None:
        """Before the backward of one call of the unit: unshard (a no-op while unsharded;
        again if resharded since), and prefetch at the unit's first."""
        if call is not None:
            call.started = True
        first = self.training_state is not TrainingState.PRE_BACKWARD
        self.training_state = TrainingState.PRE_BACKWARD
        if not self.unshard_in_backward:
            return  # the user said backward needs none of the unit's parameters
        with self.comm.record(f"FSDP::pre_backward ({self.fqn})"):
            self.unshard(True)
            if first and prefetch:  # issued before waiting: the backend runs both in turn
                self._backward_prefetch()
            self.wait_for_unshard()

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
        platform can; nothing to do for on-tape units, which gather in their forward)."""
        if self.on_tape or self.unsharded or self._pending_gather is not None:
            return
        if state is TrainingState.PRE_BACKWARD and not self.unshard_in_backward:
            return
        forward = state is TrainingState.FORWARD
        self.unshard(forward or self.comm.async_backward_prefetch)
        self._count("prefetch_forward" if forward else "prefetch_backward")

    def _call_done(self, call: _Call) -> None:
        """A call's post-backward node ran: its gradients have arrived; the unit reduces
        and reshards once no call is pending."""
        self._calls.discard(call)
        if not self._calls:
            with self.comm.record(f"FSDP::post_backward ({self.fqn})"):
                self.post_backward()

    def end_backward_pass(self) -> None:
        """The engine's final callback: calls whose backward ran in this pass are complete;
        the unit reduces what arrived, and reshards unless calls are still pending."""
        for call in list(self._calls):
            if call.started or call.recomputed:
                self._calls.discard(call)
        if self.training_state is not TrainingState.POST_BACKWARD:
            self.post_backward(reshard=not self._calls)
        self.training_state = TrainingState.IDLE

    def post_backward(self, reshard: bool = True) -> None:
        """Reduce-scatter the unit's gradients into the sharded parameters' gradients
        (accumulating), and reshard (unless ``reshard`` is False: calls still pending)."""
        self.training_state = TrainingState.POST_BACKWARD
        if self.on_tape:
            return  # the all-gather node's backward reduced already
        fw = self.fw
        reshard = reshard and self.reshard_after_backward
        with fw.no_grad():
            if not self.reduce_grads:
                for p in self.params:
                    self._accumulate_unsynced(p)
                if reshard:
                    self.reshard()
                return
            with_grad: list[FSDPParam] = []
            grads: list[Any] = []
            for p in self.params:
                if p.unsharded is None:
                    continue
                g = fw.raw_grad(p.unsharded)
                if p.acc_grad is not None:
                    g = p.acc_grad if g is None else p.acc_grad + g
                    p.acc_grad = None
                if g is None:
                    if not (self.reduce_scatter_unused_params and p.requires_grad and reshard):
                        continue
                    # ranks that used it reduce a gradient: join with zeros (as FSDP2)
                    g = p.zero_grad()
                fw.set_raw_grad(p.unsharded, None)
                with_grad.append(p)
                grads.append(g)
            if reshard:
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
        p.acc_grad = g if p.acc_grad is None else p.acc_grad + g

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
        self._calls.clear()

    def finalize_backward(self) -> None:
        """End of the last backward before the optimizer step: complete every reduce,
        drop unused prefetches."""
        self.finish_reduce()
        self.discard_pending_unshard()
        if not self._calls:  # else a later backward pass of this forward still prefetches
            self._post_forward_indices.clear()

    def __repr__(self) -> str:
        return f"FSDPParamGroup({self.fqn or 'root'}: {len(self.params)} params)"
