"""The state of one ``fully_shard`` call and the root-level coordination (framework-
neutral): lazy initialisation at the root's first forward, the per-iteration root, the
forward hooks of every module of the unit, the final callback of backward, and prefetch
order.

Prefetch: in forward, a unit starts the all-gather of the unit that ran after it in the
previous iteration (or the units named by ``set_modules_to_forward_prefetch``); in
backward, the unit that ran before it in this iteration's forward (or those named by
``set_modules_to_backward_prefetch``). Where the platform runs collectives asynchronously
the all-gather overlaps the current unit's compute (see [Note: FSDP communication]).

A unit of several modules (``fully_shard([norm, head])``) runs *forward cycles*: one
starts when a module of it that has not run in the current cycle starts (the all-gather,
the input casts), and ends when every module has run (the reshard after forward); every
module call in between is tracked for backward on its own (see
[Note: FSDP unit lifetime]), so a module of the unit called outside the cycle (the head
of a chunked loss, called per chunk after the forward that ran the norm) works too.
"""

from __future__ import annotations

from typing import Any

from ._comm import CommContext
from ._group import FSDPParamGroup, TrainingState

__all__ = ["FSDPState", "StateContext", "state_of"]

_ATTR = "_hs_fsdp_state"


def state_of(module: Any) -> FSDPState | None:
    """The FSDP state of a module ``fully_shard`` was applied to, else None."""
    st = module.__dict__.get(_ATTR) if hasattr(module, "__dict__") else None
    return st if isinstance(st, FSDPState) else None


class StateContext:
    """Shared by every state under one root."""

    def __init__(self) -> None:
        self.all_states: list[FSDPState] = []
        self.iter_forward_root: FSDPState | None = None
        self.callback_queued = False
        self.is_last_backward = True


