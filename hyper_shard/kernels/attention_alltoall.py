"""All-to-all (Ulysses) attention: ``scaled_dot_product_attention`` on query, key and value
sharded along the sequence over one mesh dim, run as attention over the whole sequence
on a share of the heads.

Each of query, key and value goes from sequence-sharded to heads-sharded by one
all-to-all over the mesh dim (:func:`hyper_shard.platform.compose.all_to_all`: native, or
composed from send/recv rounds or an all-gather), the platform's own attention runs on
``H / n`` heads over the whole sequence, and the output goes back to sequence-sharded by
one more all-to-all. Backward is the transpose: each all-to-all's
gradient takes the way back, the attention's gradient is the framework's own. Per rank
each all-to-all moves ``(n - 1) / n`` of a local piece (4 forward, 4 backward), against
``n - 1`` pieces of key and value for the all-gather form.

The query heads (and the key/value heads, after repeating them to the query heads when
they do not split over the ranks: grouped-query attention) must divide by the ranks
(checked by the rule). The gathered sequence is put in natural order first (in the
head-tail layout, :mod:`hyper_shard.kernels.attention_layout`: a few slices) so a causal
mask is the function's own ``is_causal`` (no mask tensor, the fused kernel), and the
output back in the laid-out order.

Framework-neutral.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..dispatch.op import Binder
from ..platform import compose
from .attention_layout import current_layout, laid_out, natural_order

if TYPE_CHECKING:
    from ..platform.base import Runtime

__all__ = ["AllToAllAttention"]


class AllToAllAttention:
    """The local kernel of all-to-all attention (see the module docstring); called like
    ``scaled_dot_product_attention`` with the local pieces (``attn_mask=None``,
    ``dropout_p=0``).

    Args:
        func: the platform's attention function (canonical signature).
        binder: the call's binder.
        plat: the Platform.
        group: the process group of the sequence mesh dim; n: its size; coord: this
            rank's coordinate.
        q_len, kv_len: the global sequence lengths of query and key/value.
    """

    __slots__ = ("func", "binder", "plat", "group", "n", "coord", "q_len", "kv_len")

    def __init__(
        self,
        func: Any,
        binder: Binder,
        plat: Runtime,
        group: Any,
        n: int,
        coord: int,
        q_len: int,
        kv_len: int,
    ) -> None:
        self.func, self.binder, self.plat, self.group = func, binder, plat, group
        self.n, self.coord, self.q_len, self.kv_len = n, coord, q_len, kv_len

    def __repr__(self) -> str:
        return f"AllToAllAttention(ranks={self.n}, query {self.q_len}, key/value {self.kv_len})"

    def _a2a(self, t: Any, src: int, dst: int, src_sizes: list[int], dst_sizes: list[int]) -> Any:
        """Differentiable all-to-all from sharded ``src`` to sharded ``dst`` (backward: the
        way back)."""
        plat, g, c = self.plat, self.group, self.coord

        def fwd(x: Any) -> Any:
            return compose.all_to_all(plat, x, src, dst, src_sizes, dst_sizes, g, c)

        def bwd(x: Any) -> Any:
            return compose.all_to_all(plat, x, dst, src, dst_sizes, src_sizes, g, c)

        if not plat.requires_grad(t):
            return fwd(t)
        return plat.custom_autograd(fwd, bwd, t)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b, plat, n = self.binder, self.plat, self.n
        q, k, v = (b.get(args, kwargs, r) for r in ("query", "key", "value"))
        layout = current_layout()
        layout.check(self.q_len, n, "query")
        layout.check(self.kv_len, n, "key/value")
        nd = len(plat.shape(q))
        hd, sd = nd - 3, nd - 2
        hq, hkv = plat.shape(q)[hd], plat.shape(k)[hd]
        if hkv % n:  # key/value heads that do not split: one per query head
            k = plat.repeat_interleave(k, hq // hkv, hd)
            v = plat.repeat_interleave(v, hq // hkv, hd)
            hkv = hq
        qs, ks = layout.sizes(self.q_len, n), layout.sizes(self.kv_len, n)
        qh = natural_order(plat, self._a2a(q, sd, hd, qs, [hq // n] * n), sd, layout, n)
        kh = natural_order(plat, self._a2a(k, sd, hd, ks, [hkv // n] * n), sd, layout, n)
        vh = natural_order(plat, self._a2a(v, sd, hd, ks, [hkv // n] * n), sd, layout, n)
        a2, k2 = b.replace(args, kwargs, "query", qh)
        a2, k2 = b.replace(a2, k2, "key", kh)
        a2, k2 = b.replace(a2, k2, "value", vh)
        out = laid_out(plat, self.func(*a2, **k2), sd, layout, n)
        return self._a2a(out, hd, sd, [hq // n] * n, qs)
