"""Writes through index tensors (``rule: index_put``): ``torch.index_put(input, indices,
values, accumulate=False)``, ``Tensor.index_put`` / ``Tensor.index_put_``, and
``x[idx] = v`` (``Tensor.__setitem__``) whose index is index tensors on the leading dims;
semantics as torch's on the GLOBAL tensor (duplicate indices: the last write wins, or all
add up with ``accumulate=True``).

``indices`` holds ``k`` integer index tensors (DTensors, or plain 0-d tensors) for dims
``0..k-1``; they broadcast to a shape ``B`` and ``values`` broadcasts to ``B +
input.shape[k:]``. Per mesh dim:

* the target keeps its shards on **every** dim, indexed ones included: each rank writes the
  elements it holds — the index positions inside its shard, shifted to local rows, with the
  matching values (a local selection, no communication); the index tensors are
  ``Replicate`` (sharded ones are gathered, as PyTorch) and so are the values on that mesh
  dim;
* a target sharded on a dim ``d >= k`` may keep the values sharded on the matching values
  dim (where the values have that dim at full size);
* a ``Partial(sum|avg)`` target with ``Partial`` values stays Partial (the write is linear;
  a Replicate value is partitioned locally so it is written once).

PyTorch DTensor instead gathers the indexed dims of the target (its output is not sharded
there, and a scalar value makes it Replicate): the same values, with an all-gather of the
target that this rule avoids. A boolean index tensor (a mask over its dims) is read as the index
tensors of its True positions (gathered: every rank needs the global order of the
positions to pick its values), so the target keeps its shards there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dispatch.op import Binder, DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy, search_strategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..redistribute.planner import cost_model_for
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._util import LINEAR_OPS, R, broadcast_shapes

__all__ = ["IndexPutOp", "index_put_layout"]


def _kind(dtype: Any) -> str:
    name = str(dtype).rsplit(".", 1)[-1].lower()
    if name in ("bool", "uint8"):
        return "bool"
    return "int" if name.startswith(("int", "uint", "long")) else "other"


class _LocalIndexPut:
    """The local write of a target sharded on indexed dims: index positions outside this
    rank's rows are dropped, the rest shifted to local rows, the values selected alike.
    Called like the op it replaces (``index_put``'s or ``__setitem__``'s arguments)."""

    __slots__ = ("func", "binder", "vname", "setitem", "k", "rest", "filters", "scalar")

    def __init__(
        self,
        func: Any,
        binder: Binder,
        vname: str,
        setitem: bool,
        k: int,
        rest: tuple[int, ...],
        filters: dict[int, tuple[int, int, int]],
        scalar: Any,
    ) -> None:
        self.func, self.binder, self.vname, self.setitem, self.k = func, binder, vname, setitem, k
        self.rest, self.filters, self.scalar = rest, filters, scalar

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self.binder
        x = b.get(args, kwargs, "input")
        index = b.get(args, kwargs, "indices")
        # the k leading index tensors (a __setitem__ index may end with whole slices / ...)
        items = list(index)[: self.k] if isinstance(index, (list, tuple)) else [index]
        value = b.get(args, kwargs, self.vname) if self.scalar is None else self.scalar
        idx: list[Any] = []
        for i in items:  # a boolean mask stands for the index tensors of its True positions
            if str(i.dtype).endswith(("bool", "uint8")):
                idx.extend(i.nonzero(as_tuple=True))
            else:
                idx.append(i)
        block = broadcast_shapes(*(tuple(i.shape) for i in idx))
        idx = [i.expand(block) for i in idx]
        keep = None
        for k, (size, lo, n) in self.filters.items():
            g = idx[k]
            g = g + (g < 0).to(g.dtype) * size
            inside = (g >= lo) & (g < lo + n)
            keep = inside if keep is None else keep & inside
            idx[k] = g - lo
        assert keep is not None
        new_idx = [i[keep] for i in idx]
        if hasattr(value, "expand"):
            value = value.expand((*block, *self.rest))[keep]
        if self.setitem:
            x[tuple(new_idx)] = value
            return None
        args, kwargs = b.replace(args, kwargs, "indices", type(index)(new_idx))
        args, kwargs = b.replace(args, kwargs, self.vname, value)
        return self.func(*args, **kwargs)


def index_put_layout(
    call: OpCall,
    items: Sequence[tuple[int | None, tuple[int, ...], str]],
    vname: str,
    setitem: bool,
) -> Layout:
    """The decision of a write ``input[items...] = value`` through ``k`` leading index
    tensors (see the module docstring).

    Args:
        call: the call; ``call.specs[0]`` is the target.
        items: per index tensor: (its position in ``call.specs`` or None for a plain 0-d
            tensor, its global shape, its dtype kind).
        vname: the canonical name of the values argument (``values`` or ``value``).
        setitem: the call is ``x[index] = value`` (returns None) rather than ``index_put``.

    Raises:
        ShardingError: values that do not broadcast, a DTensor argument in another role.
    """
    x = call.specs[0]
    # a boolean mask indexes as many dims as it has, with its (data-dependent) True count
    k = sum(len(s) if kind == "bool" else 1 for _, s, kind in items)
    if k > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim} (got {k})")
    roles = call.arg_roles
    iv = roles.index(vname) if vname in roles else None
    n_in = len(call.specs)
    mesh = call.mesh
    masked = any(kind == "bool" for _, _, kind in items)
    try:
        shapes = [(1,) if kind == "bool" else s for _, s, kind in items]
        block = broadcast_shapes(*shapes) if items else ()
    except ValueError as e:
        raise ShardingError(f"{call.describe()}: index tensors {e}") from None
    rest = tuple(x.shape[k:])
    res_shape = (*block, *rest)
    vspec = call.specs[iv] if iv is not None else None
    if vspec is not None and not masked:
        try:
            if broadcast_shapes(vspec.shape, res_shape) != res_shape:
                raise ValueError
        except ValueError:
            raise ShardingError(
                f"{call.describe()}: shape mismatch: value tensor of shape {list(vspec.shape)} "
                f"cannot be broadcast to indexing result of shape {list(res_shape)}"
            ) from None
    off = len(res_shape) - (vspec.ndim if vspec is not None else 0)

    def value_dim(d: int) -> Placement:
        vd = len(block) + (d - k) - off
        if vspec is not None and vd >= 0 and vspec.shape[vd] == x.shape[d] != 1:
            return Shard(vd)
        return R

    strategies: list[SingleDimStrategy] = []
    n_out = 0 if setitem else 1
    for d in range(x.ndim):
        ins: list[Placement] = [R] * n_in
        ins[0] = Shard(d)
        if iv is not None and d >= k:
            ins[iv] = value_dim(d)
        strategies.append(((Shard(d),) * n_out, tuple(ins)))
    for op in LINEAR_OPS:
        ins = [R] * n_in
        ins[0] = Partial(op)
        if iv is not None:
            ins[iv] = Partial(op)
        strategies.append(((Partial(op),) * n_out, tuple(ins)))
    fixed = (0,) if call.inplace or setitem else ()
    try:
        res = search_strategy(call.specs, strategies, n_out, cost_model_for(mesh), fixed=fixed)
    except ValueError:
        raise ShardingError(
            f"{call.describe()}: in-place operations that require placement changes are not "
            f"supported: no layout of the values keeps the target's placements; redistribute "
            f"the target first, or use torch.index_put (out of place)"
        ) from None
    layout = Layout(list(res.inputs), list(res.outputs), [] if setitem else [x.shape])
    coord = mesh.get_coordinate()
    tgt = tuple(res.inputs[0] or x.placements)
    sharded = sorted({p.dim for p in tgt if type(p) is Shard and p.dim < k})
    scalar = None
    if vname in call.scalars and any(type(p) is Partial for p in tgt):
        from .tensor_create import scalar_off_coordinate0

        scalar = scalar_off_coordinate0(call, tgt, call.scalars[vname])
    if coord is None or (not sharded and scalar is None):
        return layout
    ls, lo = compute_local_shape_and_offset(x.shape, mesh.shape, tgt, coord)
    filters = {d: (x.shape[d], lo[d], ls[d]) for d in sharded}
    local_rest = tuple(ls[k:])
    binder = call.binder or Binder(("input", "indices", vname))
    if not sharded:  # a scalar written into a Partial target: once, on coordinate 0
        layout.overrides = {vname: scalar}
        return layout
    layout.impl = _LocalIndexPut(call.func, binder, vname, setitem, k, local_rest, filters, scalar)
    return layout


@register_rule("index_put")
class IndexPutOp(DistributedOp):
    """``index_put`` / ``index_put_`` (see the module docstring).

    Raises:
        ShardingError: index tensors that are not integer or boolean, values that do not
            broadcast, or an in-place target whose placements no layout keeps.
        IndexError: more index tensors than the target has dims.
    """

    signature = ("input", "indices", "values", "accumulate")

    def infer_layout(self, call: OpCall) -> Layout:
        if not call.arg_roles or call.arg_roles[0] != "input":
            raise ShardingError(
                f"{call.describe()}: the target must be a DTensor when its indices or values "
                f"are; distribute it (e.g. distribute_tensor(t, mesh, [Replicate()]))"
            )
        indices = call.get("indices")
        if not isinstance(indices, (list, tuple)):
            raise TypeError(f"{call.describe()}: indices must be a tuple or list of tensors")
        items: list[tuple[int | None, tuple[int, ...], str]] = []
        pos = {r: i for i, r in enumerate(call.arg_roles)}
        plat = call.platform
        for j, t in enumerate(indices):
            role = f"indices[{j}]"
            if role in pos:
                s = call.specs[pos[role]]
                items.append((pos[role], tuple(s.shape), _kind(s.dtype)))
            elif t is not None and plat is not None and plat.is_tensor(t):
                items.append((None, tuple(plat.shape(t)), _kind(plat.tensor_meta(t).dtype)))
            else:
                raise TypeError(
                    f"{call.describe()}: indices[{j}] must be a tensor, got {type(t).__name__}"
                )
            if items[-1][2] == "other":
                raise ShardingError(
                    f"{call.describe()}: tensors used as indices must be long, int or bool "
                    f"tensors (indices[{j}])"
                )
        return index_put_layout(call, items, "values", setitem=False)