class FSDPState:
    """One ``fully_shard`` call: its modules, its unit (None if it manages no parameter)
    and its hooks' logic.

    Args:
        modules: the modules of the call (several for a list).
        group: the unit of its parameters, or None.
        fw: the framework adapter.
        comm: the communication context (the unit's, when there is a unit).
        mp: the mixed-precision policy (input/output casts).
        auto_reshard: ``reshard_after_forward`` was left to FSDP (the root keeps its
            parameters unsharded after forward).
    """

    def __init__(
        self,
        modules: tuple[Any, ...],
        group: FSDPParamGroup | None,
        fw: Any,
        comm: CommContext,
        mp: Any,
        auto_reshard: bool,
    ) -> None:
        self.modules = modules
        self.group = group
        self.fw = fw
        self.mp = mp
        self.auto_reshard = auto_reshard
        self.is_root: bool | None = None
        self.ctx = StateContext()
        self.comm = group.comm if group is not None else comm
        self.training_state = TrainingState.IDLE
        self.forward_prefetch: list[FSDPState] | None = None
        self.backward_prefetch: list[FSDPState] | None = None
        self._module_ids = frozenset(id(m) for m in modules)
        #: modules of this unit still to run in the current forward cycle
        self._cycle: set[int] = set()
        #: per module: the calls whose forward started and whose outputs are not hooked yet
        self._open: dict[int, list[Any]] = {}
        for m in modules:
            m.__dict__[_ATTR] = self

    # ------------------------------------------------------------------ lazy init
    def _lazy_init(self) -> None:
        if self.is_root is not None:
            return
        self.is_root = True
        states: list[FSDPState] = []
        named = [nm for root in self.modules for nm in self.fw.named_modules(root)]
        for name, m in named:
            st = state_of(m)
            if st is None or st in states:
                continue
            if st is not self:
                if st.is_root is not None:
                    raise RuntimeError(
                        f"fully_shard: the unit at {name!r} already ran forward as a root; run "
                        f"forward through the root module first (fully_shard the root before "
                        f"the first forward, and call the root)"
                    )
                st.is_root = False
            states.append(st)
            if st.group is not None:
                st.group.fqn = name
        self.ctx.all_states = states
        if self.auto_reshard and self.group is not None:
            self.group.reshard_after_forward = False
        comm = self.comm
        for st in states:
            comm.adopt(st.comm)
            st.ctx = self.ctx
            st.comm = comm
            if st.group is not None:
                st.group.comm = comm
        seen: dict[int, str] = {}
        for st in states:
            if st.group is None:
                continue
            for p in st.group.params:
                if p.orig_uid in seen:
                    raise ValueError(
                        f"fully_shard: parameter {p.fqn!r} is shared with {seen[p.orig_uid]!r} of "
                        f"another unit; tied parameters must belong to one unit (fully_shard a "
                        f"module containing every user of the weight)"
                    )
                seen[p.orig_uid] = p.fqn
            st.group.lazy_init()

    # ------------------------------------------------------------------ forward
    def pre_forward(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The forward pre-hook of every module of the unit."""
        g = self.group
        if self.training_state is TrainingState.PRE_BACKWARD:  # a recomputed forward
            if g is not None and not g.unsharded:
                g.unshard()
                g.wait_for_unshard()
            self._open.setdefault(id(module), []).append(None)
            return self._cast_inputs(args, kwargs)
        with self.comm.record("FSDP::pre_forward"):
            first = id(module) not in self._cycle
            if first:  # a new forward cycle of the unit
                self._cycle = set(self._module_ids)
                if self.ctx.iter_forward_root is None:
                    self._root_pre_forward()
            self.training_state = TrainingState.FORWARD
            args, kwargs = self._cast_inputs(args, kwargs)
            call = None
            if g is not None:
                if first:
                    self.comm.pre_forward_order.append(g)
                    g.pre_forward(lambda: self._forward_prefetch(g))
                else:
                    g.continue_forward()
                args, kwargs, call = g.track_call(args, kwargs)
            self._open.setdefault(id(module), []).append(call)
            return args, kwargs

    def _root_pre_forward(self) -> None:
        """The first forward cycle of an iteration (this state is its forward root)."""
        self._lazy_init()
        self.ctx.iter_forward_root = self
        if not self.is_root:
            return  # a unit run on its own (e.g. the head of a chunked loss)
        comm = self.comm
        comm.last_forward_order = comm.pre_forward_order
        comm.pre_forward_order = []
        for st in self.ctx.all_states:  # cycles left open since the last iteration end
            if st is not self and st._cycle:
                st._cycle.clear()
                if st.group is not None and st.group.on_tape:
                    st.group.reshard()
        if not any(st.group is not None and st.group._calls for st in self.ctx.all_states):
            comm.post_forward_order.clear()  # no backward to come for an earlier forward
            for st in self.ctx.all_states:
                if st.group is not None:
                    st.group._post_forward_indices.clear()

    def _forward_prefetch(self, g: FSDPParamGroup) -> None:
        if self.forward_prefetch is not None:
            for st in self.forward_prefetch:
                if st.group is not None:
                    st.group.prefetch(TrainingState.FORWARD)
            return
        order = self.comm.last_forward_order
        try:
            i = order.index(g)
        except ValueError:
            return
        if i + 1 < len(order) and order[i + 1] is not g:
            order[i + 1].prefetch(TrainingState.FORWARD)

    def post_forward(self, module: Any, args: Any, output: Any) -> Any:
        """The forward hook of every module of the unit."""
        fw = self.fw
        stack = self._open.get(id(module))
        call = stack.pop() if stack else None
        if self.training_state is TrainingState.PRE_BACKWARD:
            return self._cast_output(output)
        with self.comm.record("FSDP::post_forward"):
            if fw.grad_enabled():
                placed = fw.hook_outputs(output, lambda: self.pre_backward(call))
                if call is not None and not placed and not call.hooked:
                    self.group._calls.discard(call)  # type: ignore[union-attr]
            self._cycle.discard(id(module))
            if self.group is not None:
                self.group.after_call()
            if self._cycle:  # the unit's forward cycle goes on
                if self.ctx.iter_forward_root is self and not self.is_root:
                    self.ctx.iter_forward_root = None  # a unit run on its own: one call
                return self._cast_output(output)
            self._end_cycle()
            if self.ctx.iter_forward_root is self:
                self._root_post_forward()
        return self._cast_output(output)

    def _end_cycle(self) -> None:
        self._cycle.clear()
        g = self.group
        if g is not None:
            # reshard_after_forward=None (FSDP's choice): the unit that ran last in the
            # previous iteration's forward keeps its parameters too, as the root does: its
            # backward comes first, so resharding would only gather them again at once
            # (torchtitan sets reshard_after_forward=False on its last block for this)
            order = self.comm.last_forward_order
            last = bool(order) and order[-1] is g and self.auto_reshard
            g.post_forward(keep=last and self.fw.grad_enabled())
        self.training_state = TrainingState.IDLE

    def _root_post_forward(self) -> None:
        self.ctx.iter_forward_root = None
        if self.is_root:
            # units whose forward cycle the root's forward left open (a module of a unit
            # not called in it, e.g. the head of a chunked loss): their forward ends here,
            # as FSDP2's; a module called later starts a new cycle
            for st in self.ctx.all_states:
                if st is not self and st._cycle and st.training_state is TrainingState.FORWARD:
                    st._end_cycle()
        no_backward = not self.fw.grad_enabled()
        for st in self.ctx.all_states:  # prefetches nobody consumed
            if st.group is not None and st.group.training_state is TrainingState.IDLE:
                st.group.discard_pending_unshard()
                if no_backward and not st.group._calls:
                    # a no_grad forward (eval, warm-up) has no backward to wait for:
                    # reshard every unit, the root too, so the module's parameters are
                    # the sharded DTensors again (an optimizer built next steps them;
                    # FSDP2 leaves the root unsharded and such an optimizer silently
                    # steps copies)
                    st.group.reshard()

    def _cast_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mp = self.mp
        if not (mp.cast_forward_inputs and mp.param_dtype is not None):
            return args, kwargs
        fw = self.fw
        return fw.cast_floats(args, mp.param_dtype), fw.cast_floats(kwargs, mp.param_dtype)

    def _cast_output(self, output: Any) -> Any:
        if self.mp.output_dtype is None:
            return output
        return self.fw.cast_floats(output, self.mp.output_dtype)

    # ------------------------------------------------------------------ backward
    def pre_backward(self, call: Any) -> None:
        """Before the backward of one call of a module of the unit (a hook on its
        outputs' gradients)."""
        if not self.ctx.callback_queued:
            self.ctx.callback_queued = True
            self.fw.queue_callback(self._root_state().final_callback)
        first = self.training_state is not TrainingState.PRE_BACKWARD
        self.training_state = TrainingState.PRE_BACKWARD
        if self.group is not None:
            self.group.pre_backward(call, prefetch=first and self.backward_prefetch is None)
        if first and self.backward_prefetch is not None:
            for st in self.backward_prefetch:
                if st.group is not None:
                    st.group.prefetch(TrainingState.PRE_BACKWARD)

    def reset_iter_state(self) -> None:
        """Forget the current iteration (see ``FSDPModule.reset_iter_state``)."""
        ctx = self.ctx
        states = ctx.all_states or [self]
        for st in states:
            if st.group is not None:
                st.group.reset_iter_state()
            st.training_state = TrainingState.IDLE
            st._cycle.clear()
            st._open.clear()
        ctx.iter_forward_root = None
        ctx.callback_queued = False
        ctx.is_last_backward = True
        self.comm.pending_reduces.clear()
        self.comm.post_forward_order.clear()

    def _root_state(self) -> FSDPState:
        for st in self.ctx.all_states:
            if st.is_root:
                return st
        return self

    def final_callback(self) -> None:
        """End of a backward pass (queued by its first pre-backward hook): every unit ends
        the pass (:meth:`FSDPParamGroup.end_backward_pass`: units whose post-backward did
        not run reduce now); at the last backward before the optimizer step, every
        reduce completes."""
        ctx = self.ctx
        with self.comm.record("FSDP::root_post_backward_callback"):
            for st in reversed(ctx.all_states):
                if st.group is not None:
                    st.group.end_backward_pass()
                st.training_state = TrainingState.IDLE
            if ctx.is_last_backward:
                for st in ctx.all_states:
                    if st.group is not None:
                        st.group.finalize_backward()
                if not any(st.group is not None and st.group._calls for st in ctx.all_states):
                    self.comm.post_forward_order.clear()
        ctx.callback_queued = False
        ctx.iter_forward_root = None
