"""More ``rule: tensor_op`` kinds: ops that work along some dims of their input and are
independent along the others (semantics as the torch functions of the same names, GLOBAL
dims and sizes; the local call is the op itself on the local shards).

The dims an op works along are gathered (Replicate), every other dim keeps its shard
(moved to its output position), and ``Partial`` passes where the op is linear:

========================================  ===================================  ==========
kind                                      gathered dims                        Partial
========================================  ===================================  ==========
``normalize(input, p, dim)``              ``dim``                              no
``renorm(input, p, dim, maxnorm)``        every dim but ``dim``                no
``local_response_norm(input, size)``      the channel dim (1)                  no
``channel_shuffle(input, groups)``        the channel dim (1)                  yes
``pixel_shuffle`` / ``pixel_unshuffle``   the last three (channel, H, W)       yes
``msort(input)``                          dim 0                                no
``rot90(input, k, dims)``                 both ``dims`` (swapped for odd k)    yes
``fliplr`` / ``flipud``                   dim 1 / dim 0                        yes
``one_hot(input, num_classes)``           none (a new last dim, whole)         no
``diff(input, n, dim, prepend, append)``  ``dim`` (of all three)               yes (all)
``trapezoid`` / ``cumulative_trapezoid``  ``dim`` (of ``y`` and ``x``)          one factor
``cross(input, other, dim)``              ``dim`` (broadcasting elsewhere)     one factor
``median`` / ``nanmedian`` / ``mode``     ``dim`` (every dim without one)      no
``quantile`` / ``nanquantile``            the reduced dims; ``q``'s dim kept   no
``sum_to_size(input, *size)``             none: a summed dim gives Partial     yes
``prelu(input, weight)``                  none (a per-channel weight alike)    no
``rrelu(input, ..., training)``           none; every dim in training          no
========================================  ===================================  ==========

"yes": every ``Partial(op)`` input stays ``Partial(op)`` (the op only moves elements or is
linear); "one factor": the op is bilinear, exactly one ``Partial`` input (the other
Replicate) gives ``Partial``. ``one_hot(x, num_classes=-1)`` would size its output by the
values' maximum: it raises, naming the fix.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ..dispatch.op import Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..spec import compute_local_shape_and_offset
from ._util import LINEAR_OPS, R, broadcast_shapes, normalize_dim
from .planned import OpPlan, ValueDependentShape, as_int, dims_arg, keep_strategies, partials_of
from .reduction import kept_dim_map, reduced_dims, reduced_shape
from .tensor_ops import _KINDS, _pick

__all__ = ["nonempty_shards"]


def nonempty_shards(
    call: OpCall, dims: Callable[[int], bool] | None = None
) -> Callable[[tuple, tuple], bool]:
    """A search ``accept`` refusing input placements that leave some rank an empty local
    shard of a non-empty dim (kernels such as ``quantile`` and the pools refuse an empty
    input, and ``pixel_shuffle``'s backward breaks on an empty batch): such inputs are
    gathered. ``dims(d)`` picks the dims judged (default: all)."""
    shapes = [tuple(s.shape) for s in call.specs]
    mesh_shape = tuple(call.mesh.shape)
    coords = list(itertools.product(*(range(n) for n in mesh_shape)))

    def accept(ins: tuple, outs: tuple) -> bool:
        for shape, pl in zip(shapes, ins):
            if pl is None or not any(type(p) is Shard for p in pl):
                continue
            judged = [d for d, n in enumerate(shape) if n > 0 and (dims is None or dims(d))]
            for c in coords:
                local = compute_local_shape_and_offset(shape, mesh_shape, pl, c)[0]
                if any(local[d] == 0 for d in judged):
                    return False
        return True

    return accept


def _keep_except(ndim: int, touched: set[int]) -> dict[int, int]:
    return {d: d for d in range(ndim) if d not in touched}


def _plan_along(op: Any, call: OpCall, touched: set[int], shape: Any, linear: bool) -> OpPlan:
    spec = op._one(call)
    parts = partials_of([spec]) if linear else []
    n = op.params.outputs
    return OpPlan([tuple(shape)] * n, keep_strategies([_keep_except(spec.ndim, touched)], n, parts))


@_KINDS.kind("normalize", ("input", "p", "dim", "eps", "out"), ("dim",))
def _plan_normalize(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    dim = normalize_dim(as_int(_pick(st, "dim", None, 1), "dim"), spec.ndim, "dim")
    return _plan_along(op, call, {dim} if spec.ndim else set(), spec.shape, False)


@_KINDS.kind("renorm", ("input", "p", "dim", "maxnorm"), ("dim",))
def _plan_renorm(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    if st.get("dim") is None:
        raise TypeError("renorm needs dim")
    dim = normalize_dim(as_int(st["dim"], "dim"), spec.ndim, "dim")
    return _plan_along(op, call, set(range(spec.ndim)) - {dim}, spec.shape, False)


@_KINDS.kind("local_response_norm", ("input", "size", "alpha", "beta", "k"), ())
def _plan_local_response_norm(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    if spec.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {spec.ndim} dimensions)")
    return _plan_along(op, call, {1}, spec.shape, False)


@_KINDS.kind("channel_shuffle", ("input", "groups"), ("groups",))
def _plan_channel_shuffle(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    g = as_int(st.get("groups"), "groups")
    if spec.ndim < 3:
        raise ValueError(
            f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
            f"sizes {list(spec.shape)}"
        )
    if g <= 0 or spec.shape[1] % g:
        raise ValueError(
            f"Number of channels must be divisible by groups. Got {spec.shape[1]} channels and "
            f"{g} groups."
        )
    return _plan_along(op, call, {1}, spec.shape, True)


@_KINDS.kind("pixel_shuffle", ("input", "upscale_factor"), ("upscale_factor",))
def _plan_pixel_shuffle(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    r = as_int(st.get("upscale_factor"), "upscale_factor")
    if spec.ndim < 3:
        raise ValueError(
            f"pixel_shuffle expects input to have at least 3 dimensions, got {spec.ndim}"
        )
    c, h, w = spec.shape[-3:]
    if r <= 0 or c % (r * r):
        raise ValueError(
            f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square "
            f"of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}"
        )
    shape = (*spec.shape[:-3], c // (r * r), h * r, w * r)
    n = spec.ndim
    plan = _plan_along(op, call, {n - 3, n - 2, n - 1}, shape, True)
    plan.accept = nonempty_shards(call)
    return plan


@_KINDS.kind("pixel_unshuffle", ("input", "downscale_factor"), ("downscale_factor",))
def _plan_pixel_unshuffle(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    r = as_int(st.get("downscale_factor"), "downscale_factor")
    if spec.ndim < 3:
        raise ValueError(
            f"pixel_unshuffle expects input to have at least 3 dimensions, got {spec.ndim}"
        )
    c, h, w = spec.shape[-3:]
    if r <= 0 or h % r or w % r:
        raise ValueError(
            f"pixel_unshuffle expects height and width to be divisible by downscale_factor "
            f"{r}, got {h} and {w}"
        )
    shape = (*spec.shape[:-3], c * r * r, h // r, w // r)
    n = spec.ndim
    plan = _plan_along(op, call, {n - 3, n - 2, n - 1}, shape, True)
    plan.accept = nonempty_shards(call)
    return plan


@_KINDS.kind("msort", ("input",), ())
def _plan_msort(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    return _plan_along(op, call, {0} if spec.ndim else set(), spec.shape, False)


@_KINDS.kind("rot90", ("input", "k", "dims"), ("k", "dims"))
def _plan_rot90(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    raw = st.get("dims")
    dims = [0, 1] if raw is None else list(raw)
    if len(dims) != 2:
        raise ValueError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if spec.ndim < 2:
        raise ValueError(f"expected total dims >= 2, but got total dims = {spec.ndim}")
    a, b = dims_arg(dims, spec.ndim, "rot90")
    k = as_int(st.get("k") if st.get("k") is not None else 1, "k") % 4
    shape = list(spec.shape)
    if k % 2:
        shape[a], shape[b] = shape[b], shape[a]
    return _plan_along(op, call, {a, b} if k else set(), shape, True)


@_KINDS.kind("fliplr", ("input",), ())
def _plan_fliplr(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    if spec.ndim < 2:
        raise ValueError("Input must be >= 2-d.")
    return _plan_along(op, call, {1}, spec.shape, True)


@_KINDS.kind("flipud", ("input",), ())
def _plan_flipud(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    if spec.ndim < 1:
        raise ValueError("Input must be >= 1-d.")
    return _plan_along(op, call, {0}, spec.shape, True)


@_KINDS.kind("one_hot", ("input", "num_classes"), ("num_classes",))
def _plan_one_hot(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    c = as_int(_pick(st, "num_classes", None, -1), "num_classes")
    if c < 0:  # sized by the largest value: run it whole
        raise ValueDependentShape
    keep = {d: d for d in range(spec.ndim)}
    return OpPlan([(*spec.shape, c)], keep_strategies([keep], 1))


@_KINDS.kind("diff", ("input", "n", "dim", "prepend", "append"), ("n", "dim"))
def _plan_diff(op: Any, call: OpCall, st: dict) -> OpPlan:
    specs = call.specs
    x = specs[call.arg_roles.index("input")] if "input" in call.arg_roles else None
    if x is None:
        raise ShardingError(f"{call.describe()}: diff needs its input as a DTensor")
    if x.ndim == 0:
        raise ValueError("diff expects input to be at least one-dimensional")
    n = as_int(_pick(st, "n", None, 1), "n")
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n}")
    dim = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), x.ndim, "dim")
    total = 0
    for s in specs:
        if s.ndim != x.ndim or any(
            a != b for k, (a, b) in enumerate(zip(s.shape, x.shape)) if k != dim
        ):
            raise ValueError(
                f"diff expects prepend or append to be the same dimension as input, with the "
                f"same size except on dim {dim}; got {list(s.shape)} for input {list(x.shape)}"
            )
        total += s.shape[dim]
    shape = list(x.shape)
    shape[dim] = max(total - n, 0)
    keep = _keep_except(x.ndim, {dim})
    return OpPlan([tuple(shape)], keep_strategies([keep] * len(specs), 1, partials_of(specs)))


def _one_partial(n_in: int, flags: list[bool]) -> list[SingleDimStrategy]:
    """Bilinear: exactly one Partial input (of those flagged), the others Replicate."""
    out: list[SingleDimStrategy] = []
    for p in LINEAR_OPS:
        for j in range(n_in):
            if flags[j]:
                ins = tuple(Partial(p) if i == j else R for i in range(n_in))
                out.append(((Partial(p),), ins))
    return out


def _trapezoid(op: Any, call: OpCall, st: dict, cumulative: bool) -> OpPlan:
    roles = call.arg_roles
    if "y" not in roles:
        raise ShardingError(f"{call.describe()}: {op.name} needs y as a DTensor")
    y = call.specs[roles.index("y")]
    if y.ndim == 0:
        raise ValueError(f"{op.name}: y must have at least one dimension")
    dim = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), y.ndim, "dim")
    maps: list[dict[int, int] | None] = []
    for r, s in zip(roles, call.specs):
        if r == "y":
            m = _keep_except(y.ndim, {dim})
        elif s.ndim == y.ndim:  # x broadcast against y; a 1-d x runs along dim only
            m = {d: d for d in range(y.ndim) if d != dim and s.shape[d] == y.shape[d] != 1}
        else:
            m = None
        if m is not None and not cumulative:
            m = {d: (d if d < dim else d - 1) for d in m}
        maps.append(m)
    if cumulative:
        shape = list(y.shape)
        shape[dim] = max(shape[dim] - 1, 0)
    else:
        shape = [n for d, n in enumerate(y.shape) if d != dim]
    strategies = keep_strategies(maps, 1)
    strategies += _one_partial(len(call.specs), [True] * len(call.specs))
    return OpPlan([tuple(shape)], strategies)


_TRAPEZOID_SIG = ("y", "x", "dx", "dim")


@_KINDS.kind("trapezoid", _TRAPEZOID_SIG, ("dim",))
def _plan_trapezoid(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _trapezoid(op, call, st, False)


@_KINDS.kind("cumulative_trapezoid", _TRAPEZOID_SIG, ("dim",))
def _plan_cumulative_trapezoid(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _trapezoid(op, call, st, True)


@_KINDS.kind("cross", ("input", "other", "dim"), ("dim",))
def _plan_cross(op: Any, call: OpCall, st: dict) -> OpPlan:
    if len(call.specs) != 2:
        raise ShardingError(f"{call.describe()}: cross takes two DTensors on one mesh")
    a, b = call.specs
    out = broadcast_shapes(a.shape, b.shape)
    n = len(out)
    dim = st.get("dim")
    if dim is None:  # torch.cross's deprecated default: input's first dim of size 3
        k = next((d for d, s in enumerate(a.shape) if s == 3), None)
        if k is None:
            raise ValueError("no dimension of size 3 in input")
        d = k + n - a.ndim
    else:
        d = normalize_dim(as_int(dim, "dim"), n, "dim")
    if out[d] != 3:
        raise ValueError(f"linalg.cross: inputs dimension {d} must have length 3. Got {out[d]}")
    maps = []
    for s in (a, b):
        lead = n - s.ndim
        maps.append(
            {k: k + lead for k in range(s.ndim) if k + lead != d and s.shape[k] == out[k + lead]}
        )
    strategies = keep_strategies(maps, 1) + _one_partial(2, [True, True])
    if dim is not None:
        return OpPlan([out], strategies)

    def local(layout: Layout) -> Layout:  # the default dim is read from the GLOBAL shape
        layout.overrides = {**(layout.overrides or {}), "dim": d}
        return layout

    return OpPlan([out], strategies, local=local)


@_KINDS.kind("median", ("input", "dim", "keepdim"), ("dim", "keepdim"))
def _plan_median(op: Any, call: OpCall, st: dict) -> OpPlan:
    # median(x) / nanmedian(x): the median of every element (gathered); with a dim the
    # (values, indices) pair of kthvalue's plan
    op._one(call)
    if st.get("dim") is None:
        return OpPlan([()], [])
    return op._plan_kthvalue(call, st)


@_KINDS.kind(
    "quantile",
    ("input", "q", "dim", "keepdim", "interpolation"),
    ("q", "dim", "keepdim"),
)
def _plan_quantile(op: Any, call: OpCall, st: dict) -> OpPlan:
    roles = call.arg_roles
    if "input" not in roles:
        raise ShardingError(f"{call.describe()}: {op.name} needs its input as a DTensor")
    x = call.specs[roles.index("input")]
    keepdim = bool(st.get("keepdim"))
    dims = reduced_dims(st.get("dim"), x.ndim, what=op.name)
    out = reduced_shape(x.shape, dims, keepdim)
    qspec = call.specs[roles.index("q")] if "q" in roles else None
    if qspec is not None and qspec.ndim > 1:
        raise ValueError("quantile() q must be a scalar or 1D tensor")
    if isinstance(st.get("q"), (list, tuple)):
        raise TypeError("quantile on a DTensor takes q as a float or a DTensor")
    lead = 0
    shape = tuple(out)
    if qspec is not None and qspec.ndim == 1:
        lead, shape = 1, (qspec.shape[0], *out)
    kept = kept_dim_map(x.ndim, dims, keepdim)
    maps: list[dict[int, int] | None] = []
    for r in roles:
        if r == "input":
            maps.append({d: o + lead for d, o in kept.items()})
        else:
            maps.append({0: 0} if lead else None)
    return OpPlan([shape], keep_strategies(maps, 1), accept=nonempty_shards(call))


@_KINDS.kind("sum_to_size", ("input", "*size"), ("size",))
def _plan_sum_to_size(op: Any, call: OpCall, st: dict) -> OpPlan:
    spec = op._one(call)
    raw = st.get("size")
    if not isinstance(raw, (list, tuple)):
        raise TypeError("sum_to_size needs a size")
    seq = raw[0] if len(raw) == 1 and isinstance(raw[0], (list, tuple)) else raw
    size = [as_int(s, "size") for s in seq]
    lead = spec.ndim - len(size)
    if lead < 0 or any(n != s and s != 1 for n, s in zip(spec.shape[lead:], size)):
        raise ValueError(f"size {size} is not expandable to size {list(spec.shape)}")
    strategies: list[SingleDimStrategy] = []
    for d in range(spec.ndim):
        if d < lead or (size[d - lead] == 1 and spec.shape[d] != 1):
            strategies.append(((Partial("sum"),), (Shard(d),)))  # a summed dim
        else:
            strategies.append(((Shard(d - lead),), (Shard(d),)))
    pl: Placement
    for pl in partials_of([spec]):
        if pl.reduce_op in LINEAR_OPS:
            strategies.append(((pl,), (pl,)))
    mesh = call.mesh
    out_shape = tuple(size)

    def local(layout: Layout) -> Layout:  # the local call sums to this rank's output shard
        coord, out = mesh.get_coordinate(), layout.outputs[0]
        if coord is not None and out is not None:
            ls, _ = compute_local_shape_and_offset(out_shape, mesh.shape, out, coord)
            layout.overrides = {**(layout.overrides or {}), "size": tuple(ls)}
        return layout

    return OpPlan([out_shape], strategies, local=local)


@_KINDS.kind("prelu", ("input", "weight"), ())
def _plan_prelu(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.prelu(input, weight): elementwise, weight one slope per channel (input dim 1) or
    # a single one; every input dim keeps its shard, the channel dim with the weight alike
    roles = call.arg_roles
    if roles != ["input", "weight"]:
        raise ShardingError(f"{call.describe()}: prelu takes input and weight as DTensors")
    x, w = call.specs
    per_channel = w.ndim == 1 and w.shape[0] > 1 and x.ndim >= 2
    if w.ndim == 1 and w.shape[0] > 1 and (x.ndim < 2 or x.shape[1] != w.shape[0]):
        raise ValueError(
            f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
            f"{w.shape[0]} and channel size = {x.shape[1] if x.ndim >= 2 else 1}."
        )
    maps = [{d: d for d in range(x.ndim)}, {0: 1} if per_channel else None]
    return OpPlan([x.shape], keep_strategies(maps, 1))


@_KINDS.kind("rrelu", ("input", "lower", "upper", "training", "inplace"), ("training",))
def _plan_rrelu(op: Any, call: OpCall, st: dict) -> OpPlan:
    # F.rrelu: elementwise in evaluation; in training every negative element draws its own
    # slope from the generator, so the input is gathered and every rank draws the same
    # global slopes (identical generator states, as the random rule's Replicate case)
    spec = op._one(call)
    if st.get("training"):
        return OpPlan([spec.shape], [])
    return OpPlan([spec.shape], keep_strategies([{d: d for d in range(spec.ndim)}], 1))
