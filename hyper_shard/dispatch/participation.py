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

from typing import TYPE_CHECKING, Any

from .op import Layout, OpCall

if TYPE_CHECKING:
    from ..platform.base import LocalOps

__all__ = ["outside_mesh_layout"]


def outside_mesh_layout(call: OpCall, layout: Layout) -> Layout:
    """``layout`` for a rank outside ``call.mesh``: nothing moves, the local call is
    :class:`_EmptyOutputs` (or the op itself when it returns no tensor)."""
    moved = Layout(
        [None] * len(call.specs),
        list(layout.outputs),
        list(layout.shapes),
        cost=0.0,
    )
    if call.inplace:
        moved.impl = _nothing
        return moved
    if all(o is None for o in layout.outputs):
        return moved  # a plain result (a query, equal): the local op on the empty shards
    first = call.specs[0].dtype if call.specs else None
    moved.impl = _EmptyOutputs(
        call.platform,
        call.mesh.device_type,
        call.func,
        first,
        [None if o is None else len(s or ()) for o, s in zip(layout.outputs, layout.shapes)],
    )
    return moved


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _EmptyOutputs:
    """The local result of an op on a rank outside the mesh: one empty tensor per tensor
    output (a 0-d zero for a 0-d one). Its dtype is the one the op gives on the rank's empty
    local tensors (``x > 0`` is bool); the first input's dtype when the op cannot run on
    empty tensors (a matmul's shapes no longer agree)."""

    __slots__ = ("plat", "device", "func", "first", "outs")

    def __init__(
        self, plat: LocalOps, device: str, func: Any, first: Any, outs: list[int | None]
    ) -> None:
        self.plat, self.device, self.func, self.first, self.outs = plat, device, func, first, outs

    def _dtypes(self, args: Any, kwargs: Any) -> list[Any]:
        try:
            res = self.func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - shapes of empty shards: any error means "unknown"
            return []
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        return [getattr(r, "dtype", None) for r in res]

    def _one(self, ndim: int, dtype: Any) -> Any:
        if ndim == 0:
            return self.plat.new_tensor("zeros", (), 0, dtype, self.device)
        return self.plat.new_tensor("empty", (0,), None, dtype, self.device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dtypes = self._dtypes(args, kwargs) if self.func is not None else []
        made = [
            None
            if n is None
            else self._one(n, (dtypes[i] if i < len(dtypes) else None) or self.first)
            for i, n in enumerate(self.outs)
        ]
        return made[0] if len(made) == 1 else tuple(made)
