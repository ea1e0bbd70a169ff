"""``fully_shard`` (as PyTorch FSDP2's ``torch.distributed.fsdp.fully_shard``).

Framework-neutral: which parameters a call manages, checks, and the wiring of the state,
the unit and the hooks; the framework's side goes through :mod:`._adapter`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..dtensor import DTensor, redistribute_local
from ..mesh import DeviceMesh
from ..spec import DTensorSpec
from ._adapter import framework_for
from ._group import FSDPParamGroup
from ._mesh import MeshInfo
from ._param import FSDPParam
from ._policy import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from ._state import FSDPState, state_of

__all__ = [
    "fully_shard",
    "register_fsdp_forward_method",
    "share_comm_ctx",
    "DataParallelMeshDims",
]

_NO_MIXED_PRECISION = MixedPrecisionPolicy()
#: the attribute holding a module's FSDP forward hooks ``(pre, post)``
_FORWARD_HOOKS = "_hs_fsdp_forward_hooks"


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


#: the attribute marking a sharded parameter (value: its FSDPParam)
_SHARDED = "_hs_fsdp_param"


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
    become ``nn.Parameter(DTensor)`` holding this rank's dim-0 chunk (``torch.chunk``
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
    replicate dim). The next unit's all-gather is prefetched (asynchronously where the
    backend can).

    Args:
        module: a ``torch.nn.Module`` or a ``mindspore.nn.Cell`` (see docs/fsdp.md
            "MindSpore" for what a Cell supports); its class becomes ``FSDP<Class>``, a subclass of
            :class:`FSDPModule` (``reshard``, ``unshard``, ``set_requires_gradient_sync``...).
            A list of modules (or Cells) makes one unit of them all (as FSDP2: gathered when
            the first of them starts forward, resharded after the last one ends; e.g.
            ``[model.norm, model.output]``); every module of it shares the unit.
        mesh: the data-parallel mesh (1-D FSDP or 2-D HSDP); default: all ranks, 1-D.
        reshard_after_forward: True: free after forward (gather again in backward);
            False: keep until after backward; None (default, as FSDP2): True except for
            the root, which keeps its parameters for the backward that follows at once.
        shard_placement_fn: ``fn(param) -> Shard(d) | None`` (as FSDP2): shard that
            parameter along tensor dim ``d`` instead of 0 (``torch.chunk`` along ``d``; the
            flat buffers hold it with ``d`` first, the unsharded parameter is a view of
            the gathered buffer). torch modules and MindSpore Cells.
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
            manages (fully_shard bottom-up: submodules first) or shares with another unit;
            a 0-d parameter; an int ``reshard_after_forward`` of the wrong kind.
        NotImplementedError: an int ``reshard_after_forward`` (resharding to a smaller
            mesh), or ``dp_mesh_dims``.
        TypeError: ``module`` is neither a ``torch.nn.Module`` nor a ``mindspore.nn.Cell``
            (or a list mixes frameworks).
    """
    modules = tuple(module) if isinstance(module, (list, tuple)) else (module,)
    if not modules:
        raise ValueError("fully_shard([]): pass a module or a non-empty list of modules")
    fw = framework_for(modules[0])
    for m in modules:
        if framework_for(m) is not fw:
            raise TypeError(
                f"fully_shard([...]): the modules of one unit must be of one framework, got "
                f"{type(modules[0]).__name__} and {type(m).__name__}"
            )
        if state_of(m) is not None or "_hs_fsdp_unit" in getattr(m, "__dict__", {}):
            raise ValueError(
                f"fully_shard was already applied to this {type(m).__name__}; apply it once "
                f"per module (each call makes one unit)"
            )
    if len(set(map(id, modules))) != len(modules):
        raise ValueError("fully_shard([...]): a module is listed twice")
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
    if mesh is None:
        mesh = _default_mesh(modules[0], fw)
    info = MeshInfo(mesh)
    ignored = set(map(id, ignored_params or ()))
    params: list[tuple[tuple[str, Any], list[tuple[Any, str]]]] = []
    seen: dict[int, list[tuple[Any, str]]] = {}
    for m in modules:  # a unit of several modules: their parameters, each once
        for entry in _managed_params(m, fw, ignored):
            sites = seen.get(id(entry[0][1]))
            if sites is None:
                seen[id(entry[0][1])] = entry[1]
                params.append(entry)
            else:  # a weight tied between two of the unit's modules: every site shares it
                sites.extend(s for s in entry[1] if s not in sites)
    if fw.own_units:  # MindSpore: functional autograd, a unit is a differentiable gather
        device = getattr(mesh.platform, "device", "CPU")
        if isinstance(offload_policy, CPUOffloadPolicy) and device != "CPU":
            # on CPU every shard, gradient and optimizer state already is in host memory
            raise NotImplementedError(
                f"fully_shard on a {fw.name} module on {device}: CPUOffloadPolicy is "
                f"torch-only for now (the unit would need host/device copies around its "
                f"all-gather and reduction); keep offload_policy=None"
            )
        dims = [_shard_dim(shard_placement_fn, p, fqn) for (fqn, p), _ in params]
        unit = fw.shard_unit(modules, info, params, mp_policy, dims)
        for m in modules:
            m.__dict__[_FORWARD_HOOKS] = (unit.pre_forward, unit.post_forward)
            m.__class__ = fw.fsdp_class(type(m))
        return module
    plat = mesh.platform
    offload = isinstance(offload_policy, CPUOffloadPolicy)
    pin = bool(getattr(offload_policy, "pin_memory", False))
    fparams = []
    for (fqn, p), sites in params:
        dim = _shard_dim(shard_placement_fn, p, fqn)
        fp = FSDPParam(p, sites, info, fw, plat, fqn, offload, pin, dim)
        fp.unit_module = modules[0]
        fp.sharded_param.__dict__[_SHARDED] = fp
        p.__dict__["_hs_fsdp_claimed"] = f"{type(sites[0][0]).__name__}.{fqn}"
        fparams.append(fp)
    group = None
    if fparams:
        group = FSDPParamGroup(fparams, modules, info, mp_policy, fw, plat, offload)
        group.reshard_after_forward = reshard_after_forward is not False
        group.async_prefetch = plat.name == "torch"
    state = FSDPState(modules, group, fw, mp_policy, reshard_after_forward is None)
    pre, post = (
        (state.pre_forward, state.post_forward)
        if len(modules) == 1
        else group_hooks(modules, state.pre_forward, state.post_forward)
    )
    for m in modules:
        fw.register_forward_hooks(m, pre, post)
        m.__dict__[_FORWARD_HOOKS] = (state.pre_forward, state.post_forward)
    if group is not None:
        _register_state_dict_hooks(fw, group)
    for m in modules:
        m.__class__ = fw.fsdp_class(type(m))
    return module


