"""Plain (non-DTensor) tensors next to DTensors: the policy, and the conversion.

Plain tensors of rank >= 1 mixed with DTensors are refused, as in PyTorch DTensor, except
inside :func:`hyper_shard.experimental.implicit_replication` and in the tensor lists of
foreach ops (whose elements are independent): there a plain tensor becomes a ``Replicate``
DTensor alias (same storage, autograd kept) on the mesh of the call's first DTensor. A 0-d
plain tensor outside a list is a scalar. Framework-neutral: the platform wraps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..placement import Replicate
from ..spec import DTensorSpec

if TYPE_CHECKING:
    from ..platform.base import Platform

__all__ = ["replicate_plain", "replicate_where", "describe", "find_dtensors"]


def replicate_plain(
    plat: Platform,
    is_dt: Callable[[Any], bool],
    args: tuple,
    kwargs: dict,
    lists_only: bool = False,
) -> tuple[tuple, dict]:
    """Every plain tensor of rank >= 1 next to a DTensor, and every plain tensor inside a
    list or tuple (0-d too), as a ``Replicate`` DTensor on that DTensor's mesh. The plain
    tensor must hold the same values on every rank (it is the global tensor), as in PyTorch
    DTensor's ``implicit_replication``; ``out=`` tensors are left alone. ``lists_only``:
    only the list elements (the default for foreach ops)."""
    plain = plat.is_tensor

    def wanted(a: Any, nested: bool) -> bool:
        return plain(a) and (nested or (not lists_only and len(plat.shape(a)) > 0))

    return replicate_where(plat, is_dt, args, kwargs, wanted)


def replicate_where(
    plat: Platform,
    is_dt: Callable[[Any], bool],
    args: tuple,
    kwargs: dict,
    wanted: Callable[[Any, bool], bool],
    on_wrap: Callable[[Any], None] | None = None,
) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every argument ``a`` for which ``wanted(a, nested)`` holds
    (top level, or ``nested`` in a list/tuple; never ``out=``) replaced by a ``Replicate``
    DTensor alias on the mesh of the first DTensor argument (``on_wrap(a)`` called first).
    Unchanged when nothing is wanted or there is no DTensor."""
    mesh = None
    found = False

    def scan(a: Any, nested: bool = False) -> None:
        nonlocal mesh, found
        if is_dt(a):
            if mesh is None:
                mesh = a._spec.mesh
        elif type(a) in (list, tuple):
            for x in a:
                scan(x, True)
        elif wanted(a, nested):
            found = True

    for a in args:
        scan(a)
    for k, v in kwargs.items():
        if k != "out":
            scan(v)
    if mesh is None or not found:
        return args, kwargs
    reps = [Replicate()] * mesh.ndim

    def conv(a: Any, nested: bool = False) -> Any:
        if is_dt(a):
            return a
        if type(a) in (list, tuple):
            return type(a)(conv(x, True) for x in a)
        if wanted(a, nested):
            if on_wrap is not None:
                on_wrap(a)
            return plat.wrap(a, DTensorSpec(mesh, reps, plat.tensor_meta(a)))
        return a

    return tuple(conv(a) for a in args), {
        k: (v if k == "out" else conv(v)) for k, v in kwargs.items()
    }


def describe(dts: list, limit: int = 4) -> str:
    """The inputs' layouts for an error message (the first ``limit``, then a count)."""
    from .op import fmt_placements

    shown = ", ".join(fmt_placements(d._spec) for d in dts[:limit])
    return shown + (f", ... ({len(dts) - limit} more DTensors)" if len(dts) > limit else "")


def find_dtensors(args: tuple, kwargs: dict, is_dt: Callable[[Any], bool]) -> list:
    """The DTensors among the arguments (one level of lists/tuples)."""
    out = []
    for a in list(args) + list(kwargs.values()):
        if is_dt(a):
            out.append(a)
        elif type(a) in (list, tuple):
            out.extend(x for x in a if is_dt(x))
    return out
