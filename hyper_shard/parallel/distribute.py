"""``distribute_module``: DTensor parameters plus input/output hooks (as PyTorch's
``torch.distributed.tensor.distribute_module``), framework-neutral."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from ..dtensor import DTensor, distribute_tensor
from ..mesh import DeviceMesh, as_mesh
from ..placement import Replicate
from ._adapter import adapter_for

__all__ = ["distribute_module"]


def _n_params(fn: Callable) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins, some partials: assume the modern form
        return 3


def distribute_module(
    module: Any,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, Any, DeviceMesh], None] | None = None,
    input_fn: Callable[..., Any] | None = None,
    output_fn: Callable[..., Any] | None = None,
) -> Any:
    """Make a module's parameters DTensors and convert its inputs/outputs at run time
    (as ``torch.distributed.tensor.distribute_module``).

    Args:
        module: a ``torch.nn.Module`` (changed in place and returned).
        device_mesh: the mesh (a ``torch.distributed.device_mesh.DeviceMesh`` is taken too);
            default: the mesh of the innermost ``with mesh:``.
        partition_fn: ``partition_fn(name, submodule, mesh)`` is called for every submodule
            (the root as ``""``) and may replace parameters with DTensor parameters; every
            parameter and buffer it leaves plain is then replicated (``distribute_tensor``
            from rank 0 with all-``Replicate`` placements). Default: replicate everything.
        input_fn: ``input_fn(module, inputs, mesh)`` (or the deprecated
            ``input_fn(inputs, mesh)``), installed as a forward pre-hook; its result (if not
            None) replaces the positional inputs.
        output_fn: ``output_fn(module, outputs, mesh)`` (or ``output_fn(outputs, mesh)``),
            installed as a forward hook; its result (if not None) replaces the output.

    Returns:
        ``module``, whose parameters are all DTensors.

    Raises:
        RuntimeError: ``distribute_module`` was already applied to ``module``.
        ValueError: no ``device_mesh``.
        TypeError: ``module`` is not a module of a supported framework, or a hook takes
            neither 2 nor 3 arguments.
    """
    device_mesh = as_mesh(device_mesh, "distribute_module")
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError(
            f"distribute_module should only be called once on a module, but it has already "
            f"been called on this {type(module).__name__}"
        )
    ad = adapter_for(module)
    replicate = (Replicate(),) * device_mesh.ndim

    def replicate_rest(sub: Any) -> None:
        for name, p in ad.direct_params(sub):
            if p is not None and not isinstance(p, DTensor):
                dt = distribute_tensor(device_mesh.platform.detach(p), device_mesh, replicate)
                ad.set_param(sub, name, dt, ad.requires_grad(p))
        for name, b in ad.direct_buffers(sub):
            if b is not None and not isinstance(b, DTensor):
                ad.set_buffer(sub, name, distribute_tensor(b, device_mesh, replicate))

    for name, sub in ad.named_modules(module):
        if partition_fn is not None:
            partition_fn(name, sub, device_mesh)
        replicate_rest(sub)
        ad.accept_full_state(sub)

    if input_fn is not None:
        n = _n_params(input_fn)
        if n == 2:
            warnings.warn(
                "Deprecating input_fn that takes two arguments (inputs, device_mesh), please "
                "use input_fn that takes in (module, inputs, device_mesh) instead!",
                FutureWarning,
                stacklevel=2,
            )
            ad.register_input_hook(module, _pre_hook(lambda m, a: input_fn(a, device_mesh)))
        elif n == 3:
            ad.register_input_hook(module, _pre_hook(lambda m, a: input_fn(m, a, device_mesh)))
        else:
            raise TypeError(f"distribute_module: input_fn should take 2 or 3 arguments, got {n}")
    if output_fn is not None:
        n = _n_params(output_fn)
        if n == 2:
            warnings.warn(
                "Deprecating output_fn that takes two arguments (outputs, device_mesh), please "
                "use output_fn that takes in (module, outputs, device_mesh) instead!",
                FutureWarning,
                stacklevel=2,
            )
            ad.register_output_hook(module, lambda m, a, out: output_fn(out, device_mesh))
        elif n == 3:
            ad.register_output_hook(module, lambda m, a, out: output_fn(m, out, device_mesh))
        else:
            raise TypeError(f"distribute_module: output_fn should take 2 or 3 arguments, got {n}")
    module._distribute_module_applied = True
    return module


def _pre_hook(fn: Callable[[Any, tuple], Any]) -> Callable[[Any, tuple, dict], tuple[tuple, dict]]:
    """Adapt ``fn(module, args) -> new args | single input | None`` to the adapter's
    ``(module, args, kwargs) -> (args, kwargs)`` form."""

    def hook(m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        out = fn(m, args)
        if out is None:
            return args, kwargs
        if not isinstance(out, tuple):
            out = (out,)
        return out, kwargs

    return hook
