"""One block of attention with its log-sum-exp, its backward from the saved log-sum-exp,
and the online-softmax merge: the local pieces of ring attention
(:mod:`hyper_shard.kernels.ring_attention`).

For a query block ``q (*lead, Hq, Lq, E)`` and a key/value block ``k (*lead, Hkv, Sk, E)``,
``v (*lead, Hkv, Sk, Ev)``::

    scores = q k^T * scale            (causal: key j > query i masked out, top-left)
    lse    = log(sum_j exp(scores))   (*lead, Hq, Lq); -inf for a row that sees nothing
    out    = softmax(scores) v        (*lead, Hq, Lq, Ev); 0 for such a row

Two blocks of the same query rows merge exactly (:func:`merge`): ``lse = log(e^a + e^b)``,
``out = (e^a out_a + e^b out_b) / e^lse``. The backward of a block, given the *merged*
output and log-sum-exp of its rows (the flash-attention backward), is
``P = exp(scores - lse)``, ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``,
``dQ = dS K scale``, ``dK = dS^T Q scale``: the blocks' gradients sum to the gradient of
the whole attention, and nothing but ``q, k, v, out, lse`` is kept between forward and
backward.

Grouped-query attention (``Hq = g * Hkv``; query head ``h`` uses key/value head
``h // g``, as ``enable_gqa``) never copies key/value: without a mask the ``g`` query heads
of a key/value head become ``g * Lq`` rows of one call; with the causal mask each of the
``g`` groups is one call.

The local kernel is the platform's fused one where it has one
(:meth:`~hyper_shard.platform.local_ops.LocalOps.attention_lse`, torch's CPU flash
attention), else the math above composed of local ops (MindSpore). Framework-neutral.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..platform.base import LocalOps

__all__ = ["block_forward", "block_backward", "merge", "causal_keep"]

_NEG_INF = float("-inf")


def causal_keep(plat: LocalOps, n_rows: int, n_cols: int, like: Any) -> Any:
    """Boolean ``(n_rows, n_cols)``: True where key ``j <= i`` (torch's top-left causal)."""
    rows = plat.unsqueeze(plat.arange(0, n_rows, like), -1)
    cols = plat.unsqueeze(plat.arange(0, n_cols, like), 0)
    return cols <= rows


def _as(plat: LocalOps, t: Any, like: Any) -> Any:
    """``t`` in ``like``'s dtype (no copy when it is already)."""
    d = plat.dtype_of(like)
    return t if plat.dtype_of(t) == d else plat.cast(t, d)


# ---------------------------------------------------------------------- math forms
def _math_forward(plat: LocalOps, q: Any, k: Any, v: Any, causal: bool, scale: float) -> Any:
    s = plat.matmul(q, plat.transpose(k, -2, -1)) * scale
    if causal:
        s = plat.where(causal_keep(plat, plat.shape(q)[-2], plat.shape(k)[-2], q), s, _NEG_INF)
    m = plat.amax(s, -1, keepdim=True)
    m = plat.where(plat.isfinite(m), m, 0.0)
    p = plat.exp(s - m)
    total = plat.sum(p, -1, keepdim=True)
    out = plat.matmul(p, v) / plat.where(total > 0, total, 1.0)
    lse = plat.squeeze(m + plat.log(total), -1)
    return out, lse


def _math_backward(
    plat: LocalOps,
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    causal: bool,
    scale: float,
) -> tuple[Any, Any, Any]:
    s = plat.matmul(q, plat.transpose(k, -2, -1)) * scale
    lse = plat.unsqueeze(plat.where(plat.isfinite(lse), lse, 0.0), -1)
    p = plat.exp(s - lse)
    if causal:
        p = plat.where(causal_keep(plat, plat.shape(q)[-2], plat.shape(k)[-2], q), p, 0.0)
    dv = plat.matmul(plat.transpose(p, -2, -1), dout)
    dp = plat.matmul(dout, plat.transpose(v, -2, -1))
    d = plat.sum(dout * out, -1, keepdim=True)
    ds = p * (dp - d)
    dq = plat.matmul(ds, k) * scale
    dk = plat.matmul(plat.transpose(ds, -2, -1), q) * scale
    return dq, dk, dv


def _one_forward(plat: LocalOps, q: Any, k: Any, v: Any, causal: bool, scale: float) -> Any:
    fused = plat.attention_lse(q, k, v, causal, scale)
    return fused if fused is not None else _math_forward(plat, q, k, v, causal, scale)


def _one_backward(
    plat: LocalOps,
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    causal: bool,
    scale: float,
) -> tuple[Any, Any, Any]:
    fused = plat.attention_lse_backward(dout, q, k, v, out, lse, causal, scale)
    if fused is not None:
        return fused  # type: ignore[no-any-return]
    return _math_backward(plat, dout, q, k, v, out, lse, causal, scale)


# ---------------------------------------------------------------------- grouped heads
def _groups(plat: LocalOps, q: Any, k: Any) -> int:
    shq, shk = plat.shape(q), plat.shape(k)
    if len(shq) < 3 or shq[-3] == shk[-3]:
        return 1
    return shq[-3] // shk[-3]


def _rows(plat: LocalOps, t: Any, g: int) -> Any:
    """``(*lead, g*H, L, X)`` -> ``(*lead, H, g*L, X)`` (query heads of one key/value head as
    rows); works for the log-sum-exp ``(*lead, g*H, L)`` with ``X`` absent."""
    sh = plat.shape(t)
    return plat.reshape(plat.contiguous(t), (*sh[:-3], sh[-3] // g, g * sh[-2], sh[-1]))


def _unrows(plat: LocalOps, t: Any, g: int) -> Any:
    sh = plat.shape(t)
    return plat.reshape(t, (*sh[:-3], sh[-3] * g, sh[-2] // g, sh[-1]))


def _group(plat: LocalOps, t: Any, g: int, j: int) -> Any:
    """Query group ``j`` of ``(*lead, g*H, L, X)``: ``(*lead, H, L, X)`` (heads ``h*g + j``)."""
    sh = plat.shape(t)
    return plat.select(plat.reshape(t, (*sh[:-3], sh[-3] // g, g, *sh[-2:])), -3, j)


def block_forward(plat: LocalOps, q: Any, k: Any, v: Any, causal: bool, scale: float) -> Any:
    """``(out, lse)`` of one block (see the module docstring), both in the log-sum-exp's
    dtype (the merge's precision: float32 from torch's fused kernel, the inputs' dtype
    from the math form). ``causal``: top-left mask (the query rows and key columns are
    the same positions)."""
    g = _groups(plat, q, k)
    if g == 1:
        out, lse = _one_forward(plat, q, k, v, causal, scale)
    elif not causal:
        out, lse = _one_forward(plat, _rows(plat, q, g), k, v, False, scale)
        out = _unrows(plat, out, g)
        sh = plat.shape(lse)
        lse = plat.reshape(lse, (*sh[:-2], sh[-2] * g, sh[-1] // g))
    else:
        outs, lses = [], []
        for j in range(g):
            o, s = _one_forward(plat, _group(plat, q, g, j), k, v, True, scale)
            outs.append(o)
            lses.append(s)
        o = plat.stack(outs, -3)  # (*lead, H, g, L, Ev)
        s = plat.stack(lses, -2)  # (*lead, H, g, L)
        so, ss = plat.shape(o), plat.shape(s)
        out = plat.reshape(o, (*so[:-4], so[-4] * so[-3], *so[-2:]))
        lse = plat.reshape(s, (*ss[:-3], ss[-3] * ss[-2], ss[-1]))
    return _as(plat, out, lse), lse


def block_backward(
    plat: LocalOps,
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    causal: bool,
    scale: float,
) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of one block from the merged ``out`` and ``lse`` of its query rows
    (``dout`` and ``out`` in the inputs' dtype, ``lse`` as :func:`block_forward` gave it)."""
    g = _groups(plat, q, k)
    if g == 1:
        return _one_backward(plat, dout, q, k, v, out, lse, causal, scale)
    if not causal:
        sh = plat.shape(lse)
        lse_r = plat.reshape(plat.contiguous(lse), (*sh[:-2], sh[-2] // g, g * sh[-1]))
        dq, dk, dv = _one_backward(
            plat, _rows(plat, dout, g), _rows(plat, q, g), k, v, _rows(plat, out, g), lse_r,
            False, scale,
        )  # fmt: skip
        return _unrows(plat, dq, g), dk, dv
    dqs, dk, dv = [], None, None
    for j in range(g):
        sh = plat.shape(lse)
        lse_j = plat.select(plat.reshape(lse, (*sh[:-2], sh[-2] // g, g, sh[-1])), -2, j)
        a, b, c = _one_backward(
            plat, _group(plat, dout, g, j), _group(plat, q, g, j), k, v,
            _group(plat, out, g, j), lse_j, True, scale,
        )  # fmt: skip
        dqs.append(a)
        dk = b if dk is None else dk + b
        dv = c if dv is None else dv + c
    d = plat.stack(dqs, -3)
    sd = plat.shape(d)
    return plat.reshape(d, (*sd[:-4], sd[-4] * sd[-3], *sd[-2:])), dk, dv


def merge(plat: LocalOps, acc: Any, blk: Any) -> Any:
    """``(out, lse)`` of the union of two blocks' keys for the same query rows (``acc``
    None: ``blk``). Rows that see nothing (-inf) in both stay 0 / -inf."""
    if acc is None:
        return blk
    oa, la = acc
    ob, lb = blk
    m = plat.where(la > lb, la, lb)
    m = plat.where(plat.isfinite(m), m, 0.0)
    wa = plat.exp(la - m)
    wb = plat.exp(lb - m)
    total = wa + wb
    lse = m + plat.log(total)
    denom = plat.unsqueeze(plat.where(total > 0, total, 1.0), -1)
    out = (oa * plat.unsqueeze(wa, -1) + ob * plat.unsqueeze(wb, -1)) / denom
    return out, lse
