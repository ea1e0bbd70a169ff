"""``DeviceMesh._flatten`` and ``DeviceMesh.from_group``, with PyTorch's semantics.

A flattened mesh merges some dimensions of a mesh into one (``mesh["dp", "cp"]._flatten()``
is the 1-D mesh ``"dp_cp"`` over those ranks, row-major), with a process group of its own;
the root mesh remembers it by name, so ``root["dp_cp"]`` finds it again, as in PyTorch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .mesh import DeviceMesh

__all__ = ["flatten", "flattened", "from_group", "merged", "slice_with_flattened"]


def _root(mesh: DeviceMesh) -> tuple[DeviceMesh, tuple[int, ...]]:
    return (mesh._root or mesh), mesh._root_dims


def flatten(mesh: DeviceMesh, name: str | None) -> DeviceMesh:
    """The 1-D mesh over ``mesh``'s ranks (row-major), named ``name`` (default: the dim names
    joined by ``"_"``). A collective when it creates groups: every rank of the root mesh
    calls it, as in PyTorch. The same name on the same dims returns the same mesh.

    Raises:
        MeshError: no name and no dim names, or ``name`` already names other dims.
        RuntimeError: this rank is not in the mesh.
    """
    from .mesh import DeviceMesh, MeshError

    if mesh._coordinate is None:
        raise RuntimeError(f"_flatten: rank {mesh._rank} is not in {mesh!r}")
    if name is None:
        if mesh.mesh_dim_names is None:
            raise MeshError("_flatten: the mesh has no mesh_dim_names; pass mesh_dim_name")
        name = "_".join(mesh.mesh_dim_names)
    root, rdims = _root(mesh)
    cache: dict[str, tuple[tuple[int, ...], DeviceMesh]] = root.__dict__.setdefault(
        "_flattened", {}
    )
    hit = cache.get(name)
    if hit is not None:
        if hit[0] == rdims:
            return hit[1]
        raise MeshError(
            f"_flatten: {name!r} already names flattened mesh dims {hit[0]} of {root!r}"
        )
    if root.mesh_dim_names is not None and name in root.mesh_dim_names:
        if (root.mesh_dim_names.index(name),) == rdims:
            return mesh
        raise MeshError(f"_flatten: {name!r} already names a dimension of {root!r}")
    groups: list[Any] | None = None
    members = list(mesh._ranks)
    if root._groups is not None and root._platform is not None:
        if len(rdims) == 1:
            groups = [root._groups[rdims[0]]]
        else:
            groups = [_create_group(root, rdims)]
    flat = DeviceMesh(
        mesh.device_type, members, mesh_dim_names=(name,), _rank=mesh._rank, _groups=groups,
        _abstract=True, _world=root._world,
    )  # fmt: skip
    flat._platform = root._platform
    flat.__dict__["_parts_of"] = (root, (rdims,))  # the root dims it merges: merged()
    cache[name] = (rdims, flat)
    return flat


def _create_group(root: DeviceMesh, rdims: tuple[int, ...]) -> Any:
    """Every flattened group of ``root`` over dims ``rdims`` (other coordinates fixed),
    created in the same order on every rank; this rank's one."""
    assert root._platform is not None
    other = [range(s) if d not in rdims else range(1) for d, s in enumerate(root._shape)]
    mine = None
    for fixed in itertools.product(*other):
        coord = list(fixed)
        ranks = []
        for idx in itertools.product(*[range(root._shape[d]) for d in rdims]):
            for d, i in zip(rdims, idx):
                coord[d] = i
            ranks.append(root._ranks[sum(c * st for c, st in zip(coord, root._strides))])
        g = root._platform.new_group(ranks)  # collective: every rank calls it
        if root._rank in ranks:
            mine = g
    return mine


def flattened(mesh: DeviceMesh, name: str) -> DeviceMesh | None:
    """The mesh flattened from ``mesh``'s root under ``name``, or None."""
    root, _ = _root(mesh)
    hit = root.__dict__.get("_flattened", {}).get(name)
    return None if hit is None else hit[1]


