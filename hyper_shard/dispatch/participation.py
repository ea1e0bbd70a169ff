"""Ops on DTensors of a mesh this rank is not part of (a mesh over a subset of the world).

As in PyTorch DTensor, such a rank takes part in nothing: no input is redistributed, no
collective runs, and every tensor output is an empty local shard (``torch.tensor([])``'s
shape ``(0,)``; a 0-d zero for a 0-d output) with the output's global spec. Non-tensor
outputs come from the op run on the rank's (empty) local tensors, so ``x.equal(y)`` is
``True`` there, as PyTorch's default; an in-place op returns its target untouched.

The layout is the rule's own (global shapes and placements stay what every rank of the
mesh computes); only what runs locally changes. Framework-neutral: tensors are made through
the platform.
"""

from __future__ import annotations

from typing import Any

from .op import Layout, OpCall

__all__ = ["outside_mesh_layout"]


def outside_mesh_layout(call: OpCall, layout: Layout) -> Layout:
    """``layout`` for a rank outside ``call.mesh``: nothing moves, the local call is
    :class:`_EmptyOutputs` (or the op itself when it returns no tensor)."""
    moved = Layout(
        [None] * len(call.specs),
        list(layout.outputs),
        list(layout.shapes),
        cost=0.0,
        out_dtypes=layout.out_dtypes,
    )
    if call.inplace:
        moved.impl = _nothing
        return moved
    if all(o is None for o in layout.outputs):
        return moved  # a plain result (a query, equal): the local op on the empty shards
    dtypes = list(layout.out_dtypes or [])
    first = call.specs[0].dtype if call.specs else None
    moved.impl = _EmptyOutputs(
        call.platform,
        call.mesh.device_type,
        [
            None if o is None else (len(s or ()), dtypes[i] if i < len(dtypes) else first)
            for i, (o, s) in enumerate(zip(layout.outputs, layout.shapes))
        ],
    )
    return moved


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _EmptyOutputs:
    """The local result of an op on a rank outside the mesh: one empty tensor per tensor
    output (a 0-d zero for a 0-d one), of the output's dtype (the first input's dtype when
    the rule does not declare it)."""

    __slots__ = ("plat", "device", "outs")

    def __init__(self, plat: Any, device: str, outs: list[tuple[int, Any] | None]) -> None:
        self.plat, self.device, self.outs = plat, device, outs

    def _one(self, ndim: int, dtype: Any) -> Any:
        if ndim == 0:
            return self.plat.new_tensor("zeros", (), 0, dtype, self.device)
        return self.plat.new_tensor("empty", (0,), None, dtype, self.device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        made = [None if o is None else self._one(*o) for o in self.outs]
        return made[0] if len(made) == 1 else tuple(made)
