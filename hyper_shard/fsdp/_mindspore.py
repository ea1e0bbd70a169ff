"""``fully_shard`` on MindSpore ``nn.Cell`` (PyNative): the framework adapter.

MindSpore's autograd is functional (``ms.value_and_grad`` / ``ms.grad`` trace one call and
differentiate it with respect to ``weights=``): there are no gradient hooks on tensors, no
end-of-backward callback and no ``.grad`` fields, so the torch core's hook-driven state
machine (:mod:`._group`, :mod:`._state`) does not fit. A unit here is instead one
differentiable collective pair:

* **between steps** every managed parameter is a ``mindspore.Parameter(DTensor)`` holding
  this rank's dim-0 chunk (``(Shard(0),)``, ``torch.chunk`` sizes, an owned buffer): what
  ``trainable_params()`` returns and the optimizer steps;
* **before forward** (a forward pre-hook) the unit's shards are packed into one flat
  chunk (the neutral :class:`~._layout.FlatLayout`: each slot padded to the largest
  shard) and all-gathered in one collective by a custom-backward node; each unsharded
  parameter is cut out of the gathered buffer (differentiable views) and set as the
  Cell's attribute, so ``construct`` computes with plain unsharded tensors;
* **backward** of that node is the reduce-scatter of the flat gradient (the mean over
  the data-parallel ranks; on CPU, where mccl has no reduce-scatter, an all-reduce and
  this rank's slice), so the gradient MindSpore returns for a sharded parameter is this
  rank's shard of the mean gradient: ``hyper_shard.platform.mindspore.autograd``'s
  ``value_and_grad`` wraps it as a ``Shard(0)`` DTensor whose ``full_tensor()`` is the
  single-device gradient of the mean loss;
* **after forward** (a forward hook) the attributes are dropped again (the Cell shows
  its sharded parameters). The gathered values stay alive until MindSpore's backward has
  used them (the autograd tape holds them): there is no re-gather in backward.

The parameter bookkeeping (which parameters a call manages, bottom-up checks) is the
neutral core's (:mod:`.api`); everything numeric goes through the mesh's Platform.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from mindspore import Parameter, Tensor, mint, nn, ops
from mindspore._c_expression import NoFallbackGuard

from ..dtensor import DTensor
from ..spec import DTensorSpec
from ._adapter import FSDPFramework
from ._layout import FlatLayout
from ._mesh import MeshInfo
from ._module import FSDPModule

__all__ = ["MindSporeFSDP", "MSUnit"]

_local_shape = Tensor.shape.fget
_CLASSES: dict[type, type] = {}


class MSUnit:
    """One ``fully_shard`` call on a Cell: its sharded parameters and their flat layout.

    Attributes:
        params: ``(sharded Parameter, [(cell, attribute name), ...])`` per managed
            parameter (a tied weight within the unit has several sites).
        layout: the unit's :class:`FlatLayout` over the shard ranks.
        gathers: all-gathers run so far (one per forward; tests count them).
    """

    def __init__(self, module: Any, info: MeshInfo, params: list[tuple[Any, list]]) -> None:
        self.module = module
        self.info = info
        self.plat = info.mesh.platform
        self.params = params
        self.layout = FlatLayout([tuple(p.shape) for p, _ in params], info.shard_size)
        self.gathers = 0
        self._set: list[tuple[Any, str]] = []

    # ------------------------------------------------------------------ collectives
    def _flat_shard(self) -> Tensor:
        """This rank's chunk of the flat buffer, built differentiably from the sharded
        Parameters (MindSpore's ``weights=`` gradient flows through ops on the Parameter
        itself, not through an alias of it)."""
        c = self.info.shard_coord
        pieces = []
        with NoFallbackGuard():
            for (p, _), slot in zip(self.params, self.layout.slots):
                flat = mint.reshape(p, (-1,))
                pad = slot.slot_numel - slot.shard_numel(c)
                if pad:
                    flat = mint.cat([flat, mint.zeros((pad,), dtype=flat.dtype)], 0)
                pieces.append(flat)
            return pieces[0] if len(pieces) == 1 else mint.cat(pieces, 0)

    def _gather(self, flat: Tensor) -> Tensor:
        plat, info = self.plat, self.info
        parts = plat.all_gather(flat, info.shard_group(), info.shard_size)
        with NoFallbackGuard():
            return mint.cat(parts, 0)

    def _reduce_scatter(self, g: Tensor) -> Tensor:
        """The mean over the shard ranks of the gathered buffer's gradient, this rank's
        chunk (native reduce-scatter where the device has one)."""
        plat, info = self.plat, self.info
        n, S, c = info.shard_size, self.layout.chunk_numel, info.shard_coord
        group = info.shard_group()
        with NoFallbackGuard():
            g = Tensor._make_subclass(Tensor, g).contiguous()
            if "reduce_scatter" in plat.native_collectives:
                pieces = [mint.narrow(g, 0, k * S, S) for k in range(n)]
                return plat.reduce_scatter(pieces, "avg", group)
            full = plat.all_reduce(g, "avg", group)
            return ops.deepcopy(mint.narrow(full, 0, c * S, S))

    def unshard(self) -> list[Tensor]:
        """Every managed parameter's unsharded value (plain tensors, differentiable with
        respect to the sharded Parameters): one all-gather."""
        layout, n, S = self.layout, self.layout.n, self.layout.chunk_numel
        flat = self._flat_shard()
        if n > 1:
            flat = self.plat.custom_autograd(self._gather, self._reduce_scatter, flat)
        self.gathers += 1
        out = []
        with NoFallbackGuard():
            for slot in layout.slots:
                rows = [
                    mint.narrow(flat, 0, k * S + slot.offset, slot.shard_numel(k))
                    for k in range(n)
                    if slot.rows[k]
                ]
                full = rows[0] if len(rows) == 1 else mint.cat(rows, 0)
                out.append(mint.reshape(full, slot.shape))
        return out

    # ------------------------------------------------------------------ hooks
    def pre_forward(self, _cell: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self.show_unsharded()
        return args, kwargs

    def show_unsharded(self) -> None:
        """Gather (one all-gather) and set every unsharded value as its Cell's attribute.

        Raises:
            RuntimeError: a managed parameter was replaced by something other than the
                sharded DTensor parameter (update parameters in place instead).
        """
        for p, _ in self.params:
            if not isinstance(p, DTensor):
                raise RuntimeError(
                    f"fully_shard: {p.name!r} is no longer the sharded DTensor parameter "
                    f"fully_shard made; update parameters in place (optimizer, "
                    f"assign_value) instead of replacing them"
                )
        self.reshard()
        values = self.unshard()
        for (_, sites), v in zip(self.params, values):
            for m, name in sites:
                object.__setattr__(m, name, v)  # found before Cell.__getattr__'s _params
                self._set.append((m, name))

    def post_forward(self, _cell: Any, args: Any, output: Any) -> Any:
        self.reshard()
        return output

    def reshard(self) -> None:
        """Drop the unsharded attributes: the Cell shows its sharded parameters again."""
        for m, name in self._set:
            m.__dict__.pop(name, None)
        self._set.clear()


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

    def shard_unit(self, module: Any, info: MeshInfo, params: list) -> MSUnit:
        """Shard ``params`` (``((fqn, Parameter), sites)`` from the core) of ``module`` and
        hook its forward.

        Raises:
            NotImplementedError: a 2-D (HSDP) mesh, or a parameter that already is a
                DTensor (FSDP over tensor parallelism) — not built on MindSpore yet.
        """
        if info.mesh.ndim != 1:
            raise NotImplementedError(
                "fully_shard on a MindSpore Cell: only a 1-D mesh (FSDP) is supported; HSDP "
                "('replicate', 'shard') meshes are torch-only for now"
            )
        plat = info.mesh.platform
        sharded = []
        for (fqn, p), sites in params:
            if isinstance(p, DTensor):
                raise NotImplementedError(
                    f"fully_shard on a MindSpore Cell: parameter {fqn!r} is already a DTensor "
                    f"(tensor parallel); FSDP over TP is torch-only for now"
                )
            if not _local_shape(p):
                raise ValueError(
                    f"fully_shard: parameter {fqn!r} is 0-d; a scalar cannot be sharded along "
                    f"dim 0 (pass it in ignored_params)"
                )
            sp = Parameter(_shard(plat, info, p), name=p.name, requires_grad=bool(p.requires_grad))
            for m, name in sites:
                m._params[name] = sp
            sp.__dict__["_hs_fsdp_param"] = _Owner(module)
            p.__dict__["_hs_fsdp_claimed"] = f"{type(module).__name__}.{fqn}"
            sharded.append((sp, sites))
        unit = MSUnit(module, info, sharded)
        if sharded:
            module.register_forward_pre_hook(unit.pre_forward, with_kwargs=True)
            module.register_forward_hook(unit.post_forward)
        module.__dict__["_hs_fsdp_unit"] = unit
        return unit


class _Owner:
    """What the core's ``_managed_params`` reads from a sharded parameter: its unit."""

    __slots__ = ("unit_module",)

    def __init__(self, module: Any) -> None:
        self.unit_module = module


