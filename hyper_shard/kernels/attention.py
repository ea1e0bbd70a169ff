"""Local ``scaled_dot_product_attention`` for sharded layouts (see
``hyper_shard/rules/attention.py``).

* A sequence-sharded query with ``is_causal=True``: the causal mask is the top-left
  ``tril`` of an ``(L, S)`` matrix of ones (torch's convention); the local query rows start
  at global row ``o``, so the local mask is ``key index <= o + local row``, passed to the
  attention function as an explicit boolean ``attn_mask`` (built once per shape and kept).
* in the load-balanced (head-tail) sequence layout of context parallelism
  (:mod:`hyper_shard.kernels.attention_layout`), the query rows are this rank's two runs
  of positions and the gathered keys are in the laid-out order: the mask is ``key
  position <= query position`` over those positions;
* ``dropout_p > 0`` on a sharded layout: the attention weights' dropout mask is this
  rank's box of the single-device draw (:class:`hyper_shard.random.OffsetRNGTracker`), and
  attention runs as the math backend does (scores, mask, softmax, dropout, ``@ v``), which
  is what torch's CPU kernel computes with dropout.

The kernel calls the attention function it was given (the platform's own, with the
explicit mask) when there is no dropout; written against the Platform protocol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..dispatch.op import Binder
from ..random import get_rng_tracker
from . import numel
from .attention_layout import current_layout, positions

if TYPE_CHECKING:
    from ..mesh import DeviceMesh
    from ..platform.base import LocalOps, Runtime

__all__ = ["ShardedSDPA", "math_attention"]


def _connect(plat: Runtime, out: Any, inputs: Sequence[Any]) -> Any:
    """An empty local result that depends on every input requiring grad: a kernel may
    return an empty output detached from some input (e.g. the mask), and then that
    input's redistribution would skip its backward collective on this rank only."""
    for t in inputs:
        if t is not None and plat.is_tensor(t) and plat.requires_grad(t):
            out = out + plat.sum(t) * 0
    return out


def causal_mask(plat: LocalOps, offset: int, n_rows: int, n_cols: int, like: Any) -> Any:
    """Boolean ``(n_rows, n_cols)``: True where query row ``i`` (global ``offset + i``) may
    attend to key ``j`` (``j <= offset + i``)."""
    rows = plat.unsqueeze(plat.arange(offset, offset + n_rows, like), -1)
    cols = plat.unsqueeze(plat.arange(0, n_cols, like), 0)
    return cols <= rows


def math_attention(
    plat: LocalOps,
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None,
    causal: bool,
    scale: float | None,
    gqa: bool,
    dropout: Any = None,
) -> Any:
    """Scaled dot-product attention composed of local ops (torch's math backend):
    ``softmax(q k^T * scale + mask) [* dropout] @ v``.

    Args:
        q, k, v: ``(*batch, H, L, E)``, ``(*batch, Hkv, S, E)``, ``(*batch, Hkv, S, Ev)``.
        mask: boolean (True: attend) or additive, broadcastable to ``(*batch, H, L, S)``.
        causal: apply the top-left causal mask (with ``mask`` None).
        scale: default ``1 / sqrt(E)``; gqa: repeat key/value heads to ``H``.
        dropout: ``dropout(attn)`` -> the dropped-out weights, or None.
    """
    if gqa and len(plat.shape(q)) >= 3 and plat.shape(k)[-3] != plat.shape(q)[-3]:
        rep = plat.shape(q)[-3] // plat.shape(k)[-3]
        k = plat.repeat_interleave(k, rep, -3)
        v = plat.repeat_interleave(v, rep, -3)
    s = 1.0 / math.sqrt(plat.shape(q)[-1]) if scale is None else float(scale)
    sq = math.sqrt(s)
    attn = plat.matmul(q * sq, plat.transpose(k * sq, -2, -1))
    if causal:
        mask = causal_mask(plat, 0, plat.shape(q)[-2], plat.shape(k)[-2], q)
    if mask is not None:
        if str(plat.dtype_of(mask)).rsplit(".", 1)[-1].lower() == "bool":
            attn = plat.where(mask, attn, float("-inf"))
        else:
            attn = attn + mask
    attn = plat.softmax(attn, -1)
    if dropout is not None:
        attn = dropout(attn)
    return plat.matmul(attn, v)


