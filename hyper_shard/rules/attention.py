"""Scaled dot-product attention: ``scaled_dot_product_attention(query, key, value,
attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)``.

Global shapes: ``query (*batch, Hq, L, E)``, ``key (*batch, Hkv, S, E)``,
``value (*batch, Hkv, S, Ev)``, ``attn_mask`` broadcastable to ``(*batch, Hq, L, S)``;
the output is ``(*batch, Hq, L, Ev)``. Per mesh dim the rule allows:

* **batch or heads sharded** (Megatron tensor parallelism shards heads): the same dim of
  query, key, value, mask and output is sharded (a size-1 broadcast dim stays Replicate).
  With grouped-query attention (``enable_gqa``, ``Hkv`` < ``Hq``) local query heads must
  use the local key/value heads: every rank's query heads ``[g*a, g*b)`` must pair with
  key/value heads ``[a, b)`` (``g = Hq / Hkv``), checked for every mesh coordinate;
  otherwise the key/value heads are gathered (the search picks the cheapest layout that
  passes, typically Replicate key/value when ``Hkv`` does not split like ``Hq``);
* **sequence-sharded query**: query (and the mask's query dim) sharded on ``L``, key and
  value Replicate, output sharded on ``L``. With ``is_causal=True`` the local kernel
  passes an explicit boolean mask shifted by the query shard's global row offset
  (torch's causal mask is top-left aligned: row ``i`` sees keys ``j <= i``);
* **value features sharded**: value sharded on ``Ev``, query and key Replicate, output
  sharded on ``Ev``;
* **Partial value** (attention is linear in ``value``): ``Partial(sum|avg)`` value with
  Replicate query/key gives a ``Partial`` output.

* **context parallelism** (query, key and value all sharded along the sequence on one
  mesh dim, no mask, no dropout): ring attention or all-to-all (Ulysses) attention keep
  the key/value sharded; the cost model, or the user's ``set_rotate_method`` /
  ``set_context_parallel_method``, picks between them and gathering key and value
  (:mod:`hyper_shard.rules.attention_cp`). Causal masks follow the sequence layout
  (plain, or head-tail load-balanced under ``context_parallel``).

Anything else (key/value sharded on the sequence with a mask or dropout, a sharded
feature dim ``E``, Partial query or key) is gathered first. ``dropout_p > 0`` on a sharded layout draws the dropout
mask of the attention weights through :mod:`hyper_shard.random` (each rank's box of the
single-device draw), so the result equals the single-device math (torch's CPU kernel) for
the same seed.
Gradients of query, key and value follow from local autograd (a Replicate key/value gets
a ``Partial(sum)`` gradient).

The local computation is :class:`hyper_shard.kernels.attention.ShardedSDPA` (framework
neutral: it calls the platform's attention function with the shifted mask, or composes
the math path for dropout), or one of the context-parallel kernels
(:class:`~hyper_shard.kernels.ring_attention.RingAttention`,
:class:`~hyper_shard.kernels.attention_alltoall.AllToAllAttention`).

Semantics follow ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import itertools

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..kernels.attention import ShardedSDPA
from ..placement import Partial, Placement, Replicate, Shard, normalize_placements
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._util import LINEAR_OPS, R
from .attention_cp import context_parallel_layout

__all__ = ["AttentionOp"]

_ROLES = ("query", "key", "value", "attn_mask")


@register_rule("attention")
class AttentionOp(DistributedOp):
    """Scaled dot-product attention (see the module docstring).

    Raises:
        ShardingError: query, key or value is not a DTensor, a rank below 2, or a DTensor
            argument other than query/key/value/attn_mask.
    """

    signature = (
        "query",
        "key",
        "value",
        "attn_mask",
        "dropout_p",
        "is_causal",
        "scale",
        "enable_gqa",
    )
    #: a dropout needs the tracker's kernel on a sharded layout (its value is in the key)
    static_args = ("dropout_p",)

    # -- call analysis ---------------------------------------------------------------
    def _index(self, call: OpCall) -> dict[str, int]:
        idx: dict[str, int] = {}
        for i, r in enumerate(call.arg_roles):
            if r not in _ROLES:
                raise ShardingError(
                    f"{call.describe()}: unexpected DTensor argument {r!r}; only query, key, "
                    f"value and attn_mask may be DTensors"
                )
            idx[r] = i
        for r in _ROLES[:3]:
            if r not in idx:
                raise ShardingError(
                    f"{call.describe()}: {r} must be a DTensor too when any input is one; "
                    f"distribute it (e.g. distribute_tensor(t, mesh, [Replicate()]))"
                )
            if call.specs[idx[r]].ndim < 2:
                raise ShardingError(
                    f"{call.describe()}: {r} needs at least 2 dims (..., seq, features)"
                )
        return idx

    def _lead(self, call: OpCall, idx: dict[str, int]) -> tuple[int, ...]:
        """The output's leading dims ``(*batch, heads)``: q/k/v leading dims broadcast,
        except a grouped-query heads dim, which is the query's."""
        shapes = [call.specs[idx[r]].shape[:-2] for r in ("query", "key", "value")]
        n = max(len(s) for s in shapes)
        q = shapes[0]
        out = []
        for j in range(n):
            sizes = [s[j - (n - len(s))] for s in shapes if j - (n - len(s)) >= 0]
            big = {x for x in sizes if x != 1}
            if len(big) > 1 and j == n - 1 and len(q) == n:
                out.append(q[j])  # grouped-query heads
            else:
                out.append(max(big) if big else 1)
        return tuple(out)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        idx = self._index(call)
        q, v = call.specs[idx["query"]], call.specs[idx["value"]]
        return [(*self._lead(call, idx), q.shape[-2], v.shape[-1])]

    # -- strategies --------------------------------------------------------------------
    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        idx = self._index(call)
        specs = call.specs
        n_in = len(specs)
        lead = self._lead(call, idx)
        nl = len(lead)
        q = specs[idx["query"]]
        L = q.shape[-2]
        out: list[SingleDimStrategy] = []

        def aligned(spec_i: int, j: int, total: int, size: int) -> Placement:
            s = specs[spec_i]
            k = j - (total - s.ndim)
            if k < 0 or (s.shape[k] == 1 and size != 1):
                return R
            return Shard(k)

        for j in range(nl):  # batch and heads dims
            ins: list[Placement] = [R] * n_in
            for r in ("query", "key", "value"):
                ins[idx[r]] = aligned(idx[r], j, nl + 2, lead[j])
            if "attn_mask" in idx:
                ins[idx["attn_mask"]] = aligned(idx["attn_mask"], j, nl + 2, lead[j])
            out.append(((Shard(j),), tuple(ins)))
        ins = [R] * n_in
        ins[idx["query"]] = Shard(q.ndim - 2)
        if "attn_mask" in idx:
            ins[idx["attn_mask"]] = aligned(idx["attn_mask"], nl, nl + 2, L)
        out.append(((Shard(nl),), tuple(ins)))
        ins = [R] * n_in
        ins[idx["value"]] = Shard(specs[idx["value"]].ndim - 1)
        out.append(((Shard(nl + 1),), tuple(ins)))
        for op in LINEAR_OPS:
            ins = [R] * n_in
            ins[idx["value"]] = Partial(op)
            out.append(((Partial(op),), tuple(ins)))
        return out

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        """Grouped-query attention: every rank's query heads must map onto its local
        key/value heads."""
        idx = self._index(call)
        q = call.specs[idx["query"]]
        if q.ndim < 3:
            return True
        hq = q.shape[-3]
        mesh = call.mesh
        coords = list(itertools.product(*(range(s) for s in mesh.shape)))
        qp = normalize_placements(inputs[idx["query"]], mesh.ndim, q.ndim)
        for r in ("key", "value"):
            s = call.specs[idx[r]]
            if s.ndim < 3:
                continue
            hk = s.shape[-3]
            if hk == hq or hk == 1 or hk == 0 or hq % hk:
                continue
            g = hq // hk
            kp = normalize_placements(inputs[idx[r]], mesh.ndim, s.ndim)
            for c in coords:
                qs, qo = compute_local_shape_and_offset(q.shape, mesh.shape, qp, c)
                ks, ko = compute_local_shape_and_offset(s.shape, mesh.shape, kp, c)
                if qs[-3] != g * ks[-3] or (qs[-3] and qo[-3] != g * ko[-3]):
                    return False
        return True

    # -- decision ----------------------------------------------------------------------
    def infer_layout(self, call: OpCall) -> Layout:
        """The cheapest strategy (:meth:`single_dim_strategies`), or, for query, key and
        value sharded along the sequence on one mesh dim, the context-parallel method the
        cost model or the user picks (:func:`~hyper_shard.rules.attention_cp.
        context_parallel_layout`)."""
        layout = super().infer_layout(call)
        cp = context_parallel_layout(self, call, self._index(call), layout)
        return layout if cp is None else cp

    # -- local kernel ------------------------------------------------------------------
    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        out_pl = layout.outputs[0]
        mesh = call.mesh
        dropout = float(call.static.get("dropout_p") or 0.0)
        # ranks that are threads share one generator: a replicated dropout draws once too
        threads = dropout > 0.0 and not mesh.is_abstract and mesh.platform.ranks_are_threads()
        if (
            out_pl is None
            or (all(type(p) is Replicate for p in out_pl) and not threads)
            or mesh.get_coordinate() is None
        ):
            return layout
        idx = self._index(call)
        coord = mesh.get_coordinate()
        q = call.specs[idx["query"]]
        qt = layout.inputs[idx["query"]]
        qp = normalize_placements(qt if qt is not None else q.placements, mesh.ndim, q.ndim)
        q_off: int | None = None
        seq_shard: tuple[int, int, int, int] | None = None
        seq_dims = [m for m, p in enumerate(qp) if type(p) is Shard and p.dim == q.ndim - 2]
        if seq_dims:
            q_off = compute_local_shape_and_offset(q.shape, mesh.shape, qp, coord)[1][-2]
        if len(seq_dims) == 1:
            m = seq_dims[0]
            kv_len = call.specs[idx["key"]].shape[-2]
            seq_shard = (mesh.size(m), coord[m], q.shape[-2], kv_len)
        shape = layout.shapes[0]
        assert shape is not None
        S = call.specs[idx["key"]].shape[-2]
        attn_shape = (*shape[:-1], S)
        op = normalize_placements(out_pl, mesh.ndim, len(shape))
        ls, off = compute_local_shape_and_offset(shape, mesh.shape, op, coord)
        box = ((*off[:-1], 0), (*ls[:-1], S))
        empty = any(n == 0 for n in ls)
        if q_off is None and dropout <= 0.0 and not empty:
            return layout  # the plain local kernel is exact
        layout.impl = ShardedSDPA(
            call.func,
            call.binder or self.binder,
            call.platform,
            q_off,
            attn_shape,
            box,
            seq_shard,
            mesh,
        )
        return layout
