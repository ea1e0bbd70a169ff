"""The steps of ``fully_shard`` (framework-neutral), each one check or one construction,
in the order :func:`~hyper_shard.fsdp.fully_shard` runs them. Every check runs before
anything is changed, on the ranks that see the problem, before any collective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ._adapter import FSDPAdapter, adapter_for
from ._comm import CommContext
from ._group import FSDPParamGroup, check_one_dtype
from ._mesh import MeshInfo
from ._param import FSDPParam
from ._policy import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from ._state import FSDPState, state_of

__all__ = [
    "validate_module",
    "validate_options",
    "get_adapter",
    "validate_mesh",
    "get_mesh_info",
    "get_managed_params",
    "shard_dim_of",
    "init_params",
    "init_param_group",
    "init_state",
    "SHARDED",
    "FORWARD_HOOKS",
]

#: the attribute marking a sharded parameter (value: its FSDPParam)
SHARDED = "_hs_fsdp_param"
#: the attribute marking an original parameter a unit manages (value: its name)
CLAIMED = "_hs_fsdp_claimed"
#: the attribute holding a module's FSDP forward hooks ``(pre, post)``
FORWARD_HOOKS = "_hs_fsdp_forward_hooks"

Managed = list[tuple[tuple[str, Any], list[tuple[Any, str]]]]


def validate_module(module: Any) -> tuple[Any, ...]:
    """The modules of one call (a list makes one unit of several).

    Raises:
        ValueError: an empty list, a module listed twice, or ``fully_shard`` already
            applied to one of them.
    """
    modules = tuple(module) if isinstance(module, (list, tuple)) else (module,)
    if not modules:
        raise ValueError("fully_shard([]): pass a module or a non-empty list of modules")
    if len(set(map(id, modules))) != len(modules):
        raise ValueError("fully_shard([...]): a module is listed twice")
    for m in modules:
        if state_of(m) is not None:
            raise ValueError(
                f"fully_shard was already applied to this {type(m).__name__}; apply it once "
                f"per module (each call makes one unit)"
            )
    return modules


def validate_options(
    reshard_after_forward: Any, mp_policy: Any, offload_policy: Any, dp_mesh_dims: Any
) -> bool | None:
    """The keyword arguments' types and the forms not supported; returns
    ``reshard_after_forward``.

    Raises:
        NotImplementedError: ``dp_mesh_dims``, or an int ``reshard_after_forward``.
        ValueError: ``reshard_after_forward`` neither a bool nor None.
        TypeError: a policy of the wrong type, or a dtype given by name (``"bf16"``).
    """
    if dp_mesh_dims is not None:
        raise NotImplementedError(
            f"fully_shard(dp_mesh_dims={dp_mesh_dims}): the full-SPMD-mesh form is not "
            f"supported; pass the data-parallel sub-mesh as mesh (e.g. mesh=spmd_mesh['dp'], "
            f"or spmd_mesh[('dp_replicate', 'dp_shard')] for HSDP) and keep tensor-parallel "
            f"parameters on spmd_mesh['tp'] (they compose into 2-D DTensors)"
        )
    if isinstance(reshard_after_forward, int) and not isinstance(reshard_after_forward, bool):
        raise NotImplementedError(
            f"fully_shard(reshard_after_forward={reshard_after_forward}): resharding to a "
            f"smaller mesh after forward is not supported; pass True, False or None"
        )
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise ValueError(
            f"fully_shard: reshard_after_forward must be a bool or None, got "
            f"{reshard_after_forward!r}"
        )
    if offload_policy is not None and not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(
            f"fully_shard: offload_policy must be an OffloadPolicy (e.g. CPUOffloadPolicy()), "
            f"got {type(offload_policy).__name__}"
        )
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(
            f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}"
        )
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp_policy, field)
        if isinstance(value, (str, int, float, bool)):  # a name, not the framework's dtype
            raise TypeError(
                f"fully_shard: MixedPrecisionPolicy({field}={value!r}): pass a dtype object "
                f"of the module's framework (torch.bfloat16, mindspore.float16) or None"
            )
    return reshard_after_forward  # type: ignore[no-any-return]


def get_adapter(modules: tuple[Any, ...], mesh: DeviceMesh | None) -> FSDPAdapter:
    """The framework adapter of ``modules``: the mesh's platform's, else the default
    platform's.

    Raises:
        TypeError: a module is not a module of that platform's framework.
    """
    if mesh is not None:
        return adapter_for(modules, mesh.platform)
    from .._locator import get_platform

    try:
        plat = get_platform(None, device_type="cpu")
    except ValueError:  # only one framework is there to ask
        plat = get_platform(None)
    return adapter_for(modules, plat)


def validate_mesh(mesh: DeviceMesh | None, modules: tuple[Any, ...], fw: FSDPAdapter) -> DeviceMesh:
    """The data-parallel mesh: ``mesh``, or every rank 1-D on the device of the modules'
    first parameter (as FSDP2's default)."""
    if mesh is not None:
        return mesh
    from .._locator import get_platform
    from ..mesh import init_device_mesh

    dev = "cpu"
    found = False
    for module in modules:
        for _, m in fw.named_modules(module):
            for _, p in fw.direct_params(m):
                t = p._spec.mesh.device_type if isinstance(p, DTensor) else fw.device_type(p)
                dev, found = ("cpu" if t == "meta" else t), True
                break
            if found:
                break
        if found:
            break
    plat = get_platform(None, device_type=dev)
    plat.ensure_initialized(dev)
    return init_device_mesh(dev, (plat.get_world_size(),))


def get_mesh_info(mesh: DeviceMesh) -> MeshInfo:
    """What a unit needs of its mesh (raises as :class:`MeshInfo`)."""
    return MeshInfo(mesh)


def get_managed_params(modules: tuple[Any, ...], fw: FSDPAdapter, ignored: Any) -> Managed:
    """``((fqn, parameter), sites)`` of every parameter this call manages: in the modules'
    trees, not ignored, not a sharded parameter of an earlier call on a submodule; a
    weight tied between two of the modules is listed once with every site.

    Raises:
        ValueError: a parameter another unit manages (see :func:`_managed_params`).
    """
    ignored_ids = set(map(id, ignored or ()))
    params: Managed = []
    seen: dict[int, list[tuple[Any, str]]] = {}
    for m in modules:
        for entry in _managed_params(m, modules, fw, ignored_ids):
            sites = seen.get(id(entry[0][1]))
            if sites is None:
                seen[id(entry[0][1])] = entry[1]
                params.append(entry)
            else:  # a weight tied between two of the unit's modules: every site shares it
                sites.extend(s for s in entry[1] if s not in sites)
    return params


def _managed_params(
    module: Any, unit: tuple[Any, ...], fw: FSDPAdapter, ignored: set[int]
) -> Managed:
    """The parameters one module of the unit contributes.

    Raises:
        ValueError: a parameter an earlier call claimed (its original object is still
            used here: a weight tied with another unit); a sharded parameter of an
            earlier call on an enclosing module (fully_shard goes bottom-up) or of a
            module shared with another unit (one module, two fully_shard calls).
    """
    found: dict[int, tuple[str, Any]] = {}
    sites: dict[int, list[tuple[Any, str]]] = {}
    named = fw.named_modules(module)
    inside = {id(m) for _, m in named}
    for mname, m in named:
        for pname, p in fw.direct_params(m):
            fqn = f"{mname}.{pname}" if mname else pname
            if id(p) in ignored:
                continue
            owner = p.__dict__.get(SHARDED)
            if owner is not None:
                if not any(id(u) in inside for u in owner.unit_modules):
                    raise _foreign_owner(module, unit, mname, m, fqn, owner, fw)
                continue
            claimed = p.__dict__.get(CLAIMED)
            if claimed is not None:
                raise ValueError(
                    f"fully_shard: parameter {type(module).__name__ + '.' + fqn!r} is the same "
                    f"tensor as {claimed!r}, which another fully_shard unit already manages "
                    f"(a tied weight shared between two units); put every module using it in "
                    f"one unit (fully_shard their common parent only, or a list unit such as "
                    f"fully_shard([a, b])), or untie the weights"
                )
            if id(p) not in found:
                found[id(p)] = (fqn, p)
                sites[id(p)] = []
            sites[id(p)].append((m, pname))
    return [(found[k], sites[k]) for k in found]


def _foreign_owner(
    module: Any, unit: tuple[Any, ...], mname: str, m: Any, fqn: str, owner: Any, fw: FSDPAdapter
) -> ValueError:
    """The error for a parameter of ``module`` that another unit's sharded parameter: an
    enclosing module's unit (applied top-down) or a unit sharing the module."""
    owners = owner.unit_modules
    encloses = any(id(x) == id(module) for u in owners for _, x in fw.named_modules(u))
    names = ", ".join(type(u).__name__ for u in owners)
    if encloses:
        return ValueError(
            f"fully_shard: parameter {fqn!r} already belongs to the unit of an enclosing "
            f"module ({names}); apply fully_shard bottom-up (blocks first, the root last)"
        )
    what = f"submodule {mname!r} ({type(m).__name__})" if mname else f"this {type(m).__name__}"
    return ValueError(
        f"fully_shard({type(module).__name__}): {what} holding parameter {fqn!r} is shared "
        f"with another fully_shard unit ({names}), which already manages it: a module "
        f"belongs to one unit. Group its users in one unit — fully_shard(["
        f"{', '.join(type(x).__name__ for x in (*owners, *unit))}]) as a list, or fully_shard "
        f"their common parent — or fully_shard the shared module first on its own (each "
        f"user's unit then leaves it to that unit)"
    )


def shard_dim_of(fn: Callable[[Any], Any] | None, param: Any, fqn: str) -> int:
    """The tensor dim ``shard_placement_fn`` shards ``param`` on (0 without one, or where
    it returns None), as FSDP2.

    Raises:
        TypeError: it returned something other than ``Shard(d)`` or None.
        NotImplementedError: a placement together with a mesh (per-parameter meshes)."""
    if fn is None:
        return 0
    out = fn(param)
    if out is None:
        return 0
    from ..placement import Shard

    if isinstance(out, Shard):
        return int(out.dim)
    if hasattr(out, "placement") and hasattr(out, "mesh_info"):
        raise NotImplementedError(
            f"fully_shard: shard_placement_fn returned a placement with its own mesh for "
            f"{fqn!r}; per-parameter meshes are not supported: return Shard(d) or None"
        )
    raise TypeError(
        f"fully_shard: shard_placement_fn must return Shard(d) or None for a parameter, got "
        f"{out!r} for {fqn!r}"
    )


def init_params(
    params: Managed,
    modules: tuple[Any, ...],
    info: MeshInfo,
    fw: FSDPAdapter,
    shard_placement_fn: Callable[[Any], Any] | None,
    offload_policy: OffloadPolicy | None,
) -> list[FSDPParam]:
    """The sharded parameters (:class:`FSDPParam`), registered on their modules once every
    one of them was built (a parameter that raises leaves the modules unchanged).

    Raises:
        ValueError: a 0-d parameter, a shard dim out of range, trainable parameters of
            several dtypes, a tensor-parallel mesh that does not compose.
        NotImplementedError: offloading the adapter cannot do on this mesh.
    """
    offload = isinstance(offload_policy, CPUOffloadPolicy)
    if offload:
        fw.check_offload(info.mesh)
    pin = bool(getattr(offload_policy, "pin_memory", False))
    plat = info.mesh.platform
    dims = [shard_dim_of(shard_placement_fn, p, fqn) for (fqn, p), _ in params]
    fparams = [
        FSDPParam(p, sites, info, fw, plat, fqn, offload, pin, d)
        for ((fqn, p), sites), d in zip(params, dims)
    ]
    where = ", ".join(type(m).__name__ for m in modules)
    check_one_dtype(fparams, lambda fp: fp.orig_dtype, where)
    for fp, ((fqn, p), sites) in zip(fparams, params):
        fp.unit_modules = modules
        fp.sharded_param.__dict__[SHARDED] = fp
        p.__dict__[CLAIMED] = f"{type(sites[0][0]).__name__}.{fqn}"
        fp.to_sharded()
    return fparams


def init_param_group(
    fparams: list[FSDPParam],
    modules: tuple[Any, ...],
    info: MeshInfo,
    mp_policy: MixedPrecisionPolicy,
    fw: FSDPAdapter,
    offload_policy: OffloadPolicy | None,
    reshard_after_forward: bool | None,
) -> FSDPParamGroup | None:
    """The unit of ``fparams`` (None when the call manages no parameter)."""
    if not fparams:
        return None
    offload = isinstance(offload_policy, CPUOffloadPolicy)
    group = FSDPParamGroup(fparams, modules, info, mp_policy, fw, info.mesh.platform, offload)
    group.reshard_after_forward = reshard_after_forward is not False
    return group


def init_state(
    modules: tuple[Any, ...],
    group: FSDPParamGroup | None,
    fw: FSDPAdapter,
    info: MeshInfo,
    mp_policy: MixedPrecisionPolicy,
    reshard_after_forward: bool | None,
) -> FSDPState:
    """The call's state, its forward hooks on every module, the class swap."""
    mesh = info.mesh
    comm = group.comm if group is not None else CommContext(fw, mesh.platform, mesh.device_type)
    state = FSDPState(modules, group, fw, comm, mp_policy, reshard_after_forward is None)
    for m in modules:
        fw.register_forward_hooks(m, state.pre_forward, state.post_forward)
        m.__dict__[FORWARD_HOOKS] = (state.pre_forward, state.post_forward)
    for m in modules:
        m.__class__ = fw.fsdp_class(type(m))
    return state
