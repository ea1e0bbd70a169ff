"""What the framework-neutral core asks of a framework: five small protocols, one Platform.

A framework (torch, MindSpore, a test's simulated one) is one object that implements

* :class:`Comm` — process groups, its *native* collectives (``native_collectives``, asked
  with :meth:`Comm.has`), capabilities (``async_collectives``) and the cost model; a
  collective it lacks is composed once, for every platform, in
  :mod:`hyper_shard.platform.compose` (reduce-scatter from all-reduce or all-gather,
  all-to-all from send/recv or all-gather) and priced as such by the planner;
* :class:`LocalOps` (:mod:`hyper_shard.platform.local_ops`) — the local tensor primitives
  the executor, the composed collectives and the neutral kernels
  (:mod:`hyper_shard.kernels`) are written with (``narrow``,
  ``cat``, ``exp``, ``amax``, ``gather``, ``where``...): plain local tensors in and out,
  recorded by the framework's own autograd; arithmetic, comparisons and ``&``/``~`` use
  the tensors' Python operators, which both frameworks share;
* :class:`Autograd` — ``custom_autograd(fwd, bwd, x)`` and ``alias_autograd``: one node
  with a given backward, so redistribution, ``to_local`` and ``from_local`` are
  autograd-correct; whether a tensor records gradients; whether a compiler is tracing;
* :class:`FlatBuffers` — FSDP's flat 1-D buffers: allocation, packing, storage release and
  the flat collectives (``all_gather_into``, ``reduce_scatter_into``...);
* :class:`Wrapping` — its DTensor class: wrapping a local tensor, leaves, the local tensor
  of a DTensor, metadata, op schemas.

:class:`Platform` is all five (a framework subclasses it). Each function of the core takes
the narrowest protocol it uses (``plat: LocalOps``, ``plat: CommOps``...), so what a
caller needs of a framework is written in its signature and checked by mypy.

Why ``typing.Protocol`` and one object: a protocol is structural (a test double or a new
framework satisfies ``LocalOps`` by having the methods, with no registration or base
class), costs nothing at run time (no ``isinstance`` on the hot path) and mypy checks
every call site against it; one object implementing all five keeps every call one
attribute lookup (``plat.local_of(x)``, not ``plat.wrapping.local_of(x)``) on the
dispatch hot path. The defaults below raise ``NotImplementedError`` (or compose), so a
partial platform fails loudly at the first missing primitive.

Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..redistribute.cost import COLLECTIVES, DEFAULT_COST_MODEL, CostModel
from . import compose
from .local_ops import LocalOps, unimplemented

if TYPE_CHECKING:
    from ..mesh import DeviceMesh
    from ..spec import DTensorSpec, TensorMeta

__all__ = [
    "Comm",
    "LocalOps",
    "Autograd",
    "FlatBuffers",
    "Wrapping",
    "CommOps",
    "Runtime",
    "Platform",
    "GroupRanks",
    "REQUIRED_COLLECTIVES",
]

#: the collectives every platform runs natively (the others may be composed from them)
REQUIRED_COLLECTIVES = frozenset({"all_gather", "all_reduce"})


class GroupRanks:
    """A communication group's ranks in mesh-coordinate order, and the map to the backend's
    group-rank order (backends order a group's ranks ascending; a mesh need not)."""

    __slots__ = ("ranks", "order", "identity")

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = tuple(ranks)
        srt = sorted(self.ranks)
        self.order = tuple(srt.index(r) for r in self.ranks)  # coordinate -> group rank
        self.identity = self.order == tuple(range(len(self.ranks)))

    def to_coord_order(self, xs: list[Any]) -> list[Any]:
        """Per-group-rank results reordered by mesh coordinate."""
        return xs if self.identity else [xs[g] for g in self.order]

    def to_group_order(self, xs: Sequence[Any]) -> list[Any]:
        """Per-coordinate inputs reordered by group rank."""
        if self.identity:
            return list(xs)
        out: list[Any] = [None] * len(xs)
        for c, g in enumerate(self.order):
            out[g] = xs[c]
        return out


# ---------------------------------------------------------------------- communication
class Comm(Protocol):
    """Process groups, native collectives and what the backend can do.

    Groups are the platform's own objects with a ``ranks`` attribute (a
    :class:`GroupRanks`); every collective takes and returns tensors in mesh-coordinate
    order. ``native_collectives`` names the collectives the backend runs itself, among
    ``all_gather``, ``all_reduce`` (both required), ``reduce_scatter``, ``all_to_all``,
    ``all_to_all_v`` (rows in pieces of any sizes) and ``send_recv`` (a paired
    point-to-point exchange); the executor, the kernels and FSDP
    call the composed forms (:mod:`hyper_shard.platform.compose`), which use a native one
    where it exists.
    """

    #: collectives the backend runs natively (see the class docstring)
    native_collectives: frozenset[str] = COLLECTIVES
    #: whether the flat collectives (``*_into(..., async_op=True)``) can run asynchronously
    #: and return a handle whose ``wait()`` completes them (FSDP prefetches with them)
    async_collectives: bool = False
    #: whether :meth:`send_recv_start` returns before the exchange completes, so local
    #: compute overlaps it (ring attention's cost model credits the overlap)
    async_point_to_point: bool = False
    #: the exceptions the backend raises for a failed collective (timeout, lost peer):
    #: turned into CollectiveError by :func:`hyper_shard.flight.collective`
    comm_errors: tuple[type[BaseException], ...] = ()

    def has(self, collective: str) -> bool:
        """Whether the backend runs ``collective`` natively (``"all_to_all"``...)."""
        return collective in self.native_collectives

    def ensure_initialized(self, device_type: str, timeout: Any = None) -> None:
        """Initialise the default process group from the launcher's environment if needed,
        with ``timeout`` (a timedelta or seconds; None: :mod:`hyper_shard.platform.timeouts`)
        where the backend takes one."""
        unimplemented(self, "ensure_initialized")

    def get_rank(self) -> int:
        unimplemented(self, "get_rank")

    def get_world_size(self) -> int:
        unimplemented(self, "get_world_size")

    def world_id(self) -> Any:
        """A hashable id of the calling rank's current world (its default process group):
        it differs after the world is destroyed and made again, so a mesh built in the new
        world is another mesh than an equal one of the old (whose process groups are gone)
        and no cached decision or plan carries the old one's groups. Default None (a world
        that lives as long as the process)."""
        return None

    def ranks_are_threads(self) -> bool:
        """True when the ranks of the world are threads of this process sharing its
        generator (PyTorch's threaded process group, a simulated platform): the RNG tracker
        then draws each random op once for them all (:mod:`hyper_shard.random`). Default
        False (one rank per process)."""
        return False

    def new_group(self, ranks: Sequence[int], timeout: Any = None) -> Any:
        """Create a process group over ``ranks`` (called by every rank, in the same order)
        whose collectives fail after ``timeout`` where the backend supports one."""
        unimplemented(self, "new_group")

    def native_group(self, group: Any) -> Any:
        """What ``DeviceMesh.get_group`` hands users: the framework's own group object
        (default: hyper_shard's group itself)."""
        return group

    def group_from_native(self, native: Any) -> Any:
        """hyper_shard's group over a framework process group a user made (for
        ``DeviceMesh.from_group``)."""
        unimplemented(self, "group_from_native", "cannot build a mesh from a group")

    def foreign_mesh(self, mesh: Any) -> DeviceMesh | None:
        """The framework's own device-mesh object as a hyper_shard DeviceMesh over the same
        process groups, or None for anything else (default: None)."""
        return None

    def rank_tensor(self, nested: list[Any]) -> Any:
        """``DeviceMesh.mesh``: the ranks (a nested list) as the framework shows them
        (default: the nested list itself)."""
        return nested

    def cost_model(self, mesh: Any) -> CostModel:
        """The alpha-beta cost model for collectives on ``mesh`` (default constants, this
        platform's native set: composed collectives are priced as their composition)."""
        return DEFAULT_COST_MODEL.with_native(self.native_collectives)

    def all_gather(self, t: Any, group: Any, n: int) -> list[Any]:
        """Every rank's ``t`` (same shape on every rank), in mesh-coordinate order."""
        unimplemented(self, "all_gather")

    def all_reduce(self, t: Any, op: str, group: Any) -> Any:
        """A new tensor: the reduction (``sum``/``avg``/``max``/``min``/``prod``) of ``t``."""
        unimplemented(self, "all_reduce")

    def reduce_scatter(self, pieces: Sequence[Any], op: str, group: Any) -> Any:
        """Native only: piece ``c`` (equal shapes) reduced over the group lands on mesh
        coordinate ``c``. Callers use :func:`hyper_shard.platform.compose.reduce_scatter`."""
        unimplemented(self, "reduce_scatter")

    def all_to_all(self, pieces: Sequence[Any], group: Any) -> list[Any]:
        """Native only: piece ``c`` goes to coordinate ``c``; returns the pieces received,
        by sender. Callers use :func:`hyper_shard.platform.compose.all_to_all`."""
        unimplemented(self, "all_to_all")

    def all_to_all_v(
        self, t: Any, send_sizes: Sequence[int], recv_sizes: Sequence[int], group: Any
    ) -> Any:
        """Native only: ``t``'s rows in pieces of ``send_sizes`` (dim 0, one per mesh
        coordinate) go to their coordinates; returns the rows received, ``recv_sizes[c]``
        from coordinate ``c`` in turn. Callers use
        :func:`hyper_shard.platform.compose.all_to_all_v`."""
        unimplemented(self, "all_to_all_v")

    def send_recv(self, t: Any, dst: int, like: Any, src: int, group: Any) -> Any:
        """Native only: send ``t`` to mesh coordinate ``dst`` of the group and receive, at
        the same time (no deadlock whatever the pairing), a tensor shaped and typed like
        ``like`` from coordinate ``src``; returns it."""
        unimplemented(self, "send_recv")

    def send_recv_start(
        self, t: Any, dst: int, like: Any, src: int, group: Any, tag: int = 0
    ) -> Any:
        """Native only: start :meth:`send_recv` (``tag`` tells concurrent exchanges between
        the same ranks apart); returns a handle whose ``wait()`` gives the received tensor.
        Default: the synchronous exchange, already complete. Callers use
        :func:`hyper_shard.platform.compose.shift_start`."""
        return compose.Done(self.send_recv(t, dst, like, src, group))

    def broadcast(self, t: Any, src_group_rank: int, group: Any) -> Any:
        unimplemented(self, "broadcast")

    def all_gather_object(self, obj: Any, group: Any, n: int) -> list[Any]:
        """Every rank's small python object, in mesh-coordinate order."""
        unimplemented(self, "all_gather_object")

    def all_gather_bytes(self, data: bytes, group: Any, n: int) -> list[bytes]:
        """Every rank's ``data`` (the same length, a multiple of 4, on every rank), in
        mesh-coordinate order: one small all-gather, not recorded (the consistency mode's
        fingerprint exchange)."""
        unimplemented(self, "all_gather_bytes")


# ---------------------------------------------------------------------- autograd
class Autograd(Protocol):
    """The framework's autograd, as the executor, ``from_local``/``to_local`` and the
    kernels use it."""

    def custom_autograd(self, fwd: Callable[[Any], Any], bwd: Callable[[Any], Any], x: Any) -> Any:
        """``fwd(x)`` recorded as one autograd node whose backward is ``bwd(grad)``."""
        unimplemented(self, "custom_autograd")

    def custom_autograd_n(
        self, fwd: Callable[..., Any], bwd: Callable[[Any], Sequence[Any]], inputs: Sequence[Any]
    ) -> Any:
        """``fwd(*inputs)`` (one tensor) recorded as one autograd node over several inputs,
        whose backward is ``bwd(grad)``: one gradient per input (None for an input that
        gets none). ``fwd`` runs outside autograd."""
        unimplemented(self, "custom_autograd_n")

    def alias_autograd(self, bwd: Callable[[Any], Any], x: Any) -> Any:
        """An alias of ``x`` (same data, no copy) recorded as one autograd node whose
        backward is ``bwd(grad)``, that may be modified in place as a tensor of its own (as
        ``DTensor.from_local``'s result may, in PyTorch). Default: the identity
        :meth:`custom_autograd`."""
        return self.custom_autograd(lambda t: t, bwd, x)

    def requires_grad(self, t: Any) -> bool:
        """Whether ``t`` takes part in a gradient computation right now."""
        unimplemented(self, "requires_grad")

    def set_requires_grad(self, t: Any) -> Any:
        """Mark a new local tensor as requiring gradients (where the framework records it
        on tensors); returns ``t``."""
        return t

    def tracing(self) -> bool:
        """Whether a compiler is recording this platform's calls right now (no data-dependent
        communication then: e.g. ``from_local`` assumes even shards, as PyTorch DTensor)."""
        return False


# ---------------------------------------------------------------------- DTensor wrapping
class Wrapping(Protocol):
    """The platform's DTensor type: wrapping local tensors, reading them back, metadata."""

    #: whether the framework's view ops return views that share memory with their input
    #: (torch: yes), so that views of DTensors are linked to their base
    #: (:mod:`hyper_shard.dispatch.views`)
    view_semantics: bool = False
    #: ``DTensor.from_local(shape=...)`` needs ``stride=`` too (PyTorch DTensor's rule)
    from_local_needs_stride: bool = False

    def wrap(self, local: Any, spec: DTensorSpec) -> Any:
        """Wrap a local tensor (keeping its autograd history) as this platform's DTensor."""
        unimplemented(self, "wrap")

    def make_leaf(self, local: Any, spec: DTensorSpec, requires_grad: bool) -> Any:
        """A new autograd leaf DTensor over ``local``'s data."""
        unimplemented(self, "make_leaf")

    def local_of(self, dt: Any) -> Any:
        """The local tensor of a DTensor as a plain framework tensor (alias, keeps autograd)."""
        unimplemented(self, "local_of")

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> TensorMeta:
        """TensorMeta of a plain tensor (global ``shape`` if given, else ``t``'s)."""
        unimplemented(self, "tensor_meta")

    def copy_into(self, dst: Any, src: Any) -> None:
        """Copy DTensor ``src``'s local data into DTensor ``dst``'s (same layout), in place."""
        unimplemented(self, "copy_into")

    def version(self, t: Any) -> int | None:
        """A counter that changes whenever ``t``'s data is written in place, or None if the
        framework has none (then nothing is memoised)."""
        return None

    def shares_storage(self, a: Any, b: Any) -> bool:
        """Whether local tensors ``a`` and ``b`` are views of the same memory (default:
        False, for a framework that does not say)."""
        return False

    def op_schema(self, op: Any) -> Any:
        """What :func:`hyper_shard.experimental.register_sharding` needs of a framework op:
        an :class:`~hyper_shard._register_sharding.OpSchemaInfo` (the registry names that
        bind it, its argument names, which are tensors, how many tensor outputs).

        Raises:
            TypeError: ``op`` is not an op of this framework that can be registered.
        """
        raise TypeError(
            f"{type(self).__name__}: register_sharding is not available for {op!r} on this "
            f"framework; write a YAML entry with a DistributedOp class (docs/custom_ops.md)"
        )

    def meta_output_shapes(self, func: Any, args: tuple, kwargs: dict) -> list[Any]:
        """The global shapes of ``func``'s tensor outputs (None for a non-tensor output),
        computed without data from the global shapes and dtypes of the DTensor arguments
        (``args``/``kwargs`` hold the DTensors themselves).

        Raises:
            NotImplementedError: the framework cannot run ops without data.
        """
        unimplemented(
            self, "meta_output_shapes", "cannot compute an op's output shapes without data"
        )


# ---------------------------------------------------------------------- combinations
class CommOps(Comm, LocalOps, Protocol):
    """Collectives and local primitives: what the composed collectives
    (:mod:`hyper_shard.platform.compose`) and the executor's steps need."""


class Runtime(CommOps, Autograd, Protocol):
    """Collectives, local primitives and autograd: what differentiable redistribution and
    the neutral kernels need."""


# ---------------------------------------------------------------------- flat buffers
class FlatBuffers(CommOps, Protocol):
    """FSDP's flat buffers: one collective per unit over a flat 1-D buffer. Every "flat"
    tensor is 1-D and contiguous; chunks are in mesh-coordinate order. The ``*_into``
    collectives are native where the platform overrides them (and may then be async, see
    :attr:`Comm.async_collectives`); the defaults here compose them (synchronously)."""

    def empty_flat(self, numel: int, dtype: Any, like: Any) -> Any:
        """An uninitialised 1-D tensor of ``numel`` elements of ``dtype`` on ``like``'s
        device (a plain tensor, outside autograd)."""
        unimplemented(self, "empty_flat")

    def copy_flat(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` in place, element for element in row-major order (``dst``
        contiguous; ``src`` cast to ``dst``'s dtype; same number of elements), outside
        autograd."""
        unimplemented(self, "copy_flat")

    def pack_chunks(self, tensors: Sequence[Any], n: int, out: Any) -> None:
        """Write every tensor's ``n`` dim-0 ``torch.chunk`` pieces, each padded to
        ``ceil(rows / n)`` rows, rank-major into ``out`` (1-D, ``n * S`` elements): chunk
        ``c`` of tensor ``i`` lands at ``c * S + offset_i``, offsets packed in order (the
        reduce-scatter input of a unit). Pad elements are zero. Cast to ``out``'s dtype."""
        S = self.shape(out)[0] // n
        off = 0
        for t in tensors:
            shp = self.shape(t)
            rows = shp[0]
            row = 1
            for s in shp[1:]:
                row *= s
            k = -(-rows // n) if rows else 0
            start = 0
            for c in range(n):
                size = max(0, min(k, rows - c * k))
                slot = self.narrow(out, 0, c * S + off, k * row)
                if size:
                    self.copy_flat(
                        self.narrow(slot, 0, 0, size * row), self.narrow(t, 0, start, size)
                    )
                if size < k:
                    self.copy_flat(
                        self.narrow(slot, 0, size * row, (k - size) * row),
                        self.zeros_like(self.narrow(slot, 0, size * row, (k - size) * row)),
                    )
                start += size
            off += k * row

    def unpack_chunks(self, flat: Any, n: int, outs: Sequence[Any]) -> None:
        """The inverse layout of :meth:`pack_chunks` for outputs of ``n * P_i`` elements:
        ``outs[i][c * P_i : (c + 1) * P_i] = flat[c * S + offset_i : ... + P_i]`` (the
        all-gather output of a unit, split into each parameter's rank-major buffer)."""
        S = self.shape(flat)[0] // n
        sizes = [self.shape(o)[0] // n for o in outs]
        for c in range(n):
            off = 0
            for o, p in zip(outs, sizes):
                self.copy_flat(self.narrow(o, 0, c * p, p), self.narrow(flat, 0, c * S + off, p))
                off += p

    def free_storage(self, t: Any) -> None:
        """Release ``t``'s memory, keeping the tensor object (and every view and autograd
        reference to it) valid for a later :meth:`alloc_storage`. A platform without
        storage resizing may leave the memory allocated (the default)."""
        return None

    def alloc_storage(self, t: Any) -> None:
        """Give a tensor freed by :meth:`free_storage` its memory back (contents undefined)."""
        return None

    def all_gather_into(self, out: Any, inp: Any, group: Any, async_op: bool = False) -> Any:
        """All-gather flat ``inp`` (``k`` elements) into flat ``out`` (``n * k``), chunk
        ``c`` from mesh coordinate ``c``. ``inp`` may be a view of ``out``'s own chunk.

        Returns a handle whose ``wait()`` completes the collective when ``async_op`` and
        the backend runs it asynchronously, else None (already complete)."""
        compose.all_gather_flat(self, out, inp, group)
        return None

    def reduce_scatter_into(
        self, out: Any, inp: Any, op: str, group: Any, async_op: bool = False
    ) -> Any:
        """Reduce (``sum``/``avg``) flat ``inp`` (``n * k`` elements, chunk ``c`` for mesh
        coordinate ``c``) over the group; this rank's chunk lands in flat ``out`` (``k``).
        Default: :func:`hyper_shard.platform.compose.reduce_scatter_flat` (the composition
        shared by every platform). Returns a handle or None as :meth:`all_gather_into`."""
        compose.reduce_scatter_flat(self, out, inp, op, group)
        return None

    def all_reduce_into(self, t: Any, op: str, group: Any, async_op: bool = False) -> Any:
        """All-reduce flat ``t`` in place (``sum``/``avg``...). Returns a handle or None."""
        self.copy_flat(t, self.all_reduce(t, op, group))
        return None


# ---------------------------------------------------------------------- the platform
class Platform(FlatBuffers, Runtime, Wrapping):
    """A framework: every protocol above (a framework subclasses it and implements its
    methods; the defaults raise NotImplementedError or compose).

    Attributes:
        name: the platform's key (``"torch"``, ``"mindspore"``...), for messages and the
            registry's bindings; the core never compares it.
    """

    name: str = "abstract"
