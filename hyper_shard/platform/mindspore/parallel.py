"""The tensor-parallel API's view of ``mindspore.nn.Cell``: parameters and forward hooks
(the MindSpore adapter of :mod:`hyper_shard.parallel`, registered with
:func:`hyper_shard.parallel._adapter.register_adapter` by this platform package).

The styles of :mod:`hyper_shard.parallel.style` are framework-neutral; this adapter gives
them MindSpore's module system:

* module kinds: ``mindspore.mint.nn.Linear`` (weight ``[out, in]``, run by the ``Dense``
  Primitive) is ``"linear"``; ``mint.nn.Embedding`` (``weight``) and ``nn.Embedding``
  (``embedding_table``) are ``"embedding"``. ``nn.Dense`` is refused with a hint: it runs the
  legacy ``MatMul(transpose_b=True)`` + ``BiasAdd`` Primitives, which have no sharding rule;
* parameters become ``mindspore.Parameter(DTensor)`` (a ``ParameterMindSporeDTensor``:
  still a hyper_shard DTensor, keeping the parameter's name), so the Cell's forward
  dispatches through hyper_shard and ``nn.SGD``/``nn.Adam`` built afterwards update the
  local shards (feed them :func:`hyper_shard.platform.mindspore.autograd.optimizer_grads`);
* hooks are ``Cell.register_forward_pre_hook(..., with_kwargs=True)`` and
  ``Cell.register_forward_hook`` (PyNative mode).
"""

from __future__ import annotations

from typing import Any

from mindspore import Parameter, Tensor, mint, nn

from ...parallel._adapter import InputHook, ModuleAdapter, OutputHook

__all__ = ["MindSporeModuleAdapter"]


class MindSporeModuleAdapter(ModuleAdapter):
    """:class:`~hyper_shard.parallel._adapter.ModuleAdapter` for ``mindspore.nn.Cell``."""

    name = "mindspore"

    def owns(self, module: Any) -> bool:
        return isinstance(module, nn.Cell)

    def module_kind(self, module: Any) -> str | None:
        if isinstance(module, mint.nn.Linear):
            return "linear"
        if isinstance(module, (mint.nn.Embedding, nn.Embedding)):
            return "embedding"
        if isinstance(module, nn.Dense):
            raise NotImplementedError(
                "hyper_shard.parallel: mindspore.nn.Dense runs the legacy MatMul(transpose_b) + "
                "BiasAdd Primitives, which have no sharding rule; use mindspore.mint.nn.Linear "
                "(the Dense Primitive) in the model instead"
            )
        return None

    def param_roles(self, module: Any, kind: str) -> dict[str, str]:
        if kind == "embedding":
            return {"weight": "embedding_table" if isinstance(module, nn.Embedding) else "weight"}
        roles = {"weight": "weight"}
        if getattr(module, "bias", None) is not None:
            roles["bias"] = "bias"
        return roles

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.cells_and_names())

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        return list(module._params.items())

    def direct_buffers(self, module: Any) -> list[tuple[str, Any]]:
        bufs = getattr(module, "_buffers", None) or {}
        return [(k, v) for k, v in bufs.items() if isinstance(v, Tensor)]

    def set_param(self, module: Any, name: str, value: Any, requires_grad: bool) -> None:
        old = module._params.get(name)
        pname = old.name if old is not None else name
        setattr(module, name, Parameter(value, name=pname, requires_grad=requires_grad))

    def tie_param(self, module: Any, name: str, param: Any) -> None:
        setattr(module, name, param)

    def set_buffer(self, module: Any, name: str, value: Any) -> None:
        module._buffers[name] = value

    def requires_grad(self, param: Any) -> bool:
        return bool(param.requires_grad)

    def register_input_hook(self, module: Any, fn: InputHook) -> Any:
        return module.register_forward_pre_hook(fn, with_kwargs=True)

    def register_output_hook(self, module: Any, fn: OutputHook) -> Any:
        return module.register_forward_hook(fn)

    def set_forward(self, module: Any, fn: Any) -> None:
        object.__setattr__(module, "construct", fn)  # Cell.__call__ runs it, hooks around

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, Tensor)
