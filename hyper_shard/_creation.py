"""What ``DTensor.from_local`` and ``distribute_tensor`` check and infer before wrapping
(framework-neutral): the argument contract PyTorch DTensor enforces, the global shape and
stride, the cross-rank metadata check of ``run_check=True``, and the empty local shard of a
rank outside the mesh.

Every check that needs other ranks' values is collective over the mesh's groups only and
makes every rank raise together (a rank that raised alone would leave the others blocked in
their next collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .mesh import DeviceMesh
from .placement import Placement, Replicate, Shard
from .spec import DTensorSpec, TensorMeta, chunk_sizes, contiguous_stride, global_stride

if TYPE_CHECKING:
    from .platform.base import Comm, LocalOps, Platform, Wrapping

__all__ = [
    "check_shape_stride_pair",
    "local_stride",
    "infer_global_shape",
    "infer_global_stride",
    "check_metadata_collectively",
    "broadcast_replicated",
    "empty_local",
]


def check_shape_stride_pair(plat: Wrapping, shape: Any, stride: Any) -> None:
    """``shape`` and ``stride`` go together, as PyTorch's ``DTensor.from_local`` requires
    (the global stride of a non-contiguous shard cannot be told from its shape alone).
    Platforms whose tensors carry no user-visible strides (MindSpore) accept ``shape``
    alone (``from_local_needs_stride`` is False there).

    Raises:
        RuntimeError: one of them given without the other (PyTorch's message).
    """
    if (shape is None) == (stride is None):
        return
    if shape is not None and not getattr(plat, "from_local_needs_stride", False):
        return
    raise RuntimeError(
        f"Found shape:{shape}, stride:{stride}. Please pass both shape and stride at the same "
        f"time (the global stride of a shard cannot be told from the global shape alone)"
    )


def local_stride(plat: LocalOps, t: Any) -> tuple[int, ...]:
    """``t``'s strides where the platform reports them, else row-major ones."""
    fn = getattr(plat, "stride", None)
    return tuple(fn(t)) if fn is not None else contiguous_stride(plat.shape(t))


def even_global_shape(
    mesh: DeviceMesh, placements: Sequence[Placement], local_shape: Sequence[int]
) -> tuple[int, ...]:
    """The global shape if every shard is the size of this one (PyTorch's reading of
    ``from_local`` without ``shape``; what a rank outside the mesh can compute alone)."""
    shape = list(local_shape)
    for m, p in enumerate(placements):
        if type(p) is Shard and p.dim < len(shape):
            shape[p.dim] *= mesh.shape[m]
    return tuple(shape)


def infer_global_shape(
    plat: Comm, mesh: DeviceMesh, placements: Sequence[Placement], local_shape: Sequence[int]
) -> tuple[int, ...]:
    """Global shape from every rank's local shape (one all-gather of sizes per sharding mesh
    dim), uneven ``torch.chunk`` shards included; every rank raises together on a layout
    that is not ``torch.chunk``'s.

    Raises:
        ValueError: local sizes that are not the ``torch.chunk`` layout of their sum, or
            local shapes that differ on a dim the mesh dim does not shard (the gather of
            the shapes that infers the size shows it).
    """
    shape = list(local_shape)
    bad = ""
    # walk mesh dims right to left: each gathers the extents of the pieces it split
    for m in range(mesh.ndim - 1, -1, -1):
        p = placements[m]
        if type(p) is not Shard:
            continue
        shapes = plat.all_gather_object(tuple(shape), mesh._group(m), mesh.shape[m])
        sizes = [s[p.dim] if len(s) > p.dim else 0 for s in shapes]
        total = sum(sizes)
        expect = chunk_sizes(total, mesh.shape[m])
        others = {tuple(x for i, x in enumerate(s) if i != p.dim) for s in shapes}
        if len(others) > 1 and not bad:  # the same gather: free to check
            bad = (
                f"DTensor.from_local: the local shapes {[list(s) for s in shapes]} on mesh dim "
                f"{m} ({p}) differ outside the sharded tensor dim {p.dim}, so they form no one "
                f"tensor; every rank must pass a shard of the same global tensor (same sizes "
                f"on every dim but the sharded one)"
            )
        if list(sizes) != expect and not bad:
            bad = (
                f"DTensor.from_local: local sizes {list(sizes)} along tensor dim {p.dim} on "
                f"mesh dim {m} are not the torch.chunk layout of {total} over {mesh.shape[m]} "
                f"ranks (expected {expect}); re-split the data with torch.chunk, or use "
                f"distribute_tensor on the full tensor"
            )
        shape[p.dim] = total
    if _any_rank(plat, mesh, bool(bad)):
        raise ValueError(
            bad or "DTensor.from_local: another rank's local sizes are not the torch.chunk layout"
        )
    return tuple(shape)


def infer_global_stride(
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    local_shape: Sequence[int],
    lstride: Sequence[int],
    shape: Sequence[int],
) -> tuple[int, ...]:
    """The global stride PyTorch's ``from_local`` reports: for even shards its rule (every
    stride at least the sharded dim's is scaled by the mesh dim's size); otherwise the global
    tensor laid out like the local shard (:func:`~hyper_shard.spec.global_stride`)."""
    if tuple(shape) == even_global_shape(mesh, placements, local_shape):
        st = list(lstride)
        for m, p in enumerate(placements):
            if type(p) is Shard:
                d, k = p.dim, mesh.shape[m]
                for i in range(len(st)):
                    if i != d and st[i] >= st[d]:
                        st[i] *= k
        return tuple(st)
    return global_stride(shape, local_shape, lstride)


def _layouts_differ(metas: Sequence[tuple]) -> bool:
    """Whether the ranks' local tensors ``(dtype, requires_grad, shape, stride)`` lay their
    dims out in different orders, over the dims of more than one element on every rank (a
    dim of size 0 or 1 may have any stride; uneven shards have different strides)."""
    shapes = [m[2] for m in metas]
    n = len(shapes[0])
    if any(len(s) != n for s in shapes):
        return True
    dims = [d for d in range(n) if all(s[d] > 1 for s in shapes)]
    orders = set()
    for m in metas:
        st = m[3]
        orders.add(tuple(sorted(dims, key=lambda d: (-st[d], d))))  # noqa: B023
    return len(orders) > 1


def _shapes_differ(metas: Sequence[tuple], placement: Placement) -> bool:
    """Whether the local shapes of one mesh dim's ranks differ on a tensor dim that mesh dim
    does not shard (a ``Replicate`` or ``Partial`` mesh dim: on any dim), as PyTorch's
    ``run_check`` refuses; the sharded dim may differ (uneven ``torch.chunk`` shards)."""
    shapes = [m[2] for m in metas]
    n = len(shapes[0])
    if any(len(s) != n for s in shapes):
        return True
    free = placement.dim % n if type(placement) is Shard and n else None
    return len({tuple(x for d, x in enumerate(s) if d != free) for s in shapes}) > 1


def _any_rank(plat: Comm, mesh: DeviceMesh, flag: bool) -> bool:
    """OR of ``flag`` over every rank of the mesh (one object gather per mesh dim)."""
    for m in range(mesh.ndim):
        flag = any(plat.all_gather_object(flag, mesh._group(m), mesh.shape[m]))
    return flag


def check_metadata_collectively(
    plat: Platform,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    local: Any,
    shape: tuple[int, ...] | None,
) -> None:
    """``from_local(run_check=True)``: every rank of the mesh holds a local tensor of the same
    dtype, ``requires_grad``, memory layout (stride order) and shape (but on a dim its mesh
    dim shards: uneven shards are fine), as PyTorch checks; with a
    global ``shape`` given, each local shape is also its ``torch.chunk`` shard. Every rank
    raises together.

    Raises:
        ValueError: some rank disagrees (the message says on what).
    """
    lshape = plat.shape(local)
    meta = (
        str(plat.tensor_meta(local).dtype),
        plat.requires_grad(local),
        tuple(lshape),
        local_stride(plat, local),
    )
    problems: list[str] = []
    for m in range(mesh.ndim):
        metas = plat.all_gather_object(meta, mesh._group(m), mesh.shape[m])
        for i, what in enumerate(("dtype", "requires_grad")):
            vals = sorted({str(x[i]) for x in metas})
            if len(vals) > 1 and what not in " ".join(problems):
                problems.append(f"{what} ({', '.join(vals)} on mesh dim {m})")
        if _layouts_differ(metas) and "stride" not in " ".join(problems):
            strides = ", ".join(str(x[3]) for x in metas)
            problems.append(f"stride (memory layout: {strides} on mesh dim {m})")
        if _shapes_differ(metas, placements[m]) and "shape" not in " ".join(problems):
            shapes = ", ".join(str(x[2]) for x in metas)
            problems.append(f"shape ({shapes} on mesh dim {m}, {placements[m]})")
    if shape is not None:
        spec = DTensorSpec(mesh, placements, TensorMeta(shape, contiguous_stride(shape), None))
        if tuple(lshape) != spec.local_shape():
            problems.append(
                f"local shape (this rank: {tuple(lshape)}, the torch.chunk shard of global "
                f"shape {shape} is {spec.local_shape()})"
            )
    if _any_rank(plat, mesh, bool(problems)):
        mine = "; ".join(problems) if problems else "this rank's agrees; another rank's does not"
        raise ValueError(
            f"DTensor.from_local(run_check=True): Inconsistent tensor metadata across ranks "
            f"with placements {[str(p) for p in placements]}: {mine}. Make every rank pass a "
            f"local tensor of the same dtype, requires_grad, shape and layout (e.g. .contiguous())"
        )


def has_replicate_to_broadcast(mesh: DeviceMesh, placements: Sequence[Placement]) -> bool:
    """Whether ``from_local(run_check=True)`` has replicas to make equal."""
    return any(type(p) is Replicate and mesh.shape[m] > 1 for m, p in enumerate(placements))


def broadcast_replicated(
    plat: Comm, mesh: DeviceMesh, placements: Sequence[Placement], local: Any
) -> Any:
    """The local tensor with every ``Replicate`` mesh dim's coordinate-0 values taken by all
    ranks of that dim (``from_local(run_check=True)`` as PyTorch: replicas are made equal)."""
    for m, p in enumerate(placements):
        if type(p) is Replicate and mesh.shape[m] > 1:
            local = plat.broadcast(local, 0, mesh._group(m))
    return local


def empty_local(plat: LocalOps, mesh: DeviceMesh, dtype: Any, ndim: int) -> Any:
    """The local shard of a rank outside the mesh, as PyTorch DTensor: an empty 1-D tensor
    (a 0-d zero for a 0-d DTensor) of ``dtype`` on the mesh's device."""
    if ndim == 0:
        return plat.new_tensor("zeros", (), 0, dtype, mesh.device_type)
    return plat.new_tensor("empty", (0,), None, dtype, mesh.device_type)
