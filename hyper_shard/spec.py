"""DTensorSpec: a DeviceMesh, one placement per mesh dim, and the global tensor's metadata.

Local shapes and global offsets follow ``torch.chunk`` semantics, as PyTorch DTensor:
along a sharded tensor dim of extent ``E`` split over ``k`` ranks, every chunk holds
``ceil(E / k)`` elements except the last non-empty one; trailing chunks may be empty.
When several mesh dims shard the same tensor dim, they split it in its *shard order*: by
default left to right (the leftmost mesh dim splits the whole extent, the next one splits
each piece, and so on). A spec may give another order per tensor dim (``shard_order``, as
PyTorch DTensor's ``ShardOrderEntry``): FSDP over tensor parallelism shards a weight that
``tp`` (mesh dim 1) already split along dim 0 again along dim 0 over ``dp`` (mesh dim 0),
so ``tp`` splits first: ``shard_order=((0, (1, 0)),)``. The order decides which rows a rank
holds, never how many (nested ``ceil`` sizes do not depend on it).

The MindSpore "alias" form (device matrix, alias names, tensor_map) converts both ways.

This module imports no framework.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .mesh import DeviceMesh
from .placement import Partial, Placement, Replicate, Shard, normalize_placements

__all__ = [
    "TensorMeta",
    "DTensorSpec",
    "ShardOrderEntry",
    "ShardOrder",
    "AliasLayout",
    "chunk_sizes",
    "compute_local_shape_and_offset",
    "global_stride",
    "view_stride",
]


class TensorMeta(NamedTuple):
    """Global metadata of a DTensor.

    Attributes:
        shape: the global shape.
        stride: the global (contiguous) stride.
        dtype: the framework's dtype object (opaque to the core).
        itemsize: bytes per element (used by the cost model).
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any
    itemsize: int = 4


def contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (in elements)."""
    out = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def global_stride(
    global_shape: Sequence[int], local_shape: Sequence[int], local_stride: Sequence[int]
) -> tuple[int, ...]:
    """The stride of the global tensor laid out in memory like the local shard: the dims
    ordered by the local strides (outermost first; on a tie a size-1 dim goes inside, else
    dim order), each global stride
    the product of the global sizes inside it; a broadcast dim (local stride 0 over more
    than one element) keeps stride 0. This is what PyTorch DTensor reports as ``stride()``
    (``from_local`` of a sharded tensor, ``transpose``/``permute`` results, ``contiguous()``
    restoring the row-major stride), computed the same way for uneven shards.

    >>> global_stride((12, 5, 6), (3, 5, 6), (30, 6, 1))
    (30, 6, 1)
    >>> global_stride((6, 5, 12), (6, 5, 3), (1, 6, 30))
    (1, 6, 30)
    """
    n = len(global_shape)
    if len(local_shape) != n or len(local_stride) != n:
        return contiguous_stride(global_shape)
    out = [0] * n
    dense = [d for d in range(n) if not (local_stride[d] == 0 and local_shape[d] > 1)]
    acc = 1
    # ties (a size-1 dim shares its stride with a neighbour) put the size-1 dim inside, as
    # torch's own permutes of a contiguous tensor leave it
    key = lambda d: (-local_stride[d], local_shape[d] == 1, d)  # noqa: E731
    for d in sorted(dense, key=key, reverse=True):
        out[d] = acc
        acc *= max(int(global_shape[d]), 1)
    return tuple(out)


def view_stride(
    global_shape: Sequence[int], local_shape: Sequence[int], local_stride: Sequence[int]
) -> tuple[int, ...]:
    """The global stride of a DTensor whose local shard may be a *view with gaps* (a slice,
    ``narrow`` or ``select`` of an unsharded dim): each local stride scaled by how much
    larger than the shard the global tensor is along the dims inside it (in memory order,
    as :func:`global_stride` orders them), as PyTorch DTensor reports a view's stride
    (``x[:, 1:3]`` of an ``8 x 4`` sharded on rows: ``(4, 1)``). For a dense local shard
    this is :func:`global_stride`; a shard empty along a dim inside another falls back to
    it.

    >>> view_stride((8, 2), (2, 2), (4, 1))
    (4, 1)
    >>> view_stride((4, 4), (4, 2), (2, 1))
    (4, 1)
    """
    n = len(global_shape)
    if len(local_shape) != n or len(local_stride) != n:
        return global_stride(global_shape, local_shape, local_stride)
    key = lambda d: (-local_stride[d], local_shape[d] == 1, d)  # noqa: E731
    out = [0] * n
    num, den = 1, 1
    for d in sorted(range(n), key=key, reverse=True):  # innermost first
        scaled = local_stride[d] * num
        if den == 0 or scaled % den:  # an empty shard inside: its extent is unknown
            return global_stride(global_shape, local_shape, local_stride)
        out[d] = scaled // den
        if local_shape[d] != global_shape[d] and local_stride[d] != 0:
            num, den = num * int(global_shape[d]), den * int(local_shape[d])
    return tuple(out)


def chunk_sizes(extent: int, n: int) -> list[int]:
    """Sizes of the ``n`` pieces of ``extent`` elements under ``torch.chunk`` semantics,
    padded with empty pieces to exactly ``n``.

    >>> chunk_sizes(5, 4)
    [2, 2, 1, 0]
    """
    if n <= 0:
        raise ValueError(f"chunk_sizes: n must be positive, got {n}")
    c = -(-extent // n) if extent > 0 else 0
    return [max(0, min(c, extent - i * c)) for i in range(n)]


class ShardOrderEntry(NamedTuple):
    """How one tensor dim is split (as PyTorch DTensor's ``ShardOrderEntry``).

    Attributes:
        tensor_dim: the tensor dim.
        mesh_dims: the mesh dims that shard it, in the order they split it (the first
            splits the whole extent, the next each of its pieces...).
    """

    tensor_dim: int
    mesh_dims: tuple[int, ...]


#: per tensor dim whose split order is not left to right, its entry (sorted by tensor dim)
ShardOrder = tuple[ShardOrderEntry, ...]


def default_split_orders(placements: Sequence[Placement], ndim: int) -> list[list[int]]:
    """Per tensor dim, the mesh dims sharding it left to right."""
    out: list[list[int]] = [[] for _ in range(ndim)]
    for m, p in enumerate(placements):
        if type(p) is Shard:
            out[p.dim].append(m)
    return out


def normalize_shard_order(
    placements: Sequence[Placement], ndim: int, shard_order: Any
) -> ShardOrder | None:
    """A shard order in canonical form: only the entries that are not left to right,
    sorted by tensor dim; None when every tensor dim splits left to right.

    Args:
        placements: normalised placements.
        ndim: the tensor's rank.
        shard_order: None, or entries ``(tensor_dim, mesh_dims)`` (``ShardOrderEntry`` or
            pairs); tensor dims not listed split left to right.

    Raises:
        ValueError: an entry whose mesh dims are not exactly the mesh dims that shard its
            tensor dim, or a tensor dim listed twice.
    """
    if not shard_order:
        return None
    default = default_split_orders(placements, ndim)
    seen: set[int] = set()
    out = []
    for entry in shard_order:
        d, mdims = int(entry[0]), tuple(int(m) for m in entry[1])
        if d < 0:
            d += ndim
        if not 0 <= d < ndim or d in seen:
            raise ValueError(
                f"shard_order: tensor dim {entry[0]} is out of range or listed twice "
                f"({list(shard_order)})"
            )
        seen.add(d)
        if sorted(mdims) != default[d]:
            raise ValueError(
                f"shard_order: tensor dim {d} is sharded by mesh dims {default[d]} (placements "
                f"{[str(p) for p in placements]}); its entry must list exactly those, in the "
                f"order they split it, got {list(mdims)}"
            )
        if list(mdims) != default[d]:
            out.append(ShardOrderEntry(d, mdims))
    return tuple(sorted(out)) or None


def split_orders(
    placements: Sequence[Placement], ndim: int, shard_order: ShardOrder | None
) -> list[list[int]]:
    """Per tensor dim, the mesh dims sharding it in the order they split it."""
    orders = default_split_orders(placements, ndim)
    if shard_order:
        for d, mdims in shard_order:
            orders[d] = list(mdims)
    return orders


def compute_local_shape_and_offset(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coordinate: Sequence[int],
    shard_order: ShardOrder | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Local shape and global offset of the shard held at mesh ``coordinate``.

    Args:
        global_shape: the global tensor shape.
        mesh_shape: the mesh shape.
        placements: normalised placements (``Shard.dim >= 0``), one per mesh dim.
        coordinate: the mesh coordinate of the rank.
        shard_order: the canonical shard order (None: every tensor dim left to right).

    Returns:
        ``(local_shape, global_offset)``; an empty shard has offset equal to the end of
        the previous shard (as PyTorch DTensor).
    """
    shape = list(global_shape)
    offset = [0] * len(shape)
    if shard_order:
        for d, mdims in enumerate(split_orders(placements, len(shape), shard_order)):
            for m in mdims:
                sizes = chunk_sizes(shape[d], mesh_shape[m])
                c = coordinate[m]
                offset[d] += sum(sizes[:c])
                shape[d] = sizes[c]
        return tuple(shape), tuple(offset)
    for m, p in enumerate(placements):
        if type(p) is Shard:
            sizes = chunk_sizes(shape[p.dim], mesh_shape[m])
            c = coordinate[m]
            offset[p.dim] += sum(sizes[:c])
            shape[p.dim] = sizes[c]
    return tuple(shape), tuple(offset)


_SPEC_IDS: dict[tuple, int] = {}
#: spec ids start far above any int an op takes as a static argument (dims, sizes, k,
#: seeds: all below 2**64): a layout-cache key holds spec ids and static values side by
#: side (``torch.max(x, 1)`` vs ``torch.max(x, y)``), and the two must never compare equal
_SPEC_ID_BASE = 1 << 70
#: the next id (``next()`` of an ``itertools.count`` is atomic: threads never share an id)
_NEXT_SPEC_ID = itertools.count(_SPEC_ID_BASE + 1)
_MAX_SPEC_IDS = 1 << 16


def intern_spec_key(key: tuple) -> int:
    """An int standing for a spec's ``key`` in this process (from ``_SPEC_ID_BASE`` up, so
    never equal to a static argument's value): equal keys get the same int, so the
    dispatcher's layout-cache keys hash and compare ints, not specs (a Python
    ``__hash__``/``__eq__`` call per spec per lookup). When the table is full it starts
    over; ints are never reused, so a spec made after that only misses the cache."""
    i = _SPEC_IDS.get(key)
    if i is None:
        if len(_SPEC_IDS) >= _MAX_SPEC_IDS:
            _SPEC_IDS.clear()
        # two threads interning one key at once: the first id stored wins
        i = _SPEC_IDS.setdefault(key, next(_NEXT_SPEC_ID))
    return i


class DTensorSpec:
    """Mesh + placements + global metadata, with a hash computed once.

    Args:
        mesh: the DeviceMesh (abstract or concrete).
        placements: one placement per mesh dim; negative shard dims are normalised.
        tensor_meta: the global shape, stride, dtype and itemsize.
        shard_order: the split order of tensor dims sharded by several mesh dims, as
            entries ``(tensor_dim, mesh_dims)``; unlisted dims split left to right (see the
            module docstring). Kept in canonical form (:func:`normalize_shard_order`):
            None when every dim splits left to right.

    Raises:
        ValueError / IndexError / TypeError: placements that do not fit the mesh or tensor,
            or a shard order that does not fit the placements.
    """

    __slots__ = (
        "mesh",
        "placements",
        "tensor_meta",
        "shard_order",
        "key",
        "_hash",
        "_id",
        "_cid",
        "_local_shape",
        "_offset",
        "_plans",
    )

    def __init__(
        self,
        mesh: DeviceMesh,
        placements: Sequence[Placement],
        tensor_meta: TensorMeta,
        shard_order: Any = None,
    ) -> None:
        self.mesh = mesh
        self.placements: tuple[Placement, ...] = normalize_placements(
            placements, mesh.ndim, len(tensor_meta.shape)
        )
        self.tensor_meta = tensor_meta
        self.shard_order: ShardOrder | None = (
            normalize_shard_order(self.placements, len(tensor_meta.shape), shard_order)
            if shard_order
            else None
        )
        self.key = (
            mesh._key,
            self.placements,
            tensor_meta.shape,
            tensor_meta.dtype,
            self.shard_order,
        )
        self._hash = hash(self.key)
        self._id = intern_spec_key(self.key)
        #: the id as a string: how a compiled region names this layout (a compiler may turn
        #: an int it reads into a symbol; a string stays a constant)
        self._cid = str(self._id)
        self._local_shape: tuple[int, ...] | None = None
        self._offset: tuple[int, ...] | None = None
        self._plans: dict | None = None  # redistribution plans from this spec (planner cache)

    # ------------------------------------------------------------------ basics
    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape."""
        return self.tensor_meta.shape

    @property
    def ndim(self) -> int:
        """The global tensor rank."""
        return len(self.tensor_meta.shape)

    @property
    def dtype(self) -> Any:
        return self.tensor_meta.dtype

    @property
    def stride(self) -> tuple[int, ...]:
        return self.tensor_meta.stride

    def with_placements(
        self, placements: Sequence[Placement], shard_order: Any = "keep"
    ) -> DTensorSpec:
        """The same tensor on the same mesh with other placements.

        Args:
            shard_order: ``"keep"`` (default): a tensor dim sharded by the same mesh dims
                as here keeps its split order, the others split left to right; or an
                explicit order (None: left to right everywhere).
        """
        if shard_order == "keep":
            shard_order = self._kept_order(placements) if self.shard_order else None
        return DTensorSpec(self.mesh, placements, self.tensor_meta, shard_order)

    def _kept_order(self, placements: Sequence[Placement]) -> ShardOrder | None:
        pl = normalize_placements(placements, self.mesh.ndim, self.ndim)
        new = default_split_orders(pl, self.ndim)
        assert self.shard_order is not None
        kept = [e for e in self.shard_order if sorted(e.mesh_dims) == new[e.tensor_dim]]
        return tuple(kept) or None

    def split_order(self, tensor_dim: int) -> tuple[int, ...]:
        """The mesh dims sharding ``tensor_dim``, in the order they split it."""
        if self.shard_order:
            for d, mdims in self.shard_order:
                if d == tensor_dim:
                    return mdims
        return tuple(self.shard_mesh_dims(tensor_dim))

    @property
    def full_shard_order(self) -> ShardOrder:
        """Every sharded tensor dim's entry (as PyTorch's ``DTensorSpec.shard_order``)."""
        return tuple(
            ShardOrderEntry(d, tuple(ms))
            for d, ms in enumerate(split_orders(self.placements, self.ndim, self.shard_order))
            if ms
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DTensorSpec) and other.key == self.key

    def __reduce__(self) -> tuple:
        # rebuilt, never copied slot by slot: ``_hash`` and ``_id`` are this process's
        return (DTensorSpec, (self.mesh, self.placements, self.tensor_meta, self.shard_order))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self.placements)
        order = ""
        if self.shard_order:
            order = ", shard_order=" + ", ".join(f"{d}:{list(ms)}" for d, ms in self.shard_order)
        return (
            f"DTensorSpec(shape={list(self.shape)}, placements=[{pl}]{order}, "
            f"mesh={self.mesh.shape})"
        )

    # ------------------------------------------------------------------ sharding
    def is_replicated(self) -> bool:
        return all(type(p) is Replicate for p in self.placements)

    def has_partial(self) -> bool:
        return any(type(p) is Partial for p in self.placements)

    def shard_mesh_dims(self, tensor_dim: int) -> list[int]:
        """Mesh dims that shard ``tensor_dim``, left to right."""
        return [
            m for m, p in enumerate(self.placements) if type(p) is Shard and p.dim == tensor_dim
        ]

    def local_shape_and_offset(
        self, coordinate: Sequence[int] | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Local shape and global offset at ``coordinate`` (default: this rank's)."""
        if coordinate is None:
            if self._local_shape is None:
                coord = self.mesh.get_coordinate()
                if coord is None:
                    return (0,) * self.ndim, (0,) * self.ndim
                self._local_shape, self._offset = compute_local_shape_and_offset(
                    self.shape, self.mesh.shape, self.placements, coord, self.shard_order
                )
            assert self._offset is not None
            return self._local_shape, self._offset
        return compute_local_shape_and_offset(
            self.shape, self.mesh.shape, self.placements, coordinate, self.shard_order
        )

    def local_shape(self, coordinate: Sequence[int] | None = None) -> tuple[int, ...]:
        """The local shard's shape at ``coordinate`` (default: this rank's)."""
        return self.local_shape_and_offset(coordinate)[0]

    def global_offset(self, coordinate: Sequence[int] | None = None) -> tuple[int, ...]:
        """The global index of the local shard's first element at ``coordinate``."""
        return self.local_shape_and_offset(coordinate)[1]

    def max_local_numel(self) -> int:
        """Elements of the largest local shard (what a collective waits for)."""
        shape = list(self.shape)
        for m, p in enumerate(self.placements):
            if type(p) is Shard:
                shape[p.dim] = -(-shape[p.dim] // self.mesh.shape[m])
        return math.prod(shape)

    def is_evenly_sharded(self) -> bool:
        """True if every shard has the same shape."""
        shape = list(self.shape)
        for m, p in enumerate(self.placements):
            if type(p) is Shard:
                n = self.mesh.shape[m]
                if shape[p.dim] % n:
                    return False
                shape[p.dim] //= n
        return True

    # ------------------------------------------------------------------ alias form
    def to_alias(self) -> AliasLayout:
        """This layout in MindSpore's alias form (device matrix, alias names, tensor_map).

        Raises:
            ValueError: the mesh has no dim names and there is no default naming.
        """
        names = self.mesh.mesh_dim_names or tuple(f"d{i}" for i in range(self.mesh.ndim))
        tmap: list[str | tuple[str, ...]] = []
        for d in range(self.ndim):
            ms = [names[m] for m in self.split_order(d)]
            tmap.append("None" if not ms else ms[0] if len(ms) == 1 else tuple(ms))
        partial = {
            names[m]: p.reduce_op for m, p in enumerate(self.placements) if type(p) is Partial
        }
        return AliasLayout(self.mesh.shape, names, tuple(tmap), partial)

    @classmethod
    def from_alias(
        cls,
        mesh: DeviceMesh,
        tensor_map: Sequence[str | Sequence[str]],
        tensor_meta: TensorMeta,
        partial: dict[str, str] | None = None,
    ) -> DTensorSpec:
        """Build a spec from MindSpore alias form.

        Args:
            mesh: a mesh whose ``mesh_dim_names`` are the alias names.
            tensor_map: per tensor dim, ``"None"``, an alias name, or a tuple of alias names
                (major to minor: the first splits the dim first).
            tensor_meta: global metadata.
            partial: alias name -> reduce op for mesh dims holding partial values.

        Raises:
            ValueError: unknown alias, a mesh dim used twice, or a partial mesh dim that
                also shards. A tuple whose order is not left to right in the mesh becomes
                the spec's ``shard_order``.
        """
        names = mesh.mesh_dim_names or tuple(f"d{i}" for i in range(mesh.ndim))
        if len(tensor_map) != len(tensor_meta.shape):
            raise ValueError(
                f"from_alias: tensor_map {tuple(tensor_map)} has {len(tensor_map)} entries "
                f"for a tensor of rank {len(tensor_meta.shape)}"
            )
        placements: list[Placement] = [Replicate()] * mesh.ndim
        used: set[int] = set()
        order: list[tuple[int, tuple[int, ...]]] = []
        for d, entry in enumerate(tensor_map):
            if entry is None or entry == "None":
                continue
            aliases = (entry,) if isinstance(entry, str) else tuple(entry)
            mdims = []
            for a in aliases:
                if a == "None":
                    continue
                if a not in names:
                    raise ValueError(f"from_alias: alias {a!r} is not one of the mesh's {names}")
                m = names.index(a)
                if m in used:
                    raise ValueError(f"from_alias: mesh dim {a!r} shards two tensor dims")
                used.add(m)
                mdims.append(m)
            if mdims != sorted(mdims):
                order.append((d, tuple(mdims)))
            for m in mdims:
                placements[m] = Shard(d)
        for a, op in (partial or {}).items():
            if a not in names:
                raise ValueError(
                    f"from_alias: partial alias {a!r} is not one of the mesh's {names}"
                )
            m = names.index(a)
            if m in used:
                raise ValueError(f"from_alias: mesh dim {a!r} is both sharding and partial")
            placements[m] = Partial(op)
        return cls(mesh, placements, tensor_meta, tuple(order) or None)


class AliasLayout(NamedTuple):
    """MindSpore's layout form of a DTensorSpec.

    Attributes:
        device_matrix: the mesh shape.
        alias_name: one name per mesh dim.
        tensor_map: per tensor dim, ``"None"``, a name, or a tuple of names (major first).
        partial: mesh-dim name -> reduce op, for partial mesh dims.
    """

    device_matrix: tuple[int, ...]
    alias_name: tuple[str, ...]
    tensor_map: tuple[str | tuple[str, ...], ...]
    partial: dict[str, str]

    @property
    def tensor_map_ints(self) -> tuple[int | tuple[int, ...], ...]:
        """tensor_map as MindSpore's integers: a mesh dim counts from the right (the last
        mesh dim is 0), ``-1`` means not sharded."""
        n = len(self.alias_name)

        def idx(a: str) -> int:
            return n - 1 - self.alias_name.index(a)

        return tuple(
            -1 if e == "None" else idx(e) if isinstance(e, str) else tuple(idx(a) for a in e)
            for e in self.tensor_map
        )
