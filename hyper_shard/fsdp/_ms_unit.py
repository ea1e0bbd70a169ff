"""One ``fully_shard`` unit on MindSpore Cells: a differentiable all-gather whose backward
is the gradient reduction (see :mod:`._mindspore` for why MindSpore's functional autograd
calls for this form instead of the torch core's hook-driven state machine).

* **before forward** (a forward pre-hook) the unit's shards are packed into one flat
  chunk (the neutral :class:`~._layout.FlatLayout`: each slot padded to the largest
  shard), cast to ``param_dtype`` and all-gathered over the shard mesh dim in one
  collective by one custom-backward node; each unsharded parameter is cut out of the
  gathered buffer (differentiable views; a tensor-parallel parameter wrapped back as the
  DTensor on its tensor-parallel mesh) and set as its Cell's attribute, so ``construct``
  computes with them;
* **backward** of that node: the flat gradient cast to ``reduce_dtype``, reduce-scattered
  over the shard dim (the mean; on CPU, where mccl has no reduce-scatter, an all-reduce
  and this rank's slice), HSDP then all-reduced (mean) over the replicate dim, cast back
  to the parameters' dtype. Without gradient sync it is added to the unit's accumulator
  instead (zeros go back) and joins the next synchronised reduction; HSDP without
  all-reduce (``set_requires_all_reduce(False)``) keeps the reduced shard instead, for
  the next backward's all-reduce;
* **after forward** (a forward hook) the attributes are dropped again (the Cell shows its
  sharded parameters); the gathered values stay alive on MindSpore's autograd tape until
  the backward has used them (no re-gather in backward).
"""

from __future__ import annotations

from typing import Any

from mindspore import Tensor, mint, ops
from mindspore._c_expression import NoFallbackGuard

from ..dtensor import DTensor
from ..spec import DTensorSpec
from ._layout import FlatLayout
from ._mesh import MeshInfo

__all__ = ["MSParam", "MSUnit"]

_local_shape = Tensor.shape.fget


class MSParam:
    """One managed parameter of a Cell unit.

    Attributes:
        param: the sharded ``Parameter(DTensor)`` (what the optimizer steps).
        sites: ``[(cell, attribute name), ...]`` holding it (a tied weight: several).
        local_shape: the unsharded local shape (a tensor-parallel parameter's local shape).
        orig_spec: the original tensor-parallel spec, or None for a plain parameter.
        dim: the tensor dim FSDP shards (``shard_placement_fn``; 0 by default).
        flat_shape: ``local_shape`` with ``dim`` first, as the flat buffers hold it.
    """

    __slots__ = ("param", "sites", "local_shape", "orig_spec", "dim", "flat_shape")

    def __init__(
        self,
        param: Any,
        sites: list,
        local_shape: tuple[int, ...],
        orig_spec: Any,
        dim: int = 0,
    ) -> None:
        self.param = param
        self.sites = sites
        self.local_shape = local_shape
        self.orig_spec = orig_spec
        self.dim = dim
        s = local_shape
        self.flat_shape = (s[dim], *s[:dim], *s[dim + 1 :])


