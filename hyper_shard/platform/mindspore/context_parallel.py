"""Context parallelism on MindSpore: ``hyper_shard.experimental.context_parallel`` on a
MindSpore mesh, with the torch platform's semantics (PyTorch's signature).

MindSpore has no ``scaled_dot_product_attention``; hyper_shard's
(:func:`hyper_shard.platform.mindspore.functional.scaled_dot_product_attention`, bound to
the attention rule) is the function the context patches: model code that calls it
through its module (``functional.scaled_dot_product_attention(q, k, v, is_causal=True)``,
looked up per call) on plain local ``(*batch, heads, seq_piece, E)`` pieces gets
context-parallel attention over the whole sequence — the same rule and kernels as on
torch (ring, all-to-all or all-gather, causal masks following the sequence layout; the
local blocks are the math attention with an explicit log-sum-exp, since MindSpore's
fused attention has no CPU kernel). Buffers (MindSpore tensors) are laid out in place
(``Tensor.set_``: ``assign_value`` refuses a tensor a network has taken as input) and
restored on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mindspore import Parameter, Tensor

from ...kernels.attention_layout import (
    SequenceLayout,
    attend_pieces,
    check_buffers,
    layout_of,
    local_piece,
)
from . import functional

__all__ = ["context_parallel"]


def _sequence_attention(orig: Any, mesh: Any, layout: SequenceLayout, even: bool) -> Any:
    from ...dtensor import DTensor
    from ...placement import Shard

    def sdpa(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(t, DTensor) for t in (query, key, value)):
            return orig(query, key, value, *args, **kwargs)  # hyper_shard's own rule

        def view(t: Tensor) -> Any:
            shp = tuple(Tensor.shape.fget(t))  # type: ignore[attr-defined]
            d = len(shp) - 2
            if even:  # every piece has the same length: no size exchange needed
                shape = (*shp[:-2], shp[-2] * mesh.size(), shp[-1])
                return DTensor.from_local(t, mesh, [Shard(d)], shape=shape)
            return DTensor.from_local(t, mesh, [Shard(d)])

        return attend_pieces(orig, view, query, key, value, args, kwargs, mesh, layout)

    return sdpa


def _host_copy(t: Tensor) -> Tensor:
    """A copy of ``t`` through host memory: ``Tensor.set_`` from a device copy
    (``ops.deepcopy``, ``Tensor.copy``) leaves ops reading the old data on MindSpore 2.10
    CPU (the shape changes, the data ops see does not); buffers are small (ids, labels)."""
    return Tensor(t.asnumpy())


@contextmanager
def context_parallel(
    mesh: Any,
    *,
    buffers: list[Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[Tensor] | None = None,
) -> Iterator[None]:
    """See :func:`hyper_shard.experimental.context_parallel`."""
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    keep = set() if no_restore_buffers is None else no_restore_buffers
    check_buffers(buffers, seq_dims, keep, Parameter)
    if mesh.ndim != 1:
        raise ValueError(
            f"context_parallel takes a 1-D mesh (the context-parallel dim), got {mesh}; "
            f"pass mesh['cp']"
        )
    n = mesh.size()
    coord = mesh.get_coordinate()
    layout = layout_of(buffers, seq_dims, n)
    plat = mesh.platform
    originals = [None if any(b is k for k in keep) else _host_copy(b) for b in buffers]
    even = bool(buffers) and all(b.shape[d] % n == 0 for b, d in zip(buffers, seq_dims))
    for b, d in zip(buffers, seq_dims):
        if coord is None:
            piece = plat.narrow(b, d, 0, 0)
        else:
            piece = local_piece(plat, b, d, layout, n, coord[0])
        b.set_(_host_copy(piece))
    from .dispatch import bind

    bind()  # the bound wrapper is the function's module attribute from now on
    orig = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _sequence_attention(orig, mesh, layout, even)
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = orig
        for b, o in zip(buffers, originals):
            if o is not None:
                b.set_(o)
