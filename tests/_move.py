"""``redistribute`` for tests that cover every placement pair, Partial targets included.

A Partial target the source does not already have is internal-only in the public API (as
PyTorch DTensor: "redistributing to Partial is for internal use only"), so those plans run
through the executor directly: the same autograd-aware path ops and parallel styles use.
Framework-neutral (the mesh's platform wraps and unwraps).
"""

from __future__ import annotations

from typing import Any

from hyper_shard.placement import Partial


def move(x: Any, dst: Any) -> Any:
    """``x.redistribute(x's mesh, dst)``, or the executor's plan for a new Partial target."""
    from hyper_shard.dtensor import redistribute_local

    spec = x._spec
    dst = tuple(dst)
    if not any(type(p) is Partial and p != q for p, q in zip(dst, spec.placements)):
        return x.redistribute(spec.mesh, dst)
    plat = spec.mesh.platform
    tgt = spec.with_placements(dst)
    return plat.wrap(redistribute_local(plat, plat.local_of(x), spec, tgt), tgt)
