"""A unit's collectives as plain functions: copy-in to a flat buffer, one collective,
copy-out (framework-neutral: every tensor operation goes through the Platform).

Two forms of the same collectives (see [Note: FSDP adapters] in :mod:`._adapter`):

* **buffers** (hook-driven units): copy-in into the all-gather output's own chunk, an
  in-place collective on preallocated flat buffers (``Platform.all_gather_into`` /
  ``reduce_scatter_into`` / ``all_reduce_into``, asynchronous where the platform has work
  handles), copy-out into each parameter's persistent buffer;
* **values** (on-tape units): the same layout built with differentiable local ops
  (:func:`pack_shards`, :func:`unpack_params`) around collectives that return new tensors
  (:func:`all_gather_value`, :func:`reduce_scatter_value`), run inside one
  ``Platform.custom_autograd`` node per unit.

Tests call these with no model: ``all_gather_unit`` + ``copy_out`` (or ``pack_shards`` +
``all_gather_value`` + ``unpack_params``) on a few tensors must give every parameter's
unsharded value, ``reduce_scatter_unit`` + ``shard_views`` (or ``reduce_scatter_value``)
every parameter's reduced shard (see :mod:`hyper_shard.fsdp._layout` for the layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..platform.compose import reduce_scatter
from ._layout import FlatLayout

__all__ = [
    "Pending",
    "all_gather_unit",
    "copy_out",
    "reduce_scatter_unit",
    "shard_views",
    "all_reduce_unit",
    "pack_shards",
    "unpack_params",
    "all_gather_value",
    "reduce_scatter_value",
]


class Pending:
    """A collective's result buffer and, while it runs asynchronously, its handle.

    Attributes:
        flat: the output buffer (complete once :meth:`wait` returned).
        keep: tensors the collective reads, kept alive until it completes.
    """

    __slots__ = ("flat", "work", "keep")

    def __init__(self, flat: Any, work: Any = None, keep: Any = None) -> None:
        self.flat = flat
        self.work = work
        self.keep = keep

    @property
    def done(self) -> bool:
        return self.work is None

    def wait(self) -> Any:
        """Complete the collective (no-op when it already is); returns :attr:`flat`."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        self.keep = None
        return self.flat


# ---------------------------------------------------------------------- buffers
def all_gather_unit(
    plat: Any,
    group: Any,
    coord: int,
    layout: FlatLayout,
    shards: Sequence[Any],
    dtype: Any,
    like: Any,
    async_op: bool = False,
) -> Pending:
    """All-gather a unit's shards in one collective (buffer form).

    Args:
        plat: the Platform; group: the shard mesh dim's group; coord: this rank's
            coordinate on it.
        layout: the unit's :class:`FlatLayout`.
        shards: this rank's shard of every parameter (plain local tensors in flat order,
            any dtype: cast to ``dtype`` on the way in).
        dtype: the all-gather dtype (``param_dtype`` under mixed precision).
        like: a tensor on the device the buffer lives on.
        async_op: run asynchronously where the backend can (``Pending.wait`` completes).

    Returns:
        A :class:`Pending` whose flat buffer (``layout.total_numel`` elements) holds every
        coordinate's chunk once complete.
    """
    S = layout.chunk_numel
    flat = plat.empty_flat(layout.total_numel, dtype, like)
    base = coord * S
    for slot, shard in zip(layout.slots, shards):
        k = slot.shard_numel(coord)
        if k:
            plat.copy_flat(plat.narrow(flat, 0, base + slot.offset, k), shard)
    if layout.n == 1:
        return Pending(flat)
    work = plat.all_gather_into(flat, plat.narrow(flat, 0, base, S), group, async_op)
    return Pending(flat, work)


def copy_out(plat: Any, layout: FlatLayout, flat: Any, outs: Sequence[Any]) -> None:
    """Split a gathered flat buffer into each parameter's rank-major buffer (``outs[i]``:
    ``n * slot_numel_i`` elements, whose first ``numel_i`` are the unsharded parameter)."""
    if layout.n == 1:
        for slot, o in zip(layout.slots, outs):
            plat.copy_flat(o, plat.narrow(flat, 0, slot.offset, slot.slot_numel))
        return
    plat.unpack_chunks(flat, layout.n, outs)


