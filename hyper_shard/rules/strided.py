"""``Tensor.as_strided(size, stride, storage_offset=None)`` / ``torch.as_strided`` on
DTensors (``rule: as_strided``); semantics as torch's on the GLOBAL tensor.

``as_strided`` reads raw storage, which only the whole tensor has:

* on a DTensor no mesh dim shards (``Replicate``/``Partial``), every rank's local tensor is
  the global one (a ``Partial`` value: a selection commutes with the reduction), so the
  call runs locally as is — any size, stride and offset torch accepts;
* on a sharded DTensor the identity (``size`` the global shape, ``stride`` its global
  stride (:meth:`DTensor.stride`), ``storage_offset`` None or the tensor's own) is an alias
  with the same placements, as PyTorch DTensor;
* any other form on a sharded DTensor gathers it into a tensor laid out in memory as the
  global tensor is (its global stride, from the local shard's layout) and reads that:
  the single-device result, ``Replicate``. PyTorch DTensor raises ``RuntimeError("as_strided
  not supported with DTensor")`` there.
"""

from __future__ import annotations

from typing import Any

from .._creation import local_stride
from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from ..placement import Replicate, Shard
from ..redistribute.executor import redistribute_local
from ..spec import global_stride, view_stride
from . import register_rule

__all__ = ["AsStridedOp"]

R = Replicate()


class _Identity:
    """The local identity ``as_strided``: checked on the actual local layout each call (the
    cached decision does not see strides), then a view of the whole local shard."""

    __slots__ = ("func", "plat", "size", "stride", "offset", "describe")

    def __init__(self, func: Any, plat: Any, size: tuple, stride: tuple, offset: Any, d: str):
        self.func, self.plat, self.size, self.stride = func, plat, size, stride
        self.offset, self.describe = offset, d

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        plat = self.plat
        lshape, lstride = plat.shape(x), local_stride(plat, x)
        gstride = global_stride(self.size, lshape, lstride)
        if gstride != self.stride and view_stride(self.size, lshape, lstride) == self.stride:
            gstride = self.stride  # the stride DTensor.stride() reports for a view
        if gstride != self.stride or (self.offset not in (None, x.storage_offset())):
            raise ShardingError(
                f"{self.describe}: as_strided not supported with DTensor except as the identity "
                f"(size {self.size}, stride {gstride}); redistribute to Replicate() first"
            )
        return self.func(x, tuple(lshape), tuple(lstride), x.storage_offset())


class _GatheredAsStrided:
    """``as_strided`` of a sharded DTensor read on the whole tensor: the local shard is
    gathered (autograd-aware), laid out with the global stride its own layout implies, and
    the view taken there."""

    __slots__ = ("func", "plat", "spec", "size", "stride", "offset")

    def __init__(self, func: Any, plat: Any, spec: Any, size: tuple, stride: tuple, offset: Any):
        self.func, self.plat, self.spec = func, plat, spec
        self.size, self.stride, self.offset = size, stride, offset

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        plat, spec = self.plat, self.spec
        gst = global_stride(spec.shape, plat.shape(x), local_stride(plat, x))
        full = redistribute_local(plat, x, spec, spec.with_placements((R,) * spec.mesh.ndim))
        if tuple(local_stride(plat, full)) != gst:
            dense = full.new_empty_strided(tuple(spec.shape), gst)
            full = dense.copy_(full)
        return self.func(full, self.size, self.stride, self.offset)


@register_rule("as_strided")
class AsStridedOp(DistributedOp):
    """``as_strided`` (see the module docstring).

    Raises:
        ShardingError: (at run time) an identity decision met by a shard of another layout
            (PyTorch's message: redistribute to Replicate() first).
    """

    signature = ("input", "size", "stride", "storage_offset")
    static_args = ("size", "stride", "storage_offset")

    def infer_layout(self, call: OpCall) -> Layout:
        x = call.specs[0]
        size = tuple(int(s) for s in call.static.get("size") or ())
        stride = tuple(int(s) for s in call.static.get("stride") or ())
        offset = call.static.get("storage_offset")
        if not any(type(p) is Shard for p in x.placements):
            return Layout([None], [x.placements], [size])
        plat = call.platform
        local = plat.local_of(call.args[0]) if call.args else None
        ident = size == tuple(x.shape) and len(stride) == len(size)
        if ident and local is not None:
            lst = local_stride(plat, local)
            lsh = plat.shape(local)
            ident = stride in (global_stride(x.shape, lsh, lst), view_stride(x.shape, lsh, lst))
            ident = ident and offset in (
                None,
                getattr(local, "storage_offset", lambda: None)(),
            )
        if ident:
            layout = Layout([None], [x.placements], [size])
            if call.mesh.get_coordinate() is not None:
                layout.impl = _Identity(call.func, plat, size, stride, offset, call.describe())
            return layout
        rep = (R,) * call.mesh.ndim
        layout = Layout([None], [rep], [size])
        if call.mesh.get_coordinate() is not None:
            layout.impl = _GatheredAsStrided(call.func, plat, x, size, stride, offset)
        return layout
