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
* ``rule: metadata`` (``torch.is_complex``, ``torch.is_floating_point``): a query about
  dtype; the local answer is the global one. No layout, no communication, a plain result.

Semantics follow the torch functions named in ``op_specs/misc.yaml``.
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..placement import Partial, Placement, Replicate
from . import register_rule

__all__ = ["ConvertOp", "LikeFactoryOp", "MetadataOp"]

_R = Replicate()


def _reduced(placements: tuple[Placement, ...]) -> tuple[Placement, ...]:
    return tuple(_R if type(p) is Partial else p for p in placements)


@register_rule("convert")
class ConvertOp(DistributedOp):
    """``Tensor.to``-style conversion: output placed as the (Partial-reduced) input."""

    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        target = _reduced(src.placements)
        inputs: list[tuple[Placement, ...] | None] = [target] + [None] * (len(call.specs) - 1)
        return Layout(inputs, [target], [src.shape])


@register_rule("like_factory")
class LikeFactoryOp(DistributedOp):
    """``zeros_like``-style factories: the input's shape and shards, Partial -> Replicate."""

    signature = ("input", "*args")

    def infer_layout(self, call: OpCall) -> Layout:
        src = call.specs[0]
        inputs: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        return Layout(inputs, [_reduced(src.placements)], [src.shape])


@register_rule("metadata")
class MetadataOp(DistributedOp):
    """A dtype query: the local result is returned as is (not a tensor)."""

    signature = ("input",)

    def infer_layout(self, call: OpCall) -> Layout:
        return Layout([None] * len(call.specs), [None], [None])
