"""More ``rule: tensor_op`` kinds: lookups of values in other tensors — ``take``,
``take_along_dim``, ``searchsorted``, ``bucketize``, ``isin``, ``embedding_bag`` — and
pairwise distances and moments (``cdist``, ``pdist``, ``cov``, ``corrcoef``) (semantics as the torch
functions of the same names; the local call is the op itself on the local shards).

* ``take(input, index)`` reads the flattened input: ``input`` is gathered, ``index`` keeps
  its shards (the output has its shape); a ``Partial`` input passes through (selection);
* ``take_along_dim(input, indices, dim)``: ``input`` is gathered along ``dim``; the other
  dims keep their shards where input and indices hold them at full size (broadcast ones
  Replicate); ``indices`` may stay sharded along ``dim`` (the output follows it); without
  ``dim`` both are flattened and gathered;
* ``searchsorted(sorted_sequence, input)``, ``bucketize(input, boundaries)``,
  ``isin(elements, test_elements)`` are elementwise in the values looked up (they keep
  every shard) with the table Replicate; an N-D ``sorted_sequence`` (and its ``sorter``)
  shares its leading dims with ``input``, which may stay sharded on both. The outputs are
  integers or bools: no ``Partial``;
* ``embedding_bag`` keeps a weight column shard (the output's last dim), a batch shard of a
  2-d input of bags, and a weight ``Partial`` for ``sum``/``mean``; ``cdist`` keeps batch
  shards and each point set's own dim (the distance's feature dim is gathered); ``pdist``,
  ``max_unpool`` keeps the batch/channel shards of input and indices, the spatial dims
  gathered (the indices are flat positions in each plane's output).
  ``cov`` and ``corrcoef`` pair every row with every other: their inputs are gathered.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ._util import R, broadcast_shapes, normalize_dim
from .planned import OpPlan, as_int, keep_strategies, no_empty_shards, partials_of
from .tensor_ops import _KINDS

__all__: list[str] = []


def _role(call: OpCall, name: str) -> Any:
    for r, s in zip(call.arg_roles, call.specs):
        if r == name:
            return s
    return None


@_KINDS.kind("take", ("input", "index"), ())
def _plan_take(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, idx = _role(call, "input"), _role(call, "index")
    if x is None or idx is None:
        raise ShardingError(f"{call.describe()}: take needs input and index as DTensors")
    maps = [None if r == "input" else {d: d for d in range(idx.ndim)} for r in call.arg_roles]
    flags = [r == "input" for r in call.arg_roles]
    return OpPlan([idx.shape], keep_strategies(maps, 1, partials_of([x]), flags))


@_KINDS.kind("take_along_dim", ("input", "indices", "dim"), ("dim",))
def _plan_take_along_dim(op: Any, call: OpCall, st: dict) -> OpPlan:
    x, idx = _role(call, "input"), _role(call, "indices")
    if x is None or idx is None:
        raise ShardingError(
            f"{call.describe()}: take_along_dim needs input and indices as DTensors"
        )
    flags = [r == "input" for r in call.arg_roles]
    parts = partials_of([x])
    if st.get("dim") is None:
        maps: list[dict[int, int] | None] = [None] * len(call.specs)
        return OpPlan([(math.prod(idx.shape),)], keep_strategies(maps, 1, parts, flags))
    if x.ndim != idx.ndim:
        raise ValueError(
            f"torch.take_along_dim(): input and indices should have the same number of "
            f"dimensions, but got {x.ndim} dimensions for input, and {idx.ndim} dimensions for "
            f"indices"
        )
    dim = normalize_dim(as_int(st["dim"], "dim"), x.ndim, "dim")
    out = []
    for d, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if d == dim:
            out.append(b)
        elif a != b and 1 not in (a, b):
            raise ValueError(
                f"take_along_dim: shapes {list(x.shape)} and {list(idx.shape)} do not broadcast"
            )
        else:
            out.append(b if a == 1 else a)
    mx = {d: d for d in range(x.ndim) if d != dim and x.shape[d] == out[d]}
    mi = {d: d for d in range(idx.ndim) if idx.shape[d] == out[d]}
    maps = [mx if r == "input" else mi for r in call.arg_roles]
    return OpPlan([tuple(out)], keep_strategies(maps, 1, parts, flags))


def _elementwise_lookup(call: OpCall, values: str) -> OpPlan:
    v = _role(call, values)
    if v is None:  # a python-scalar value: a 0-d result
        return OpPlan([()], [])
    maps = [{d: d for d in range(v.ndim)} if r == values else None for r in call.arg_roles]
    return OpPlan([v.shape], keep_strategies(maps, 1))


@_KINDS.kind(
    "searchsorted", ("sorted_sequence", "input", "out_int32", "right", "side", "sorter"), ()
)
def _plan_searchsorted(op: Any, call: OpCall, st: dict) -> OpPlan:
    seq, v = _role(call, "sorted_sequence"), _role(call, "input")
    if seq is None:
        raise ShardingError(f"{call.describe()}: searchsorted needs sorted_sequence as a DTensor")
    if v is None or seq.ndim <= 1:
        return _elementwise_lookup(call, "input")
    if v.ndim != seq.ndim or tuple(v.shape[:-1]) != tuple(seq.shape[:-1]):
        raise ValueError(
            f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
            f"dimensions of boundaries tensor and input value tensor must match, but we got "
            f"boundaries tensor {list(seq.shape)} and input value tensor {list(v.shape)}"
        )
    lead = {d: d for d in range(seq.ndim - 1)}
    maps = [{**lead, v.ndim - 1: v.ndim - 1} if r == "input" else lead for r in call.arg_roles]
    return OpPlan([v.shape], keep_strategies(maps, 1))


@_KINDS.kind("bucketize", ("input", "boundaries", "out_int32", "right"), ())
def _plan_bucketize(op: Any, call: OpCall, st: dict) -> OpPlan:
    b = _role(call, "boundaries")
    if b is not None and b.ndim != 1:
        raise ValueError(f"boundaries tensor must be 1 dimension, but got dim({b.ndim})")
    return _elementwise_lookup(call, "input")


@_KINDS.kind("isin", ("elements", "test_elements", "assume_unique", "invert"), ())
def _plan_isin(op: Any, call: OpCall, st: dict) -> OpPlan:
    return _elementwise_lookup(call, "elements")


_BAG_SIG = (
    "input", "weight", "offsets", "max_norm", "norm_type", "scale_grad_by_freq", "mode",
    "sparse", "per_sample_weights", "include_last_offset", "padding_idx",
)  # fmt: skip


@_KINDS.kind("embedding_bag", _BAG_SIG, ("max_norm", "mode", "include_last_offset"))
def _plan_embedding_bag(op: Any, call: OpCall, st: dict) -> OpPlan:
    # F.embedding_bag: a weight column shard (dim 1) shards the output's last dim; a 2-d
    # input of bags (B, n) keeps a batch shard (its per_sample_weights alike); sum/mean are
    # linear in the weight (Partial passes); max_norm renormalises whole weight rows in
    # place, so the weight must then be Replicate and stays where it is
    x, w = _role(call, "input"), _role(call, "weight")
    if x is None or w is None or w.ndim != 2:
        raise ShardingError(
            f"{call.describe()}: embedding_bag needs its input and a 2-d weight as DTensors"
        )
    mode = st.get("mode") or "mean"
    if x.ndim == 2:
        bags = x.shape[0]
    else:
        offs = _role(call, "offsets")
        if offs is None:
            raise ShardingError(
                f"{call.describe()}: a 1-d embedding_bag input needs offsets as a DTensor"
            )
        bags = offs.shape[0] - (1 if st.get("include_last_offset") else 0)
    shape = (bags, w.shape[1])
    renorm = st.get("max_norm") is not None
    maps: list[dict[int, int] | None] = []
    for r in call.arg_roles:
        if r == "weight":
            maps.append(None if renorm else {1: 1})
        elif r in ("input", "per_sample_weights") and x.ndim == 2:
            maps.append({0: 0})
        else:
            maps.append(None)
    flags = [r == "weight" for r in call.arg_roles]
    parts = [] if mode == "max" or renorm else partials_of([w])
    plan = OpPlan([shape], keep_strategies(maps, 1, parts, flags))
    if renorm:
        if any(p != R for p in w.placements):
            raise ShardingError(
                f"{call.describe()}: max_norm renormalises the looked-up weight rows in place, "
                f"which needs the whole rows on every rank: make the weight Replicate() first "
                f"or drop max_norm"
            )
        plan.fixed = tuple(i for i, r in enumerate(call.arg_roles) if r == "weight")
    return plan


@_KINDS.kind("cdist", ("x1", "x2", "p", "compute_mode"), ())
def _plan_cdist(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.cdist(x1 (B.., P, M), x2 (B.., R, M)) -> (B.., P, R): batch dims broadcast and
    # keep shards, P follows x1, R follows x2, M (the distance's sum) is gathered
    a, b = _role(call, "x1"), _role(call, "x2")
    if a is None or b is None or a.ndim < 2 or b.ndim < 2:
        raise ShardingError(f"{call.describe()}: cdist needs x1 and x2 as DTensors of >= 2 dims")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"X1 and X2 must have the same number of columns. X1: {a.shape[-1]} X2: {b.shape[-1]}"
        )
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n = len(batch)
    shape = (*batch, a.shape[-2], b.shape[-2])
    maps = []
    for s, own in ((a, n), (b, n + 1)):
        lead = n - (s.ndim - 2)
        m = {k: k + lead for k in range(s.ndim - 2) if s.shape[k] == batch[k + lead]}
        m[s.ndim - 2] = own
        maps.append(m)
    return OpPlan([shape], keep_strategies(maps, 1))


def _whole(call: OpCall, shape: tuple[int, ...]) -> OpPlan:
    return OpPlan([shape], keep_strategies([None] * len(call.specs), 1))


@_KINDS.kind("pdist", ("input", "p"), ())
def _plan_pdist(op: Any, call: OpCall, st: dict) -> OpPlan:
    x = op._one(call)
    if x.ndim != 2:
        raise ValueError(f"pdist only supports 2D tensors, got: {x.ndim}D")
    n = x.shape[0]
    return _whole(call, (n * (n - 1) // 2,))


@_KINDS.kind("cov", ("input", "correction", "fweights", "aweights"), ())
@_KINDS.kind("corrcoef", ("input",), ())
def _plan_cov(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.cov / corrcoef: every variable pairs with every other over all observations
    x = _role(call, "input")
    if x is None or x.ndim > 2:
        raise ValueError("cov(): expected input to have two or fewer dimensions")
    n = x.shape[0] if x.ndim == 2 else 1
    return _whole(call, (n, n) if n > 1 else ())


def _pair(v: Any, n: int, name: str) -> tuple[int, ...]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v] * n
    if len(vals) != n:
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
    return tuple(as_int(x, name) for x in vals)


def _batch_only(call: OpCall, x: Any, shape: tuple[int, ...], batched: bool) -> OpPlan:
    # a (N, ...) input keeps its batch shard; every other dim is gathered; the ops are
    # linear in their input (they copy or add elements), so Partial values pass through
    maps = [{0: 0} if batched and s is x else None for s in call.specs]
    return OpPlan([shape], keep_strategies(maps, 1, partials_of([x]), [s is x for s in call.specs]))


@_KINDS.kind(
    "im2col",
    ("input", "kernel_size", "dilation", "padding", "stride"),
    ("kernel_size", "dilation", "padding", "stride"),
)
def _plan_im2col(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.nn.functional.unfold(input (N, C, *spatial) or (C, *spatial), kernel_size, ...):
    # (N, C * prod(kernel), L), L the number of sliding blocks; the batch dim keeps its shard
    x = _role(call, "input")
    if x is None or x.ndim not in (3, 4):
        raise ShardingError(
            f"{call.describe()}: torch.nn.functional.unfold needs a 3-d or 4-d DTensor input"
        )
    batched = x.ndim == 4
    sp = x.shape[-2:]
    k = _pair(st.get("kernel_size"), 2, "kernel_size")
    d = _pair(st.get("dilation", 1) if st.get("dilation") is not None else 1, 2, "dilation")
    p = _pair(st.get("padding", 0) if st.get("padding") is not None else 0, 2, "padding")
    s = _pair(st.get("stride", 1) if st.get("stride") is not None else 1, 2, "stride")
    blocks = [(sp[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    if min(blocks) <= 0:
        raise ValueError(
            f"unfold: the spatial size {tuple(sp)} with kernel {k}, dilation {d}, padding {p} "
            f"and stride {s} gives no sliding block"
        )
    c = x.shape[-3] * k[0] * k[1]
    shape = ((x.shape[0],) if batched else ()) + (c, blocks[0] * blocks[1])
    return _batch_only(call, x, shape, batched)


@_KINDS.kind(
    "col2im",
    ("input", "output_size", "kernel_size", "dilation", "padding", "stride"),
    ("output_size", "kernel_size", "dilation", "padding", "stride"),
)
def _plan_col2im(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.nn.functional.fold(input (N, C * prod(kernel), L) or (C * prod(kernel), L),
    # output_size, kernel_size, ...): (N, C, *output_size); the batch dim keeps its shard
    x = _role(call, "input")
    if x is None or x.ndim not in (2, 3):
        raise ShardingError(
            f"{call.describe()}: torch.nn.functional.fold needs a 2-d or 3-d DTensor input"
        )
    batched = x.ndim == 3
    out = _pair(st.get("output_size"), 2, "output_size")
    k = _pair(st.get("kernel_size"), 2, "kernel_size")
    if x.shape[-2] % (k[0] * k[1]):
        raise ValueError(
            f"fold: expected size of input's dimension 1 ({x.shape[-2]}) to be divisible by "
            f"the product of kernel_size ({k[0] * k[1]})"
        )
    c = x.shape[-2] // (k[0] * k[1])
    shape = ((x.shape[0],) if batched else ()) + (c, *out)
    return _batch_only(call, x, shape, batched)


@_KINDS.kind("linspace", ("start", "end", "steps", "base"), ("steps",))
def _plan_linspace(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.linspace / logspace with 0-d DTensor start or end: a Replicate (steps,) tensor
    # from the whole (Partial reduced) values
    if st.get("steps") is None:
        raise TypeError(f"{op.name} needs steps")
    steps = as_int(st["steps"], "steps")
    if steps < 0:
        raise ValueError("number of steps must be non-negative")
    if any(s.ndim != 0 for s in call.specs):
        raise ValueError(f"{op.name}(): start and end must be 0-dimensional tensors")
    return _whole(call, (steps,))


@_KINDS.kind("histogram", ("input", "bins", "range", "weight", "density"), ("bins",))
def _plan_histogram(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.histogram(input, bins): (hist, bin_edges) counted over every element, so the
    # inputs are gathered; int bins give (bins,) and (bins + 1,), a 1-d DTensor of edges
    # (n,) gives (n - 1,) and (n,)
    bins = st.get("bins")
    edges = _role(call, "bins")
    if edges is not None:
        if edges.ndim != 1:
            raise ValueError("torch.histogram(): bins tensor should have one dimension")
        n = edges.shape[0]
    elif bins is None:
        raise TypeError("histogram needs bins")
    else:
        n = as_int(bins, "bins") + 1
    return OpPlan([(n - 1,), (n,)], keep_strategies([None] * len(call.specs), 2))


@_KINDS.kind("masked_scatter", ("input", "mask", "source"), ())
def _plan_masked_scatter(op: Any, call: OpCall, st: dict) -> OpPlan:
    # Tensor.masked_scatter(mask, source): source elements are taken in the global order of
    # the mask's True positions, so every argument is gathered
    x, mask = _role(call, "input"), _role(call, "mask")
    if x is None or mask is None:
        raise ShardingError(f"{call.describe()}: masked_scatter needs input and mask as DTensors")
    return _whole(call, broadcast_shapes(x.shape, mask.shape))


@_KINDS.kind("multi_dot", ("*tensors",), ())
def _plan_multi_dot(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.linalg.multi_dot([A, B, ...]): a chain of matrix products (the first and last
    # may be 1-d); the factors are gathered (a Partial one reduced first) and multiplied
    # whole, so the product order torch picks is kept
    specs = list(call.specs)
    if len(specs) < 2 or len(specs) != len(call.arg_roles):
        raise ShardingError(
            f"{call.describe()}: multi_dot needs at least two tensors, all DTensors on one mesh"
        )
    first, last = specs[0], specs[-1]
    if any(s.ndim != 2 for s in specs[1:-1]) or first.ndim not in (1, 2) or last.ndim not in (1, 2):
        raise ValueError("multi_dot(): the first and last tensors must be 1D or 2D, the others 2D")
    shape = ((first.shape[0],) if first.ndim == 2 else ()) + (
        (last.shape[1],) if last.ndim == 2 else ()
    )
    return _whole(call, shape)


@_KINDS.kind("vander", ("x", "N", "increasing"), ("N",))
def _plan_vander(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.vander(x, N=None, increasing=False): (n,) -> (n, N), each row from one element
    # of x, so the rows keep x's shard when N is given (without it the local call would
    # take N from the local length: x is gathered)
    x = _role(call, "x")
    if x is None or x.ndim != 1:
        raise ValueError("x must be a one-dimensional tensor.")
    n = st.get("N")
    cols = x.shape[0] if n is None else as_int(n, "N")
    if cols < 0:
        raise ValueError("N must be non-negative.")
    return OpPlan([(x.shape[0], cols)], keep_strategies([None if n is None else {0: 0}], 1))


@_KINDS.kind("combinations", ("input", "r", "with_replacement"), ("r", "with_replacement"))
def _plan_combinations(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.combinations(input, r=2, with_replacement=False): every r-subset of the 1-d
    # input, so the input is gathered; a selection, so Partial values pass through
    x = _role(call, "input")
    if x is None or x.ndim != 1:
        raise ValueError("Expect a 1D vector, but got shape of a different rank")
    r = as_int(st.get("r") if st.get("r") is not None else 2, "r")
    if r < 0:
        raise ValueError(f"Expect a non-negative number, but got {r}")
    n = x.shape[0]
    count = math.comb(n + r - 1, r) if st.get("with_replacement") else math.comb(n, r)
    shape = (count, r) if r else (0,)
    return OpPlan([shape], keep_strategies([None], 1, partials_of([x])))


@_KINDS.kind("diagflat", ("input", "offset"), ("offset",))
def _plan_diagflat(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.diagflat(input, offset): the flattened input on a diagonal of a square matrix;
    # the input is gathered; every other element is 0, so Partial values pass through
    x = _role(call, "input")
    if x is None:
        raise ShardingError(f"{call.describe()}: diagflat needs a DTensor input")
    n = math.prod(x.shape) + abs(as_int(st.get("offset") or 0, "offset"))
    return OpPlan([(n, n)], keep_strategies([None], 1, partials_of([x])))


@_KINDS.kind("put", ("input", "index", "source", "accumulate"), ("accumulate",))
def _plan_put(op: Any, call: OpCall, st: dict) -> OpPlan:
    # Tensor.put(index, source, accumulate): flat global indices into the input, so every
    # argument is gathered
    x = _role(call, "input")
    if x is None:
        raise ShardingError(f"{call.describe()}: put needs a DTensor input")
    return _whole(call, x.shape)


@_KINDS.kind("grid_sample", ("input", "grid", "mode", "padding_mode", "align_corners"), ())
def _plan_grid_sample(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.nn.functional.grid_sample(input (N, C, *in), grid (N, *out, k)): (N, C, *out);
    # batch shards are kept on both, a channel shard of input with grid Replicate; linear in
    # input for a fixed grid, so an input Partial passes through (grid Replicate)
    x, grid = _role(call, "input"), _role(call, "grid")
    if x is None or grid is None or x.ndim not in (4, 5) or grid.ndim != x.ndim:
        raise ShardingError(
            f"{call.describe()}: grid_sample needs 4-d or 5-d DTensor input and grid"
        )
    if grid.shape[0] != x.shape[0] or grid.shape[-1] != x.ndim - 2:
        raise ValueError(
            f"grid_sample(): expected grid of shape ({x.shape[0]}, ..., {x.ndim - 2}), got "
            f"{tuple(grid.shape)}"
        )
    shape = (x.shape[0], x.shape[1], *grid.shape[1:-1])
    maps = [{0: 0, 1: 1} if s is x else {0: 0} for s in call.specs]
    flags = [s is x for s in call.specs]
    return OpPlan([shape], keep_strategies(maps, 1, partials_of([x]), flags))


@_KINDS.kind(
    "max_unpool", ("input", "indices", "output_size", "stride", "padding"), ("output_size",)
)
def _plan_max_unpool(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch._C._nn.max_unpool2d/3d(input (*lead, *in), indices (same), output_size): (*lead,
    # *output_size), as F.max_unpool1d/2d/3d call them; the indices address each lead
    # (batch, channel) plane's flattened output, so lead shards are kept on input and
    # indices and the spatial dims gathered; a Partial input is reduced first
    x, idx = _role(call, "input"), _role(call, "indices")
    size = st.get("output_size")
    if x is None or idx is None or not isinstance(size, (list, tuple)) or not size:
        raise ShardingError(
            f"{call.describe()}: max_unpool needs DTensor input and indices and an output_size"
        )
    size = [as_int(s, "output_size") for s in size]
    lead = x.ndim - len(size)
    shape = (*x.shape[:lead], *size)
    maps = [{d: d for d in range(lead)} if (s is x or s is idx) else None for s in call.specs]
    # torch's kernel rejects an empty channel dim: no rank may hold an empty lead shard (one
    # rank raising would leave the others waiting in the next collective)
    return OpPlan([shape], keep_strategies(maps, 1), accept=no_empty_shards(list(call.specs)))


@_KINDS.kind(
    "max_pool_backward",
    ("grad_output", "input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
     "indices"),
    (),
)  # fmt: skip
def _plan_max_pool_backward(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.ops.aten.max_pool2d/3d_with_indices_backward(grad_output (*lead, *out), input
    # (*lead, *in), ..., indices (*lead, *out)): the input's shape; each lead (batch,
    # channel) plane scatters its own gradient by its indices, so lead shards are kept on
    # all three, the spatial dims gathered; no rank holds an empty plane (the kernel
    # rejects one); a Partial grad_output passes (linear in it)
    g, x, idx = _role(call, "grad_output"), _role(call, "input"), _role(call, "indices")
    if g is None or x is None or idx is None or x.ndim < 3:
        raise ShardingError(
            f"{call.describe()}: max_pool backward needs DTensor grad_output, input and indices"
        )
    lead = x.ndim - (3 if "3d" in call.platform_name else 2)  # the spatial dims follow
    maps = [{d: d for d in range(lead)} if s in (g, x, idx) else None for s in call.specs]
    flags = [s is g for s in call.specs]
    return OpPlan(
        [tuple(x.shape)],
        keep_strategies(maps, 1, partials_of([g]), flags),
        accept=no_empty_shards(list(call.specs)),
    )


@_KINDS.kind("affine_grid", ("theta", "size", "align_corners"), ("size",))
def _plan_affine_grid(op: Any, call: OpCall, st: dict) -> OpPlan:
    # torch.nn.functional.affine_grid(theta (N, k, k + 1), size (N, C, *spatial)):
    # (N, *spatial, k); theta is gathered (the local call reads the global N from size);
    # linear in theta, so Partial passes through
    theta = _role(call, "theta")
    size = st.get("size")
    if theta is None or not isinstance(size, (list, tuple)) or len(size) not in (4, 5):
        raise ShardingError(
            f"{call.describe()}: affine_grid needs a DTensor theta and a 4- or 5-long size"
        )
    size = [as_int(s, "size") for s in size]
    shape = (size[0], *size[2:], len(size) - 2)
    return OpPlan([shape], keep_strategies([None], 1, partials_of([theta])))
