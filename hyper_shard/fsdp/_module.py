"""The methods a module gains from ``fully_shard`` (as FSDP2's ``FSDPModule``), by a class
swap: ``type(module)`` becomes ``FSDP<Class>`` with :class:`FSDPModule` first in its MRO,
so ``isinstance(module, FSDPModule)`` holds and nothing wraps the module.
Framework-neutral: recursion over submodules goes through the framework adapter.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ._state import FSDPState, state_of

__all__ = ["FSDPModule", "UnshardHandle"]


class UnshardHandle:
    """Returned by ``unshard(async_op=True)``: ``wait()`` completes the all-gather and
    registers the unsharded parameters (as FSDP2's ``UnshardHandle``)."""

    def __init__(self, states: list[FSDPState]) -> None:
        self._states = states

    def wait(self) -> None:
        for st in self._states:
            if st.group is not None:
                st.group.wait_for_unshard()
        self._states = []


class FSDPModule:
    """Mixin of every module ``fully_shard`` was applied to (see the module docstring)."""

    def _fsdp_state(self) -> FSDPState:
        st = state_of(self)
        if st is None:  # pragma: no cover - the class swap always goes with a state
            raise RuntimeError("this module has no fully_shard state")
        return st

    def _fsdp_states(self, recurse: bool) -> list[FSDPState]:
        st = self._fsdp_state()
        if not recurse:
            return [st]
        out = []
        for _, m in st.fw.named_modules(self):
            s = state_of(m)
            if s is not None and s not in out:
                out.append(s)
        return out

    def reshard(self) -> None:
        """Free the unsharded parameters and register the sharded ones (not recursive)."""
        g = self._fsdp_state().group
        if g is not None:
            g.discard_pending_unshard()
            g.reshard()

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """All-gather the module's parameters and register the unsharded ones (not
        recursive), in ``param_dtype`` under mixed precision. With ``async_op`` the
        all-gather is started and the returned handle's ``wait()`` completes it (the
        module's next forward waits for it too)."""
        st = self._fsdp_state()
        if st.group is not None:
            st.group.unshard(async_op)
        handle = UnshardHandle([st])
        if async_op:
            return handle
        handle.wait()
        return None

    def set_requires_gradient_sync(
        self, requires_gradient_sync: bool, *, recurse: bool = True
    ) -> None:
        """Whether backward reduces gradients (False: gradient accumulation without
        communication; the unsharded gradients add up until a backward with sync). For
        HSDP it controls the reduce-scatter and the all-reduce together."""
        _check_bool("set_requires_gradient_sync", requires_gradient_sync)
        for st in self._fsdp_states(recurse):
            if st.group is not None:
                st.group.reduce_grads = requires_gradient_sync
                st.group.all_reduce_grads = requires_gradient_sync

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """HSDP: whether backward all-reduces the reduce-scattered gradients over the
        replicate dim (False: accumulate reduce-scattered shards, all-reduce later)."""
        _check_bool("set_requires_all_reduce", requires_all_reduce)
        for st in self._fsdp_states(recurse):
            if st.group is not None:
                st.group.all_reduce_grads = requires_all_reduce

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Whether forward frees the unsharded parameters (True: all-gather again in
        backward)."""
        _check_bool("set_reshard_after_forward", reshard_after_forward)
        for st in self._fsdp_states(recurse):
            st.auto_reshard = False
            if st.group is not None:
                st.group.reshard_after_forward = reshard_after_forward

    def set_reshard_after_backward(
        self, reshard_after_backward: bool, *, recurse: bool = True
    ) -> None:
        """Whether backward frees the unsharded parameters (False: keep them for the next
        forward, e.g. during gradient accumulation)."""
        _check_bool("set_reshard_after_backward", reshard_after_backward)
        for st in self._fsdp_states(recurse):
            if st.group is not None:
                st.group.reshard_after_backward = reshard_after_backward

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Whether the next backward is the last before the optimizer step (False: the
        end of backward does not wait for the reduces still in flight)."""
        self._fsdp_state().ctx.is_last_backward = bool(is_last_backward)

    def set_modules_to_forward_prefetch(self, modules: list[Any]) -> None:
        """The FSDP modules whose all-gather this module's forward starts (instead of the
        next module of the previous iteration)."""
        self._fsdp_state().forward_prefetch = _states_of("set_modules_to_forward_prefetch", modules)

    def set_modules_to_backward_prefetch(self, modules: list[Any]) -> None:
        """The FSDP modules whose all-gather this module's backward starts (instead of the
        module that ran before it in forward)."""
        self._fsdp_state().backward_prefetch = _states_of(
            "set_modules_to_backward_prefetch", modules
        )

    # ------------------------------------------------------------ gradient reduction
    def set_gradient_divide_factor(self, factor: float) -> None:
        """Divide the unit's summed gradients by ``factor`` instead of taking their mean
        over the data-parallel ranks (as FSDP2's; HSDP: ``factor`` replaces shard size x
        replicate size). The collectives then sum, and the division follows them.

        Raises:
            ValueError: ``factor`` is not a positive number."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise ValueError(
                f"set_gradient_divide_factor: expected a positive number, got {factor!r}"
            )
        g = self._fsdp_state().group
        if g is not None:
            g.gradient_divide_factor = float(factor)

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """Deprecated alias of :meth:`set_gradient_divide_factor` (as FSDP2)."""
        warnings.warn(
            "set_reduce_scatter_divide_factor is deprecated; use set_gradient_divide_factor",
            FutureWarning,
            stacklevel=2,
        )
        self.set_gradient_divide_factor(factor)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """Reduce gradients with "sum" collectives only, dividing by the data-parallel
        size afterwards (the same values as the default mean; as FSDP2's, for backends
        whose fast paths only sum). Not recursive."""
        _check_bool("set_force_sum_reduction_for_comms", enable)
        g = self._fsdp_state().group
        if g is not None:
            g.force_sum_reduction = enable

    def set_all_reduce_hook(self, hook: Callable[[Any], None], *, stream: Any = None) -> None:
        """Call ``hook(reduce_output)`` once per backward with the unit's reduced gradient
        buffer (a 1-D local tensor holding this rank's shard of every parameter's
        gradient, before any division a divide factor asks for): after the
        reduce-scatter for FSDP, after the all-reduce for HSDP, as FSDP2. An in-place
        change to it (a custom all-reduce over another group) lands in the gradients.

        Args:
            hook: the callable.
            stream: a CUDA stream to run it in (FSDP2's); collectives here complete on
                the calling thread, so only None is taken.

        Raises:
            ValueError: ``stream`` given for HSDP (as FSDP2), or ``hook`` not callable.
            NotImplementedError: ``stream`` given otherwise."""
        if not callable(hook):
            raise ValueError(f"set_all_reduce_hook: hook must be callable, got {hook!r}")
        g = self._fsdp_state().group
        if stream is not None:
            if g is not None and g.info.replicate_size > 1:
                raise ValueError("set_all_reduce_hook: stream cannot be set when using HSDP")
            raise NotImplementedError(
                "set_all_reduce_hook(stream=...): hyper_shard runs gradient reductions on "
                "the calling thread, not on CUDA streams; pass stream=None"
            )
        if g is not None:
            g.all_reduce_hook = hook

    def set_reduce_scatter_unused_params(
        self, reduce_scatter_unused_params: bool, *, recurse: bool = True
    ) -> None:
        """Reduce zeros for parameters that got no gradient in a backward (as FSDP2; DDP's
        ``find_unused_parameters``): needed when ranks use different parameters
        (conditional control flow, mixture of experts), whose reduce-scatters would
        otherwise not match."""
        _check_bool("set_reduce_scatter_unused_params", reduce_scatter_unused_params)
        for st in self._fsdp_states(recurse):
            if st.group is not None:
                st.group.reduce_scatter_unused_params = reduce_scatter_unused_params

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        """False: backward does not all-gather this unit's parameters (as FSDP2; for units
        whose backward needs none of their values, e.g. an embedding). Their gradients
        are still reduced."""
        _check_bool("set_unshard_in_backward", unshard_in_backward)
        g = self._fsdp_state().group
        if g is not None:
            g.unshard_in_backward = unshard_in_backward

    def set_reduce_scatter_max_input_buffers(
        self, max_input_buffers: int, *, recurse: bool = True
    ) -> None:
        """How many units' gradient reductions may be in flight at once (FSDP2's cap on
        reduce-scatter input buffers; default 1): more overlap, more memory. The limit is
        shared by every unit under one root."""
        if isinstance(max_input_buffers, bool) or not isinstance(max_input_buffers, int):
            raise ValueError(
                f"set_reduce_scatter_max_input_buffers: expected an int >= 1, got "
                f"{max_input_buffers!r}"
            )
        if max_input_buffers < 1:
            raise ValueError(
                f"set_reduce_scatter_max_input_buffers: expected an int >= 1, got "
                f"{max_input_buffers}"
            )
        for st in self._fsdp_states(recurse):
            st.comm.max_pending_reduces = max_input_buffers

    # ------------------------------------------------------------ CUDA-only knobs
    def set_post_optim_event(self, event: Any) -> None:
        """FSDP2 makes the next all-gather wait on this CUDA event instead of the current
        stream. Here collectives are issued on the calling thread after the optimizer
        step has run, so the order already holds: the event is synchronized and dropped."""
        sync = getattr(event, "synchronize", None)
        if sync is not None:
            sync()

    def set_allocate_memory_from_process_group_for_comm(self, enable: bool) -> None:
        """FSDP2's NCCL staging-buffer allocator switch: accepted; hyper_shard allocates
        its flat buffers with the framework's allocator."""
        _check_bool("set_allocate_memory_from_process_group_for_comm", enable)

    def set_symm_mem_for_comm(self, backend: str = "NCCL") -> None:
        """FSDP2's symmetric-memory all-gather (NCCL only).

        Raises:
            NotImplementedError: always; the all-gather uses the process group's own
                collective."""
        raise NotImplementedError(
            "set_symm_mem_for_comm: symmetric-memory all-gathers are not supported; FSDP "
            "uses the process group's all-gather (remove the call)"
        )

    def set_separate_reduce_scatter_group(
        self, enable: bool = True, *, recurse: bool = True
    ) -> None:
        """FSDP2 runs reduce-scatters on their own NCCL communicator so they overlap
        all-gathers: accepted; here one process group serves both (the collectives are
        the same)."""
        _check_bool("set_separate_reduce_scatter_group", enable)

    def set_custom_all_gather(self, comm: Any) -> None:
        """FSDP2's custom all-gather (an ``AllGather`` object).

        Raises:
            NotImplementedError: always."""
        raise NotImplementedError(
            "set_custom_all_gather: custom FSDP collectives are not supported; the unit "
            "all-gathers through the mesh's process group"
        )

    def set_custom_reduce_scatter(self, comm: Any) -> None:
        """FSDP2's custom reduce-scatter (a ``ReduceScatter`` object).

        Raises:
            NotImplementedError: always."""
        raise NotImplementedError(
            "set_custom_reduce_scatter: custom FSDP collectives are not supported; the unit "
            "reduce-scatters through the mesh's process group"
        )

    # ------------------------------------------------------------ recovery
    def reset_iter_state(self) -> None:
        """After an exception aborted a forward or backward: finish and drop every
        collective in flight, drop the gradients not yet reduced (accumulated ones too),
        reshard every unit and forget the iteration (as FSDP2's). Call it on the root,
        then run the next iteration normally; a gradient-accumulation sequence restarts.

        Raises:
            RuntimeError: called on a module that is not the root (the module the
                top-level ``fully_shard`` was applied to)."""
        st = self._fsdp_state()
        if st.is_root is False:
            raise RuntimeError(
                f"reset_iter_state: {type(self).__name__} is not the root FSDP module; call "
                f"it on the module the top-level fully_shard was applied to"
            )
        st.reset_iter_state()


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")


def _states_of(name: str, modules: list[Any]) -> list[FSDPState]:
    out = []
    for m in modules:
        st = state_of(m)
        if st is None:
            raise ValueError(
                f"{name}: {type(m).__name__} is not a fully_shard module; pass modules "
                f"fully_shard was applied to"
            )
        out.append(st)
    return out
