"""Context parallelism as sharding strategies of ``scaled_dot_product_attention``: when
query, key and value arrive sharded along the sequence on one mesh dim, three local
kernels can compute it, and the cost model (or the user) picks one:

* ``allgather`` — key and value all-gathered along the sequence (the rule's
  sequence-sharded-query strategy, run by the redistribution executor; backward:
  reduce-scatter), the query kept, the causal mask shifted
  (:class:`~hyper_shard.kernels.attention.ShardedSDPA`);
* ``ring`` — key/value pieces passed round the ring, blocks merged by log-sum-exp
  (:class:`~hyper_shard.kernels.ring_attention.RingAttention`): memory O(sequence / n);
* ``ulysses`` — all-to-all to heads-sharded, attention over the whole sequence, all-to-all
  back (:class:`~hyper_shard.kernels.attention_alltoall.AllToAllAttention`): the heads must
  split over the ranks.

Costs are alpha-beta per rank on the mesh dim (:mod:`hyper_shard.redistribute.cost`: the
platform's latency per hop, seconds per byte, native collectives), forward and backward,
with ``B`` a local key+value piece, ``Q``/``O`` the local query/output:

==========  =============================================  ==================================
method      forward                                        backward
==========  =============================================  ==================================
allgather   all-gather of key and value (the planner's     reduce-scatter of their gradients
            price)                                         (priced as the forward)
ring        ``n - 1`` shifts of ``B``                      ``n - 1`` shifts of ``B`` and ``n``
                                                           of its gradient
ulysses     all-to-all of ``Q``, ``B`` and ``O``            the same
==========  =============================================  ==================================

A shift is one paired send/recv (``alpha + B beta``) where the platform has point-to-point,
else an all-gather. Where it is asynchronous (``Comm.async_point_to_point``) a shift
overlaps a block's compute, modelled as ``flops x`` :data:`FLOP_SECONDS`: only what the
compute does not cover is paid (at least one ``alpha``). Ties go to ``allgather`` (PyTorch's
default rotation), then ``ring``.

The choice is made per call signature when the decision is cached; ``set_rotate_method``
and ``set_context_parallel_method`` (:mod:`hyper_shard.experimental`) clear the cache.
Framework-neutral.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..dispatch.op import Layout, OpCall
from ..dispatch.search import SingleDimStrategy, search_strategy
from ..errors import ShardingError
from ..kernels.attention_alltoall import AllToAllAttention
from ..kernels.attention_layout import cp_options
from ..kernels.ring_attention import RingAttention, shift_route
from ..placement import Shard, normalize_placements
from ..redistribute.planner import cost_model_for

if TYPE_CHECKING:
    from ..redistribute.cost import CostModel

__all__ = ["FLOP_SECONDS", "cp_costs", "context_parallel_layout"]

#: modelled seconds per floating-point operation of local attention (10 GFLOP/s: a CPU
#: core; it only decides how much of a ring shift a block's compute hides)
FLOP_SECONDS = 1e-10


def _seq_dim_of(spec: Any) -> int:
    return spec.ndim - 2


def _cp_mesh_dim(call: OpCall, idx: dict[str, int]) -> int | None:
    """The one mesh dim sharding the sequence of query, key and value alike (and no other
    mesh dim sharding any of their sequences), or None."""
    mesh = call.mesh
    found = None
    for m in range(mesh.ndim):
        kinds = []
        for r in ("query", "key", "value"):
            s = call.specs[idx[r]]
            p = normalize_placements(s.placements, mesh.ndim, s.ndim)[m]
            kinds.append(type(p) is Shard and p.dim == _seq_dim_of(s))
        if all(kinds):
            if found is not None or mesh.size(m) == 1:
                return None
            found = m
        elif any(kinds):
            return None
    return found


def _local_shape(shape: tuple[int, ...], placements: Any, mesh: Any) -> tuple[int, ...]:
    """The largest local shard's shape of ``shape`` under ``placements``."""
    splits = [1] * len(shape)
    for m, p in enumerate(normalize_placements(placements, mesh.ndim, len(shape))):
        if type(p) is Shard:
            splits[p.dim] *= mesh.size(m)
    return tuple(-(-d // s) for d, s in zip(shape, splits))


def cp_costs(
    cm: CostModel,
    m: int,
    n: int,
    q_bytes: int,
    kv_bytes: int,
    out_bytes: int,
    flops: float,
    *,
    async_p2p: bool,
    shift_by: str,
    ulysses_kv_bytes: int | None,
) -> dict[str, float]:
    """Modelled seconds (forward + backward, per rank) of the ring and all-to-all methods
    on mesh dim ``m`` of ``n`` ranks (see the module docstring).

    Args:
        q_bytes, kv_bytes, out_bytes: local query, key+value and output bytes.
        flops: floating-point operations of one ring block's forward.
        async_p2p: shifts overlap compute.
        shift_by: ``"send_recv"`` or ``"all_gather"`` (:func:`~hyper_shard.platform.
            compose.shift_route`).
        ulysses_kv_bytes: key+value bytes the all-to-all moves (repeated heads included),
            or None when the all-to-all form does not apply.
    """
    a, b = cm.alpha_at(m), cm.beta_at(m)
    hops = 1 if shift_by == "send_recv" else n - 1
    shift = cm.step_penalty + hops * (a + kv_bytes * b)
    blk = flops * FLOP_SECONDS

    def exposed(comm: float, compute: float) -> float:
        return max(a, comm - compute) if async_p2p else comm

    # backward: per step a key/value shift and a gradient shift over one block's backward
    # (about 2.5 forwards: the recomputation and three matmuls), then the last gradient hop
    ring = (n - 1) * exposed(shift, blk) + (n - 1) * exposed(2 * shift, 2.5 * blk) + shift
    out = {"ring": ring}
    if ulysses_kv_bytes is not None:
        fwd = sum(
            cm.step_cost("all_to_all", m, n, nb, nb)
            for nb in (q_bytes, ulysses_kv_bytes // 2, ulysses_kv_bytes // 2, out_bytes)
        )
        out["ulysses"] = 2 * fwd  # backward: the four transposed all-to-alls
    return out


def _ulysses_heads(call: OpCall, idx: dict[str, int], local_q: Any, local_k: Any, n: int) -> str:
    """Why the all-to-all form cannot split the local heads over ``n`` ranks ('' if it
    can)."""
    q = call.specs[idx["query"]]
    if q.ndim < 3:
        return "the query has no heads dim (it needs (..., heads, seq, features))"
    hq, hkv = local_q[-3], local_k[-3]
    if hq % n:
        return f"{hq} query heads per rank do not split over {n} ranks"
    if hkv % n and hq % hkv:
        return f"{hkv} key/value heads do not split over {n} ranks"
    return ""


def context_parallel_layout(
    op: Any, call: OpCall, idx: dict[str, int], ag: Layout
) -> Layout | None:
    """The context-parallel decision for a call whose query, key and value are
    sequence-sharded on one mesh dim (None: keep ``ag``, the all-gather decision).

    Raises:
        ShardingError: the all-to-all form forced (``set_context_parallel_method(
            "ulysses")``) on heads that do not split over the ranks.
    """
    method = cp_options().method
    if method == "allgather":
        return None
    specs = call.specs
    q, k, v = (specs[idx[r]] for r in ("query", "key", "value"))
    if "attn_mask" in idx or call.get("attn_mask") is not None:
        return None
    if float(call.static.get("dropout_p") or 0.0) > 0.0:
        return None
    if not (q.ndim == k.ndim == v.ndim) or k.tensor_meta.dtype != v.tensor_meta.dtype:
        return None
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        return None
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        if not call.get("enable_gqa") or k.shape[-3] == 0 or q.shape[-3] % k.shape[-3]:
            return None
    m = _cp_mesh_dim(call, idx)
    if m is None:
        return None
    mesh = call.mesh
    n = mesh.size(m)
    causal = bool(call.get("is_causal"))
    nl = len(op._lead(call, idx))
    seq_strategy: SingleDimStrategy = (
        (Shard(nl),),
        tuple(Shard(_seq_dim_of(s)) for s in specs),  # only query, key and value here
    )

    def accept(ins: tuple, outs: tuple) -> bool:
        if not op.accept(call, ins, outs):
            return False
        for mm in range(mesh.ndim):  # the sequence strategy on the cp mesh dim only
            pk = normalize_placements(ins[idx["key"]], mesh.ndim, k.ndim)[mm]
            if type(pk) is Shard and pk.dim == _seq_dim_of(k) and mm != m:
                return False
        return True

    cm = cost_model_for(mesh)
    try:
        res = search_strategy(
            specs, [*op.single_dim_strategies(call), seq_strategy], 1, cm, accept=accept
        )
    except ValueError:
        return None
    kp = normalize_placements(res.inputs[idx["key"]], mesh.ndim, k.ndim)[m]
    if not (type(kp) is Shard and kp.dim == _seq_dim_of(k)):
        return None
    # in a compiled region the ring's shifts are traced as functional collectives (the
    # platform's send_recv while tracing), its loop unrolled into the graph
    ring_ok = not causal or q.shape[-2] == k.shape[-2]
    shapes = {r: _local_shape(specs[idx[r]].shape, res.inputs[idx[r]], mesh) for r in idx}
    why = _ulysses_heads(call, idx, shapes["query"], shapes["key"], n)
    if method == "ulysses" and why:
        raise ShardingError(
            f"{call.describe()}: the all-to-all (Ulysses) context-parallel attention splits "
            f"the heads over the {n} ranks of mesh dim {m}, but {why}; choose a head count "
            f"divisible by {n}, or set_context_parallel_method('ring') / 'allgather'"
        )
    if method == "ring" and not ring_ok:
        return None
    item = q.tensor_meta.itemsize
    q_bytes = math.prod(shapes["query"]) * item
    kv_bytes = (math.prod(shapes["key"]) + math.prod(shapes["value"])) * item
    choice = method
    if method == "auto":
        ql = shapes["query"]
        e = q.shape[-1]
        lead = math.prod(ql[:-2])
        flops = 4.0 * lead * ql[-2] * -(-k.shape[-2] // n) * e * (0.5 if causal else 1.0)
        rep = 1
        if q.ndim >= 3 and shapes["key"][-3] % n and shapes["key"][-3]:
            rep = shapes["query"][-3] // shapes["key"][-3]
        plat = call.platform
        costs = cp_costs(
            cm, m, n, q_bytes, kv_bytes, q_bytes * v.shape[-1] // max(q.shape[-1], 1), flops,
            async_p2p=bool(getattr(plat, "async_point_to_point", False)),
            shift_by=shift_route(plat) if plat is not None else "send_recv",
            ulysses_kv_bytes=None if why else kv_bytes * rep,
        )  # fmt: skip
        totals = {"allgather": 2 * ag.cost}
        if ring_ok:
            totals["ring"] = 2 * res.cost + costs["ring"]
        if "ulysses" in costs:
            totals["ulysses"] = 2 * res.cost + costs["ulysses"]
        choice = min(totals, key=lambda x: (totals[x], list(totals).index(x)))
        if choice == "allgather":
            return None
        cost = totals[choice]
    else:
        cost = res.cost
    layout = Layout(list(res.inputs), list(res.outputs), op.output_shapes(call), cost=cost)
    coord = mesh.get_coordinate()
    if coord is None or mesh.is_abstract:
        return layout
    group, plat = mesh._group(m), call.platform
    binder = call.binder or op.binder
    if choice == "ring":
        layout.impl = RingAttention(binder, plat, group, n, coord[m], q.shape[-2], k.shape[-2])
    else:
        layout.impl = AllToAllAttention(
            call.func, binder, plat, group, n, coord[m], q.shape[-2], k.shape[-2]
        )
    return layout
