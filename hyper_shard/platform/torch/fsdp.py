"""The torch adapter of FSDP (see [Note: FSDP adapters] in ``hyper_shard.fsdp._adapter``):
``nn.Module`` hooks, autograd hooks, parameter swaps, profiler ranges.

A hook-driven unit: forward pre/post hooks on the unit's modules, a hook on each forward
call's outputs' gradients (the unit's pre-backward), an autograd function on each call's
inputs whose backward reports the call's completion (the unit's post-backward), the
engine's end-of-backward callback, the parameter swap (``module._parameters[name]``), and
``torch.profiler.record_function`` ranges. Under ``torch.compile`` the hooks run eagerly
around the compiled forward (``torch._dynamo.disable``, as FSDP2 with dynamo's default
``skip_fsdp_hooks``): their all-gathers, frees and autograd hooks are state changes dynamo
does not trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._C import DisableTorchFunctionSubclass
from torch.distributed.utils import _apply_to_tensors

from ...dtensor import DTensor
from ...fsdp._adapter import FSDPAdapter
from ...fsdp._module import FSDPModule
from ...fsdp._state import state_of

__all__ = ["TorchFSDP", "TorchFSDPModule", "ADAPTER"]

_T: Any = torch.Tensor


class TorchFSDPModule(FSDPModule):
    """:class:`~hyper_shard.fsdp.FSDPModule` for ``torch.nn.Module`` (the class swap puts
    it first in the module's MRO)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # container indexing (nn.Sequential[1:]) builds ``type(self)(...)``: build the
        # original class instead, as FSDP2 does
        orig: Any = cls.__mro__[2]
        self = orig.__new__(orig)
        self.__init__(*args, **kwargs)
        return self

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``to_empty`` / ``.to()`` / ``.float()`` replace parameters; FSDP adopts the new
        sharded parameters afterwards."""
        ret = super()._apply(fn, *args, **kwargs)  # type: ignore[misc]
        st = state_of(self)
        if st is not None and st.group is not None:
            with torch.no_grad():
                st.group.reset_sharded_params()
        return ret

    def __deepcopy__(self, memo: Any) -> Any:
        raise AssertionError(
            "fully_shard modules cannot be deep-copied; copy the model before fully_shard, "
            "or go through its state_dict"
        )


class _PostBackward(torch.autograd.Function):
    """Identity on a call's inputs; its backward (the inputs' gradients are complete,
    hence the call's parameters' too) reports the call's completion."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[[], None], *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.fn = fn
        return inputs if len(inputs) != 1 else inputs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        ctx.fn()
        return (None, *grads)


