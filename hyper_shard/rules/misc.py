"""Small rules an existing model's training loop needs: conversions, ``*_like`` factories
and metadata queries.

* ``rule: convert`` (``Tensor.to``): a dtype/device conversion of the first DTensor. Its
  output has the input's global shape and placements; a ``Partial`` input is reduced to
  ``Replicate`` first (rounding is not linear), as the ``cast`` entry does. Other DTensor
  arguments (``x.to(other)``) only lend their dtype/device: they are never redistributed.
* ``rule: like_factory`` (``torch.zeros_like``, ``ones_like``, ``empty_like``,
  ``full_like``): a new tensor of the input's global shape, sharded like the input; the
  fill value is a valid ``Replicate`` value, so a ``Partial`` input gives a ``Replicate``
  output (no communication: the input is never moved).
* ``rule: new_factory`` (``Tensor.new_zeros``, ``new_ones``, ``new_empty``, ``new_full``):
  a tensor of the GLOBAL ``size`` given; as PyTorch DTensor, when ``size`` is the input's
  global shape the result is sharded like the input (Partial -> Replicate), otherwise it is
  Replicate. The local call gets the local size (a rank-local override). No communication.
* ``rule: metadata`` (``torch.is_complex``, ``torch.is_floating_point``): a query about
  dtype; the local answer is the global one. No layout, no communication, a plain result.

Semantics follow the torch functions named in ``op_specs/misc.yaml``.
"""

from __future__ import annotations

import operator

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..placement import Partial, Placement, Replicate
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


@register_rule("like_factory")
class LikeFactoryOp(DistributedOp):
    """``zeros_like``-style factories: the input's shape and shards, Partial -> Replicate."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        inputs: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        return Layout(inputs, [_reduced(src.placements)], [src.shape])


@register_rule("new_factory")
class NewFactoryOp(DistributedOp):
    """``Tensor.new_zeros(size)``-style factories (see the module docstring).

    Raises:
        TypeError: a size that is not a sequence of ints.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    signature = ("input", "*size")
    static_args = ("size",)

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
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
            out = _reduced(src.placements)
        else:
            out = (_R,) * len(src.placements)
        layout = Layout(inputs, [out], [size])
        coord = call.mesh.get_coordinate()
        if coord is not None and any(type(p) is not Replicate for p in out):
            from ..spec import DTensorSpec, TensorMeta

            meta = TensorMeta(size, src.stride, src.dtype, src.tensor_meta.itemsize)
            layout.overrides = {"size": tuple(DTensorSpec(call.mesh, out, meta).local_shape())}
        return layout


@register_rule("metadata")
class MetadataOp(DistributedOp):
    """A dtype query: the local result is returned as is (not a tensor)."""

    keeps_shard_order = True  # nothing moves and no tensor comes out
    signature = ("input",)

    def infer_layout(self, call: OpCall) -> Layout:
        return Layout([None] * len(call.specs), [None], [None])