class MSUnit:
    """One ``fully_shard`` call on a Cell (see the module docstring).

    Attributes:
        params: the managed :class:`MSParam` s.
        layout: the unit's :class:`FlatLayout` over the shard ranks.
        dtype / compute_dtype / reduce_dtype: the parameters' dtype, the all-gather and
            compute dtype (``param_dtype``) and the reduction dtype (``reduce_dtype``).
        gathers: all-gathers run so far (one per forward; tests count them).
        reduces: gradient reductions run so far (one per synchronised backward).
        requires_gradient_sync: False: backward accumulates instead of reducing.
        requires_all_reduce: False (HSDP): backward reduces over the shard dim and keeps
            the result for the next all-reduce over the replicate dim.
    """

    def __init__(self, module: Any, info: MeshInfo, params: list[MSParam], mp: Any) -> None:
        self.module = module
        self.info = info
        self.plat = info.mesh.platform
        self.params = params
        self.mp = mp
        self.layout = FlatLayout([p.flat_shape for p in params], info.shard_size)
        dtype = params[0].param.dtype if params else None
        floating = params and _is_float(params[0].param)
        self.dtype = dtype
        self.compute_dtype = mp.param_dtype if floating and mp.param_dtype is not None else dtype
        rd = mp.reduce_dtype if floating and mp.reduce_dtype is not None else self.compute_dtype
        self.reduce_dtype = rd
        self.requires_gradient_sync = True
        self.requires_all_reduce = True
        #: set_gradient_divide_factor / set_force_sum_reduction_for_comms: reduce with
        #: "sum" and divide by this afterwards (None: the mean, "avg" collectives)
        self.divide_factor: float | None = None
        self.acc: Tensor | None = None  # unsharded flat gradient accumulated without sync
        self.acc_shard: Tensor | None = None  # HSDP: reduced shard awaiting its all-reduce
        self.gathers = 0
        self.reduces = 0
        self._set: list[tuple[Any, str]] = []

    # ------------------------------------------------------------------ collectives
    def _flat_shard(self) -> Tensor:
        """This rank's chunk of the flat buffer, built differentiably from the sharded
        Parameters (MindSpore's ``weights=`` gradient flows through ops on the Parameter
        itself, not through an alias of it)."""
        c = self.info.shard_coord
        pieces = []
        with NoFallbackGuard():
            for p, slot in zip(self.params, self.layout.slots):
                t = p.param if p.dim == 0 else _movedim(p.param, p.dim, 0)
                flat = mint.reshape(t, (-1,))
                pad = slot.slot_numel - slot.shard_numel(c)
                if pad:
                    flat = mint.cat([flat, mint.zeros((pad,), dtype=flat.dtype)], 0)
                pieces.append(flat)
            return pieces[0] if len(pieces) == 1 else mint.cat(pieces, 0)

    def _gather(self, flat: Tensor) -> Tensor:
        """The gathered flat buffer (``n * S`` elements, in ``compute_dtype``)."""
        info = self.info
        with NoFallbackGuard():
            if self.compute_dtype != self.dtype:
                flat = flat.astype(self.compute_dtype)
        if info.shard_size == 1:
            return flat
        parts = self.plat.all_gather(flat, info.shard_group(), info.shard_size)
        with NoFallbackGuard():
            return mint.cat(parts, 0)

    def _reduce(self, g: Tensor) -> Tensor:
        """The gradient of this rank's flat chunk: the mean over the data-parallel ranks
        of the gathered buffer's gradient (see the module docstring)."""
        plat, info = self.plat, self.info
        n, S, c = info.shard_size, self.layout.chunk_numel, info.shard_coord
        with NoFallbackGuard():
            g = Tensor._make_subclass(Tensor, g).contiguous()
            if g.dtype != self.reduce_dtype:
                g = g.astype(self.reduce_dtype)
            if not self.requires_gradient_sync:
                self.acc = g if self.acc is None else self.acc + g
                return mint.zeros((S,), dtype=self.dtype)
            if self.acc is not None:
                g, self.acc = g + self.acc, None
        self.reduces += 1
        op = "avg" if self.divide_factor is None else "sum"
        if n > 1:
            group = info.shard_group()
            with NoFallbackGuard():
                if "reduce_scatter" in plat.native_collectives:
                    pieces = [mint.narrow(g, 0, k * S, S) for k in range(n)]
                    g = plat.reduce_scatter(pieces, op, group)
                else:
                    full = plat.all_reduce(g, op, group)
                    g = ops.deepcopy(mint.narrow(full, 0, c * S, S))
        if info.replicate_size > 1:
            with NoFallbackGuard():
                if self.acc_shard is not None:
                    g, self.acc_shard = g + self.acc_shard, None
                if not self.requires_all_reduce:  # HSDP micro-batch: all-reduce later
                    self.acc_shard = g
                    return mint.zeros((S,), dtype=self.dtype)
                g = plat.all_reduce(g, op, info.replicate_group())
        with NoFallbackGuard():
            if self.divide_factor is not None and self.divide_factor != 1:
                g = g * (1.0 / self.divide_factor)
            return g.astype(self.dtype) if g.dtype != self.dtype else g

    def unshard(self) -> list[Any]:
        """Every managed parameter's unsharded value, differentiable with respect to the
        sharded Parameters (one all-gather): plain tensors, or DTensors on the tensor-
        parallel mesh for tensor-parallel parameters."""
        layout, n, S = self.layout, self.layout.n, self.layout.chunk_numel
        flat = self._flat_shard()
        if self.info.dp_size > 1:
            flat = self.plat.custom_autograd(self._gather, self._reduce, flat)
        else:  # one rank: no collective, a differentiable cast at most
            flat = self._gather(flat)
        self.gathers += 1
        out = []
        with NoFallbackGuard():
            for p, slot in zip(self.params, layout.slots):
                rows = [
                    mint.narrow(flat, 0, k * S + slot.offset, slot.shard_numel(k))
                    for k in range(n)
                    if slot.rows[k]
                ]
                full = mint.reshape(rows[0] if len(rows) == 1 else mint.cat(rows, 0), slot.shape)
                out.append(full if p.dim == 0 else _movedim(full, 0, p.dim))
        for i, p in enumerate(self.params):
            o = p.orig_spec
            if o is not None:
                meta = self.plat.tensor_meta(out[i], o.shape)._replace(stride=o.stride)
                out[i] = self.plat.wrap(
                    out[i], DTensorSpec(o.mesh, o.placements, meta, o.shard_order)
                )
        return out

    # ------------------------------------------------------------------ hooks
    def pre_forward(self, _cell: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self.show_unsharded()
        mp = self.mp
        if mp.cast_forward_inputs and mp.param_dtype is not None:
            args, kwargs = _cast_floats(args, mp.param_dtype), _cast_floats(kwargs, mp.param_dtype)
        return args, kwargs

    def show_unsharded(self) -> None:
        """Gather (one all-gather) and set every unsharded value as its Cell's attribute.

        Raises:
            RuntimeError: a managed parameter was replaced by something other than the
                sharded DTensor parameter (update parameters in place instead).
        """
        for p in self.params:
            if not isinstance(p.param, DTensor):
                raise RuntimeError(
                    f"fully_shard: {p.param.name!r} is no longer the sharded DTensor parameter "
                    f"fully_shard made; update parameters in place (optimizer, "
                    f"assign_value) instead of replacing them"
                )
        self.reshard()
        if not self.params:
            return
        values = self.unshard()
        for p, v in zip(self.params, values):
            for m, name in p.sites:
                object.__setattr__(m, name, v)  # found before Cell.__getattr__'s _params
                self._set.append((m, name))

    def post_forward(self, _cell: Any, args: Any, output: Any) -> Any:
        self.reshard()
        if self.mp.output_dtype is not None:
            return _cast_floats(output, self.mp.output_dtype)
        return output

    def reshard(self) -> None:
        """Drop the unsharded attributes: the Cell shows its sharded parameters again."""
        for m, name in self._set:
            m.__dict__.pop(name, None)
        self._set.clear()


def _movedim(t: Any, source: int, destination: int) -> Any:
    """``t`` with dim ``source`` moved to ``destination`` (differentiable; as torch.movedim)."""
    perm = [d for d in range(len(_local_shape(t))) if d != source]
    perm.insert(destination, source)
    return mint.permute(t, tuple(perm))


def _is_float(t: Any) -> bool:
    with NoFallbackGuard():
        return bool(ops.is_floating_point(Tensor._make_subclass(Tensor, t)))


def _cast_floats(obj: Any, dtype: Any) -> Any:
    """``obj`` (tensors in tuples, lists, dicts) with every floating-point tensor of
    another dtype cast to ``dtype`` (a DTensor through the dispatcher: its layout kept)."""
    if isinstance(obj, Tensor):
        return obj.astype(dtype) if obj.dtype != dtype and _is_float(obj) else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floats(x, dtype) for x in obj)
    if isinstance(obj, list):
        return [_cast_floats(x, dtype) for x in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj
