"""One FSDP parameter: its sharded DTensor, and the unsharded tensor the module computes
with (framework-neutral: tensors through the Platform, parameters through the
:class:`~hyper_shard.fsdp._adapter.FSDPFramework`).

* **original parameter**: what the module held when ``fully_shard`` ran — a plain tensor,
  or a DTensor on a tensor-parallel sub-mesh.
* **sharded parameter**: ``nn.Parameter(DTensor)`` holding this rank's dim-0 chunk
  (``torch.chunk`` semantics) of the original's local data, on the data-parallel mesh
  (``Shard(0)``; HSDP ``(Replicate(), Shard(0))``) or, for a tensor-parallel original, on
  the mesh spanning both. Its own storage, contiguous, no padding: this is what the
  optimizer steps and ``state_dict()`` returns.
* **unsharded parameter**: an autograd leaf over ``n * slot`` elements of the all-gather
  copy-out (the first ``numel`` are the value), created once and refilled in place at
  each unshard (its memory is released at reshard, the object and every reference to it
  stay valid): a plain tensor, or a DTensor with the original's spec.
"""

from __future__ import annotations

from typing import Any

from ..dtensor import DTensor
from ..placement import Placement
from ..spec import DTensorSpec, TensorMeta, chunk_sizes
from ._mesh import MeshInfo, grad_placements, sharded_spec

__all__ = ["FSDPParam"]


class FSDPParam:
    """One parameter of a unit (see the module docstring).

    Args:
        param: the original parameter.
        sites: every ``(module, attribute name)`` that holds it (tied weights: several).
        info: the unit's data-parallel mesh.
        fw: the framework adapter; plat: the Platform.
        offload: keep the shard (and gradient) in host memory.
        pin: pin host memory.

    Raises:
        ValueError: a 0-d parameter, or a DTensor parameter on a mesh that does not
            compose with the data-parallel mesh.
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
        self.unit_module: Any = None  # the module of the fully_shard call managing it
        self.fw, self.plat, self.info = fw, plat, info
        self.fqn = fqn
        self.offload, self.pin = offload, pin
        self.orig_uid = id(param)
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
        start = sum(rows[:c])
        meta = plat.tensor_meta(local)
        # a copy in its own storage: the original's memory is released with it
        shard_shape = (*shape[:d], rows[c], *shape[d + 1 :])
        shard = plat.empty_flat(_numel(shard_shape), meta.dtype, local)
        plat.copy_flat(shard, plat.narrow(local, d, start, rows[c]))
        shard = plat.reshape(shard, shard_shape)
        if offload:
            shard = fw.to_host(shard, pin)
        self.orig_dtype = meta.dtype
        self.spec = self._sharded_spec(ospec, meta)
        self.grad_spec = self.spec.with_placements(self._grad_placements())
        self.sharded_param = fw.new_param(plat.make_leaf(shard, self.spec, False), req)
        self.requires_grad = req
        self.param_dtype: Any = None
        self.reduce_dtype: Any = None
        self.unsharded: Any = None  # the unsharded parameter (created at the 1st unshard)
        self.buffer: Any = None  # its rank-major flat storage
        self.acc_grad: Any = None  # gradient accumulated in reduce_dtype without sync
        self.to_sharded()

    # ------------------------------------------------------------------ layout
    def _sharded_spec(self, ospec: DTensorSpec | None, meta: TensorMeta) -> DTensorSpec:
        spec, self.dp_dims, self.tp_dims = sharded_spec(self.info, ospec, meta, self.shard_dim)
        return spec

    def _grad_placements(self) -> tuple[Placement, ...]:
        return grad_placements(self.spec, self.tp_dims)

    # ------------------------------------------------------------------ states
    def shard_local(self) -> Any:
        """This rank's shard as a plain local tensor (an alias of the sharded parameter)."""
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
        parameter is not floating point; ``reduce_dtype`` defaults to ``param_dtype``."""
        orig = self.orig_dtype
        floating = getattr(orig, "is_floating_point", True)
        self.param_dtype = None if param_dtype in (None, orig) or not floating else param_dtype
        rd = reduce_dtype if reduce_dtype is not None else self.param_dtype
        self.reduce_dtype = None if rd in (None, orig) else rd

    @property
    def compute_dtype(self) -> Any:
        return self.param_dtype if self.param_dtype is not None else self.orig_dtype

    def buffer_for(self, slot_numel: int, like: Any) -> Any:
        """The rank-major flat storage of the unsharded parameter (allocated again if it
        was freed), creating the unsharded parameter on first use."""
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
            self.fw.set_param(m, name, self.sharded_param)
        if self.buffer is not None:
            self.plat.free_storage(self.buffer)

    def to_unsharded(self) -> None:
        """Register the (filled) unsharded parameter on every site."""
        up = self.unsharded
        req = self.fw.requires_grad(self.sharded_param)
        if self.fw.requires_grad(up) != req:  # the user may have frozen it since
            up.requires_grad_(req)
        for m, name in self.sites:
            self.fw.set_param(m, name, up)

    def reset_sharded_param(self) -> None:
        """Adopt a sharded parameter some module operation put in our place
        (``to_empty``, ``load_state_dict(assign=True)``, ``.to(...)``): it must be a DTensor
        with our layout; every site holds it afterwards.

        Raises:
            ValueError: the module now holds something that is not our sharded layout.
        """
        m, name = self.sites[0]
        cur = dict(self.fw.direct_params(m)).get(name)
        if cur is None or cur is self.sharded_param or cur is self.unsharded:
            return
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
            self.fw.set_param(mm, nn, cur)
        if self.buffer is not None and self.fw.device_type(self.buffer) != self.fw.device_type(
            self.plat.local_of(cur)
        ):
            self.buffer = None  # moved device: re-created at the next unshard
            self.unsharded = None

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self.spec.placements)
        return f"FSDPParam({self.fqn}: {list(self.spec.shape)} [{pl}])"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
