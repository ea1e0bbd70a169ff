"""The methods a module gains from ``fully_shard`` (as FSDP2's ``FSDPModule``), by a class
swap: ``type(module)`` becomes ``FSDP<Class>`` with :class:`FSDPModule` first in its MRO,
so ``isinstance(module, FSDPModule)`` holds and nothing wraps the module.
Framework-neutral: recursion over submodules goes through the framework adapter.
"""

from __future__ import annotations

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
