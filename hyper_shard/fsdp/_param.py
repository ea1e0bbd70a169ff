"""One FSDP parameter: its sharded DTensor, and the unsharded tensor the module computes
with (framework-neutral: tensors through the Platform, parameters through the
:class:`~hyper_shard.fsdp._adapter.FSDPAdapter`).

[Note: FSDP tensors]

* **original parameter**: what the module held when ``fully_shard`` ran — a plain tensor,
  or a DTensor on a tensor-parallel sub-mesh.
* **sharded parameter**: the framework's parameter over a DTensor holding this rank's
  chunk (``torch.chunk`` semantics along the shard dim, 0 unless ``shard_placement_fn``
  says otherwise) of the original's local data, on the data-parallel mesh (``Shard(d)``;
  HSDP ``(Replicate(), Shard(d))``) or, for a tensor-parallel original, on the mesh
  spanning both. Its own storage, contiguous, no padding: this is what the optimizer
  steps and ``state_dict()`` returns.
* **unsharded parameter**: what the module computes with between unshard and reshard: a
  plain tensor, or a DTensor with the original's spec. Hook-driven units (see
  [Note: FSDP adapters]) keep one autograd leaf over ``n * slot`` elements of the
  all-gather copy-out (the first ``numel`` are the value), created once and refilled in
  place at each unshard (its memory is released at reshard; the object and every
  reference to it stay valid). On-tape units make a new differentiable value per forward.
* **flat order**: the parameter with its shard dim first, as the flat buffers hold it
  (:meth:`FSDPParam.to_flat_order`).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from ..dtensor import DTensor
from ..placement import Placement
from ..spec import DTensorSpec, TensorMeta, chunk_sizes
from ._mesh import MeshInfo, grad_placements, sharded_spec

__all__ = ["FSDPParam"]


_UIDS = itertools.count()
#: id(original parameter) -> (a weak reference to it, its uid), while it is alive
_LIVE_UIDS: dict[int, tuple[weakref.ref, int]] = {}


def _uid_of(param: Any) -> int:
    """A number naming the original parameter ``param`` for good: the same for every unit
    that sees the same object (a tied weight), never reused, unlike ``id()`` once the
    original is freed (a tensor-parallel DTensor replaced by its FSDP shard) and a new
    object of another unit takes its address."""
    key = id(param)
    ent = _LIVE_UIDS.get(key)
    if ent is not None and ent[0]() is param:
        return ent[1]
    uid = next(_UIDS)

    def forget(ref: weakref.ref, key: int = key) -> None:
        if _LIVE_UIDS.get(key, (None, 0))[0] is ref:
            del _LIVE_UIDS[key]

    _LIVE_UIDS[key] = (weakref.ref(param, forget), uid)
    return uid


class FSDPParam:
    """One parameter of a unit (see the module note).

    Args:
        param: the original parameter.
        sites: every ``(module, attribute name)`` that holds it (tied weights: several).
        info: the unit's data-parallel mesh.
        fw: the framework adapter; plat: the Platform.
        fqn: its name in the unit (error messages).
        offload: keep the shard (and gradient) in host memory.
        pin: pin host memory.
        shard_dim: the tensor dim FSDP shards.

    Raises:
        ValueError: a 0-d parameter, a shard dim out of range, or a DTensor parameter on
            a mesh that does not compose with the data-parallel mesh.
    """

    def __init__(
        self,
        param: Any,
        sites: list[tuple[Any, str]],
        info: MeshInfo,
        fw: Any,
        plat: Any,
        fqn: str,
        offload: bool = False,
        pin: bool = False,
        shard_dim: int = 0,
    ) -> None:
        self.sites = sites
        self.unit_modules: tuple[Any, ...] = ()  # the modules of the fully_shard call
        self.fw, self.plat, self.info = fw, plat, info
        self.fqn = fqn
        self.offload, self.pin = offload, pin
        self.orig_uid = _uid_of(param)
        req = fw.requires_grad(param)
        if isinstance(param, DTensor):
            ospec: DTensorSpec | None = param._spec
            local = plat.detach(plat.local_of(param))
        else:
            ospec = None
            local = plat.detach(param)
        self.orig_spec = ospec
        shape = tuple(plat.shape(local))
        if not shape:
            raise ValueError(
                f"fully_shard: parameter {fqn!r} is 0-d; FSDP shards dim 0. Pass it in "
                f"ignored_params, or make it 1-D"
            )
        self.shape = shape  # the unsharded (local) shape
        if not -len(shape) <= shard_dim < len(shape):
            raise ValueError(
                f"fully_shard: shard_placement_fn gave Shard({shard_dim}) for parameter "
                f"{fqn!r} of {len(shape)} dims; return Shard(d) with 0 <= d < {len(shape)}"
            )
        d = self.shard_dim = shard_dim % len(shape)
        #: the shape the flat buffers hold: the sharded dim first (``shape`` when d = 0)
        self.flat_shape = (shape[d], *shape[:d], *shape[d + 1 :])
        n, c = info.shard_size, info.shard_coord
        rows = chunk_sizes(shape[d], n)
        meta = plat.tensor_meta(local)
        # a copy in its own storage: the original's memory is released with it
        shard = plat.contiguous(plat.clone(plat.narrow(local, d, sum(rows[:c]), rows[c])))
        if offload:
            shard = fw.to_host(shard, pin)
        self.orig_dtype = meta.dtype
        self.spec = self._sharded_spec(ospec, meta)
        self.grad_spec = self.spec.with_placements(self._grad_placements())
        self.sharded_param = fw.make_sharded_param(param, shard, self.spec, self.grad_spec, req)
        self.requires_grad = req
        self.param_dtype: Any = None
        self.reduce_dtype: Any = None
        self.unsharded: Any = None  # the unsharded parameter (hook-driven units)
        self.buffer: Any = None  # its rank-major flat storage
        self.acc_grad: Any = None  # gradient accumulated in reduce_dtype without sync

    # ------------------------------------------------------------------ layout
    def _sharded_spec(self, ospec: DTensorSpec | None, meta: TensorMeta) -> DTensorSpec:
        spec, self.dp_dims, self.tp_dims = sharded_spec(self.info, ospec, meta, self.shard_dim)
        return spec

    def _grad_placements(self) -> tuple[Placement, ...]:
        return grad_placements(self.spec, self.tp_dims)

    # ------------------------------------------------------------------ states
    def shard_local(self) -> Any:
        """This rank's shard as a plain local tensor (an alias of the sharded parameter;
        differentiable with respect to it where the framework's tape records it)."""
        return self.plat.local_of(self.sharded_param)

    def to_flat_order(self, t: Any) -> Any:
        """A tensor of the parameter's (or its shard's) shape with the sharded dim first,
        as the flat buffers hold it (a view; ``t`` itself when FSDP shards dim 0)."""
        d = self.shard_dim
        return t if d == 0 else self.plat.movedim(t, d, 0)

    def from_flat_order(self, t: Any) -> Any:
        """The inverse of :meth:`to_flat_order` (a view)."""
        d = self.shard_dim
        return t if d == 0 else self.plat.movedim(t, 0, d)

    def init_dtypes(self, param_dtype: Any, reduce_dtype: Any) -> None:
        """Mixed precision (as FSDP2): no cast when the dtype already matches or the
        parameter is not floating point; gradients are reduced in ``reduce_dtype`` where
        it differs from the compute dtype they are computed in (None: that dtype)."""
        orig = self.orig_dtype
        floating = _is_floating(orig)
        self.param_dtype = None if param_dtype in (None, orig) or not floating else param_dtype
        rd = None if reduce_dtype is None or not floating else reduce_dtype
        self.reduce_dtype = None if rd == self.compute_dtype else rd

    @property
    def compute_dtype(self) -> Any:
        return self.param_dtype if self.param_dtype is not None else self.orig_dtype

    def unsharded_value(self, flat_value: Any) -> Any:
        """The unsharded parameter from its flat-order value (a plain local tensor of
        ``flat_shape``): back to the parameter's dim order, wrapped as the original's
        DTensor for a tensor-parallel parameter (keeps autograd)."""
        plat = self.plat
        t = self.from_flat_order(flat_value)
        o = self.orig_spec
        if o is None:
            return t
        meta = plat.tensor_meta(t, o.shape)._replace(stride=o.stride)
        return plat.wrap(t, DTensorSpec(o.mesh, o.placements, meta, o.shard_order))

    def buffer_for(self, slot_numel: int, like: Any) -> Any:
        """The rank-major flat storage of the unsharded parameter (allocated again if it
        was freed), creating the unsharded parameter on first use (hook-driven units)."""
        plat = self.plat
        n = self.info.shard_size
        if self.buffer is None:
            self.buffer = plat.empty_flat(n * slot_numel, self.compute_dtype, like)
            view = plat.narrow(self.buffer, 0, 0, _numel(self.shape))
            view = self.from_flat_order(plat.reshape(view, self.flat_shape))
            if self.orig_spec is None:
                t = view
            else:
                o = self.orig_spec
                meta = plat.tensor_meta(view, o.shape)._replace(stride=o.stride)
                t = plat.make_leaf(view, DTensorSpec(o.mesh, o.placements, meta), False)
            self.unsharded = self.fw.new_param(t, self.requires_grad)
        else:
            plat.alloc_storage(self.buffer)
        return self.buffer

    def zero_grad(self) -> Any:
        """A zero unsharded gradient (a plain local tensor of the unsharded shape, in the
        compute dtype): what a rank that did not use the parameter reduces."""
        view = self.plat.narrow(self.buffer, 0, 0, _numel(self.shape))
        return self.from_flat_order(self.plat.zeros_like(self.plat.reshape(view, self.flat_shape)))

    def to_sharded(self) -> None:
        """Register the sharded parameter on every site and release the unsharded memory."""
        for m, name in self.sites:
            self.fw.register_sharded(m, name, self.sharded_param)
        if self.buffer is not None:
            self.plat.free_storage(self.buffer)

    def to_unsharded(self, value: Any = None) -> None:
        """Register the unsharded parameter on every site: ``value`` (on-tape units), or
        the filled persistent one."""
        if value is None:
            value = self.unsharded
            req = self.fw.requires_grad(self.sharded_param)
            if self.fw.requires_grad(value) != req:  # the user may have frozen it since
                value.requires_grad_(req)
        for m, name in self.sites:
            self.fw.register_unsharded(m, name, value)

    def reset_sharded_param(self) -> bool:
        """Adopt a sharded parameter some module operation put in our place
        (``to_empty``, ``load_state_dict(assign=True)``, ``.to(...)``), or the new dtype of
        ours (``module.to(torch.float64)`` swaps its data in place): it must be a DTensor
        with our layout; every site holds it afterwards.

        Returns:
            Whether the parameter's dtype changed (the unit's flat layouts are stale).

        Raises:
            ValueError: the module now holds something that is not our sharded layout.
        """
        m, name = self.sites[0]
        cur = dict(self.fw.direct_params(m)).get(name)
        if cur is None or cur is self.unsharded:
            return False
        if cur is self.sharded_param and cur._spec.tensor_meta.dtype == self.orig_dtype:
            return False
        if not isinstance(cur, DTensor) or cur._spec.shape != self.spec.shape:
            raise ValueError(
                f"fully_shard: parameter {self.fqn!r} was replaced by a {type(cur).__name__} "
                f"of shape {tuple(getattr(cur, 'shape', ()))}; it must stay a DTensor with "
                f"the sharded layout {list(self.spec.placements)} of global shape "
                f"{self.spec.shape} (load sharded state dicts, or copy into the parameter)"
            )
        if cur._spec.placements != self.spec.placements or cur._spec.mesh != self.spec.mesh:
            raise ValueError(
                f"fully_shard: parameter {self.fqn!r} was replaced by a DTensor with "
                f"placements {list(cur._spec.placements)}; FSDP needs "
                f"{list(self.spec.placements)} on {self.spec.mesh}"
            )
        self.sharded_param = cur
        self.spec = cur._spec
        self.grad_spec = self.spec.with_placements(self._grad_placements())
        for mm, nn in self.sites:
            self.fw.register_sharded(mm, nn, cur)
        new_dtype = cur._spec.tensor_meta.dtype != self.orig_dtype
        self.orig_dtype = cur._spec.tensor_meta.dtype
        if self.buffer is not None and (
            new_dtype
            or self.fw.device_type(self.buffer) != self.fw.device_type(self.plat.local_of(cur))
        ):
            self.buffer = None  # moved device or new dtype: re-created at the next unshard
            self.unsharded = None
        return new_dtype

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self.spec.placements)
        return f"FSDPParam({self.fqn}: {list(self.spec.shape)} [{pl}])"


def _is_floating(dtype: Any) -> bool:
    flag = getattr(dtype, "is_floating_point", None)
    if flag is not None:
        return bool(flag)
    return "float" in str(dtype).lower()  # a dtype object without the attribute


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
