"""``torch.equal(input, other)`` / ``Tensor.equal`` on DTensors (``rule: equal``): a python
bool, ``True`` when both have the same global shape and the same values, as torch.

Layout: ``other`` is redistributed to ``input``'s placements (``Partial`` reduced first:
two different partial splits of one value are equal), each rank compares its shards, and
the ranks' answers are AND-ed over the mesh (one small object gather per mesh dim, on the
mesh's own groups). Different global shapes give ``False`` with no communication. A rank
outside the mesh answers ``True`` and takes part in nothing (PyTorch makes every rank of
the world join a world-wide reduction instead, so its sub-mesh ranks must call ``equal``
too).
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from ..placement import Partial, Placement
from . import register_rule
from ._util import R

__all__ = ["AllcloseOp", "EqualOp"]


class _Constant:
    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        return self.value


class _AllEqual:
    """The local ``equal``, AND-ed over every mesh dim."""

    __slots__ = ("func", "plat", "mesh")

    def __init__(self, func: Any, plat: Any, mesh: Any) -> None:
        self.func, self.plat, self.mesh = func, plat, mesh

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        ok = bool(self.func(*args, **kwargs))
        mesh = self.mesh
        for m in range(mesh.ndim):
            if mesh.shape[m] > 1:
                ok = all(self.plat.all_gather_object(ok, mesh._group(m), mesh.shape[m]))
        return ok


@register_rule("equal")
class EqualOp(DistributedOp):
    """``equal`` (see the module docstring).

    Raises:
        ShardingError: ``other`` is not a DTensor (a plain tensor next to a DTensor).
    """

    signature = ("input", "other")

    def infer_layout(self, call: OpCall) -> Layout:
        if len(call.specs) != 2:
            raise ShardingError(
                f"{call.describe()}: both tensors must be DTensors on one mesh; distribute the "
                f"plain one first (e.g. distribute_tensor(t, mesh, [Replicate()]))"
            )
        a, b = call.specs
        if a.shape != b.shape:
            return Layout([None, None], [None], [None], impl=_Constant(False))
        tgt: tuple[Placement, ...] = tuple(R if type(p) is Partial else p for p in a.placements)
        layout = Layout([tgt, tgt], [None], [None])
        mesh = call.mesh
        if mesh.get_coordinate() is not None and not mesh.is_abstract:
            layout.impl = _AllEqual(call.func, call.platform, mesh)
        return layout


@register_rule("allclose")
class AllcloseOp(EqualOp):
    """``torch.allclose(input, other, rtol, atol, equal_nan)``: a python bool, as torch.

    Same shapes: ``other`` moves to ``input``'s placements and the local answers are AND-ed
    over the mesh, as :class:`EqualOp`. Different (broadcast) shapes: both are gathered and
    every rank compares the whole tensors (the same answer everywhere).
    """

    signature = ("input", "other", "rtol", "atol", "equal_nan")  # type: ignore[assignment]

    def infer_layout(self, call: OpCall) -> Layout:
        if len(call.specs) == 2 and call.specs[0].shape != call.specs[1].shape:
            whole = (R,) * call.mesh.ndim
            return Layout([whole, whole], [None], [None])
        return super().infer_layout(call)
