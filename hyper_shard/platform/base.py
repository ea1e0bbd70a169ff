"""The Platform protocol: everything the framework-neutral core asks of a framework.

A platform (torch, MindSpore) provides:

* process-group management (``ensure_initialized``, ``get_rank``, ``new_group``...);
* a handful of local tensor primitives the redistribution executor composes
  (``narrow``, ``cat``, ``pad_dim``, ``embed``...), all differentiable-agnostic: the
  executor runs them inside :meth:`custom_autograd`, never under the framework's tape;
* local math the framework-neutral kernels (:mod:`hyper_shard.kernels`) are written with
  (``exp``, ``log``, ``amax``, ``sum``, ``gather``, ``where``, ``softmax``...): plain local
  tensors in and out, recorded by the framework's own autograd; arithmetic, comparisons
  and ``&``/``~`` use the tensors' Python operators, which both frameworks share;
* collectives on a group (``all_gather``, ``all_reduce`` and, where the device has them,
  ``reduce_scatter`` and ``all_to_all``), with the set of native ones declared in
  ``native_collectives`` so the cost model prices composed ones honestly;
* ``custom_autograd(fwd, bwd, x)``: run ``fwd`` on a local tensor and register ``bwd`` as
  its backward, so redistribution, ``to_local`` and ``from_local`` are autograd-correct;
* its DTensor class and how to wrap a local tensor into it.

Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..redistribute.cost import COLLECTIVES, DEFAULT_COST_MODEL, CostModel

__all__ = ["Platform", "GroupRanks"]


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


class Platform:
    """Base class of the framework platforms. Subclasses implement every method."""

    name: str = "abstract"
    #: collectives the backend runs natively; the others are composed by the executor.
    #: whether the framework's view ops return views that share memory with their input
    #: (torch: yes), so that views of DTensors are linked to their base
    #: (:mod:`hyper_shard.dispatch.views`)
    view_semantics: bool = False
    native_collectives: frozenset[str] = COLLECTIVES
    #: the exceptions the backend raises for a failed collective (timeout, lost peer):
    #: turned into CollectiveError by :func:`hyper_shard.flight.collective`
    comm_errors: tuple[type[BaseException], ...] = ()

    def tracing(self) -> bool:
        """Whether a compiler is recording this platform's calls right now (no data-dependent
        communication then: e.g. ``from_local`` assumes even shards, as PyTorch DTensor)."""
        return False

    # ------------------------------------------------------------ process groups
    def ensure_initialized(self, device_type: str, timeout: Any = None) -> None:
        """Initialise the default process group from the launcher's environment if needed,
        with ``timeout`` (a timedelta or seconds; None: :mod:`hyper_shard.platform.timeouts`)
        where the backend takes one."""
        raise NotImplementedError

    def get_rank(self) -> int:
        raise NotImplementedError

    def get_world_size(self) -> int:
        raise NotImplementedError

    def new_group(self, ranks: Sequence[int], timeout: Any = None) -> Any:
        """Create a process group over ``ranks`` (called by every rank, in the same order)
        whose collectives fail after ``timeout`` where the backend supports one."""
        raise NotImplementedError

    def cost_model(self, mesh: Any) -> CostModel:
        """The cost model for collectives on ``mesh`` (default alpha/beta, native set)."""
        return DEFAULT_COST_MODEL.with_native(self.native_collectives_for(mesh))

    def native_collectives_for(self, mesh: Any) -> frozenset[str]:
        return self.native_collectives

    # ------------------------------------------------------------ local primitives
    def shape(self, t: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def narrow(self, t: Any, dim: int, start: int, length: int) -> Any:
        raise NotImplementedError

    def cat(self, ts: Sequence[Any], dim: int) -> Any:
        raise NotImplementedError

    def pad_dim(self, t: Any, dim: int, size: int) -> Any:
        """Zero-pad ``t`` at the end of ``dim`` to ``size``."""
        raise NotImplementedError

    def embed(self, t: Any, dim: int, start: int, extent: int) -> Any:
        """Zeros with ``extent`` along ``dim`` and ``t`` placed at ``start``."""
        raise NotImplementedError

    def zeros_like(self, t: Any) -> Any:
        raise NotImplementedError

    def ones_like(self, t: Any) -> Any:
        raise NotImplementedError

    def scale(self, t: Any, factor: float) -> Any:
        raise NotImplementedError

    def eq_mask(self, a: Any, b: Any) -> Any:
        """``a == b`` as a tensor of ``a``'s dtype (1 where equal, 0 elsewhere)."""
        raise NotImplementedError

    def mul(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def div(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------ local math (kernels)
    # Plain local tensors in and out, differentiable by the framework's own autograd.
    # Semantics follow torch's functions of the same name (dims may be negative).
    def exp(self, t: Any) -> Any:
        raise NotImplementedError

    def log(self, t: Any) -> Any:
        raise NotImplementedError

    def amax(self, t: Any, dim: int | Sequence[int], keepdim: bool = False) -> Any:
        """The maximum over ``dim`` (an int or a sequence), as ``torch.amax``."""
        raise NotImplementedError

    def amin(self, t: Any, dim: int | Sequence[int], keepdim: bool = False) -> Any:
        raise NotImplementedError

    def sum(self, t: Any, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
        """The sum over ``dim`` (None: every element, a 0-d result), as ``torch.sum``."""
        raise NotImplementedError

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """``a`` where ``cond`` else ``b`` (``b`` may be a python scalar), as ``torch.where``."""
        raise NotImplementedError

    def gather(self, t: Any, dim: int, index: Any) -> Any:
        """As ``torch.gather(t, dim, index)``: ``out[i][j] = t[i][index[i][j]]`` along ``dim``."""
        raise NotImplementedError

    def take_rows(self, t: Any, index: Any) -> Any:
        """``t[index]``: rows of ``t`` along dim 0 picked by an integer tensor of any shape."""
        raise NotImplementedError

    def stack(self, ts: Sequence[Any], dim: int) -> Any:
        raise NotImplementedError

    def select(self, t: Any, dim: int, index: int) -> Any:
        """``t`` at ``index`` along ``dim``, which is removed (as ``torch.select``)."""
        raise NotImplementedError

    def unsqueeze(self, t: Any, dim: int) -> Any:
        raise NotImplementedError

    def squeeze(self, t: Any, dim: int) -> Any:
        raise NotImplementedError

    def transpose(self, t: Any, dim0: int, dim1: int) -> Any:
        raise NotImplementedError

    def movedim(self, t: Any, source: int, destination: int) -> Any:
        """``t`` with dim ``source`` moved to ``destination`` (a view; as ``torch.movedim``)."""
        raise NotImplementedError

    def matmul(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def softmax(self, t: Any, dim: int) -> Any:
        raise NotImplementedError

    def isfinite(self, t: Any) -> Any:
        raise NotImplementedError

    def repeat_interleave(self, t: Any, repeats: int, dim: int) -> Any:
        raise NotImplementedError

    def full(self, shape: Sequence[int], value: Any, like: Any, dtype: Any = None) -> Any:
        """A new tensor of ``shape`` filled with ``value``, with ``like``'s dtype (or
        ``dtype``) and device."""
        raise NotImplementedError

    def arange(self, start: int, end: int, like: Any) -> Any:
        """The integers ``[start, end)`` (int64) on ``like``'s device."""
        raise NotImplementedError

    def clone(self, t: Any) -> Any:
        """An owned contiguous copy of local ``t`` (differentiable; never a view)."""
        raise NotImplementedError(f"{type(self).__name__} cannot clone local tensors")

    def dropout(self, t: Any, p: float) -> Any:
        """The framework's own training-mode dropout of ``t`` (``input * mask / (1 - p)``),
        drawn from its default generator."""
        raise NotImplementedError

    def no_grad(self) -> AbstractContextManager[Any]:
        """A context in which the framework records no gradients."""
        raise NotImplementedError

    def is_dtype(self, obj: Any) -> bool:
        """True if ``obj`` is one of the framework's dtypes."""
        raise NotImplementedError

    def dtype_of(self, t: Any) -> Any:
        raise NotImplementedError

    def loss_precision(self, t: Any) -> Any:
        """``t`` in the precision the framework's autocast runs losses in (torch: float32
        for a half-precision input while autocast is on); ``t`` itself otherwise."""
        return t

    def set_requires_grad(self, t: Any) -> Any:
        """Mark a new local tensor as requiring gradients (where the framework records it
        on tensors); returns ``t``."""
        return t

    def assign(self, dst: Any, src: Any, no_grad: bool = False) -> Any:
        """Write ``src``'s values into the plain local tensor ``dst`` in place; returns
        ``dst``. ``no_grad``: outside autograd (as ``nn.init`` writes)."""
        raise NotImplementedError

    def inplace_mul(self, dst: Any, other: Any) -> Any:
        """``dst *= other`` in place; returns ``dst``."""
        raise NotImplementedError

    def put_rows_(self, dst: Any, index: Any, rows: Any) -> Any:
        """``dst[index] = rows`` in place along dim 0, outside autograd (``index`` a 1-D
        integer tensor, duplicates only with equal rows; ``rows`` of shape
        ``(len(index), *dst.shape[1:])``); returns ``dst``."""
        raise NotImplementedError

    # ------------------------------------------------------------ collectives
    def all_gather(self, t: Any, group: Any, n: int) -> list[Any]:
        """Every rank's ``t`` (same shape on every rank), in group-rank order."""
        raise NotImplementedError

    def all_reduce(self, t: Any, op: str, group: Any) -> Any:
        """A new tensor: the reduction (``sum``/``avg``/``max``/``min``/``prod``) of ``t``."""
        raise NotImplementedError

    def reduce_scatter(self, pieces: Sequence[Any], op: str, group: Any) -> Any:
        """Piece ``i`` reduced over the group lands on group rank ``i`` (native only)."""
        raise NotImplementedError

    def all_to_all(self, pieces: Sequence[Any], group: Any) -> list[Any]:
        """Piece ``i`` goes to group rank ``i``; returns the pieces received (native only)."""
        raise NotImplementedError

    def broadcast(self, t: Any, src_group_rank: int, group: Any) -> Any:
        raise NotImplementedError

    def all_gather_object(self, obj: Any, group: Any, n: int) -> list[Any]:
        """Every rank's small python object, in group-rank order."""
        raise NotImplementedError

    # ------------------------------------------------------------ flat buffers (FSDP)
    # Used by :mod:`hyper_shard.fsdp`: one collective per unit over a flat 1-D buffer.
    # Every "flat" tensor is 1-D and contiguous; chunks are in mesh-coordinate order.
    def empty_flat(self, numel: int, dtype: Any, like: Any) -> Any:
        """An uninitialised 1-D tensor of ``numel`` elements of ``dtype`` on ``like``'s
        device (a plain tensor, outside autograd)."""
        raise NotImplementedError

    def reshape(self, t: Any, shape: Sequence[int]) -> Any:
        """``t`` viewed with ``shape`` (same elements, row-major; a view where possible)."""
        raise NotImplementedError

    def copy_flat(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` in place, element for element in row-major order (``dst``
        contiguous; ``src`` cast to ``dst``'s dtype; same number of elements), outside
        autograd."""
        raise NotImplementedError

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
        storage resizing may leave the memory allocated."""

    def alloc_storage(self, t: Any) -> None:
        """Give a tensor freed by :meth:`free_storage` its memory back (contents undefined)."""

    def all_gather_into(self, out: Any, inp: Any, group: Any, async_op: bool = False) -> Any:
        """All-gather flat ``inp`` (``k`` elements) into flat ``out`` (``n * k``), chunk
        ``c`` from mesh coordinate ``c``. ``inp`` may be a view of ``out``'s own chunk.

        Returns a handle whose ``wait()`` completes the collective when ``async_op`` and
        the backend runs it asynchronously, else None (already complete)."""
        n = len(group.ranks) if hasattr(group, "ranks") else 1
        parts = self.all_gather(inp, group, n)
        k = self.shape(inp)[0]
        for c, p in enumerate(parts):
            self.copy_flat(self.narrow(out, 0, c * k, k), p)
        return None

    def reduce_scatter_into(
        self, out: Any, inp: Any, op: str, group: Any, async_op: bool = False
    ) -> Any:
        """Reduce (``sum``/``avg``) flat ``inp`` (``n * k`` elements, chunk ``c`` for mesh
        coordinate ``c``) over the group; this rank's chunk lands in flat ``out`` (``k``).
        Composed from an all-reduce where the backend has no reduce-scatter. Returns a
        handle or None as :meth:`all_gather_into`."""
        k = self.shape(out)[0]
        c = list(group.ranks).index(self.get_rank()) if hasattr(group, "ranks") else 0
        full = self.all_reduce(inp, op, group)
        self.copy_flat(out, self.narrow(full, 0, c * k, k))
        return None

    def all_reduce_into(self, t: Any, op: str, group: Any, async_op: bool = False) -> Any:
        """All-reduce flat ``t`` in place (``sum``/``avg``...). Returns a handle or None."""
        self.copy_flat(t, self.all_reduce(t, op, group))
        return None

    def all_gather_bytes(self, data: bytes, group: Any, n: int) -> list[bytes]:
        """Every rank's ``data`` (the same length, a multiple of 4, on every rank), in
        mesh-coordinate order: one small all-gather, not recorded (the consistency mode's
        fingerprint exchange)."""
        raise NotImplementedError

    # ------------------------------------------------------------ autograd & wrapping
    def custom_autograd(self, fwd: Callable[[Any], Any], bwd: Callable[[Any], Any], x: Any) -> Any:
        """``fwd(x)`` recorded as one autograd node whose backward is ``bwd(grad)``."""
        raise NotImplementedError

    def alias_autograd(self, bwd: Callable[[Any], Any], x: Any) -> Any:
        """An alias of ``x`` (same data, no copy) recorded as one autograd node whose
        backward is ``bwd(grad)``, that may be modified in place as a tensor of its own (as
        ``DTensor.from_local``'s result may, in PyTorch). Default: the identity
        :meth:`custom_autograd`."""
        return self.custom_autograd(lambda t: t, bwd, x)

    def requires_grad(self, t: Any) -> bool:
        raise NotImplementedError

    def native_group(self, group: Any) -> Any:
        """What ``DeviceMesh.get_group`` hands users: the framework's own group object
        (default: hyper_shard's group itself)."""
        return group

    def group_from_native(self, native: Any) -> Any:
        """hyper_shard's group over a framework process group a user made (for
        ``DeviceMesh.from_group``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot build a mesh from a group")

    def rank_tensor(self, nested: list[Any]) -> Any:
        """``DeviceMesh.mesh``: the ranks (a nested list) as the framework shows them
        (default: the nested list itself)."""
        return nested

    def cast(self, t: Any, dtype: Any) -> Any:
        """``t`` converted to ``dtype`` (differentiable; a plain local tensor)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot cast local tensors (forward_dtype/backward_dtype)"
        )

    def wrap(self, local: Any, spec: Any) -> Any:
        """Wrap a local tensor (keeping its autograd history) as this platform's DTensor."""
        raise NotImplementedError

    def make_leaf(self, local: Any, spec: Any, requires_grad: bool) -> Any:
        """A new autograd leaf DTensor over ``local``'s data."""
        raise NotImplementedError

    def local_of(self, dt: Any) -> Any:
        """The local tensor of a DTensor as a plain framework tensor (alias, keeps autograd)."""
        raise NotImplementedError

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> Any:
        """TensorMeta of a plain tensor (global ``shape`` if given, else ``t``'s)."""
        raise NotImplementedError

    def is_tensor(self, obj: Any) -> bool:
        raise NotImplementedError

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
        raise NotImplementedError(
            f"{type(self).__name__} cannot compute an op's output shapes without data"
        )

    def version(self, t: Any) -> int | None:
        """A counter that changes whenever ``t``'s data is written in place, or None if the
        framework has none (then nothing is memoised)."""
        return None

    def copy_into(self, dst: Any, src: Any) -> None:
        """Copy DTensor ``src``'s local data into DTensor ``dst``'s (same layout), in place."""
        raise NotImplementedError

    def shares_storage(self, a: Any, b: Any) -> bool:
        """Whether local tensors ``a`` and ``b`` are views of the same memory (default:
        False, for a framework that does not say)."""
        return False

    def copy_plain(self, dst: Any, src: Any) -> None:
        """``dst`` (a plain local tensor, possibly a view) overwritten in place with ``src``
        (differentiable)."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy into local tensors")

    def detach(self, t: Any) -> Any:
        raise NotImplementedError

    def contiguous(self, t: Any) -> Any:
        raise NotImplementedError

    def new_tensor(
        self, kind: str, shape: Sequence[int], fill_value: Any, dtype: Any, device: Any = None
    ) -> Any:
        """A new plain tensor (kind: zeros/ones/empty/full/rand/randn) on the mesh's device
        type ``device``."""
        raise NotImplementedError