class TorchFSDP(FSDPAdapter):
    """:class:`~hyper_shard.fsdp._adapter.FSDPAdapter` for torch."""

    gather_on_tape = False
    _classes: dict[type, type] = {}

    def owns(self, module: Any) -> bool:
        return isinstance(module, nn.Module)

    def module_kind(self) -> str:
        return "torch.nn.Module"

    # ---------------------------------------------------------------- modules
    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_modules(remove_duplicate=False))

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        return [(n, p) for n, p in module._parameters.items() if p is not None]

    def fsdp_class(self, cls: type) -> type:
        if issubclass(cls, TorchFSDPModule):
            return cls
        out = self._classes.get(cls)
        if out is None:
            out = self._classes[cls] = type(f"FSDP{cls.__name__}", (TorchFSDPModule, cls), {})
        return out

    def register_forward_hooks(self, module: Any, pre: Callable, post: Callable) -> None:
        module.register_forward_pre_hook(
            torch._dynamo.disable(pre, recursive=True), prepend=True, with_kwargs=True
        )
        module.register_forward_hook(torch._dynamo.disable(post, recursive=True), prepend=False)

    def register_state_dict_hooks(
        self,
        module: Any,
        pre_save: Callable[[], None],
        pre_load: Callable[[dict, str], None],
        loaded: Callable[[], list[str]],
    ) -> None:
        module.register_state_dict_pre_hook(lambda m, *rest: pre_save())
        module.register_load_state_dict_pre_hook(lambda m, sd, prefix, *rest: pre_load(sd, prefix))

    # ---------------------------------------------------------------- parameters
    def requires_grad(self, param: Any) -> bool:
        with DisableTorchFunctionSubclass():
            return bool(param.requires_grad)

    def make_sharded_param(
        self, orig: Any, local: Any, spec: Any, grad_spec: Any, requires_grad: bool
    ) -> Any:
        plat = spec.mesh.platform
        return nn.Parameter(plat.make_leaf(local, spec, False), requires_grad=requires_grad)

    def new_param(self, tensor: Any, requires_grad: bool) -> Any:
        return nn.Parameter(tensor, requires_grad=requires_grad)

    def register_sharded(self, module: Any, name: str, param: Any) -> None:
        module._parameters[name] = param

    def register_unsharded(self, module: Any, name: str, value: Any) -> None:
        module._parameters[name] = value

    # ---------------------------------------------------------------- autograd
    def grad_enabled(self) -> bool:
        return torch.is_grad_enabled()

    def in_backward(self) -> bool:
        return torch._C._current_graph_task_id() != -1

    def hook_outputs(self, output: Any, fn: Callable[[], None]) -> bool:
        placed = False

        def hook(_g: Any) -> None:
            fn()

        def reg(t: torch.Tensor) -> torch.Tensor:
            nonlocal placed
            with DisableTorchFunctionSubclass():
                if t.requires_grad:
                    t.register_hook(hook)
                    placed = True
            return t

        _apply_to_tensors(reg, output)
        return placed

    def hook_inputs(
        self, args: tuple, kwargs: dict, fn: Callable[[], None]
    ) -> tuple[tuple, dict, bool]:
        if not torch.is_grad_enabled():
            return args, kwargs, False
        found: list[torch.Tensor] = []

        def collect(t: torch.Tensor) -> torch.Tensor:
            with DisableTorchFunctionSubclass():
                if t.requires_grad:
                    found.append(t)
            return t

        _apply_to_tensors(collect, (args, kwargs))
        if not found:
            return args, kwargs, False
        locals_ = []
        for t in found:
            with DisableTorchFunctionSubclass():
                locals_.append(t.as_subclass(torch.Tensor) if isinstance(t, DTensor) else t)
        with DisableTorchFunctionSubclass():
            outs = _PostBackward.apply(fn, *locals_)
        if len(locals_) == 1:
            outs = (outs,)
        new: dict[int, torch.Tensor] = {}
        for t, o in zip(found, outs):
            new[id(t)] = t._spec.mesh.platform.wrap(o, t._spec) if isinstance(t, DTensor) else o

        def replace(t: torch.Tensor) -> torch.Tensor:
            return new.get(id(t), t)

        args, kwargs = _apply_to_tensors(replace, (args, kwargs))
        return args, kwargs, True

    def queue_callback(self, fn: Callable[[], None]) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(fn)  # type: ignore[attr-defined]

    def cast_floats(self, obj: Any, dtype: Any) -> Any:
        def cast(t: torch.Tensor) -> torch.Tensor:
            with DisableTorchFunctionSubclass():
                floating = t.is_floating_point() and t.dtype != dtype
            return t.to(dtype) if floating else t

        return _apply_to_tensors(cast, obj)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return torch.no_grad()

    @contextlib.contextmanager
    def preserve_versions(self, tensors: list[Any]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for t in tensors:
                stack.enter_context(torch.autograd._unsafe_preserve_version_counter(t))
            yield

    def raw_grad(self, param: Any) -> Any:
        with DisableTorchFunctionSubclass():
            return _T.grad.__get__(param)

    def set_raw_grad(self, param: Any, grad: Any) -> None:
        with DisableTorchFunctionSubclass():
            _T.grad.__set__(param, grad)
        param.__dict__.pop("_grad_wrapper", None)

    def to_device(self, t: Any, like: Any) -> Any:
        with DisableTorchFunctionSubclass():
            return t if t.device == like.device else t.to(like.device, non_blocking=True)

    def to_host(self, t: Any, pin: bool) -> Any:
        with DisableTorchFunctionSubclass():
            out = t if t.device.type == "cpu" else t.cpu()
            if pin and torch.accelerator.is_available() and not out.is_pinned():
                out = out.pin_memory()
            return out

    def device_type(self, t: Any) -> str:
        with DisableTorchFunctionSubclass():
            return str(t.device.type)

    # ---------------------------------------------------------------- profiling
    def record(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return torch.profiler.record_function(name)


ADAPTER = TorchFSDP()