def _shard_dim(fn: Callable[[Any], Any] | None, param: Any, fqn: str) -> int:
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


def group_hooks(
    modules: tuple[Any, ...], pre_forward: Callable[..., Any], post_forward: Callable[..., Any]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Forward hooks of a unit of several modules (as FSDP2's grouped ``fully_shard``; both
    frameworks): the unit's ``pre_forward`` runs when the first of its modules starts (a
    module that already ran this cycle starts a new one), its ``post_forward`` when the
    last one ends."""
    ids = frozenset(id(m) for m in modules)
    pending: set[int] = set()

    def pre(m: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if id(m) not in pending:
            pending.clear()
            pending.update(ids)
            return pre_forward(m, args, kwargs)  # type: ignore[no-any-return]
        return args, kwargs

    def post(m: Any, args: Any, output: Any) -> Any:
        pending.discard(id(m))
        if pending:
            return output
        return post_forward(m, args, output)

    return pre, post


def register_fsdp_forward_method(module: Any, method_name: str) -> None:
    """Make ``module.<method_name>`` run FSDP's forward hooks around it, as ``forward``
    does (as FSDP2's): the unit's parameters are all-gathered before the method and
    resharded after it as ``reshard_after_forward`` says, so a ``generate`` or an
    ``encode`` computes with the whole parameters. A no-op for a module ``fully_shard``
    was not applied to.

    Raises:
        ValueError: the module has no attribute ``method_name``."""
    hooks = getattr(module, "__dict__", {}).get(_FORWARD_HOOKS)
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
    """FSDP2 shares its CUDA communication streams between several roots (pipeline
    stages). hyper_shard issues collectives on the process group from the calling
    thread, with no streams of its own, so there is nothing to share: the modules are
    checked and left as they are.

    Raises:
        ValueError: an element ``fully_shard`` was not applied to."""
    for m in modules:
        if state_of(m) is None and "_hs_fsdp_unit" not in getattr(m, "__dict__", {}):
            raise ValueError(
                f"share_comm_ctx: {type(m).__name__} is not a fully_shard module; pass "
                f"modules fully_shard was applied to"
            )


def _default_mesh(module: Any, fw: Any) -> DeviceMesh:
    from ..mesh import init_device_mesh

    dev = "cpu"
    for _, m in fw.named_modules(module):
        for _, p in fw.direct_params(m):
            t = p._spec.mesh.device_type if isinstance(p, DTensor) else fw.device_type(p)
            dev = "cpu" if t == "meta" else t
            break
        else:
            continue
        break
    from ..platform.select import get_platform

    plat = get_platform(None, device_type=dev)
    plat.ensure_initialized(dev)
    return init_device_mesh(dev, (plat.get_world_size(),))


def _managed_params(
    module: Any, fw: Any, ignored: set[int]
) -> list[tuple[tuple[str, Any], list[tuple[Any, str]]]]:
    """``((fqn, parameter), sites)`` of every parameter this call manages: in ``module``'s
    tree, not ignored, not a sharded parameter of an earlier call.

    Raises:
        ValueError: a parameter an earlier call claimed (its original object is still used
            here: a weight shared with another unit), or a sharded parameter of an earlier
            call on an ancestor (fully_shard must go bottom-up).
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
            owner = p.__dict__.get(_SHARDED)
            if owner is not None:
                if id(owner.unit_module) not in inside:
                    raise ValueError(
                        f"fully_shard: parameter {fqn!r} already belongs to the unit of an "
                        f"enclosing module; apply fully_shard bottom-up (blocks first, the "
                        f"root last)"
                    )
                continue
            claimed = p.__dict__.get("_hs_fsdp_claimed")
            if claimed is not None:
                raise ValueError(
                    f"fully_shard: parameter {type(module).__name__ + '.' + fqn!r} is the same "
                    f"tensor as {claimed!r}, which "
                    f"another fully_shard unit already manages (a tied weight shared between "
                    f"two units); put every module using it in one unit (fully_shard their "
                    f"common parent only), or untie the weights"
                )
            if id(p) not in found:
                found[id(p)] = (fqn, p)
                sites[id(p)] = []
            sites[id(p)].append((m, pname))
    return [(found[k], sites[k]) for k in found]


def _register_state_dict_hooks(fw: Any, group: FSDPParamGroup) -> None:
    """``state_dict()`` reshards first (it returns the sharded DTensors); before a module
    loads its entries, a full tensor (every rank holds the whole value) is cut to this
    rank's shard and a DTensor of another layout redistributed, so ``load_state_dict``
    takes sharded or full state dicts."""
    by_module: dict[int, tuple[Any, list[tuple[str, FSDPParam]]]] = {}
    for fp in group.params:
        for m, name in fp.sites:
            by_module.setdefault(id(m), (m, []))[1].append((name, fp))

    def pre_save() -> None:
        group.discard_pending_unshard()
        group.reshard()

    for m, entries in by_module.values():

        def pre_load(sd: dict, prefix: str, entries: list = entries) -> None:
            pre_save()
            for name, fp in entries:
                key = prefix + name
                if key in sd:
                    sd[key] = _to_sharded_value(fp, sd[key], key)

        fw.register_state_dict_hooks(m, pre_save, pre_load)


def _to_sharded_value(fp: Any, value: Any, key: str) -> Any:
    """A state-dict value as a DTensor with ``fp``'s sharded layout (``fp``: an
    :class:`FSDPParam` or a sharded DTensor parameter, anything with a ``spec`` or a
    ``_spec``).

    Raises:
        ValueError: a plain tensor or DTensor whose global shape is not the parameter's.
    """
    spec = fp.spec if isinstance(fp, FSDPParam) else fp._spec
    plat = spec.mesh.platform
    if isinstance(value, DTensor):
        vs = value._spec
        if vs.shape != spec.shape:
            raise ValueError(
                f"load_state_dict: {key!r} has global shape {tuple(vs.shape)}, the parameter "
                f"{tuple(spec.shape)}"
            )
        if vs.mesh == spec.mesh and vs.placements == spec.placements:
            return value  # copy_ casts a dtype difference and matches shard orders
        if vs.mesh != spec.mesh:
            value = value.full_tensor()
        else:
            dst = DTensorSpec(spec.mesh, spec.placements, vs.tensor_meta, spec.shard_order)
            local = redistribute_local(plat, plat.local_of(value), vs, dst)
            return plat.wrap(local, dst)
    if not plat.is_tensor(value):
        return value
    shape = tuple(plat.shape(value))
    if shape != tuple(spec.shape):
        raise ValueError(
            f"load_state_dict: {key!r} is a plain tensor of shape {shape}; a full state dict "
            f"entry must have the parameter's global shape {tuple(spec.shape)} (or load a "
            f"sharded state dict of DTensors)"
        )
    return _shard_of_full(plat, value, spec)


def _shard_of_full(plat: Any, full: Any, spec: DTensorSpec) -> Any:
    """This rank's box of a full tensor under ``spec`` (no communication)."""
    shape, offset = spec.local_shape_and_offset()
    t = plat.detach(full)
    for d, (o, ln) in enumerate(zip(offset, shape)):
        if ln != plat.shape(t)[d]:
            t = plat.narrow(t, d, o, ln)
    meta = plat.tensor_meta(t, spec.shape)._replace(stride=spec.stride)
    return plat.wrap(
        plat.contiguous(t), DTensorSpec(spec.mesh, spec.placements, meta, spec.shard_order)
    )
