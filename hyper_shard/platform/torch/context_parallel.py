"""Context parallelism on torch: ``hyper_shard.experimental.context_parallel``, with the
signature and semantics of PyTorch's ``torch.distributed.tensor.experimental.
context_parallel``.

Inside the context every buffer (input ids, labels, position ids...) holds, in place, this
rank's piece of its sequence dim in the context's sequence layout
(:mod:`hyper_shard.kernels.attention_layout`: head-tail load-balanced where ``2 n``
divides the length, as PyTorch's default load balancer, else contiguous ``torch.chunk``
pieces), and ``torch.nn.functional.scaled_dot_product_attention`` called on plain
tensors runs as context-parallel attention: the query, key and value arrive as local
sequence pieces, are viewed as ``Shard(-2)`` DTensors of the laid-out sequence on the
mesh and go through hyper_shard's attention rule, whose cost model (or
``set_rotate_method`` / ``set_context_parallel_method``) picks ring, all-to-all or
all-gather attention, with causal masks following the layout; the local piece of the
output is returned. On exit the buffers get their original values back (except those in
``no_restore_buffers``) and the function is restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.attention_layout import (
    SequenceLayout,
    check_buffers,
    layout_of,
    local_piece,
    output_piece,
    using_layout,
)

__all__ = ["context_parallel"]


def _sequence_attention(orig: Any, mesh: Any, layout: SequenceLayout, even: bool) -> Any:
    from ...dtensor import DTensor
    from ...placement import Shard
    from ...spec import contiguous_stride

    def sdpa(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(t, DTensor) for t in (query, key, value)):
            return orig(query, key, value, *args, **kwargs)  # hyper_shard's own rule

        def view(t: torch.Tensor) -> Any:
            if even:  # every piece has the same length: no size exchange needed
                shape = (*t.shape[:-2], t.shape[-2] * mesh.size(), t.shape[-1])
                return DTensor.from_local(
                    t, mesh, [Shard(t.dim() - 2)], shape=shape, stride=contiguous_stride(shape)
                )
            return DTensor.from_local(t, mesh, [Shard(t.dim() - 2)])

        mask = kwargs.get("attn_mask", args[0] if args else None)
        if mask is not None:
            raise NotImplementedError(
                "context_parallel: scaled_dot_product_attention with an explicit attn_mask "
                "on sequence pieces is not supported (as PyTorch's context_parallel); use "
                "is_causal=True, or call it outside the context"
            )
        dq, dk, dv = view(query), view(key), view(value)
        with using_layout(layout):
            out = orig(dq, dk, dv, *args, **kwargs)
        causal = bool(kwargs.get("is_causal", args[2] if len(args) > 2 else False))
        return output_piece(out, mesh, layout, causal, dk.shape[-2])

    return sdpa


@contextmanager
def context_parallel(
    mesh: Any,
    *,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> Iterator[None]:
    """See :func:`hyper_shard.experimental.context_parallel`."""
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    keep = set() if no_restore_buffers is None else no_restore_buffers
    check_buffers(buffers, seq_dims, keep, torch.nn.Parameter)
    for i, b in enumerate(buffers):
        if b.requires_grad:
            raise ValueError(
                f"context_parallel: buffers[{i}] requires grad; a buffer is resized in place "
                f"to this rank's piece, which autograd cannot follow. Pass a tensor that does "
                f"not require grad (e.g. x.detach()) and turn requires_grad on inside the "
                f"block if you want the pieces' gradients"
            )
    if mesh.ndim != 1:
        raise ValueError(
            f"context_parallel takes a 1-D mesh (the context-parallel dim), got {mesh}; "
            f"pass mesh['cp']"
        )
    n = mesh.size()
    coord = mesh.get_coordinate()
    layout = layout_of(buffers, seq_dims, n)
    plat = mesh.platform
    originals = [None if any(b is k for k in keep) else b.clone() for b in buffers]
    even = bool(buffers) and all(b.shape[d] % n == 0 for b, d in zip(buffers, seq_dims))
    with torch.no_grad():
        for b, d in zip(buffers, seq_dims):
            if coord is None:
                piece = b.narrow(d, 0, 0).clone()
            else:
                piece = local_piece(plat, b, d, layout, n, coord[0]).clone()
            b.resize_(piece.shape)
            b.copy_(piece)
    orig = F.scaled_dot_product_attention
    from .dispatch import _lookup

    _lookup(orig)  # bind the registry now: name lookups inside the context see the patch
    F.scaled_dot_product_attention = _sequence_attention(orig, mesh, layout, even)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig
        with torch.no_grad():
            for b, o in zip(buffers, originals):
                if o is None:
                    continue
                if b.requires_grad:  # turned on in the block: a leaf autograd cannot resize
                    b.data = o  # its .grad stays the piece's gradient
                else:
                    b.resize_(o.shape)
                    b.copy_(o)