def _shard(plat: Any, info: MeshInfo, p: Any) -> Any:
    """This rank's dim-0 chunk of ``p`` (``torch.chunk`` sizes) as an owned DTensor."""
    shape = tuple(_local_shape(p))
    meta = plat.tensor_meta(p, shape)
    spec = DTensorSpec(info.mesh, info.placements, meta)
    lshape, offset = spec.local_shape_and_offset()
    with NoFallbackGuard():
        local = Tensor._make_subclass(Tensor, p)
        local = mint.narrow(local, 0, offset[0], lshape[0]).contiguous()
        local = ops.deepcopy(local)
    return plat.wrap(local, DTensorSpec(info.mesh, info.placements, plat.tensor_meta(local, shape)))


class MSFSDPCell(FSDPModule):
    """The MindSpore ``FSDP<Cell>`` base: ``unshard()`` (the Cells show their unsharded
    parameters, plain tensors, until ``reshard()``) and ``reshard()``. The gradient-sync,
    resharding and prefetch setters of :class:`FSDPModule` are torch-only (they raise)."""

    def reshard(self) -> None:
        _unit(self).reshard()

    def unshard(self, async_op: bool = False) -> None:  # type: ignore[override]
        """Gather the unit's parameters now (synchronously: ``async_op`` is accepted for
        FSDP2 compatibility); the Cells compute with them until :meth:`reshard`."""
        _unit(self).show_unsharded()

    def _torch_only(self, name: str) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.{name}: not supported on MindSpore Cells (functional "
            f"autograd: every backward reduce-scatters, nothing is prefetched)"
        )

    def set_requires_gradient_sync(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_requires_gradient_sync")

    def set_requires_all_reduce(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_requires_all_reduce")

    def set_reshard_after_forward(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_reshard_after_forward")

    def set_reshard_after_backward(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_reshard_after_backward")

    def set_is_last_backward(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_is_last_backward")

    def set_modules_to_forward_prefetch(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(self, *a: Any, **k: Any) -> None:
        self._torch_only("set_modules_to_backward_prefetch")


def _unit(cell: Any) -> MSUnit:
    return cell.__dict__["_hs_fsdp_unit"]  # type: ignore[no-any-return]
