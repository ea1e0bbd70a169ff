"""DeviceMesh: an N-D arrangement of ranks, with one process group per mesh dimension.

The mesh itself is framework-neutral: it knows its shape, its ranks, its dimension
names and this process's coordinate. A *concrete* mesh also holds a platform (torch or
MindSpore) and, per mesh dimension, the process group this rank belongs to, created
once when the mesh is built. An *abstract* mesh (:meth:`DeviceMesh.abstract`) has no
platform and no process group: it is all that specs, rules and the planner need, so
they are testable in one process with no backend.

Semantics follow PyTorch's ``torch.distributed.device_mesh.DeviceMesh``.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ._mesh_flatten import flatten, flattened, from_group, slice_with_flattened

if TYPE_CHECKING:
    from .platform.base import Platform

__all__ = [
    "DeviceMesh",
    "MeshError",
    "init_device_mesh",
    "as_mesh",
    "current_mesh",
    "this_rank",
]


class MeshError(ValueError, RuntimeError):
    """A mesh argument that does not fit the mesh (a missing ``mesh_dim`` on an N-D mesh,
    repeated or miscounted dim names). A ``ValueError``, and a ``RuntimeError`` as PyTorch's
    ``DeviceMesh`` raises for the same calls, so code catching either keeps working."""


#: the meshes entered with ``with mesh:`` in this thread/task, innermost last
_MESH_STACK: ContextVar[tuple[DeviceMesh, ...]] = ContextVar("hyper_shard_mesh_stack", default=())


class _ThreadRank(threading.local):
    """The rank this thread last built a concrete mesh as (ranks as threads: its own)."""

    rank: int | None = None


_THREAD_RANK = _ThreadRank()
#: the rank of the first concrete mesh built in this process (a process of one rank: its
#: rank, for threads that build no mesh, e.g. the autograd engine's)
_PROCESS_RANK: list[int | None] = [None]


def _note_rank(rank: int) -> None:
    _THREAD_RANK.rank = rank
    if _PROCESS_RANK[0] is None:
        _PROCESS_RANK[0] = rank


def this_rank() -> int | None:
    """The global rank the calling thread runs as: the rank its last concrete mesh was
    built by, else the rank of the first mesh built in the process (None before any).

    One rank per process (torchrun, msrun): the process's rank, from every thread. Ranks
    as threads of one process (PyTorch's threaded process group, the test platforms): the
    calling thread's own rank, which keys the state kept per rank (the flight recorder,
    the consistency mode, ``CommDebugMode``'s counters)."""
    r = _THREAD_RANK.rank
    return _PROCESS_RANK[0] if r is None else r


def _flatten(mesh: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, flat ranks) of a nested list / array-like of ints."""
    if hasattr(mesh, "tolist"):
        mesh = mesh.tolist()
    if isinstance(mesh, int):
        return (), (mesh,)
    if not isinstance(mesh, (list, tuple)) or len(mesh) == 0:
        raise ValueError(f"DeviceMesh: mesh must be a non-empty nested list of ranks, got {mesh!r}")
    subs = [_flatten(m) for m in mesh]
    inner = subs[0][0]
    if any(s[0] != inner for s in subs):
        raise ValueError(f"DeviceMesh: mesh {mesh!r} is ragged; every row must have the same shape")
    return (len(mesh), *inner), tuple(r for s in subs for r in s[1])


class DeviceMesh:
    """An N-D mesh of ranks (as ``torch.distributed.device_mesh.DeviceMesh``).

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ``"npu"`` (torch) or ``"CPU"``, ``"GPU"``,
            ``"Ascend"`` (MindSpore).
        mesh: nested list (or tensor/array with ``tolist``) of global ranks; its shape is
            the mesh shape.
        mesh_dim_names: optional unique names, one per mesh dimension.
        platform: ``"torch"``, ``"mindspore"`` or a Platform; default: chosen by
            :func:`hyper_shard.platform.select.get_platform`.
        timeout: how long a collective on this mesh's process groups waits for its group
            before it raises :class:`~hyper_shard.errors.CollectiveError` (a
            ``datetime.timedelta`` or seconds); default ``HYPER_SHARD_TIMEOUT`` seconds, else
            10 minutes (docs/troubleshooting.md). MindSpore has no per-group timeout:
            there it is process-wide and fixed when communication starts.

    The process groups of every mesh dimension are created when the mesh is built (a
    collective call: every rank of the world must build the same mesh). A mesh may cover a
    subset of the world (``DeviceMesh("cpu", [0, 2])`` on 4 ranks), as in PyTorch: ranks
    outside it have no coordinate, hold empty local shards and take part in no collective
    of its DTensors.

    ``with mesh:`` makes it the default mesh of the ``distribute_tensor``, ``from_local``,
    factory and ``parallelize_module`` calls inside (as PyTorch's ``DeviceMesh`` context
    manager); contexts nest.

    Raises:
        ValueError: ragged mesh, duplicate ranks, or bad/duplicate dimension names.
    """

    #: True for a mesh unpickled in a process that had not built it (no process group)
    _detached: bool = False

    def __init__(
        self,
        device_type: str,
        mesh: Any,
        *,
        mesh_dim_names: Sequence[str] | None = None,
        platform: str | Platform | None = None,
        timeout: Any = None,
        _rank: int | None = None,
        _groups: Sequence[Any] | None = None,
        _abstract: bool = False,
        _world: Any = None,
    ) -> None:
        shape, ranks = _flatten(mesh)
        if len(shape) == 0:
            raise ValueError("DeviceMesh: a mesh needs at least one dimension")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"DeviceMesh: mesh {mesh!r} lists a rank twice")
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != len(shape):
                raise MeshError(
                    f"mesh_shape and mesh_dim_names should have same length! DeviceMesh: "
                    f"{len(mesh_dim_names)} mesh_dim_names {mesh_dim_names} for a "
                    f"{len(shape)}-D mesh of shape {shape}"
                )
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise MeshError(
                    f"Each mesh_dim_name must be unique. DeviceMesh: mesh_dim_names "
                    f"{mesh_dim_names} repeat a name"
                )
        self.device_type = device_type
        self._shape: tuple[int, ...] = shape
        self._ranks: tuple[int, ...] = ranks
        self.mesh_dim_names: tuple[str, ...] | None = mesh_dim_names
        self._strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        self._platform: Platform | None = None
        #: the mesh this one was sliced from (None for a root mesh) and its dims there
        self._root: DeviceMesh | None = None
        self._root_dims: tuple[int, ...] = tuple(range(len(shape)))
        if _abstract:
            self._rank = ranks[0] if _rank is None else _rank
        else:
            from ._locator import get_platform

            self._platform = get_platform(platform, device_type=device_type)
            self._platform.ensure_initialized(device_type, timeout)
            self._rank = self._platform.get_rank() if _rank is None else _rank
            _world = self._platform.world_id()
            _note_rank(self._rank)
        #: the mesh as every rank describes it
        self._desc = (device_type, shape, ranks, mesh_dim_names)
        # the identity adds the rank holding this mesh and its world (see "Ranks as threads"
        # in docs/architecture.md): the same mesh built by ranks r and s of one process
        # (ranks as threads), or again after the process group was made anew, is another
        # mesh, so every spec, decision and plan keyed on it is per rank and per world
        self._world = _world
        self._key = (*self._desc, self._rank, _world)
        self._hash = hash(self._key)
        self._coordinate = self._compute_coordinate(self._rank)
        if _groups is not None:
            self._groups: list[Any] | None = list(_groups)
        elif self._platform is not None:
            self._groups = self._create_groups(timeout)
        else:
            self._groups = None
        if self._platform is not None:
            _LIVE[self._key] = self

    # ------------------------------------------------------------------ default mesh
    def __enter__(self) -> DeviceMesh:
        _MESH_STACK.set((*_MESH_STACK.get(), self))
        return self

    def __exit__(self, *_exc: object) -> None:
        stack = _MESH_STACK.get()
        # pop this mesh (the innermost entry that is it), tolerating unbalanced exits
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                _MESH_STACK.set(stack[:i] + stack[i + 1 :])
                break

    def __reduce__(self) -> tuple:
        # pickled by description; unpickling finds the live mesh of this process (see
        # _rebuild_mesh): process groups are never pickled nor created by torch.load
        return (
            _rebuild_mesh,
            (
                self.device_type,
                self._nested(),
                self.mesh_dim_names,
                self._platform is None,
                self._coordinate,
            ),
        )

    # ------------------------------------------------------------------ building
    @classmethod
    def abstract(
        cls,
        shape: Sequence[int],
        mesh_dim_names: Sequence[str] | None = None,
        *,
        rank: int = 0,
        device_type: str = "cpu",
    ) -> DeviceMesh:
        """A mesh of ``shape`` over ranks ``0..prod(shape)-1`` with no process group.

        Enough for everything that only plans (specs, rules, the redistribution planner).
        ``rank`` picks the coordinate that local-shape queries default to.
        """
        n = math.prod(shape)
        ranks = list(range(n))
        nested: Any = ranks
        for s in reversed(list(shape)[1:]):
            nested = [nested[i : i + s] for i in range(0, len(nested), s)]
        return cls(device_type, nested, mesh_dim_names=mesh_dim_names, _rank=rank, _abstract=True)

    def _compute_coordinate(self, rank: int) -> tuple[int, ...] | None:
        try:
            flat = self._ranks.index(rank)
        except ValueError:
            return None
        return tuple((flat // st) % sz for st, sz in zip(self._strides, self._shape))

    def _dim_groups_ranks(self, mesh_dim: int) -> list[list[int]]:
        """Every group of ranks along ``mesh_dim`` (other coordinates fixed), in order."""
        other = [range(s) for i, s in enumerate(self._shape) if i != mesh_dim]
        out = []
        for fixed in itertools.product(*other):
            coord = list(fixed)
            coord.insert(mesh_dim, 0)
            members = []
            for k in range(self._shape[mesh_dim]):
                coord[mesh_dim] = k
                members.append(self._ranks[sum(c * st for c, st in zip(coord, self._strides))])
            out.append(members)
        return out

    def _create_groups(self, timeout: Any = None) -> list[Any]:
        assert self._platform is not None
        groups: list[Any] = []
        for d in range(self.ndim):
            mine = None
            for members in self._dim_groups_ranks(d):
                g = self._platform.new_group(members, timeout)  # collective: every rank calls it
                if self._rank in members:
                    mine = g
            groups.append(mine)
        return groups

    # ------------------------------------------------------------------ queries
    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape."""
        return self._shape

    @property
    def ndim(self) -> int:
        """Number of mesh dimensions."""
        return len(self._shape)

    @property
    def mesh(self) -> Any:
        """The ranks in the mesh's shape: a framework integer tensor on a concrete mesh (as
        PyTorch's ``DeviceMesh.mesh``: ``mesh.mesh.tolist()``, ``mesh.mesh[0]``), a nested
        list on an abstract one."""
        nested = self._nested()
        return nested if self._platform is None else self._platform.rank_tensor(nested)

    def _nested(self) -> list[Any]:
        """The ranks as a nested list of the mesh's shape."""
        nested: Any = list(self._ranks)
        for s in reversed(self._shape[1:]):
            nested = [nested[i : i + s] for i in range(0, len(nested), s)]
        return nested

    @property
    def ranks(self) -> tuple[int, ...]:
        """All ranks of the mesh, row-major."""
        return self._ranks

    @property
    def platform(self) -> Platform:
        """The platform that runs this mesh's collectives.

        Raises:
            RuntimeError: the mesh is abstract.
        """
        if self._platform is None:
            raise RuntimeError(
                f"{self!r} is abstract (no process group); build it with init_device_mesh "
                f"to run collectives or hold tensors"
            )
        return self._platform

    @property
    def is_abstract(self) -> bool:
        """True for a mesh with no platform and no process group."""
        return self._platform is None

    def size(self, mesh_dim: int | None = None) -> int:
        """Number of ranks in the mesh, or along ``mesh_dim``."""
        return math.prod(self._shape) if mesh_dim is None else self._shape[mesh_dim]

    def get_rank(self) -> int:
        """This process's global rank."""
        return self._rank

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinate in the mesh, or None if it is not in the mesh."""
        return self._coordinate

    def _is_current_rank_part_of_mesh(self) -> bool:
        """True when this rank has a coordinate in the mesh (PyTorch's name)."""
        return self._coordinate is not None

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (index or name)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise MeshError(
                    f"Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > "
                    f"1. get_local_rank(): the DeviceMesh has {self.ndim} dimensions"
                )
            mesh_dim = 0
        d = self._dim_index(mesh_dim)
        if self._coordinate is None:
            raise RuntimeError(f"rank {self._rank} is not in {self!r}")
        return self._coordinate[d]

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """The process group of this rank along ``mesh_dim``, as the framework's own
        collectives take it (as PyTorch's ``DeviceMesh.get_group``: a torch
        ``ProcessGroup`` for ``torch.distributed.all_reduce(t, group=...)``; on MindSpore
        the group object whose ``name`` MindSpore's communication takes).

        A rank outside the mesh (``DeviceMesh("cpu", [0, 2])`` on rank 1) gets ``None``, as
        PyTorch since pytorch/pytorch#118614.

        Raises:
            RuntimeError: the mesh is abstract.
            ValueError: no ``mesh_dim`` on a mesh of more than one dim.
        """
        g = self._group(mesh_dim)
        if self._coordinate is None and not self.is_abstract:
            return None
        assert self._platform is not None
        return self._platform.native_group(g)

    def _group(self, mesh_dim: int | str | None = None) -> Any:
        """hyper_shard's group of this rank along ``mesh_dim`` (ranks + native group)."""
        if self._groups is None:
            if self._detached:
                raise RuntimeError(
                    f"{self!r} was loaded (torch.load) in a process that had not built it: it "
                    f"has no process group; build the mesh (init_device_mesh / DeviceMesh) "
                    f"before loading to run collectives on its DTensors"
                )
            raise RuntimeError(f"{self!r} is abstract: it has no process group")
        if mesh_dim is None:
            if self.ndim != 1:
                raise MeshError(
                    f"Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > "
                    f"1. get_group(): the DeviceMesh has {self.ndim} dimensions (or use "
                    f"get_all_groups())"
                )
            mesh_dim = 0
        return self._groups[self._dim_index(mesh_dim)]

    def get_all_groups(self) -> list[Any]:
        """The process group of every mesh dimension (see :meth:`get_group`)."""
        return [self.get_group(d) for d in range(self.ndim)]

    def _dim_index(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if self.mesh_dim_names is None or mesh_dim not in self.mesh_dim_names:
                raise KeyError(
                    f"mesh dim {mesh_dim!r} not found; this mesh has dims {self.mesh_dim_names}"
                )
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh dim {mesh_dim} out of range for a {self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def __getitem__(self, names: str | int | Iterable[str | int]) -> DeviceMesh:
        """The sub-mesh over the named dimensions that contains this rank (as torch); a dim
        may also be given by its index (``mesh[-1]``, which PyTorch does not take).

        The sub-mesh reuses this mesh's process groups; no group is created.
        """
        if isinstance(names, (str, int)):
            names = (names,)
        names = tuple(names)
        if (
            len(names) == 1
            and isinstance(names[0], str)
            and (self.mesh_dim_names is None or names[0] not in self.mesh_dim_names)
        ):
            flat = flattened(self, names[0])
            if flat is not None:
                return flat
        own = self.mesh_dim_names
        if len(names) > 1 and own is not None and all(isinstance(n, str) for n in names):
            others = [flattened(self, str(n)) for n in names if n not in own]
            if others and all(f is not None for f in others):  # mesh["rep", "shard_cp"]
                return slice_with_flattened(self, [str(n) for n in names])
        dims = [self._dim_index(n) for n in names]
        if len(set(dims)) != len(dims):
            raise ValueError(f"mesh[{names}]: a dimension is named twice")
        return self._sub(dims)

    def _sub(self, dims: Sequence[int]) -> DeviceMesh:
        """The sub-mesh over mesh dims ``dims`` (in that order) containing this rank; it
        reuses this mesh's groups and remembers the root mesh and its dims there
        (``_root``, ``_root_dims``), so sub-meshes of one mesh can be composed again."""
        dims = list(dims)
        if self._coordinate is None:
            raise RuntimeError(f"rank {self._rank} is not in {self!r}")
        names = (
            tuple(self.mesh_dim_names[d] for d in dims) if self.mesh_dim_names is not None else None
        )
        coord = list(self._coordinate)
        sub_shape = [self._shape[d] for d in dims]
        ranks = []
        for idx in itertools.product(*[range(s) for s in sub_shape]):
            for d, i in zip(dims, idx):
                coord[d] = i
            ranks.append(self._ranks[sum(c * st for c, st in zip(coord, self._strides))])
        nested: Any = ranks
        for s in reversed(sub_shape[1:]):
            nested = [nested[i : i + s] for i in range(0, len(nested), s)]
        groups = None if self._groups is None else [self._groups[d] for d in dims]
        sub = DeviceMesh.__new__(DeviceMesh)
        sub.__init__(  # type: ignore[misc]
            self.device_type,
            nested,
            mesh_dim_names=names,
            _rank=self._rank,
            _groups=groups,
            _abstract=True,
            _world=self._world,
        )
        sub._platform = self._platform
        root = self._root if self._root is not None else self
        root_dims = self._root_dims if self._root is not None else tuple(range(self.ndim))
        sub._root = root
        sub._root_dims = tuple(root_dims[d] for d in dims)
        return sub

    def _flatten(self, mesh_dim_name: str | None = None) -> DeviceMesh:
        """This mesh's dims merged into one, row-major (as PyTorch's ``_flatten``): a 1-D
        mesh named ``mesh_dim_name`` (default: the dim names joined by ``"_"``) with its own
        process group, found again as ``root[mesh_dim_name]``. Every rank calls it (it may
        create groups)."""
        return flatten(self, mesh_dim_name)

    @staticmethod
    def from_group(
        group: Any,
        device_type: str,
        mesh: Any = None,
        *,
        mesh_dim_names: Sequence[str] | None = None,
    ) -> DeviceMesh:
        """A mesh over existing framework process groups (as PyTorch's
        ``DeviceMesh.from_group``); see :func:`hyper_shard._mesh_flatten.from_group`."""
        return from_group(group, device_type, mesh, mesh_dim_names=mesh_dim_names)

    # ------------------------------------------------------------------ identity
    def __eq__(self, other: object) -> bool:
        """Same ranks, shape, device type and dim names, seen by the same rank (ranks as
        threads of one process hold one mesh each); a framework's own mesh (a torch
        ``DeviceMesh``) compares by what it converts to, so ``dt.device_mesh == torch_mesh``
        holds as in PyTorch (no collective)."""
        if self is other or (isinstance(other, DeviceMesh) and other._key == self._key):
            return True
        if isinstance(other, DeviceMesh) or other is None or self._platform is None:
            return False
        from ._locator import platform_of_object

        if platform_of_object(other) is None:  # not a framework's own mesh
            return False
        try:
            return as_mesh(other)._key == self._key
        except TypeError:
            return False

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        kind = "abstract " if self._platform is None else ""
        return f"DeviceMesh({kind}{self.device_type!r}, {self._nested()}{names})"


#: platforms' readers of their framework's own innermost ``with mesh:`` (PyTorch's
#: ``DeviceMesh`` is a context manager too), converted; consulted when no hyper_shard mesh
#: is entered
FOREIGN_CURRENT: list[Callable[[], DeviceMesh | None]] = []


def current_mesh() -> DeviceMesh | None:
    """The innermost mesh entered with ``with mesh:`` in this thread/task, or None."""
    stack = _MESH_STACK.get()
    return stack[-1] if stack else None


def as_mesh(mesh: Any, what: str = "this call") -> DeviceMesh:
    """``mesh`` as a hyper_shard DeviceMesh: ``None`` is the mesh of the innermost
    ``with mesh:`` (a hyper_shard mesh's, else a ``torch.distributed`` mesh's, converted);
    a framework's own mesh (a ``torch.distributed.device_mesh.DeviceMesh``)
    is converted by its platform, reusing its process groups (no collective, cached per
    mesh object), so code written for PyTorch DTensor passes its meshes unchanged.

    Raises:
        ValueError: ``None`` outside any ``with mesh:`` block.
        TypeError: an object that is not a mesh of a supported framework.
    """
    if type(mesh) is DeviceMesh or isinstance(mesh, DeviceMesh):
        return mesh
    if mesh is None:
        cur = current_mesh()
        for entered in FOREIGN_CURRENT if cur is None else ():
            cur = entered()  # a framework's own mesh entered with `with torch_mesh:`
            if cur is not None:
                break
        if cur is None:
            raise ValueError(
                f"{what} needs device_mesh: pass one (e.g. init_device_mesh('cpu', "
                f"(world_size,))) or call it inside `with mesh:`"
            )
        return cur
    from ._locator import platform_of_object

    plat = platform_of_object(mesh)  # a framework's own mesh: its platform converts it
    convert = getattr(plat, "foreign_mesh", None)
    out = convert(mesh) if convert is not None else None
    if out is not None:
        return out
    raise TypeError(
        f"{what}: expected a hyper_shard DeviceMesh (or a torch.distributed.device_mesh."
        f"DeviceMesh), got {type(mesh).__module__}.{type(mesh).__qualname__}"
    )


#: every concrete mesh this process has built, by key (weakly held)
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _rebuild_mesh(
    device_type: str,
    mesh: Any,
    mesh_dim_names: Sequence[str] | None,
    abstract: bool,
    coordinate: Sequence[int] | None = None,
) -> DeviceMesh:
    """Unpickle a DeviceMesh: an abstract one is rebuilt (at the saved coordinate); a
    concrete one is the live mesh of this rank and world with the same ranks, device type
    and dim names. When there is none (a checkpoint opened in another process, as PyTorch
    DTensor allows), the mesh comes back
    *detached*: its description, the platform and the saving rank's ``coordinate``, but no
    process group, so the DTensor's metadata and local shard are usable and a collective
    raises (build the mesh first to run them). Process groups are never made by
    ``torch.load``: creating them is a collective call unpickling cannot make safely.
    """
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    shape, ranks = _flatten(mesh)
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    rank = ranks[sum(c * s for c, s in zip(coordinate, strides))] if coordinate else ranks[0]
    if abstract:
        return DeviceMesh(device_type, mesh, mesh_dim_names=names, _rank=rank, _abstract=True)
    from ._locator import get_platform

    plat = get_platform(None, device_type=device_type)
    live = _LIVE.get((device_type, shape, ranks, names, this_rank(), plat.world_id()))
    if live is not None:  # this rank's mesh of that description, in its current world
        return live
    detached = DeviceMesh(device_type, mesh, mesh_dim_names=names, _rank=rank, _abstract=True)
    detached._platform = plat
    detached._detached = True
    return detached


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    *,
    mesh_dim_names: Sequence[str] | None = None,
    platform: str | Platform | None = None,
    timeout: Any = None,
) -> DeviceMesh:
    """Build a DeviceMesh of ``mesh_shape`` over all ranks (as ``torch.distributed.device_mesh
    .init_device_mesh``), initialising the default process group from the launcher's
    environment (torchrun/msrun) if needed.

    Args:
        device_type: ``"cpu"``/``"cuda"``/``"npu"`` for torch; ``"CPU"``/``"GPU"``/``"Ascend"``
            for MindSpore.
        mesh_shape: the mesh shape; its product must equal the world size.
        mesh_dim_names: optional names, one per mesh dimension.
        platform: ``"torch"`` or ``"mindspore"``; default as :func:`get_platform`.
        timeout: the collective timeout of the mesh's process groups, and of the default
            group when this call initialises it (a ``datetime.timedelta`` or seconds);
            default ``HYPER_SHARD_TIMEOUT`` seconds, else 10 minutes. A collective that
            waits longer raises :class:`~hyper_shard.errors.CollectiveError` on every
            surviving rank (docs/troubleshooting.md).

    Raises:
        MeshError: (a ``ValueError`` and, as PyTorch raises there, a ``RuntimeError``) the
            product of ``mesh_shape`` differs from the world size, or ``device_type`` names
            a device index (``"cuda:0"``).
        ValueError: a timeout that is not positive.
        TypeError: a timeout that is neither a timedelta nor a number.
    """
    from ._locator import get_platform

    if isinstance(device_type, str) and ":" in device_type:
        raise MeshError(
            f"init_device_mesh: Device type with index is not supported but got {device_type}; "
            f"pass the type alone ({device_type.split(':')[0]!r}, or a torch.device's .type)"
        )
    plat = get_platform(platform, device_type=device_type)
    plat.ensure_initialized(device_type, timeout)
    world = plat.get_world_size()
    if math.prod(mesh_shape) != world:
        raise MeshError(
            f"init_device_mesh: mesh_shape {tuple(mesh_shape)} has {math.prod(mesh_shape)} ranks "
            f"but the world has {world}; choose a shape whose product is {world}"
        )
    nested: Any = list(range(world))
    for s in reversed(list(mesh_shape)[1:]):
        nested = [nested[i : i + s] for i in range(0, len(nested), s)]
    return DeviceMesh(
        device_type, nested, mesh_dim_names=mesh_dim_names, platform=plat, timeout=timeout
    )
