"""The MindSpore adapter of FSDP (see [Note: FSDP adapters] in
``hyper_shard.fsdp._adapter``): ``nn.Cell`` hooks, ``Parameter`` swaps, state dicts.

MindSpore's autograd is functional (``ms.value_and_grad`` / ``ms.grad`` trace one call and
differentiate it with respect to ``weights=``): there are no gradient hooks on tensors, no
end-of-backward callback and no ``.grad`` fields. So a unit here is *on the tape*
(``gather_on_tape``): between steps every managed parameter is a
``mindspore.Parameter(DTensor)`` holding this rank's shard (what ``trainable_params()``
returns and the optimizer steps); at each forward the engine builds this rank's flat
chunk from them with differentiable ops, all-gathers it inside one
``Platform.custom_autograd`` node whose backward is the engine's gradient reduction, and
sets the unsharded values cut out of it as the Cells' attributes (dropped again after
forward). The gradient MindSpore returns for a sharded parameter is then this rank's shard
of the mean gradient; ``hyper_shard.platform.mindspore.autograd.value_and_grad`` wraps it
as a DTensor with the FSDP gradient layout read from the parameter's ``_hs_grad_spec``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.graph.api import _pynative_executor

from ...fsdp._adapter import FSDPAdapter
from ...fsdp._module import FSDPModule
from ...fsdp._state import state_of

__all__ = ["MindSporeFSDP", "MSFSDPCell", "ADAPTER", "GRAD_SPEC"]

#: the attribute of a sharded Parameter holding its gradient's spec (read by
#: hyper_shard.platform.mindspore.autograd.grad_dtensor)
GRAD_SPEC = "_hs_grad_spec"

_CLASSES: dict[type, type] = {}


class MindSporeFSDP(FSDPAdapter):
    """:class:`~hyper_shard.fsdp._adapter.FSDPAdapter` for ``mindspore.nn.Cell``."""

    gather_on_tape = True
    _ascend: bool | None = None

    def owns(self, module: Any) -> bool:
        return isinstance(module, nn.Cell)

    def module_kind(self) -> str:
        return "mindspore.nn.Cell"

    # ---------------------------------------------------------------- modules
    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.cells_and_names())

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in module._params.items() if v is not None]

    def fsdp_class(self, cls: type) -> type:
        if issubclass(cls, MSFSDPCell):
            return cls
        out = _CLASSES.get(cls)
        if out is None:
            out = _CLASSES[cls] = type(f"FSDP{cls.__name__}", (MSFSDPCell, cls), {})
        return out

    def register_forward_hooks(self, module: Any, pre: Callable, post: Callable) -> None:
        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post)

    def register_state_dict_hooks(
        self,
        module: Any,
        pre_save: Callable[[], None],
        pre_load: Callable[[dict, str], None],
        loaded: Callable[[], list[str]],
    ) -> None:
        """``Cell.load_state_dict``: the pre-hook copies each entry into this rank's shard
        itself (:meth:`load_value`; MindSpore's own copy would ``asnumpy()`` a DTensor,
        i.e. assign the full tensor to the shard) and takes it out of the dict; a
        post-hook drops those keys from ``missing_keys``."""

        def post_load(_cell: Any, incompatible: Any) -> None:
            for key in loaded():
                while key in incompatible.missing_keys:
                    incompatible.missing_keys.remove(key)

        module.register_state_dict_pre_hook(lambda *_a: pre_save())
        module.register_load_state_dict_pre_hook(
            lambda _cell, sd, prefix, *_a: pre_load(sd, prefix)
        )
        module.register_load_state_dict_post_hook(post_load)

    def load_value(self, sd: dict, key: str, param: Any, value: Any) -> None:
        plat = param._spec.mesh.platform
        del sd[key]
        if value.dtype != param.dtype:
            value = plat.wrap(plat.cast(plat.local_of(value), param.dtype), value._spec)
        plat.copy_into(param, value)

    # ---------------------------------------------------------------- parameters
    def requires_grad(self, param: Any) -> bool:
        return bool(param.requires_grad)

    def make_sharded_param(
        self, orig: Any, local: Any, spec: Any, grad_spec: Any, requires_grad: bool
    ) -> Any:
        plat = spec.mesh.platform
        sp = Parameter(plat.wrap(local, spec), name=orig.name, requires_grad=requires_grad)
        sp.__dict__[GRAD_SPEC] = grad_spec
        return sp

    def register_sharded(self, module: Any, name: str, param: Any) -> None:
        module.__dict__.pop(name, None)
        if module._params.get(name) is not param:
            module._params[name] = param

    def register_unsharded(self, module: Any, name: str, value: Any) -> None:
        object.__setattr__(module, name, value)  # found before Cell.__getattr__'s _params

    # ---------------------------------------------------------------- autograd
    def grad_enabled(self) -> bool:
        return bool(_pynative_executor.grad_flag())

    def queue_callback(self, fn: Callable[[], None]) -> None:
        raise NotImplementedError("MindSpore's functional autograd has no backward callback")

    def cast_floats(self, obj: Any, dtype: Any) -> Any:
        return _cast_floats(obj, dtype)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return ms._no_grad()  # type: ignore[no-any-return]

    def raw_grad(self, param: Any) -> Any:
        return None  # gradients are returned by value_and_grad, never stored

    def set_raw_grad(self, param: Any, grad: Any) -> None:
        raise NotImplementedError("MindSpore parameters hold no gradient")

    def device_type(self, t: Any) -> str:
        return "cpu"

    def check_offload(self, mesh: Any) -> None:
        device = getattr(mesh.platform, "device", "CPU")
        if device != "CPU":
            # on CPU every shard, gradient and optimizer state already is in host memory
            raise NotImplementedError(
                f"fully_shard on a MindSpore Cell on {device}: CPUOffloadPolicy is not "
                f"supported there yet (the unit would need host/device copies around its "
                f"all-gather and reduction); keep offload_policy=None"
            )

    # ---------------------------------------------------------------- profiling
    def record(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if self._ascend is None:
            self._ascend = ms.get_context("device_target") == "Ascend"
        if not self._ascend:
            return contextlib.nullcontext()  # mstx ranges exist on Ascend only
        return _mstx_range(name)


@contextlib.contextmanager
def _mstx_range(name: str) -> Any:
    from mindspore.profiler import mstx

    rid = mstx.range_start(name)
    try:
        yield
    finally:
        mstx.range_end(rid)


def _is_float(t: Any) -> bool:
    return bool(ops.is_floating_point(Tensor._make_subclass(Tensor, t)))


def _cast_floats(obj: Any, dtype: Any) -> Any:
    """``obj`` (tensors in tuples, lists, dicts) with every floating-point tensor of
    another dtype cast to ``dtype`` (a DTensor through the dispatcher: its layout kept)."""
    if isinstance(obj, Tensor):
        return obj.astype(dtype) if obj.dtype != dtype and _is_float(obj) else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floats(x, dtype) for x in obj)
    if isinstance(obj, list):
        return [_cast_floats(x, dtype) for x in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class MSFSDPCell(FSDPModule):
    """The MindSpore ``FSDP<Cell>`` base. The resharding, last-backward, prefetch and
    all-reduce-hook setters of :class:`FSDPModule` raise ``NotImplementedError`` (each
    says why: they choose between behaviours an on-tape unit does not have); the others
    work as on torch (``set_unshard_in_backward`` and ``set_reduce_scatter_unused_params``
    hold already: an on-tape unit never gathers in backward, and reduces its whole flat
    buffer)."""

    def _unsupported(self, name: str, why: str) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.{name}: not supported on MindSpore Cells; {why}"
        )

    def set_all_reduce_hook(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_all_reduce_hook",
            "the reduction runs inside MindSpore's functional backward, where an in-place "
            "hook on its output would not reach the returned gradients",
        )

    def set_reshard_after_forward(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_reshard_after_forward",
            "the gathered parameters are held by MindSpore's autograd tape until backward "
            "(as reshard_after_forward=False); there is no re-gather in backward to choose",
        )

    def set_reshard_after_backward(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_reshard_after_backward",
            "every forward gathers the current shards (nothing is kept between steps)",
        )

    def set_is_last_backward(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_is_last_backward",
            "functional autograd has no end-of-backward callback; use set_requires_gradient_sync",
        )

    def set_modules_to_forward_prefetch(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_modules_to_forward_prefetch",
            "nothing is prefetched (each unit gathers in its own forward pre-hook)",
        )

    def set_modules_to_backward_prefetch(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_modules_to_backward_prefetch",
            "nothing is prefetched (there is no all-gather in backward)",
        )

    def reset_iter_state(self) -> None:
        """Drop gradients accumulated without sync (and HSDP's held shards) in every unit
        inside this Cell, and show the sharded parameters (a failed step holds nothing
        else: each forward gathers afresh)."""
        for _, cell in self.cells_and_names():  # type: ignore[attr-defined]
            st = state_of(cell)
            if st is not None and st.group is not None:
                st.group.reset_iter_state()


ADAPTER = MindSporeFSDP()
