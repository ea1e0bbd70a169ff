"""The data-parallel mesh of a ``fully_shard`` call and how it composes with a tensor-
parallel mesh (framework-neutral).

* 1-D mesh: FSDP, parameters ``(Shard(0),)``.
* 2-D mesh ``("replicate", "shard")``: HSDP, parameters ``(Replicate(), Shard(0))``;
  gradients are reduce-scattered over dim 1 and all-reduced over dim 0.
* A parameter that already is a DTensor on another sub-mesh of the same root mesh (a
  tensor-parallel one, from ``parallelize_module(model, mesh["tp"], ...)``) becomes a
  DTensor on the sub-mesh of the root spanning both (e.g. the whole ``("dp", "tp")``
  mesh), with the data-parallel placements on the data-parallel dims and its own
  placements on the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._mesh_flatten import merged
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate, Shard, grad_placement
from ..spec import DTensorSpec, TensorMeta

__all__ = ["MeshInfo", "compose_mesh", "sharded_spec", "grad_placements"]


class MeshInfo:
    """What a unit needs to know about its data-parallel mesh.

    Attributes:
        mesh: the mesh given to ``fully_shard``.
        shard_dim / replicate_dim: its mesh dims (``replicate_dim`` None for FSDP).
        shard_size / shard_coord: ranks on the shard dim and this rank's coordinate.
        replicate_size: ranks on the replicate dim (1 for FSDP).
    """

    __slots__ = (
        "mesh",
        "shard_dim",
        "replicate_dim",
        "shard_size",
        "shard_coord",
        "replicate_size",
    )

    def __init__(self, mesh: DeviceMesh) -> None:
        coord = mesh.get_coordinate()
        if coord is None:
            raise ValueError(
                f"fully_shard: rank {mesh.get_rank()} is not in the mesh {mesh} (ranks "
                f"{list(mesh.ranks)}); pass a mesh that contains every rank calling "
                f"fully_shard, e.g. mesh['dp'] of a mesh built by every rank"
            )
        if mesh.ndim not in (1, 2):
            raise ValueError(
                f"fully_shard: the mesh must be 1-D (FSDP) or 2-D (HSDP: ('replicate', "
                f"'shard')), got shape {mesh.shape}; slice the data-parallel dims, e.g. "
                f"mesh['dp'] or mesh[('dp_replicate', 'dp_shard')]"
            )
        self.mesh = mesh
        self.shard_dim = mesh.ndim - 1
        self.replicate_dim = 0 if mesh.ndim == 2 else None
        self.shard_size = mesh.shape[self.shard_dim]
        self.shard_coord = coord[self.shard_dim]
        self.replicate_size = mesh.shape[0] if mesh.ndim == 2 else 1

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The data-parallel placements of a parameter: ``(Shard(0),)`` or
        ``(Replicate(), Shard(0))``."""
        return self.placements_for(0)

    def placements_for(self, dim: int) -> tuple[Placement, ...]:
        """The data-parallel placements of a parameter sharded along ``dim``."""
        return (Shard(dim),) if self.mesh.ndim == 1 else (Replicate(), Shard(dim))

    @property
    def dp_size(self) -> int:
        """Ranks that see different data (the gradient is their mean)."""
        return self.shard_size * self.replicate_size

    def shard_group(self) -> object:
        return self.mesh._group(self.shard_dim)

    def replicate_group(self) -> object:
        assert self.replicate_dim is not None
        return self.mesh._group(self.replicate_dim)


def _parts(mesh: DeviceMesh) -> tuple[DeviceMesh, tuple[tuple[int, ...], ...]]:
    """The root mesh of ``mesh`` and, per dim of ``mesh``, the root dims it spans: one dim
    for a slice (``mesh["tp"]``), several for a flattened mesh (``mesh["dp", "cp"]._flatten()``)."""
    parts_of = mesh.__dict__.get("_parts_of")
    if parts_of is not None:
        return parts_of
    root = mesh._root
    if root is None:
        return mesh, tuple((d,) for d in range(mesh.ndim))
    return root, tuple((d,) for d in mesh._root_dims)


