"""``fully_shard`` (as PyTorch FSDP2's ``torch.distributed.fsdp.fully_shard``) and the
module-level helpers. Framework-neutral: the steps are :mod:`._init`'s, the framework's
side goes through its :class:`~._adapter.FSDPAdapter`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..mesh import DeviceMesh, as_mesh
from ._init import (
    FORWARD_HOOKS,
    get_adapter,
    get_managed_params,
    get_mesh_info,
    init_param_group,
    init_params,
    init_state,
    validate_mesh,
    validate_module,
    validate_options,
)
from ._policy import MixedPrecisionPolicy, OffloadPolicy
from ._state import state_of
from ._state_dict import register_state_dict_hooks

__all__ = [
    "fully_shard",
    "register_fsdp_forward_method",
    "share_comm_ctx",
    "DataParallelMeshDims",
]

_NO_MIXED_PRECISION = MixedPrecisionPolicy()


@dataclass
class DataParallelMeshDims:
    """FSDP2's names of the data-parallel dims of a full SPMD mesh (``shard``: the dim(s)
    FSDP shards on; ``replicate``: HSDP's replicate dim(s)), for
    ``fully_shard(..., dp_mesh_dims=...)``. hyper_shard does not take that form yet: pass
    the data-parallel sub-mesh instead (``mesh=spmd_mesh["dp"]``, or
    ``spmd_mesh[("dp_replicate", "dp_shard")]`` for HSDP), with tensor-parallel
    parameters on ``spmd_mesh["tp"]`` (docs/fsdp.md)."""

    shard: str | tuple[str, ...] | None = None
    replicate: str | tuple[str, ...] | None = None

    @property
    def shard_names(self) -> tuple[str, ...]:
        return _names(self.shard)

    @property
    def replicate_names(self) -> tuple[str, ...]:
        return _names(self.replicate)


def _names(v: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


def fully_shard(
    module: Any,
    *,
    mesh: DeviceMesh | None = None,
    reshard_after_forward: bool | int | None = None,
    shard_placement_fn: Callable[[Any], Any] | None = None,
    mp_policy: MixedPrecisionPolicy = _NO_MIXED_PRECISION,
    offload_policy: OffloadPolicy | None = None,
    ignored_params: set[Any] | None = None,
    dp_mesh_dims: DataParallelMeshDims | None = None,
) -> Any:
    """Shard ``module``'s parameters over the data-parallel ranks (as FSDP2's
    ``fully_shard``): apply it to each block, then to the root.

    The parameters of ``module`` not already managed by an earlier call on a submodule
    become parameters over DTensors holding this rank's dim-0 chunk (``torch.chunk``
    semantics, uneven sizes included): ``(Shard(0),)`` on a 1-D mesh, ``(Replicate(),
    Shard(0))`` on a 2-D ``("replicate", "shard")`` mesh (HSDP). A parameter that is
    already a DTensor on a tensor-parallel sub-mesh of the same root mesh (after
    ``parallelize_module(model, mesh["tp"], plan)``) becomes a DTensor on the mesh
    spanning both, with its tensor-parallel placements kept. The optimizer steps these
    sharded parameters; ``state_dict()`` returns them.

    Before each forward the unit's parameters are all-gathered in one collective (a flat
    buffer, in ``mp_policy.param_dtype``) and the module computes with the unsharded
    tensors; after forward they are freed if ``reshard_after_forward`` and gathered again
    before backward; after backward the gradients are reduce-scattered in one collective
    (the mean over the data-parallel ranks, in ``reduce_dtype``; HSDP then all-reduces
    over the replicate dim) into ``Shard(0)`` DTensor gradients (``Replicate`` on the
    replicate dim). The next unit's all-gather is prefetched, and reductions overlap the
    next unit's backward, where the platform runs collectives asynchronously. Semantics:
    PyTorch FSDP2; docs/fsdp.md says where hyper_shard differs.

    Args:
        module: a module of the mesh's framework (a ``torch.nn.Module``, a
            ``mindspore.nn.Cell``: see docs/fsdp.md "MindSpore"); its class becomes
            ``FSDP<Class>``, a subclass of :class:`FSDPModule`. A list of modules makes one
            unit of them all (as FSDP2: gathered when the first of them starts forward,
            resharded after the last one ends; e.g. ``[model.norm, model.output]``).
        mesh: the data-parallel mesh (1-D FSDP or 2-D HSDP); default: all ranks, 1-D. A
            ``torch.distributed.device_mesh.DeviceMesh`` is taken too (converted).
        reshard_after_forward: True: free after forward (gather again in backward);
            False: keep until after backward; None (default, as FSDP2): True except for
            the root, which keeps its parameters for the backward that follows at once.
        shard_placement_fn: ``fn(param) -> Shard(d) | None`` (as FSDP2): shard that
            parameter along tensor dim ``d`` instead of 0.
        mp_policy: mixed precision (:class:`MixedPrecisionPolicy`).
        offload_policy: :class:`CPUOffloadPolicy` keeps shards, gradients and optimizer
            state in host memory; None or :class:`OffloadPolicy`: no offloading.
        ignored_params: parameters left alone (not sharded, not reduced).
        dp_mesh_dims: FSDP2's full-SPMD-mesh form: only None (see
            :class:`DataParallelMeshDims`).

    Returns:
        ``module`` (its class swapped; a list: the same list, each module swapped).

    Raises:
        ValueError: ``fully_shard`` already applied to ``module``; a mesh that does not
            contain this rank or is not 1-D/2-D; a parameter that another unit already
            manages (an enclosing module's unit: go bottom-up; a module or a weight shared
            with another unit: group their users in one unit); a 0-d parameter;
            trainable parameters of several dtypes in one unit.
        NotImplementedError: an int ``reshard_after_forward`` (resharding to a smaller
            mesh), or ``dp_mesh_dims``.
        TypeError: ``module`` is not a module of the mesh's framework, or a policy of the
            wrong type.
    """
    modules = validate_module(module)
    if mesh is not None:  # a torch.distributed DeviceMesh is converted (its groups reused)
        mesh = as_mesh(mesh, "fully_shard")
    raf = validate_options(reshard_after_forward, mp_policy, offload_policy, dp_mesh_dims)
    fw = get_adapter(modules, mesh)
    info = get_mesh_info(validate_mesh(mesh, modules, fw))
    managed = get_managed_params(modules, fw, ignored_params)
    params = init_params(managed, modules, info, fw, shard_placement_fn, offload_policy)
    group = init_param_group(params, modules, info, mp_policy, fw, offload_policy, raf)
    init_state(modules, group, fw, info, mp_policy, raf)
    if group is not None:
        register_state_dict_hooks(fw, group)
    return module


def register_fsdp_forward_method(module: Any, method_name: str) -> None:
    """Make ``module.<method_name>`` run FSDP's forward hooks around it, as ``forward``
    does (as FSDP2's): the unit's parameters are all-gathered before the method and
    resharded after it as ``reshard_after_forward`` says, so a ``generate`` or an
    ``encode`` computes with the whole parameters. A no-op for a module ``fully_shard``
    was not applied to.

    Raises:
        ValueError: the module has no attribute ``method_name``."""
    hooks = getattr(module, "__dict__", {}).get(FORWARD_HOOKS)
    if hooks is None:
        return  # as FSDP2: the same code runs with and without FSDP
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module).__name__} does not have a method {method_name!r}")
    pre, post = hooks
    orig = getattr(module, method_name)

    @functools.wraps(orig)
    def method(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = pre(module, args, kwargs)
        return post(module, args, orig(*args, **kwargs))

    setattr(module, method_name, method)


def share_comm_ctx(modules: list[Any]) -> None:
    """FSDP2 shares its communication streams between several roots (pipeline stages).
    hyper_shard issues collectives through each root's communication context with the
    process group's own work handles and no streams of its own, so there is nothing to
    share: the modules are checked and left as they are.

    Raises:
        ValueError: an element ``fully_shard`` was not applied to."""
    for m in modules:
        if state_of(m) is None:
            raise ValueError(
                f"share_comm_ctx: {type(m).__name__} is not a fully_shard module; pass "
                f"modules fully_shard was applied to"
            )
