"""Local ``scaled_dot_product_attention`` for sharded layouts (see
``hyper_shard/rules/attention.py``).

* A sequence-sharded query with ``is_causal=True``: torch's causal mask is the top-left
  ``tril`` of a ``(L, S)`` matrix of ones; the local query rows start at global row ``o``,
  so the local mask is ``key index <= o + local row``, passed as an explicit boolean
  ``attn_mask`` (built once per shape and kept).
* ``dropout_p > 0`` on a sharded layout: the attention weights' dropout mask is this
  rank's box of the single-device draw (:class:`hyper_shard.random.OffsetRNGTracker`), and
  attention runs as torch's math backend does (scores, mask, softmax, dropout, ``@ v``),
  which is what torch's CPU kernel computes with dropout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ....dispatch.op import Binder
from ....random import get_rng_tracker

__all__ = ["ShardedSDPA"]

_sdpa = F.scaled_dot_product_attention


def _connect(out: torch.Tensor, inputs: Sequence[Any]) -> torch.Tensor:
    """An empty local result that depends on every input requiring grad: torch's kernel
    may return an empty output detached from some input (e.g. the mask), and then that
    input's redistribution would skip its backward collective on this rank only."""
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            out = out + t.sum() * 0
    return out


class ShardedSDPA:
    """``scaled_dot_product_attention`` on local shards.

    Args:
        binder: the rule's binder (canonical argument names).
        plat: the torch Platform.
        query_offset: global row offset of the local query rows (None: the query's
            sequence dim is not sharded).
        attn_shape: the global shape of the attention weights ``(*batch, heads, L, S)``.
        attn_box: ``(offset, local shape)`` of this rank's attention weights.
    """

    __slots__ = ("binder", "plat", "query_offset", "attn_shape", "attn_box", "_masks")

    def __init__(
        self,
        binder: Binder,
        plat: Any,
        query_offset: int | None,
        attn_shape: Sequence[int],
        attn_box: tuple[Sequence[int], Sequence[int]],
    ) -> None:
        self.binder = binder
        self.plat = plat
        self.query_offset = query_offset
        self.attn_shape = tuple(attn_shape)
        self.attn_box = (tuple(attn_box[0]), tuple(attn_box[1]))
        self._masks: dict[tuple, torch.Tensor] = {}

    def __repr__(self) -> str:
        return (
            f"ShardedSDPA(query_offset={self.query_offset}, attention {list(self.attn_shape)}, "
            f"box offset={list(self.attn_box[0])} shape={list(self.attn_box[1])})"
        )

    def causal_mask(self, n_rows: int, n_cols: int, device: Any) -> torch.Tensor:
        """Boolean ``(n_rows, n_cols)``: True where local query row ``i`` (global
        ``query_offset + i``) may attend to key ``j``."""
        key = (n_rows, n_cols, str(device))
        m = self._masks.get(key)
        if m is None:
            off = self.query_offset or 0
            rows = torch.arange(off, off + n_rows, device=device).unsqueeze(-1)
            m = torch.arange(n_cols, device=device).unsqueeze(0) <= rows
            self._masks[key] = m
        return m

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        b = self.binder
        q = b.get(args, kwargs, "query")
        k = b.get(args, kwargs, "key")
        v = b.get(args, kwargs, "value")
        mask = b.get(args, kwargs, "attn_mask")
        p = float(b.get(args, kwargs, "dropout_p", 0.0))
        causal = bool(b.get(args, kwargs, "is_causal", False))
        scale = b.get(args, kwargs, "scale")
        gqa = bool(b.get(args, kwargs, "enable_gqa", False))
        if causal and mask is not None:  # torch's own error
            return _sdpa(q, k, v, mask, p, True, scale=scale, enable_gqa=gqa)
        if causal and self.query_offset is not None:
            mask = self.causal_mask(q.shape[-2], k.shape[-2], q.device)
            causal = False
        if p > 0.0:
            out = self._math_with_dropout(q, k, v, mask, p, causal, scale, gqa)
        else:
            out = _sdpa(q, k, v, mask, 0.0, causal, scale=scale, enable_gqa=gqa)
        if out.numel() == 0:
            out = _connect(out, (q, k, v, mask))
        return out

    def _math_with_dropout(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        p: float,
        causal: bool,
        scale: float | None,
        gqa: bool,
    ) -> torch.Tensor:
        if gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // k.shape[-3]
            k = k.repeat_interleave(rep, dim=-3)
            v = v.repeat_interleave(rep, dim=-3)
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        sq = math.sqrt(s)
        attn = (q * sq) @ (k * sq).transpose(-2, -1)
        if causal:  # an unsharded query: torch's top-left causal mask
            mask = self.causal_mask(q.shape[-2], k.shape[-2], q.device)
        if mask is not None:
            if mask.dtype == torch.bool:
                attn = attn.masked_fill(~mask, float("-inf"))
            else:
                attn = attn + mask
        attn = torch.softmax(attn, dim=-1)
        dtype, device = attn.dtype, attn.device
        drop = get_rng_tracker().draw_shard(
            self.plat,
            lambda: F.dropout(torch.ones(self.attn_shape, dtype=dtype, device=device), p, True),
            *self.attn_box,
        )
        return (attn * drop) @ v
