"""Module-boundary conversions used by the parallel styles (framework-neutral).

``from_local_even`` wraps a plain local tensor as a DTensor the way PyTorch's
``DTensor.from_local(..., run_check=False)`` without ``shape`` does: every ``Shard(d)``
mesh dim is assumed to split tensor dim ``d`` evenly, so the global size is the local size
times the mesh dim's size and no collective is needed. The specs are cached per (mesh,
placements, local shape, dtype), so a module hook pays one dict lookup, not a spec build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dtensor import COMPILED_API, DTensor, _from_local_backward, redistribute_local
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate, Shard, normalize_placements
from ..spec import DTensorSpec

__all__ = ["from_local_even", "redistribute", "to_local", "full_tensor", "normalize_layout"]

_CACHE_MAX = 4096
_SPECS: dict[tuple, DTensorSpec] = {}
_TARGETS: dict[tuple, DTensorSpec] = {}
#: specs whose placements are all Shard (their conversions need no backward node)
_ALL_SHARD: set[DTensorSpec] = set()
#: the last wrap of each rank that has a backward node (one entry with one rank per process;
#: ranks that are threads of one process each keep their own, so each reuses exactly as a
#: process would and the ranks' backward collectives stay the same): rank -> (local,
#: version, grad enabled, mesh, placements, DTensor, token); cleared by a wrap without a
#: backward node and by the entry's own backward
_LAST: dict[int, tuple | None] = {}


def normalize_layout(
    placements: Placement | Sequence[Placement], mesh: DeviceMesh, ndim: int
) -> tuple[Placement, ...]:
    """One placement (or a sequence of them) as a normalised tuple for ``mesh``."""
    pl = (placements,) if isinstance(placements, Placement) else tuple(placements)
    return normalize_placements(pl, mesh.ndim, ndim)


def from_local_even(
    local: Any,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    key: tuple | None = None,
    dim_size: tuple[int, int] | None = None,
) -> Any:
    """``DTensor.from_local(local, mesh, placements)`` assuming even shards (no collective).

    Consecutive calls on the same tensor (the input shared by q/k/v or gate/up projections)
    return the same DTensor, so the backward reduces the summed gradient once instead of
    once per consumer. A tensor changed in place in between (its version counter moved) is
    wrapped anew.

    Args:
        local: this rank's plain tensor.
        mesh: the DeviceMesh.
        placements: one per mesh dim (negative shard dims allowed).
        key: ``(local shape, dtype)`` if the caller has it (saves a metadata query).
        dim_size: ``(dim, global size)`` when the caller knows a sharded dim's true global
            size (a Linear's ``in_features``): uneven shards in ``torch.chunk`` layout are
            then read right instead of as ``local size x mesh size``.

    Raises:
        ValueError: with ``dim_size``, a local size that is not this rank's ``torch.chunk``
            shard of it.

    Returns:
        A DTensor autograd-connected to ``local``; in backward the local tensor receives the
        gradient as PyTorch's ``from_local`` gives it (``Replicate``: the whole gradient, an
        all-reduce of the per-rank contributions; ``Shard``: its shard).
    """
    if COMPILED_API and COMPILED_API[0]():  # a compiled region: one traced from_local
        return _from_local_traced(local, mesh, placements, dim_size)
    plat = mesh.platform
    grad = plat.requires_grad(local)
    placements = tuple(placements)
    try:  # platforms with a version counter reuse (inference tensors have none)
        version = getattr(local, "_version", None)
    except RuntimeError:
        version = None
    last = _LAST.get(mesh._rank) if dim_size is None and grad else None
    if (
        last is not None
        and last[0] is local
        and version is not None
        and last[1] == version
        and last[2] == grad
        and last[3] == mesh
        and last[4] == placements
    ):
        return last[5]
    if key is None:
        meta = plat.tensor_meta(local)
        key = (meta.shape, meta.dtype)
    ck = (mesh, placements, key, dim_size)
    spec = _SPECS.get(ck)
    if spec is None:
        local_shape = key[0]
        pl = normalize_placements(placements, mesh.ndim, len(local_shape))
        shape = list(local_shape)
        for m, p in enumerate(pl):
            if type(p) is Shard:
                shape[p.dim] *= mesh.shape[m]
        if dim_size is not None:
            shape[dim_size[0] % len(shape)] = dim_size[1]
        spec = DTensorSpec(mesh, pl, plat.tensor_meta(local, tuple(shape)))
        if dim_size is not None and tuple(spec.local_shape()) != tuple(local_shape):
            raise ValueError(
                f"a local tensor of shape {tuple(local_shape)} is not this rank's "
                f"torch.chunk shard of a global size {dim_size[1]} on dim {dim_size[0]} "
                f"(expected {tuple(spec.local_shape())} with placements {list(pl)})"
            )
        if len(_SPECS) > _CACHE_MAX:
            _SPECS.clear()
        _SPECS[ck] = spec
    rank = mesh._rank
    if not grad or spec in _ALL_SHARD or _all_shard(spec):
        # Shard-only: the gradient's local form is the local gradient itself, so the alias
        # (which keeps the autograd graph) is the whole conversion; no backward node, and
        # nothing a reuse would save
        if dim_size is None:
            _LAST[rank] = None
        return plat.wrap(local, spec)
    token = object()  # names this call's cache entry (the closure must not hold the DTensor)

    def bwd(g: Any) -> Any:
        # the forward that could reuse this wrap is over: the cache lets go of it, so the
        # last module's input (the LM head's) is freed by its consumer's backward, not
        # held until the next step's first wrap
        last = _LAST.get(rank)
        if last is not None and last[6] is token:
            _LAST[rank] = None
        return _from_local_backward(plat, g, spec, None)

    out = plat.wrap(plat.custom_autograd(lambda x: x, bwd, local), spec)
    if dim_size is None:
        _LAST[rank] = (
            (local, version, grad, mesh, placements, out, token) if version is not None else None
        )
    return out


def _from_local_traced(
    local: Any, mesh: DeviceMesh, placements: Sequence[Placement], dim_size: Any
) -> Any:
    """:func:`from_local_even` inside a compiled region: ``DTensor.from_local`` with the
    even global shape (no cache, no collective)."""
    shape = list(local.shape)
    pl = normalize_placements(tuple(placements), mesh.ndim, len(shape))
    for m, p in enumerate(pl):
        if type(p) is Shard:
            shape[p.dim] *= mesh.shape[m]
    if dim_size is not None:
        shape[dim_size[0] % len(shape)] = dim_size[1]
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * max(shape[i + 1], 1)
    return DTensor.from_local(local, mesh, pl, shape=tuple(shape), stride=tuple(stride))


def redistribute(dt: Any, placements: Sequence[Placement]) -> Any:
    """``dt.redistribute(dt.device_mesh, placements)`` with the target spec cached."""
    if COMPILED_API and COMPILED_API[0]():
        return DTensor.redistribute(dt, dt._spec.mesh, placements)
    spec = dt._spec
    ck = (spec, tuple(placements))
    dst = _TARGETS.get(ck)
    if dst is None:
        dst = spec.with_placements(placements)
        if len(_TARGETS) > _CACHE_MAX:
            _TARGETS.clear()
        _TARGETS[ck] = dst
    if dst.placements == spec.placements:
        return dt
    plat = spec.mesh.platform
    return plat.wrap(redistribute_local(plat, plat.local_of(dt), spec, dst), dst)


def to_local(dt: Any) -> Any:
    """``dt.to_local()`` (the gradient arriving at the local tensor is read with the
    DTensor's placements, ``Partial`` as ``Replicate``, as PyTorch). For Shard-only
    placements that reading is the identity: the local alias is returned as is."""
    if COMPILED_API and COMPILED_API[0]():
        return DTensor.to_local(dt)
    spec = dt._spec
    if spec in _ALL_SHARD or _all_shard(spec):
        return spec.mesh.platform.local_of(dt)
    return DTensor.to_local(dt)


def _all_shard(spec: DTensorSpec) -> bool:
    if all(type(p) is Shard for p in spec.placements):
        if len(_ALL_SHARD) > _CACHE_MAX:
            _ALL_SHARD.clear()
        _ALL_SHARD.add(spec)
        return True
    return False


def full_tensor(dt: Any) -> Any:
    """``redistribute`` to ``Replicate`` and ``to_local`` in one differentiable step (as
    ``dt.full_tensor()``): forward gathers/reduces; backward reads the incoming gradient as
    one value computed identically by every rank (the plain, replicated code after a
    module boundary) and converts it to ``dt``'s gradient form without communication —
    Megatron's "g" for a ``Partial`` output (all-reduce forward, identity backward), a
    local chunk for a ``Shard`` one. Redistributing then calling ``to_local`` would turn the
    replicated gradient into per-rank contributions and all-reduce them again."""
    return DTensor.full_tensor(dt)


def replicate(mesh: DeviceMesh) -> tuple[Placement, ...]:
    return (Replicate(),) * mesh.ndim