def reduce_scatter_unit(
    plat: Any,
    group: Any,
    layout: FlatLayout,
    grads: Sequence[Any],
    reduce_dtype: Any,
    like: Any,
    op: str = "avg",
    async_op: bool = False,
) -> Pending:
    """Reduce-scatter a unit's unsharded gradients in one collective (buffer form).

    Args:
        grads: each parameter's unsharded gradient (plain local tensors of the layout's
            shapes; cast to ``reduce_dtype`` on the way in).
        reduce_dtype: dtype of the reduction.
        op: ``"avg"`` (FSDP's default: the mean over the shard ranks) or ``"sum"``.

    Returns:
        A :class:`Pending` whose flat buffer (``layout.chunk_numel`` elements) holds this
        rank's reduced shard of every parameter at its slot offset once complete.
    """
    n = layout.n
    inp = plat.empty_flat(layout.total_numel, reduce_dtype, like)
    plat.pack_chunks(grads, n, inp)
    if n == 1:
        return Pending(inp)
    out = plat.empty_flat(layout.chunk_numel, reduce_dtype, like)
    work = plat.reduce_scatter_into(out, inp, op, group, async_op)
    return Pending(out, work, keep=inp if work is not None else None)


def shard_views(plat: Any, layout: FlatLayout, coord: int, flat: Any) -> list[Any]:
    """Each parameter's reduced shard in a reduce-scattered flat buffer: flat views of
    ``shard_numel(coord)`` elements (reshape them to ``shard_shape(coord)``)."""
    return [plat.narrow(flat, 0, s.offset, s.shard_numel(coord)) for s in layout.slots]


def all_reduce_unit(
    plat: Any, group: Any, flat: Any, op: str = "avg", async_op: bool = False, inplace: bool = True
) -> Pending:
    """All-reduce a flat buffer (HSDP's replicate mesh dim): in place (buffer form), or
    into a new tensor (value form)."""
    if not inplace:
        return Pending(plat.all_reduce(flat, op, group))
    return Pending(flat, plat.all_reduce_into(flat, op, group, async_op))


# ---------------------------------------------------------------------- values
def pack_shards(plat: Any, layout: FlatLayout, coord: int, shards: Sequence[Any]) -> Any:
    """This rank's chunk of the flat buffer (``layout.chunk_numel`` elements) built with
    differentiable local ops: each shard (flat order) flattened and zero-padded to its
    slot, concatenated."""
    pieces = []
    for slot, shard in zip(layout.slots, shards):
        flat = plat.reshape(shard, (slot.shard_numel(coord),))
        if slot.shard_numel(coord) != slot.slot_numel:
            flat = plat.pad_dim(flat, 0, slot.slot_numel)
        pieces.append(flat)
    return plat.cat(pieces, 0)


def unpack_params(plat: Any, layout: FlatLayout, flat: Any) -> list[Any]:
    """Each parameter's unsharded value (flat order, its ``slot.shape``) cut out of a
    gathered flat buffer with differentiable local ops."""
    S = layout.chunk_numel
    out = []
    for slot in layout.slots:
        rows = [
            plat.narrow(flat, 0, c * S + slot.offset, slot.shard_numel(c))
            for c in range(layout.n)
            if slot.rows[c]
        ]
        out.append(plat.reshape(plat.cat(rows, 0), slot.shape))
    return out


def all_gather_value(plat: Any, group: Any, layout: FlatLayout, chunk: Any) -> Any:
    """The gathered flat buffer (``layout.total_numel`` elements, chunk ``c`` from mesh
    coordinate ``c``) of every rank's ``chunk`` (value form)."""
    if layout.n == 1:
        return chunk
    return plat.cat(plat.all_gather(chunk, group, layout.n), 0)


def reduce_scatter_value(
    plat: Any, group: Any, layout: FlatLayout, coord: int, flat: Any, op: str = "avg"
) -> Any:
    """This rank's chunk (``layout.chunk_numel`` elements) of the reduction of every rank's
    flat buffer (value form): the platform's reduce-scatter where it has one, else the one
    composition every caller shares (:func:`hyper_shard.platform.compose.reduce_scatter`:
    e.g. an all-reduce and this rank's chunk, on MindSpore's mccl on CPU)."""
    n, S = layout.n, layout.chunk_numel
    if n == 1:
        return flat
    out = reduce_scatter(plat, flat, 0, [S] * n, op, group, coord)
    # a composed result may be a view of the n-times larger reduced buffer: own the chunk
    # so that buffer is freed now
    return out if plat.has("reduce_scatter") else plat.clone(out)
