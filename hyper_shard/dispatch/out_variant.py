"""``out=`` variants on DTensors: the result is written into ``out`` in ``out``'s layout.

As PyTorch DTensor (whose sharding propagation makes the op produce ``out``'s placements),
``torch.add(x, y, out=o)`` leaves ``o`` with its own placements and the op's values: the
op runs out of place with its own cheapest layout, the result is redistributed to ``o``'s
placements (no communication when they already match) and copied into ``o``'s local shard.
``out`` keeps its identity and is returned. Framework-neutral.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ShardingError
from .op import fmt_placements

if TYPE_CHECKING:
    from ..platform.base import Platform

__all__ = ["write_out"]


def write_out(
    plat: Platform,
    name: str,
    is_dt: Callable[[Any], bool],
    out: Any,
    result: Any,
) -> Any:
    """Write ``result`` (DTensor or tuple of them) into ``out`` (same structure); return
    ``out``. Everything is checked before anything is written.

    Raises:
        ShardingError: a different number of tensors, a plain ``out`` tensor, or an ``out``
            whose global shape or mesh differs from the result's (torch would resize a plain
            ``out``; a DTensor's global shape is fixed by its shards).
    """
    from ..dtensor import redistribute_local

    outs = out if isinstance(out, (tuple, list)) else (out,)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(outs) != len(results):
        raise ShardingError(f"{name}: out= has {len(outs)} tensors, the op returns {len(results)}")
    for o, r in zip(outs, results):
        if not is_dt(o):
            raise ShardingError(
                f"{name}: out= must be a DTensor when the inputs are DTensors, got "
                f"{type(o).__name__}; call without out= (or pass a DTensor)"
            )
        if not is_dt(r):
            raise ShardingError(f"{name}: the op returned {type(r).__name__}, not a DTensor")
        if o._spec.shape != r._spec.shape or o._spec.mesh != r._spec.mesh:
            raise ShardingError(
                f"{name}: out= is {fmt_placements(o._spec)} on {o._spec.mesh} but the result is "
                f"{fmt_placements(r._spec)} on {r._spec.mesh}; pass an out= of the result's "
                f"global shape on the same mesh, or call without out="
            )
    for o, r in zip(outs, results):
        spec = r._spec
        local = plat.local_of(r)
        if spec.placements != o._spec.placements and spec.mesh.get_coordinate() is not None:
            # out= is written, never differentiated: a plain (non-autograd) move suffices
            local = redistribute_local(plat, plat.detach(local), spec, o._spec)
        if spec.mesh.get_coordinate() is not None:
            plat.copy_into(o, local)
    return out