class ShardedSDPA:
    """``scaled_dot_product_attention`` on local shards.

    Args:
        func: the attention function called (the platform's, canonical signature
            ``query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa``).
        binder: the call's binder (canonical argument names).
        plat: the Platform.
        query_offset: global row offset of the local query rows (None: the query's
            sequence dim is not sharded).
        attn_shape: the global shape of the attention weights ``(*batch, heads, L, S)``.
        attn_box: ``(offset, local shape)`` of this rank's attention weights.
        seq_shard: ``(n, coord, q_len, kv_len)`` when one mesh dim of ``n`` ranks shards
            the query's sequence (its coordinate, the global query and key lengths): the
            sequence layout applies (None: the plain offset).
        mesh: the query's mesh (the dropout draw is shared by ranks that are threads).
    """

    __slots__ = (
        "func", "binder", "plat", "query_offset", "attn_shape", "attn_box", "seq_shard", "mesh",
        "_masks",
    )  # fmt: skip

    def __init__(
        self,
        func: Any,
        binder: Binder,
        plat: Runtime,
        query_offset: int | None,
        attn_shape: Sequence[int],
        attn_box: tuple[Sequence[int], Sequence[int]],
        seq_shard: tuple[int, int, int, int] | None = None,
        mesh: DeviceMesh | None = None,
    ) -> None:
        self.func = func
        self.mesh = mesh
        self.binder = binder
        self.plat = plat
        self.query_offset = query_offset
        self.attn_shape = tuple(attn_shape)
        self.attn_box = (tuple(attn_box[0]), tuple(attn_box[1]))
        self.seq_shard = seq_shard
        self._masks: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return (
            f"ShardedSDPA(query_offset={self.query_offset}, attention {list(self.attn_shape)}, "
            f"box offset={list(self.attn_box[0])} shape={list(self.attn_box[1])})"
        )

    def causal_mask(self, n_rows: int, n_cols: int, like: Any) -> Any:
        """Boolean ``(n_rows, n_cols)``: True where local query row ``i`` (global
        ``query_offset + i``) may attend to key ``j``."""
        cur = current_layout()
        layout = cur if cur.balanced and self.seq_shard is not None else None
        key = (n_rows, n_cols, str(getattr(like, "device", "")), layout)
        # a compiled region's trace builds its own (a kept mask would be a constant of
        # another trace, or a real tensor among fake ones; this kernel outlives traces)
        tracing = self.plat.tracing()
        m = None if tracing else self._masks.get(key)
        if m is None:
            if layout is None:
                m = causal_mask(self.plat, self.query_offset or 0, n_rows, n_cols, like)
            else:
                m = self._layout_mask(layout, like)
            if not tracing:
                self._masks[key] = m
        return m

    def _layout_mask(self, layout: Any, like: Any) -> Any:
        """``key position <= query position`` for this rank's query runs and the keys in
        the laid-out order."""
        assert self.seq_shard is not None
        plat = self.plat
        n, coord, q_len, kv_len = self.seq_shard
        layout.check(q_len, n, "query")
        layout.check(kv_len, n, "key/value")
        qp = positions(plat, layout.segments(q_len, n, coord), like)
        kp = positions(
            plat, tuple(s for c in range(n) for s in layout.segments(kv_len, n, c)), like
        )
        return plat.unsqueeze(kp, 0) <= plat.unsqueeze(qp, -1)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self.binder
        plat = self.plat
        q = b.get(args, kwargs, "query")
        k = b.get(args, kwargs, "key")
        v = b.get(args, kwargs, "value")
        mask = b.get(args, kwargs, "attn_mask")
        p = float(b.get(args, kwargs, "dropout_p", 0.0) or 0.0)
        causal = bool(b.get(args, kwargs, "is_causal", False))
        if causal and mask is not None:  # the function's own error
            return self.func(*args, **kwargs)
        if causal and self.query_offset is not None:
            mask = self.causal_mask(plat.shape(q)[-2], plat.shape(k)[-2], q)
            causal = False
        if p > 0.0:
            scale = b.get(args, kwargs, "scale")
            gqa = bool(b.get(args, kwargs, "enable_gqa", False))
            out = math_attention(plat, q, k, v, mask, causal, scale, gqa, self._dropout(p, q))
        else:
            a2, k2 = b.replace(args, kwargs, "attn_mask", mask)
            a2, k2 = b.replace(a2, k2, "is_causal", causal)
            out = self.func(*a2, **k2)
        if numel(plat, out) == 0:
            out = _connect(plat, out, (q, k, v, mask))
        return out

    def _dropout(self, p: float, like: Any) -> Any:
        plat, shape, box = self.plat, self.attn_shape, self.attn_box

        def drop(attn: Any) -> Any:
            ones = plat.full(shape, 1, attn)
            mask = get_rng_tracker().draw_shard(
                plat, lambda: plat.dropout(ones, p), *box, self.mesh
            )
            return attn * mask

        return drop
