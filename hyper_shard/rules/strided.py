"""``Tensor.as_strided(size, stride, storage_offset=None)`` / ``torch.as_strided`` on
DTensors (``rule: as_strided``); semantics as torch's on the GLOBAL tensor.

``as_strided`` reads raw storage, which only the whole tensor has:

* on a DTensor no mesh dim shards (``Replicate``/``Partial``), every rank's local tensor is
  the global one (a ``Partial`` value: a selection commutes with the reduction), so the
  call runs locally as is — any size, stride and offset torch accepts;
* on a sharded DTensor only the identity is defined: ``size`` the global shape, ``stride``
  its global stride (:meth:`DTensor.stride`), ``storage_offset`` None or the tensor's own
  — it returns an alias with the same placements, as PyTorch DTensor;
* anything else raises ``RuntimeError("as_strided not supported with DTensor ...")``, as
  PyTorch, saying to redistribute to ``Replicate()`` first.
"""

from __future__ import annotations

from typing import Any

from .._creation import local_stride
from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from ..placement import Shard
from ..spec import global_stride
from . import register_rule

__all__ = ["AsStridedOp"]


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
        if gstride != self.stride or (self.offset not in (None, x.storage_offset())):
            raise ShardingError(
                f"{self.describe}: as_strided not supported with DTensor except as the identity "
                f"(size {self.size}, stride {gstride}); redistribute to Replicate() first"
            )
        return self.func(x, tuple(lshape), tuple(lstride), x.storage_offset())


@register_rule("as_strided")
class AsStridedOp(DistributedOp):
    """``as_strided`` (see the module docstring).

    Raises:
        ShardingError: a non-identity ``as_strided`` of a sharded DTensor (a
            ``RuntimeError``, with PyTorch's message).
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
        if size != tuple(x.shape) or len(stride) != len(size):
            raise ShardingError(
                f"{call.describe()}: as_strided not supported with DTensor except as the "
                f"identity (size {list(x.shape)} and the tensor's stride); redistribute to "
                f"Replicate() first"
            )
        layout = Layout([None], [x.placements], [size])
        if call.mesh.get_coordinate() is not None:
            layout.impl = _Identity(call.func, call.platform, size, stride, offset, call.describe())
        return layout
