"""One-element DTensors from another mesh over the same ranks (pytorch/pytorch#180346).

``clip_grad_norm_`` over parameters on several meshes (an FSDP mesh and a TP/EP mesh, or
two meshes over the same ranks with different dim names) computes one norm per parameter
and stacks them, then multiplies every gradient by the clip coefficient: both mix
one-element DTensors of different meshes. A one-element DTensor on a mesh that spans
exactly the ranks of the call's first DTensor's mesh has one global value that every one
of those ranks can hold: it is reduced to ``Replicate`` on its own mesh (a collective over
the same ranks, which all run this call) and taken as a ``Replicate`` DTensor on the
call's mesh (no further communication; differentiable). Larger DTensors on other meshes
still raise, naming the meshes: moving them is a choice of layout the user makes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..placement import Replicate

__all__ = ["foreign_mesh", "adopt_scalars", "split_foreach"]


def foreign_mesh(dts: list) -> bool:
    """Whether some DTensor of ``dts`` lives on another mesh than the first."""
    if len(dts) < 2:
        return False
    mesh = dts[0]._spec.mesh
    return any(d._spec.mesh is not mesh and d._spec.mesh != mesh for d in dts[1:])


def _adoptable(dt: Any, mesh: Any) -> bool:
    other = dt._spec.mesh
    return (
        math.prod(dt._spec.shape) == 1
        and other.device_type == mesh.device_type
        and sorted(other.ranks) == sorted(mesh.ranks)
    )


def adopt_scalars(
    dts: list, args: tuple, kwargs: dict, is_dt: Callable[[Any], bool]
) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every one-element DTensor on another mesh than ``dts[0]``'s
    that spans the same ranks replaced by a ``Replicate`` DTensor of the same value on
    ``dts[0]``'s mesh (top level, or in a list/tuple). Others are left as they are."""
    from ..dtensor import DTensor

    mesh = dts[0]._spec.mesh

    def conv(a: Any) -> Any:
        if is_dt(a):
            m = a._spec.mesh
            if m is mesh or m == mesh or not _adoptable(a, mesh):
                return a
            rep = a.redistribute(m, [Replicate()] * m.ndim)
            spec = a._spec
            return DTensor.from_local(
                rep.to_local(),
                mesh,
                [Replicate()] * mesh.ndim,
                shape=spec.shape,
                stride=spec.tensor_meta.stride,
            )
        if type(a) in (list, tuple):
            return type(a)(conv(x) for x in a)
        return a

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def split_foreach(
    dispatch: Callable[[Any, tuple, dict], Any],
    func: Any,
    args: tuple,
    kwargs: dict,
    is_dt: Callable[[Any], bool],
) -> tuple[bool, Any]:
    """A foreach op whose tensor lists hold DTensors of several meshes (``_foreach_norm``
    over the gradients of an FSDP mesh and a TP mesh): each element is its own op, so the
    call runs once per mesh on that mesh's elements (positional lists of the elements' count,
    scalar lists too; plain elements go with the first mesh) and the per-element results are put back in order. Returns
    ``(False, None)`` when the lists hold one mesh (nothing to split)."""
    lists = [k for k, a in enumerate(args) if type(a) in (list, tuple) and any(is_dt(x) for x in a)]
    if not lists:
        return False, None
    n = len(args[lists[0]])
    # every per-element list is split: the tensor lists and the scalar lists (Adam's steps)
    lists = [k for k, a in enumerate(args) if type(a) in (list, tuple) and len(a) == n]
    groups: dict[Any, list[int]] = {}
    for i in range(n):
        mesh = None
        for k in lists:
            x: Any = args[k][i]
            if is_dt(x):
                mesh = x._spec.mesh
                break
        groups.setdefault(mesh, []).append(i)
    if len([m for m in groups if m is not None]) < 2:
        return False, None
    if None in groups:  # elements with no DTensor run with the first mesh's
        plain = groups.pop(None)
        first = next(iter(groups))
        groups[first] = sorted(groups[first] + plain)
    results: list[Any] = [None] * n
    any_out = False
    for idx in groups.values():
        sub = tuple(type(a)(a[i] for i in idx) if k in lists else a for k, a in enumerate(args))
        out = dispatch(func, sub, kwargs)
        if out is not None:
            any_out = True
            for j, i in enumerate(idx):
                results[i] = out[j]
    return True, (results if any_out else None)