def compose_mesh(
    dp_mesh: DeviceMesh,
    dp_placements: Sequence[Placement],
    other: DeviceMesh,
    other_placements: Sequence[Placement],
) -> tuple[DeviceMesh, tuple[Placement, ...], tuple[int, ...], tuple[int, ...]]:
    """The mesh spanning two sub-meshes of one root mesh, and the placements there. A
    flattened mesh (torchtitan's ``mesh["dp_shard", "cp"]._flatten("dp_shard_cp")``) is one
    dim of it, over the adjacent root dims it merges.

    Returns:
        ``(mesh, placements, dp_dims, other_dims)``: the sub-mesh of the root over both
        meshes' dims (in the root's order), the placements on it, and the positions of
        the data-parallel and the other mesh's dims in it.

    Raises:
        ValueError: the meshes are not sub-meshes of one root, share a mesh dim, or a
            flattened mesh merges root dims that are not adjacent.
    """
    root_a, parts_a = _parts(dp_mesh)
    root_b, parts_b = _parts(other)
    if root_a is not root_b and root_a != root_b:
        raise ValueError(
            f"fully_shard: a parameter is a DTensor on {other}, which is not a sub-mesh of "
            f"the same mesh as the data-parallel mesh {dp_mesh}; slice both from one mesh "
            f"(mesh['dp'] and mesh['tp'] of init_device_mesh(..., mesh_dim_names=('dp', 'tp')))"
        )
    used_a = {d for g in parts_a for d in g}
    if used_a & {d for g in parts_b for d in g}:
        raise ValueError(
            f"fully_shard: a parameter is a DTensor on {other}, which shares a mesh dim with "
            f"the data-parallel mesh {dp_mesh}; a parameter cannot be sharded twice over "
            f"the same ranks"
        )
    parts = sorted(parts_a + parts_b)
    if all(len(g) == 1 for g in parts):
        dims = [g[0] for g in parts]
        mesh = root_a if dims == list(range(root_a.ndim)) else root_a._sub(dims)
    else:
        if any(list(g) != list(range(g[0], g[0] + len(g))) for g in parts):
            raise ValueError(
                f"fully_shard: the data-parallel mesh {dp_mesh} and {other} merge mesh dims "
                f"that are not adjacent in their root mesh; flatten adjacent dims only"
            )
        mesh = merged(root_a, parts)
    placement_of: dict[tuple[int, ...], Placement] = {}
    for g, p in zip(parts_a, dp_placements):
        placement_of[g] = p
    for g, p in zip(parts_b, other_placements):
        placement_of[g] = p
    placements = tuple(placement_of[g] for g in parts)
    return (
        mesh,
        placements,
        tuple(parts.index(g) for g in parts_a),
        tuple(parts.index(g) for g in parts_b),
    )


def sharded_spec(
    info: MeshInfo, ospec: DTensorSpec | None, meta: TensorMeta, dim: int = 0
) -> tuple[DTensorSpec, tuple[int, ...], tuple[int, ...]]:
    """The layout of a sharded parameter and the positions of its data-parallel and
    tensor-parallel mesh dims (framework-neutral: both FSDP adapters use it).

    Args:
        info: the unit's data-parallel mesh.
        ospec: the original parameter's spec (a DTensor on a tensor-parallel sub-mesh), or
            None for a plain parameter.
        meta: the original's local metadata (a plain parameter's: its global metadata).
        dim: the tensor dim FSDP shards (0 unless ``shard_placement_fn`` says otherwise).

    Returns:
        ``(spec, dp_dims, tp_dims)``. A plain parameter: ``info.placements`` on the
        data-parallel mesh. A tensor-parallel one: the mesh spanning both, FSDP's dim-0
        split of the tensor-parallel local data made *after* every split the original
        layout made (the shard order ``0: [tp..., dp]``), the other dims keeping the
        original's order.

    Raises:
        ValueError: the meshes do not compose (:func:`compose_mesh`).
    """
    dp = info.placements_for(dim)
    if ospec is None:
        return DTensorSpec(info.mesh, dp, meta), tuple(range(info.mesh.ndim)), ()
    mesh, placements, dp_dims, tp_dims = compose_mesh(info.mesh, dp, ospec.mesh, ospec.placements)
    gmeta = TensorMeta(ospec.shape, ospec.stride, meta.dtype, meta.itemsize)
    order = [
        (d, tuple(tp_dims[m] for m in ospec.split_order(d)))
        for d in range(ospec.ndim)
        if ospec.split_order(d) and d != dim
    ]
    shard_dp = dp_dims[info.shard_dim]
    order.append((dim, tuple(tp_dims[m] for m in ospec.split_order(dim)) + (shard_dp,)))
    order.sort()
    return DTensorSpec(mesh, placements, gmeta, order), dp_dims, tp_dims


def grad_placements(spec: DTensorSpec, tp_dims: Sequence[int]) -> tuple[Placement, ...]:
    """FSDP's gradient placements: the parameter's on the data-parallel dims (reduce-
    scattered to ``Shard``, all-reduced to ``Replicate``) and the local-derivative form of
    the tensor-parallel placements on the others (a ``Replicate`` tensor-parallel
    parameter's gradient is ``Partial(sum)`` there)."""
    pl = list(spec.placements)
    for m in tp_dims:
        pl[m] = grad_placement(pl[m])
    return tuple(pl)
