"""torch functions MindSpore 2.10 lacks, for MindSpore tensors and DTensors.

* :func:`scaled_dot_product_attention` — as ``torch.nn.functional.scaled_dot_product_attention``.
  MindSpore 2.10 has no such function (``ops.flash_attention_score`` has no CPU kernel and
  another signature); on plain tensors this one computes the math path with ``mint`` ops
  (scores, mask, softmax, dropout, ``@ v``); on DTensors it is the ``attention`` op of the
  registry (``op_specs/attention.yaml`` binds it): heads or batch sharded, a
  sequence-sharded query with the causal mask shifted to each shard's offset, sharded
  dropout equal to the single-device draw.
"""

from __future__ import annotations

from mindspore import Tensor

from ...kernels.attention import math_attention

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Attention ``softmax(q k^T * scale + mask) @ v`` with torch's semantics.

    Shapes: ``query (*batch, H, L, E)``, ``key (*batch, Hkv, S, E)``, ``value (*batch, Hkv,
    S, Ev)``, ``attn_mask`` boolean (True: attend) or additive, broadcastable to ``(*batch,
    H, L, S)``; returns ``(*batch, H, L, Ev)``. ``is_causal``: the top-left causal mask
    (``key index <= query index``), exclusive with ``attn_mask``. ``scale`` defaults to
    ``1 / sqrt(E)``; ``enable_gqa`` repeats key/value heads to ``H`` (``H % Hkv == 0``).
    ``dropout_p > 0`` drops attention weights with ``mindspore.ops.dropout`` (always, as
    torch's function does: pass 0.0 in evaluation).

    Raises:
        ValueError: ``is_causal`` together with an ``attn_mask`` (as torch).
    """
    from ..select import get_platform
    from . import MindSporePlatform

    if is_causal and attn_mask is not None:
        raise ValueError(
            "scaled_dot_product_attention: pass either attn_mask or is_causal=True, not both "
            "(as torch)"
        )
    plat = get_platform("mindspore")
    assert isinstance(plat, MindSporePlatform)
    drop = None
    if dropout_p and dropout_p > 0.0:
        p = float(dropout_p)
        drop = lambda a: plat.dropout(a, p)  # noqa: E731
    return math_attention(plat, query, key, value, attn_mask, is_causal, scale, enable_gqa, drop)
