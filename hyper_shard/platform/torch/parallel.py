"""The tensor-parallel API's view of ``torch.nn``: parameters and forward hooks (the
torch adapter of :mod:`hyper_shard.parallel`, registered with
:func:`hyper_shard.parallel._adapter.register_adapter` by this platform package).

Parameters become ``nn.Parameter(DTensor)``: ``nn.Parameter`` keeps a tensor subclass's
type and marks it ``_is_param``, so the parameter *is* a hyper_shard DTensor, an autograd
leaf whose ``.grad`` is a DTensor, and any ``torch.optim`` optimizer built afterwards steps
it through the dispatcher.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...parallel._adapter import InputHook, ModuleAdapter, OutputHook

__all__ = ["TorchModuleAdapter"]


_FULL_LOAD = "_hs_accepts_full_state"


def _local_device(t: Any) -> Any:
    """The device of a DTensor's local shard (read below torch-function handling)."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.device.__get__(t)


def _full_to_shards(module: Any, state_dict: dict, prefix: str, *_rest: Any) -> None:
    from ...dtensor import DTensor, distribute_tensor

    for name, cur in [*module._parameters.items(), *module._buffers.items()]:
        key = prefix + name
        value = state_dict.get(key)
        if (
            not isinstance(cur, DTensor)
            or not isinstance(value, torch.Tensor)
            or isinstance(value, DTensor)
            or tuple(value.shape) != tuple(cur._spec.shape)
        ):
            continue  # anything else: torch's own loading (and its shape errors)
        spec = cur._spec
        state_dict[key] = distribute_tensor(
            value.detach().to(_local_device(cur)),
            spec.mesh,
            spec.placements,
            src_data_rank=None,
            shard_order=spec.shard_order or None,
        )


class TorchModuleAdapter(ModuleAdapter):
    """:class:`~hyper_shard.parallel._adapter.ModuleAdapter` for ``torch.nn.Module``."""

    name = "torch"

    def owns(self, module: Any) -> bool:
        return isinstance(module, nn.Module)

    def module_kind(self, module: Any) -> str | None:
        if isinstance(module, nn.Linear):
            return "linear"
        if isinstance(module, nn.Embedding):
            return "embedding"
        return None

    def param_roles(self, module: Any, kind: str) -> dict[str, str]:
        roles = {"weight": "weight"}
        if kind == "linear" and getattr(module, "bias", None) is not None:
            roles["bias"] = "bias"
        return roles

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_modules())

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        return list(module._parameters.items())

    def direct_buffers(self, module: Any) -> list[tuple[str, Any]]:
        return list(module._buffers.items())

    def set_param(self, module: Any, name: str, value: Any, requires_grad: bool) -> None:
        module.register_parameter(name, nn.Parameter(value, requires_grad=requires_grad))
        self.accept_full_state(module)

    def whole_replicate_grad(self, param: Any) -> None:
        from .grad_sync import whole_replicate_grad

        whole_replicate_grad(param)

    def set_buffer(self, module: Any, name: str, value: Any) -> None:
        module._buffers[name] = value
        self.accept_full_state(module)

    def accept_full_state(self, module: Any) -> None:
        """``module.load_state_dict`` takes a plain tensor of a DTensor entry's global shape
        as the full value and keeps this rank's shard of it (``distribute_tensor(...,
        src_data_rank=None)``: no communication). PyTorch refuses the mix; this is what a
        consolidated checkpoint (``torch.save`` of a full state dict, or
        ``set_model_state_dict(..., StateDictOptions(full_state_dict=True))``) needs."""
        if module.__dict__.get(_FULL_LOAD):
            return
        module.__dict__[_FULL_LOAD] = True
        module.register_load_state_dict_pre_hook(_full_to_shards)

    def tie_param(self, module: Any, name: str, param: Any) -> None:
        module.register_parameter(name, param)

    def requires_grad(self, param: Any) -> bool:
        return bool(param.requires_grad)

    def register_input_hook(self, module: Any, fn: InputHook) -> Any:
        return module.register_forward_pre_hook(fn, with_kwargs=True)

    def register_output_hook(self, module: Any, fn: OutputHook) -> Any:
        return module.register_forward_hook(fn)

    def set_forward(self, module: Any, fn: Any) -> None:
        # an instance attribute: nn.Module.__call__ runs it, the hooks around it
        module.__dict__["forward"] = fn

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)
