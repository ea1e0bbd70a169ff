"""Context parallelism on torch: ``hyper_shard.experimental.context_parallel``, with the
signature and semantics of PyTorch's ``torch.distributed.tensor.experimental.
context_parallel``.

Inside the context every buffer (input ids, labels, position ids...) holds this rank's
piece of its sequence dim (``torch.chunk`` pieces in mesh-coordinate order), and
``torch.nn.functional.scaled_dot_product_attention`` called on plain tensors runs as
sequence-parallel attention: the query, key and value arrive as local sequence pieces, are
viewed as ``Shard(-2)`` DTensors on the mesh and go through hyper_shard's attention rule
(key and value all-gathered, the query kept sharded, ``is_causal`` shifted by the piece's
global offset; backward reduce-scatters the key/value gradients), and the local piece of
the output is returned. On exit the buffers get their original values back (except those
in ``no_restore_buffers``) and the function is restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["context_parallel"]


def _sequence_attention(orig: Any, mesh: Any, even: bool) -> Any:
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
        out = orig(view(query), view(key), view(value), *args, **kwargs)
        return out.to_local()

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
    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    for b in keep:
        if not any(b is x for x in buffers):
            raise ValueError("`no_restore_buffers` must be a subset of `buffers`.")
    for b in buffers:
        if isinstance(b, torch.nn.Parameter):
            raise ValueError(
                "context_parallel: `buffers` may not contain nn.Parameter (its shape would "
                "change under the optimizer); pass activations, labels, position ids"
            )
    if mesh.ndim != 1:
        raise ValueError(
            f"context_parallel takes a 1-D mesh (the context-parallel dim), got {mesh}; "
            f"pass mesh['cp']"
        )
    n = mesh.size()
    coord = mesh.get_coordinate()
    originals = [None if any(b is k for k in keep) else b.clone() for b in buffers]
    even = all(b.shape[d] % n == 0 for b, d in zip(buffers, seq_dims))
    with torch.no_grad():
        for b, d in zip(buffers, seq_dims):
            pieces = torch.chunk(b, n, dim=d)
            piece = (
                pieces[coord[0]].clone()
                if coord is not None and coord[0] < len(pieces)
                else b.narrow(d, 0, 0).clone()
            )
            b.resize_(piece.shape)
            b.copy_(piece)
    orig = F.scaled_dot_product_attention
    from .dispatch import _lookup

    _lookup(orig)  # bind the registry now: name lookups inside the context see the patch
    F.scaled_dot_product_attention = _sequence_attention(orig, mesh, even)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig
        with torch.no_grad():
            for b, o in zip(buffers, originals):
                if o is not None:
                    b.resize_(o.shape)
                    b.copy_(o)
