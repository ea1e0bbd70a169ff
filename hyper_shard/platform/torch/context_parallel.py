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

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.attention_layout import (
    SequenceLayout,
    attend_pieces,
    check_buffers,
    layout_of,
    local_piece,
)

__all__ = ["context_parallel"]


def _sequence_attention(
    orig: Any,
    mesh: Any,
    layout: SequenceLayout,
    even: bool,
    query: Any,
    key: Any,
    value: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``scaled_dot_product_attention`` on plain local sequence pieces inside a context."""
    from ...dtensor import DTensor
    from ...placement import Shard
    from ...spec import contiguous_stride

    if any(isinstance(t, DTensor) for t in (query, key, value)):
        return orig(query, key, value, *args, **kwargs)  # hyper_shard's own rule

    def view(t: torch.Tensor) -> Any:
        if even:  # every piece has the same length: no size exchange needed
            shape = (*t.shape[:-2], t.shape[-2] * mesh.size(), t.shape[-1])
            return DTensor.from_local(
                t, mesh, [Shard(t.dim() - 2)], shape=shape, stride=contiguous_stride(shape)
            )
        return DTensor.from_local(t, mesh, [Shard(t.dim() - 2)])

    return attend_pieces(orig, view, query, key, value, args, kwargs, mesh, layout)


#: this thread's open contexts, innermost last: (mesh, layout, even). Per thread, so rank
#: threads (ranks as threads) each attend over their own mesh; the function in ``F`` is
#: patched once for all of them (a patch per context, restored on exit, left a thread
#: still inside its context with torch's function, or another rank's mesh: wrong values
#: or a deadlock)
_OPEN: ContextVar[tuple] = ContextVar("hyper_shard_context_parallel", default=())
_PATCH_LOCK = threading.Lock()
#: [number of open contexts in the process, torch's function while patched]
_PATCHED: list[Any] = [0, None]


#: the innermost open context of the process, as a compiled region reads it (dynamo cannot
#: read a ContextVar; it reads this and guards on it: a region traced inside one context
#: and called in another, or outside any, recompiles). Compiling inside several rank
#: threads' contexts at once is not supported.
_COMPILED_VIEW: list[tuple] = [()]


def attention_in_region(
    mesh: Any, kind: str, even: bool, query: Any, key: Any, value: Any, args: tuple, kwargs: dict
) -> Any:
    """The body of a compiled region's context-parallel attention (one nonstrict call,
    ``"cp_attention"`` in ``compiled.py``): runs while AOTAutograd traces the region, on
    the local (fake) pieces, with the context's layout in force."""
    layout = SequenceLayout(kind)
    return _sequence_attention(_PATCHED[1], mesh, layout, even, query, key, value, *args, **kwargs)


def _traced_attention(open_: tuple, query: Any, key: Any, value: Any, *a: Any, **kw: Any) -> Any:
    """Context-parallel attention as dynamo traces it: even pieces are one nonstrict call
    (its collectives and the chosen kernel in the graph); uneven ones need the pieces'
    sizes exchanged at run time, which a trace cannot: that call runs eagerly (a graph
    break)."""
    from ...dtensor import DTensor
    from .compiled import _call

    mesh, layout, even = open_
    if any(isinstance(t, DTensor) for t in (query, key, value)):
        return _PATCHED[1](query, key, value, *a, **kw)  # hyper_shard's own rule
    if not even:
        return _eager_attention(open_, query, key, value, *a, **kw)
    return _call("cp_attention", (query, key, value, mesh, layout.kind, even, a, kw), {})


@torch._dynamo.disable
def _eager_attention(open_: tuple, query: Any, key: Any, value: Any, *a: Any, **kw: Any) -> Any:
    mesh, layout, even = open_
    return _sequence_attention(_PATCHED[1], mesh, layout, even, query, key, value, *a, **kw)


def _dispatching_sdpa(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _PATCHED[1]
    if torch.compiler.is_compiling():
        open_ = _COMPILED_VIEW[0]
        if not open_:
            return orig(query, key, value, *args, **kwargs)
        return _traced_attention(open_[-1], query, key, value, *args, **kwargs)
    open_ = _OPEN.get()
    if not open_:  # a thread outside any context: torch's own
        return orig(query, key, value, *args, **kwargs)
    mesh, layout, even = open_[-1]
    return _sequence_attention(orig, mesh, layout, even, query, key, value, *args, **kwargs)


def _patch() -> None:
    from .dispatch import _lookup

    with _PATCH_LOCK:
        if _PATCHED[0] == 0:
            # bind the registry first: its name lookups must see torch's function; and
            # torch's cached list of overridable functions, which dynamo asks whether a
            # torch function dispatches to a subclass' __torch_function__: built while
            # patched, it would hold the patch, and a DTensor attention compiled after the
            # context would skip hyper_shard (the aten op on DTensors in the graph)
            _lookup(F.scaled_dot_product_attention)
            torch.overrides.get_overridable_functions()
            _PATCHED[1] = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _dispatching_sdpa
        _PATCHED[0] += 1


def _unpatch() -> None:
    with _PATCH_LOCK:
        _PATCHED[0] -= 1
        if _PATCHED[0] == 0:
            F.scaled_dot_product_attention = _PATCHED[1]
            _PATCHED[1] = None


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
    token = _OPEN.set((*_OPEN.get(), (mesh, layout, even)))
    _COMPILED_VIEW[0] = _OPEN.get()
    _patch()
    try:
        yield
    finally:
        _unpatch()
        _OPEN.reset(token)
        _COMPILED_VIEW[0] = _OPEN.get()
        with torch.no_grad():
            for b, o in zip(buffers, originals):
                if o is None:
                    continue
                if b.requires_grad:  # turned on in the block: a leaf autograd cannot resize
                    b.data = o  # its .grad stays the piece's gradient
                else:
                    b.resize_(o.shape)
                    b.copy_(o)
