"""Small rules an existing model's training loop needs: conversions, ``*_like`` factories
and metadata queries.

* ``rule: convert`` (``Tensor.to``): a dtype/device conversion of the first DTensor. Its
  output has the input's global shape and placements; a ``Partial`` input is reduced to
  ``Replicate`` first (rounding is not linear), as the ``cast`` entry does. Other DTensor
  arguments (``x.to(other)``) only lend their dtype/device: they are never redistributed.
* ``rule: like_factory`` (``torch.zeros_like``, ``ones_like``, ``empty_like``,
  ``full_like``): a new tensor of the input's global shape, sharded like the input; the
  fill value is a valid ``Replicate`` value, so a ``Partial`` input gives a ``Replicate``
  output (no communication: the input is never moved). ``uninitialized: true``
  (``empty_like``) keeps ``Partial`` too, as PyTorch DTensor: the memory is about to be
  overwritten (``module.to_empty`` keeps a Partial buffer Partial).
* ``rule: new_factory`` (``Tensor.new_zeros``, ``new_ones``, ``new_empty``, ``new_full``,
  ``new_empty_strided``): a tensor of the GLOBAL ``size`` given; as PyTorch DTensor, when
  ``size`` is the input's global shape the result is sharded like the input (Partial ->
  Replicate, kept Partial for the ``uninitialized`` ones), otherwise it is Replicate. The
  local call gets the local size (a rank-local override) and, for ``new_empty_strided``,
  the local strides in the order of the global ones. No communication.
* ``rule: metadata`` (``torch.is_complex``, ``torch.is_floating_point``): a query about
  dtype; the local answer is the global one. No layout, no communication, a plain result.

Semantics follow the torch functions named in ``op_specs/misc.yaml``.
"""

from __future__ import annotations

import operator
from typing import Any

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..placement import Partial, Placement, Replicate
from ..registry.models import RuleParams
from . import register_rule

__all__ = ["ConvertOp", "LikeFactoryOp", "MetadataOp", "NewFactoryOp"]

_R = Replicate()


def _reduced(placements: tuple[Placement, ...]) -> tuple[Placement, ...]:
    return tuple(_R if type(p) is Partial else p for p in placements)


@register_rule("convert")
class ConvertOp(DistributedOp):
    """``Tensor.to``-style conversion: output placed as the (Partial-reduced) input."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        target = _reduced(src.placements)
        inputs: list[tuple[Placement, ...] | None] = [target] + [None] * (len(call.specs) - 1)
        return Layout(inputs, [target], [src.shape])


class FactoryParams(RuleParams):
    """``uninitialized``: the factory leaves its memory unset (``empty_like``,
    ``new_empty``): a ``Partial`` input's placements are kept (as PyTorch DTensor)."""

    uninitialized: bool = False


@register_rule("like_factory")
class LikeFactoryOp(DistributedOp):
    """``zeros_like``-style factories: the input's shape and shards, Partial -> Replicate
    (kept for an uninitialized factory)."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = FactoryParams
    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        inputs: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        out = src.placements if self.params.uninitialized else _reduced(src.placements)
        return _leaf_if_requested(call, Layout(inputs, [out], [src.shape]))


@register_rule("new_factory")
class NewFactoryOp(DistributedOp):
    """``Tensor.new_zeros(size)``-style factories (see the module docstring).

    Raises:
        TypeError: a size that is not a sequence of ints.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = FactoryParams
    signature = ("input", "*size")
    static_args = ("size",)

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        strided = "stride" in self.static_names
        raw = call.static.get("size")
        if raw is None:
            raw = call.get("size")
        if isinstance(raw, (list, tuple)) and len(raw) == 1 and isinstance(raw[0], (list, tuple)):
            raw = raw[0]
        try:
            size = tuple(
                operator.index(n) for n in (raw if isinstance(raw, (list, tuple)) else [raw])
            )
        except TypeError:
            raise TypeError(
                f"{call.describe()}: size must be a sequence of ints, got {raw!r}"
            ) from None
        inputs: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        if size == tuple(src.shape):
            out = src.placements if self.params.uninitialized else _reduced(src.placements)
        else:
            out = (_R,) * len(src.placements)
        layout = Layout(inputs, [out], [size])
        coord = call.mesh.get_coordinate()
        if coord is not None and any(type(p) is not Replicate for p in out):
            from ..spec import DTensorSpec, TensorMeta

            meta = TensorMeta(size, src.stride, src.dtype, src.tensor_meta.itemsize)
            local = tuple(DTensorSpec(call.mesh, out, meta).local_shape())
            layout.overrides = {"size": local}
            if strided:
                layout.overrides["stride"] = _local_strides(local, call.static.get("stride"))
        return _leaf_if_requested(call, layout)


class _LeafFactory:
    """The local factory call of ``requires_grad=True``: the tensor is made without grad and
    returned as a DTensor leaf that requires it (the wrap keeps that leaf: an alias of a leaf
    would not be one), as ``torch.empty_like(x, requires_grad=True)`` is a leaf."""

    __slots__ = ("func", "plat", "spec")

    def __init__(self, func: Any, plat: Any, spec: Any) -> None:
        self.func, self.plat, self.spec = func, plat, spec

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.func(*args, **{**kwargs, "requires_grad": False})
        leaf = self.plat.make_leaf(out, self.spec, True)
        leaf.__dict__["_hs_fresh_leaf"] = True  # the platform's wrap keeps this very leaf
        return leaf


def _leaf_if_requested(call: OpCall, layout: Layout) -> Layout:
    """Install :class:`_LeafFactory` when the call passes ``requires_grad=True``."""
    if call.kwargs.get("requires_grad") and call.platform is not None:
        layout.impl = _LeafFactory(call.func, call.platform, call.specs[0])
    return layout


def _local_strides(local: tuple[int, ...], stride: object) -> tuple[int, ...]:
    """Dense strides of the local shape in the order the global ``stride`` lays dims out."""
    from ..spec import global_stride

    if not isinstance(stride, (tuple, list)) or len(stride) != len(local):
        raise TypeError(f"new_empty_strided: stride must be a sequence of {len(local)} ints")
    return global_stride(local, local, tuple(int(x) for x in stride))


@register_rule("metadata")
class MetadataOp(DistributedOp):
    """A dtype query: the local result is returned as is (not a tensor)."""

    keeps_shard_order = True  # nothing moves and no tensor comes out
    signature = ("input",)

    def infer_layout(self, call: OpCall) -> Layout:
        return Layout([None] * len(call.specs), [None], [None])
