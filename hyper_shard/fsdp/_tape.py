"""On-tape units (see [Note: FSDP adapters] in :mod:`._adapter`): where the framework's
autograd is functional, a unit's unsharded values are a differentiable function of its
sharded parameters, recorded on the framework's tape: per bucket, this rank's flat chunk
packed with differentiable local ops, one ``Platform.custom_autograd`` node whose forward
casts to the compute dtype and all-gathers (the engine's value-form collectives) and
whose backward is the engine's gradient reduction (:meth:`OnTapeUnit.tape_reduce`, the
:mod:`._reduce` pipeline), and the values cut out of the gathered buffer. Nothing is kept
between steps and nothing is gathered in backward; a forward cycle's values are cached
so the cycle's later modules compute with the same node (:mod:`._state`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._collectives import (
    Pending,
    all_gather_value,
    pack_shards,
    reduce_scatter_value,
    unpack_params,
)
from ._layout import FlatLayout
from ._param import FSDPParam
from ._reduce import UnitReduction

if TYPE_CHECKING:
    from ._group import _Bucket

__all__ = ["OnTapeUnit"]


class OnTapeUnit(UnitReduction):
    """The on-tape half of :class:`~._group.FSDPParamGroup` (a mixin; the reduction
    helpers come from :class:`~._reduce.UnitReduction`)."""

    unsharded: bool
    _buckets: list[_Bucket] | None
    _tape_values: list[tuple[FSDPParam, Any]] | None
    _partial_reduce: dict[Any, Any]

    def _unshard_on_tape(self) -> None:
        """On-tape units: one differentiable all-gather per bucket whose backward is the
        gradient reduction (:meth:`tape_reduce`), and the unsharded values cut out of it."""
        assert self._buckets is not None
        plat, c = self.plat, self.info.shard_coord
        cache: list[tuple[FSDPParam, Any]] = []
        for b in self._buckets:
            params = [self.params[i] for i in b.indices]
            chunk = pack_shards(
                plat, b.layout, c, [p.to_flat_order(p.shard_local()) for p in params]
            )
            flat = self._gather_node(b, params, chunk)
            if b.layout.n > 1:
                self._count("all_gather")
            with self.comm.record("FSDP::all_gather_copy_out"):
                values = unpack_params(plat, b.layout, flat)
                cache.extend((p, p.unsharded_value(v)) for p, v in zip(params, values))
        self._tape_values = cache
        self.show_tape_values()

    def show_tape_values(self) -> None:
        """On-tape units: register the values of the current forward cycle's gather (a
        later module of the cycle computes with them; the values are registered only
        while a module of the unit runs)."""
        assert self._tape_values is not None
        for p, v in self._tape_values:
            p.to_unsharded(v)
        self.unsharded = True

    def _gather_node(self, b: _Bucket, params: list[FSDPParam], chunk: Any) -> Any:
        """The gathered flat buffer of bucket ``b`` as one autograd node of the platform
        (forward: cast to the compute dtype and all-gather; backward: :meth:`tape_reduce`)."""
        plat, info, comm = self.plat, self.info, self.comm
        layout, dtype = b.layout, b.dtype
        orig = params[0].orig_dtype
        rd = params[0].reduce_dtype or dtype
        key = ("tape", tuple(b.indices))
        group = info.shard_group() if layout.n > 1 else None

        def gather(x: Any) -> Any:
            if plat.tensor_meta(x).dtype != dtype:
                x = plat.cast(x, dtype)
            with self._frame("all-gather", params), comm.record("FSDP::all_gather"):
                return all_gather_value(plat, group, layout, x)

        def reduce(g: Any) -> Any:
            return self.tape_reduce(layout, g, rd, orig, key)

        if info.dp_size > 1:
            return plat.custom_autograd(gather, reduce, chunk)
        # one rank: no collective, a differentiable cast at most
        return chunk if plat.tensor_meta(chunk).dtype == dtype else plat.cast(chunk, dtype)

    def tape_reduce(self, layout: FlatLayout, grad: Any, rd: Any, orig: Any, key: Any) -> Any:
        """The backward of an on-tape unit's all-gather: the gradient of this rank's flat
        chunk (``layout.chunk_numel`` elements, dtype ``orig``) from the gathered buffer's
        gradient ``grad`` (zeros while gradients are accumulated or held)."""
        plat, info = self.plat, self.info
        g = plat.contiguous(plat.detach(grad))
        if plat.tensor_meta(g).dtype != rd:
            g = plat.cast(g, rd)
        acc = self._partial_reduce.get(("acc", key))
        if not self.reduce_grads:  # set_requires_gradient_sync(False): accumulate
            self._partial_reduce[("acc", key)] = g if acc is None else acc + g
            return self._zero_chunk(layout, orig)
        if acc is not None:
            g = g + self._partial_reduce.pop(("acc", key))
        with self._frame("gradient reduce-scatter", self.params):
            with self.comm.record("FSDP::reduce_scatter"):
                group = info.shard_group() if layout.n > 1 else None
                out = reduce_scatter_value(
                    plat, group, layout, info.shard_coord, g, self._reduce_op()
                )
        if layout.n > 1:
            self._count("reduce_scatter")
        flat = self._after_reduce_scatter(Pending(out), key, self.params, inplace=False)
        if flat is None:
            return self._zero_chunk(layout, orig)
        return plat.cast(flat, orig) if plat.tensor_meta(flat).dtype != orig else flat

    def _zero_chunk(self, layout: FlatLayout, dtype: Any) -> Any:
        return self.plat.new_tensor(
            "zeros", (layout.chunk_numel,), None, dtype, self.info.mesh.device_type
        )
