"""The built-in platforms' declarations (:class:`~hyper_shard.registry.platforms.PlatformBindings`):
what the neutral core knows of torch and MindSpore before importing either.

Every reference is a ``"module:attr"`` string, loaded on first use, so registering these
imports no framework (each platform package imports its framework at its top). A third
platform declares the same in its own package and registers it with
:func:`~hyper_shard.registry.platforms.register_platform` or an entry point in group
``hyper_shard.platforms``.
"""

from __future__ import annotations

from ..registry.platforms import PlatformBindings

__all__ = ["TORCH", "MINDSPORE"]


def _torch_seed_names(name: str) -> list[str]:
    """hyper-parallel keys a torch op by its ``__name__`` (``relu``: every function of that
    name) or a dotted path; a capitalised name is a MindSpore Primitive."""
    if "." in name:
        return [name]
    if name[:1].isupper():
        return []
    return [f"torch.{name}", f"Tensor.{name}"]


def _mindspore_seed_names(name: str) -> list[str]:
    """hyper-parallel keys a MindSpore op by its Primitive name (capitalised)."""
    return [name] if name[:1].isupper() and "." not in name else []


_T = "hyper_shard.platform.torch"
_M = "hyper_shard.platform.mindspore"

TORCH = PlatformBindings(
    key="torch",
    resolve=f"{_T}.names:resolve_torch_op",
    build_table=f"{_T}.dispatch:build_torch_table",
    platform=f"{_T}:TorchPlatform",
    names_hint="a list of torch function names, e.g. [torch.add, Tensor.add, Tensor.add_]",
    seed_names=_torch_seed_names,
    modules=("torch",),
    tensor_type="torch:Tensor",
    generator=f"{_T}.features:GENERATOR",
    rng_state=True,
    checkpoint=f"{_T}.checkpoint",
    checkpoint_exports={
        "DTensorStager": f"{_T}.checkpoint:DTensorStager",
        "HyperShardWriter": f"{_T}.dcp_storage:HyperShardWriter",
        "HyperShardReader": f"{_T}.dcp_storage:HyperShardReader",
    },
    context_parallel=f"{_T}.context_parallel:context_parallel",
    dtype=f"{_T}.features:dtype_named",
    # torch.load(weights_only=True) of DTensors needs their rebuild functions allowlisted
    preload=f"{_T}.dtensor",
)

MINDSPORE = PlatformBindings(
    key="mindspore",
    resolve=f"{_M}.dispatch:resolve_ms_op",
    build_table=f"{_M}.dispatch:build_ms_table",
    platform=f"{_M}:MindSporePlatform",
    names_hint="a list of MindSpore Primitive names, e.g. [AddExt, Add]",
    seed_names=_mindspore_seed_names,
    modules=("mindspore",),
    tensor_type="mindspore:Tensor",
    generator=f"{_M}.features:GENERATOR",
    rng_state=False,
    checkpoint=f"{_M}.checkpoint",
    context_parallel=f"{_M}.context_parallel:context_parallel",
    dtype=f"{_M}.features:dtype_named",
)
