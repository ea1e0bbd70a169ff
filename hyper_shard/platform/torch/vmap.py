"""``torch.vmap`` / ``torch.func.vmap`` over DTensors.

functorch's transforms act below ``__torch_function__``: a function vmapped over a
hyper_shard DTensor would see the local shard only. vmap maps a function over a batch
dim, each sample on its own, so it runs locally when every rank holds whole samples:

* a batched DTensor (``in_dim`` ``b``) keeps the mesh dims that shard ``b`` and is
  gathered on every other mesh dim (a sample sharded inside would be split between
  ranks; a ``Partial`` is reduced); all batched DTensors (and plain batched tensors, cut
  to this rank's piece) are sharded on ``b`` by the same mesh dims, so the ranks' batch
  pieces line up;
* an unbatched DTensor (``in_dim=None``) is made ``Replicate``;
* functorch then vmaps the function over the local tensors, and each tensor output is
  the DTensor sharded on its ``out_dim`` by those mesh dims (``Replicate`` when none):
  exactly the single-device result, laid out as the inputs' batch. Autograd runs through
  ``to_local``/``from_local``: a batched input's local gradient is its own samples', an
  unbatched input's is this rank's samples' contribution (``Partial`` over the batch mesh
  dims), so the gradients are the single-device ones.

Installed by wrapping ``torch._functorch.apis.vmap_impl`` (the function ``torch.vmap`` and
``torch.func.vmap`` call); calls without DTensor arguments go to it unchanged. On a torch
without that function nothing is installed and vmap over a sharded DTensor keeps raising
``NotImplementedError`` (``dtensor._refuse_vmap``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...dtensor import DTensor
from ...placement import Partial, Replicate, Shard
from ...spec import compute_local_shape_and_offset, contiguous_stride

__all__ = ["install"]


def _flat_dims(dims: Any, spec: Any) -> list | None:
    from torch.utils._pytree import _broadcast_to_and_flatten

    return _broadcast_to_and_flatten(dims, spec)


def _mesh_of(flat: list) -> Any:
    meshes = {id(a._spec.mesh): a._spec.mesh for a in flat if isinstance(a, DTensor)}
    if len(meshes) > 1:
        raise ValueError(
            "torch.vmap over DTensors on different meshes: redistribute them to one mesh first"
        )
    return next(iter(meshes.values()))


def _batch_mesh_dims(flat: list, dims: list) -> tuple[int, ...]:
    """The mesh dims that shard the batch dim: those of the first batched DTensor."""
    for a, d in zip(flat, dims):
        if isinstance(a, DTensor) and d is not None:
            d %= len(a._spec.shape)
            return tuple(m for m, p in enumerate(a._spec.placements) if p == Shard(d))
    return ()


def _local_arg(a: Any, d: int | None, mesh: Any, bdims: tuple[int, ...]) -> Any:
    """``a`` as this rank's local tensor for the local vmap (see the module docstring)."""
    if isinstance(a, DTensor):
        nd = len(a._spec.shape)
        want = [
            Shard(d % nd) if d is not None and m in bdims else Replicate() for m in range(mesh.ndim)
        ]
        if list(a._spec.placements) != want or a._spec.shard_order is not None:
            a = a.redistribute(mesh, want)
        # the local gradient is this rank's: its own samples' (Shard) for a batched input, its
        # samples' contribution (Partial) for an unbatched one; whole across other mesh dims
        grad = [
            (want[m] if d is not None else Partial()) if m in bdims else Replicate()
            for m in range(mesh.ndim)
        ]
        return a.to_local(grad_placements=grad)
    if isinstance(a, torch.Tensor) and d is not None and bdims:
        d %= a.dim()
        pl = [Shard(d) if m in bdims else Replicate() for m in range(mesh.ndim)]
        coord = mesh.get_coordinate()
        if coord is None:
            return a.narrow(d, 0, 0)
        ls, off = compute_local_shape_and_offset(tuple(a.shape), mesh.shape, pl, coord)
        return a.narrow(d, off[d], ls[d])
    return a


def _wrap_out(o: Any, d: int | None, mesh: Any, bdims: tuple[int, ...], batch: int) -> Any:
    if not isinstance(o, torch.Tensor) or isinstance(o, DTensor):
        return o
    if d is None or not bdims:
        return DTensor.from_local(o, mesh, [Replicate()] * mesh.ndim)
    d %= o.dim()
    shape = list(o.shape)
    shape[d] = batch
    pl = [Shard(d) if m in bdims else Replicate() for m in range(mesh.ndim)]
    return DTensor.from_local(o, mesh, pl, shape=tuple(shape), stride=contiguous_stride(shape))


def _vmap_dtensors(
    impl: Any,
    func: Any,
    in_dims: Any,
    out_dims: Any,
    randomness: str,
    chunk_size: int | None,
    args: tuple,
    kwargs: dict,
) -> Any:
    flat, spec = tree_flatten(args)
    dims = _flat_dims(in_dims, spec)
    if dims is None:  # functorch's own error for in_dims that do not fit the inputs
        return impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)
    mesh = _mesh_of(flat)
    bdims = _batch_mesh_dims(flat, dims)
    batch = next(
        a.shape[d] for a, d in zip(flat, dims) if isinstance(a, torch.Tensor) and d is not None
    ) if any(d is not None for d in dims) else 0  # fmt: skip
    local = [_local_arg(a, d, mesh, bdims) for a, d in zip(flat, dims)]
    out = impl(
        func, in_dims, out_dims, randomness, chunk_size, *tree_unflatten(local, spec), **kwargs
    )
    flat_out, out_spec = tree_flatten(out)
    odims = _flat_dims(out_dims, out_spec)
    if odims is None:
        odims = [out_dims] * len(flat_out)
    wrapped = [_wrap_out(o, d, mesh, bdims, batch) for o, d in zip(flat_out, odims)]
    return tree_unflatten(wrapped, out_spec)


def install() -> bool:
    """Route ``torch.vmap`` calls with DTensor arguments through the local vmap above
    (idempotent). Returns whether it is installed."""
    try:
        import torch._functorch.apis as apis
    except ImportError:
        return False
    impl = getattr(apis, "vmap_impl", None)
    if impl is None:
        return False
    if getattr(impl, "_hs_vmap", False):
        return True

    def vmap_impl(
        func: Any,
        in_dims: Any,
        out_dims: Any,
        randomness: str,
        chunk_size: int | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if any(isinstance(a, DTensor) for a in tree_flatten(args)[0]):
            return _vmap_dtensors(
                impl, func, in_dims, out_dims, randomness, chunk_size, args, kwargs
            )
        return impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)

    vmap_impl._hs_vmap = True  # type: ignore[attr-defined]
    apis.vmap_impl = vmap_impl
    return True
