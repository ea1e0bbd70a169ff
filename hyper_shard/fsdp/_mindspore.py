"""``fully_shard`` on MindSpore ``nn.Cell`` (PyNative): the framework adapter.

MindSpore's autograd is functional (``ms.value_and_grad`` / ``ms.grad`` trace one call and
differentiate it with respect to ``weights=``): there are no gradient hooks on tensors, no
end-of-backward callback and no ``.grad`` fields, so the torch core's hook-driven state
machine (:mod:`._group`, :mod:`._state`) does not fit. A unit here is instead one
differentiable collective pair (:class:`~._ms_unit.MSUnit`): between steps every managed
parameter is a ``mindspore.Parameter(DTensor)`` holding this rank's dim-0 chunk (what
``trainable_params()`` returns and the optimizer steps); before forward one all-gather
node rebuilds the unsharded parameters, and its backward is the gradient reduction, so
the gradient MindSpore returns for a sharded parameter is this rank's shard of the mean
gradient. ``hyper_shard.platform.mindspore.autograd.value_and_grad`` wraps it as a DTensor
with the FSDP gradient layout (``Shard(0)`` on the shard dim, ``Replicate()`` on the HSDP
replicate dim, the local-derivative form of tensor-parallel placements), read from the
parameter's ``_hs_grad_spec``.

The parameter bookkeeping (which parameters a call manages, bottom-up checks) is the
neutral core's (:mod:`.api`), the sharded layout too (:func:`~._mesh.sharded_spec`, shared
with torch: FSDP over tensor parallelism uses the same shard order); everything numeric
goes through the mesh's Platform.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from mindspore import Parameter, Tensor, mint, nn, ops
from mindspore._c_expression import NoFallbackGuard

from ..dtensor import DTensor
from ..spec import chunk_sizes
from ._adapter import FSDPFramework
from ._mesh import MeshInfo, grad_placements, sharded_spec
from ._module import FSDPModule
from ._ms_unit import MSParam, MSUnit

__all__ = ["MindSporeFSDP", "MSUnit"]

#: the attribute of a sharded Parameter holding its gradient's spec (read by
#: hyper_shard.platform.mindspore.autograd.grad_dtensor)
GRAD_SPEC = "_hs_grad_spec"

_local_shape = Tensor.shape.fget
_CLASSES: dict[type, type] = {}


class MindSporeFSDP(FSDPFramework):
    """:class:`~hyper_shard.fsdp._adapter.FSDPFramework` for ``mindspore.nn.Cell``: the
    module system; a unit is built by :meth:`shard_unit` (see the module docstring)."""

    name = "mindspore"
    own_units = True

    def owns(self, module: Any) -> bool:
        return isinstance(module, nn.Cell)

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.cells_and_names())

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in module._params.items() if v is not None]

    def requires_grad(self, param: Any) -> bool:
        return bool(param.requires_grad)

    def device_type(self, t: Any) -> str:
        return "cpu"

    def fsdp_class(self, cls: type) -> type:
        out = _CLASSES.get(cls)
        if out is None:
            out = _CLASSES[cls] = type(f"FSDP{cls.__name__}", (MSFSDPCell, cls), {})
        return out

    def no_grad(self) -> AbstractContextManager[Any]:
        from ..platform.mindspore import MindSporePlatform

        return MindSporePlatform().no_grad()  # type: ignore[no-any-return]

    def shard_unit(
        self, module: Any, info: MeshInfo, params: list, mp: Any = None, dims: Any = None
    ) -> MSUnit:
        """Shard ``params`` (``((fqn, Parameter), sites)`` from the core) of ``module`` (a
        Cell, or a tuple of Cells making one unit) and hook its forward.

        Raises:
            ValueError: a 0-d parameter; parameters of several dtypes in one unit (one flat
                buffer has one dtype); a DTensor parameter whose mesh does not compose with
                the data-parallel mesh.
        """
        from ._policy import MixedPrecisionPolicy

        mp = mp if mp is not None else MixedPrecisionPolicy()
        modules = tuple(module) if isinstance(module, (list, tuple)) else (module,)
        module = modules[0]
        plat = info.mesh.platform
        sharded: list[MSParam] = []
        dtypes: dict[Any, str] = {}
        for (fqn, p), _ in params:  # every check before anything changes
            if not _local_shape(p):
                raise ValueError(
                    f"fully_shard: parameter {fqn!r} is 0-d; a scalar cannot be sharded along "
                    f"dim 0 (pass it in ignored_params)"
                )
            dtypes.setdefault(p.dtype, fqn)
            if len(dtypes) > 1:
                raise ValueError(
                    f"fully_shard on a MindSpore Cell: parameters of several dtypes in one unit "
                    f"({', '.join(f'{v!r}: {k}' for k, v in dtypes.items())}); one flat "
                    f"all-gather buffer has one dtype: cast the Cell first (e.g. "
                    f"cell.to_float) or fully_shard the submodules separately"
                )
        dims = list(dims) if dims is not None else [0] * len(params)
        for ((fqn, p), _), d in zip(params, dims):
            nd = len(_local_shape(p))
            if not -nd <= d < nd:
                raise ValueError(
                    f"fully_shard: shard_placement_fn gave Shard({d}) for parameter {fqn!r} of "
                    f"{nd} dims; return Shard(d) with 0 <= d < {nd}"
                )
        dims = [d % len(_local_shape(p)) for ((_, p), _), d in zip(params, dims)]
        # may raise: nothing swapped yet
        shards = [_shard(plat, info, p, d) for ((_, p), _), d in zip(params, dims)]
        for ((fqn, p), sites), (local, spec, tp_dims), d in zip(params, shards, dims):
            sp = Parameter(plat.wrap(local, spec), name=p.name, requires_grad=bool(p.requires_grad))
            sp.__dict__[GRAD_SPEC] = spec.with_placements(grad_placements(spec, tp_dims))
            for m, name in sites:
                m._params[name] = sp
            sp.__dict__["_hs_fsdp_param"] = _Owner(module)
            p.__dict__["_hs_fsdp_claimed"] = f"{type(sites[0][0]).__name__}.{fqn}"
            ospec = p._spec if isinstance(p, DTensor) else None
            lshape = tuple(_local_shape(p))
            sharded.append(MSParam(sp, sites, lshape, ospec, d))
        unit = MSUnit(module, info, sharded, mp)
        _register_state_dict_hooks(sharded, unit)
        if sharded or mp.param_dtype is not None or mp.output_dtype is not None:
            from .api import group_hooks

            pre, post = (
                (unit.pre_forward, unit.post_forward)
                if len(modules) == 1
                else group_hooks(modules, unit.pre_forward, unit.post_forward)
            )
            for m in modules:
                m.register_forward_pre_hook(pre, with_kwargs=True)
                m.register_forward_hook(post)
        for m in modules:
            m.__dict__["_hs_fsdp_unit"] = unit
        return unit


def _register_state_dict_hooks(params: list[MSParam], unit: MSUnit) -> None:
    """``Cell.state_dict()`` returns the sharded DTensor Parameters (the unit is resharded
    first). ``Cell.load_state_dict`` takes sharded DTensors (another layout on the same
    mesh is redistributed) or full plain tensors (every rank holds the whole value; each
    keeps its box): a pre-hook copies each entry into this rank's shard itself (MindSpore's
    own copy would ``asnumpy()`` a DTensor, i.e. assign the full tensor to the shard) and
    takes it out of the dict; a post-hook drops those keys from ``missing_keys``."""
    from .api import _to_sharded_value

    by_cell: dict[int, tuple[Any, list[tuple[str, MSParam]]]] = {}
    for p in params:
        for m, name in p.sites:
            by_cell.setdefault(id(m), (m, []))[1].append((name, p))
    for cell, entries in by_cell.values():
        loaded: list[str] = []

        def pre_save(*_a: Any) -> None:
            unit.reshard()

        def pre_load(_cell: Any, sd: dict, prefix: str, *_a: Any, entries: list = entries,
                     loaded: list = loaded) -> None:  # fmt: skip
            unit.reshard()
            for name, p in entries:
                key = prefix + name
                if key in sd:
                    value = _to_sharded_value(p.param, sd.pop(key), key)
                    if value._spec.shard_order != p.param._spec.shard_order:
                        value = _to_sharded_value(p.param, value.full_tensor(), key)
                    with NoFallbackGuard():
                        local = Tensor._make_subclass(Tensor, value)
                        if local.dtype != p.param.dtype:
                            local = local.astype(p.param.dtype)
                        Tensor.assign_value(p.param, ops.deepcopy(local))
                    loaded.append(key)

        def post_load(_cell: Any, incompatible: Any, loaded: list = loaded) -> None:
            for key in loaded:
                while key in incompatible.missing_keys:
                    incompatible.missing_keys.remove(key)
            loaded.clear()

        cell.register_state_dict_pre_hook(pre_save)
        cell.register_load_state_dict_pre_hook(pre_load)
        cell.register_load_state_dict_post_hook(post_load)


class _Owner:
    """What the core's ``_managed_params`` reads from a sharded parameter: its unit."""

    __slots__ = ("unit_module",)

    def __init__(self, module: Any) -> None:
        self.unit_module = module


def _shard(plat: Any, info: MeshInfo, p: Any, dim: int = 0) -> tuple[Tensor, Any, tuple[int, ...]]:
    """This rank's chunk along ``dim`` (``torch.chunk`` sizes over the shard mesh dim) of
    ``p``'s local data as an owned tensor, the sharded spec and its tensor-parallel mesh
    dims."""
    ospec = p._spec if isinstance(p, DTensor) else None
    with NoFallbackGuard():
        local = Tensor._make_subclass(Tensor, p)
        shape = tuple(_local_shape(local))
        rows = chunk_sizes(shape[dim], info.shard_size)
        c = info.shard_coord
        chunk = mint.narrow(local, dim, sum(rows[:c]), rows[c]).contiguous()
        chunk = ops.deepcopy(chunk)
    meta = plat.tensor_meta(local, shape if ospec is None else ospec.shape)
    spec, _, tp_dims = sharded_spec(info, ospec, meta, dim)
    assert spec.local_shape_and_offset()[0] == tuple(_local_shape(chunk)), (spec, rows)
    return chunk, spec, tp_dims


class MSFSDPCell(FSDPModule):
    """The MindSpore ``FSDP<Cell>`` base: ``unshard()`` (the Cells show their unsharded
    parameters until ``reshard()``), ``reshard()``, ``set_requires_gradient_sync`` and
    ``set_requires_all_reduce``. The resharding, last-backward and prefetch setters of
    :class:`FSDPModule` raise ``NotImplementedError`` (each says why: they choose between
    behaviours the functional design does not have)."""

    def reshard(self) -> None:
        _unit(self).reshard()

    def unshard(self, async_op: bool = False) -> None:  # type: ignore[override]
        """Gather the unit's parameters now (synchronously: ``async_op`` is accepted for
        FSDP2 compatibility); the Cells compute with them until :meth:`reshard`."""
        _unit(self).show_unsharded()

    def set_requires_gradient_sync(
        self, requires_gradient_sync: bool, *, recurse: bool = True
    ) -> None:
        """As FSDP2's: ``False`` makes the following backwards accumulate the unit's
        unsharded gradient locally (no communication; the gradients returned for its
        parameters are zeros) until a backward with sync on, which reduces the sum of
        everything accumulated and its own gradient at once. Summing the gradients
        ``value_and_grad`` returns over the micro-batches, or taking the last one's, gives
        the reduced sum of all micro-batches' gradients either way. ``recurse``: every
        FSDP unit inside this Cell too."""
        for _, cell in self.cells_and_names() if recurse else [("", self)]:  # type: ignore[attr-defined]
            unit = cell.__dict__.get("_hs_fsdp_unit")
            if unit is not None:
                unit.requires_gradient_sync = bool(requires_gradient_sync)

    def _unsupported(self, name: str, why: str) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.{name}: not supported on MindSpore Cells; {why}"
        )

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """As FSDP2's (HSDP): ``False`` makes the following backwards reduce over the shard
        dim only and keep the reduced shard (the gradients returned are zeros); the next
        backward with it on adds them and all-reduces once over the replicate dim. No
        effect on a 1-D mesh. ``recurse``: every FSDP unit inside this Cell too."""
        for _, cell in self.cells_and_names() if recurse else [("", self)]:  # type: ignore[attr-defined]
            unit = cell.__dict__.get("_hs_fsdp_unit")
            if unit is not None:
                unit.requires_all_reduce = bool(requires_all_reduce)

    def set_gradient_divide_factor(self, factor: float) -> None:
        """As :meth:`FSDPModule.set_gradient_divide_factor` (this unit only)."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise ValueError(
                f"set_gradient_divide_factor: expected a positive number, got {factor!r}"
            )
        _unit(self).divide_factor = float(factor)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """As :meth:`FSDPModule.set_force_sum_reduction_for_comms` (this unit only)."""
        unit = _unit(self)
        if enable and unit.divide_factor is None:
            unit.divide_factor = float(unit.info.dp_size)
        elif not enable and unit.divide_factor == float(unit.info.dp_size):
            unit.divide_factor = None

    def set_reduce_scatter_unused_params(self, *a: Any, **k: Any) -> None:
        """Accepted: a Cell unit's backward always reduces its whole flat buffer (an unused
        parameter's part is zeros), so ranks using different parameters already match."""

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        """Accepted: a Cell unit never all-gathers in backward (the forward's gathered
        parameters are held by the autograd tape)."""

    def set_reduce_scatter_max_input_buffers(self, *a: Any, **k: Any) -> None:
        """Accepted: each Cell unit's reduction completes inside its backward."""

    def set_all_reduce_hook(self, *a: Any, **k: Any) -> None:
        self._unsupported(
            "set_all_reduce_hook",
            "the reduction runs inside MindSpore's functional backward, where an in-place "
            "hook on its output would not reach the returned gradients",
        )

    def reset_iter_state(self) -> None:
        """Drop gradients accumulated without sync (and HSDP's held shards) in every unit
        inside this Cell, and show the sharded parameters (a failed step holds nothing
        else: each forward gathers afresh)."""
        for _, cell in self.cells_and_names():  # type: ignore[attr-defined]
            unit = cell.__dict__.get("_hs_fsdp_unit")
            if unit is not None:
                unit.acc = unit.acc_shard = None
                unit.reshard()

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


def _unit(cell: Any) -> MSUnit:
    return cell.__dict__["_hs_fsdp_unit"]  # type: ignore[no-any-return]