def from_group(
    group: Any,
    device_type: str,
    mesh: Any = None,
    *,
    mesh_dim_names: Sequence[str] | None = None,
) -> DeviceMesh:
    """A mesh over existing process groups (as PyTorch's ``DeviceMesh.from_group``): one
    group gives the 1-D mesh over its ranks; a list of groups (one per mesh dim, each this
    rank's group along that dim) needs ``mesh``, the ranks in the mesh's shape. No
    collective: the groups are reused.

    Raises:
        MeshError: a list of groups without ``mesh``, or a count that differs from its ndim.
    """
    from ._locator import get_platform
    from .mesh import DeviceMesh, MeshError, _flatten

    plat = get_platform(None, device_type=device_type)
    natives = list(group) if isinstance(group, (list, tuple)) else [group]
    groups = [plat.group_from_native(g) for g in natives]
    if mesh is None:
        if len(groups) != 1:
            raise MeshError(
                f"DeviceMesh.from_group: {len(groups)} groups need `mesh`, the ranks in the "
                f"mesh's shape"
            )
        mesh = list(groups[0].ranks)
    shape, _ = _flatten(mesh)
    if len(shape) != len(groups) or math.prod(shape) == 0:
        raise MeshError(
            f"DeviceMesh.from_group: {len(groups)} groups for a {len(shape)}-D mesh {mesh!r}; "
            f"give one group per mesh dimension"
        )
    return DeviceMesh(
        device_type, mesh, mesh_dim_names=mesh_dim_names, platform=plat, _groups=groups
    )


def merged(root: DeviceMesh, parts: Sequence[tuple[int, ...]]) -> DeviceMesh:
    """The mesh of ``root`` over ``parts`` (ascending, disjoint runs of adjacent root
    dims), each run one mesh dim: a root dim, or dims flattened before (``_flatten``),
    whose group it reuses (no collective). ``root["rep", "shard_cp"]`` after
    ``root["shard", "cp"]._flatten("shard_cp")``, as PyTorch; FSDP composes a flattened
    data-parallel mesh with a tensor-parallel one by it.

    Raises:
        MeshError: a run of several dims that was not flattened before.
    """
    from .mesh import DeviceMesh, MeshError

    flats = {rd: m for rd, m in root.__dict__.get("_flattened", {}).values()}
    dims = [d for g in parts for d in g]
    sub = root if dims == list(range(root.ndim)) else root._sub(dims)
    shape = [math.prod(root.shape[d] for d in g) for g in parts]
    nested: Any = list(sub._ranks)
    for n in reversed(shape[1:]):
        nested = [nested[i : i + n] for i in range(0, len(nested), n)]
    names: list[str] = []
    groups: list[Any] = []
    for g in parts:
        src = flats.get(tuple(g)) if len(g) > 1 else root._sub(g)
        if src is None:
            raise MeshError(f"mesh dims {tuple(g)} of {root!r} were not flattened into one")
        names.extend(src.mesh_dim_names or ())
        groups.append(None if src._groups is None else src._groups[0])
    out = DeviceMesh.__new__(DeviceMesh)
    out.__init__(  # type: ignore[misc]
        root.device_type,
        nested,
        mesh_dim_names=tuple(names) if len(names) == len(parts) else None,
        _rank=root._rank,
        _groups=None if any(g is None for g in groups) else groups,
        _abstract=True,
        _world=root._world,
    )
    out._platform = root._platform
    out.__dict__["_parts_of"] = (root, tuple(tuple(g) for g in parts))
    return out


def slice_with_flattened(mesh: DeviceMesh, names: Sequence[str]) -> DeviceMesh:
    """``mesh[names]`` where some names are flattened dims of its root (as PyTorch:
    ``mesh["dp_replicate", "dp_shard_cp"]``): :func:`merged` over their root dims.

    Raises:
        MeshError: the names are not in the root's dim order, or two share a dim.
    """
    from .mesh import MeshError

    root, _ = _root(mesh)
    table = root.__dict__.get("_flattened", {})
    own = root.mesh_dim_names or ()
    parts = [(own.index(n),) if n in own else tuple(table[n][0]) for n in names]
    dims = [d for g in parts for d in g]
    if dims != sorted(set(dims)):
        raise MeshError(
            f"mesh[{tuple(names)}]: the dims must follow the mesh's order ({own}) and not "
            f"repeat a dim (a flattened name covers {', '.join(f'{n}={p}' for n, p in zip(names, parts))})"
        )
    return merged(root, parts)
