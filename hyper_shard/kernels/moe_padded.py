"""Expert parallelism with static shapes: the token exchange padded to its bound, for
compiled regions.

The dropless layer of :mod:`hyper_shard.kernels.moe` exchanges the per-expert counts first
and sizes the all-to-all with them: python ints read from a tensor, which a compiled
region cannot have (a trace has no data, and each rank would compile other sizes). Here
every shape depends on the token count alone. Rank ``c`` of ``n`` holds ``T`` tokens and
``K`` choices each, ``P = T K`` (token, choice) pairs; ``E`` experts, ``L = E / n`` per
rank:

1. the pairs sorted by expert (a stable sort), each one's destination rank
   ``expert // L``; the pairs for rank ``d`` are one run of the sorted order, starting at
   ``start[d]`` (counted with comparisons against ``0 .. n - 1``: no ``bincount`` of
   data-dependent length);
2. a send buffer of ``n`` pieces of ``P`` rows: piece ``d`` holds the rows of the pairs
   for rank ``d`` first, then zero rows (a pair goes to one rank, so ``P`` rows always
   fit: the bound of a dropless layer), built by a gather (its backward a scatter-add);
   beside it the pairs' local expert ids (-1 on padding rows);
3. one even all-to-all of the rows and one of the ids (the platform's collective: a
   functional ``all_to_all_single`` in a traced torch region);
4. each local expert on every received row, kept where the row is its own (the padding
   rows and the other experts' rows masked to zero): ``L`` dense products over ``n P``
   rows instead of grouped products over the received rows;
5. the all-to-all back, each pair's row picked from its slot, the pairs back in (token,
   choice) order, times the router weights, summed over the ``K`` choices.

The values and every gradient are those of the dropless layer (the padding rows are
zeros in, masked out, never picked); the price is ``n`` times the exchange's rows on the
wire and ``L n`` times the expert rows computed, the cost of shapes that do not depend on
the routing. Nothing here imports a framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .moe import ExpertWeights, Group, _project

if TYPE_CHECKING:
    from ..platform.base import Runtime

__all__ = ["moe_forward_padded", "bad_index_count"]


def bad_index_count(plat: Runtime, index: Any, num_experts: int) -> Any:
    """How many of ``index``'s expert ids fall outside ``[0, num_experts)`` (a 0-d int64
    tensor)."""
    flat = plat.reshape(index, [-1])
    bad = (flat < 0) | (flat >= num_experts)
    return plat.sum(plat.cast(bad, plat.dtype_of(flat)))


def _even_exchange(plat: Runtime, t: Any, n: int, ep: Group) -> Any:
    """``t`` (``n`` pieces of equal rows, piece ``d`` for coordinate ``d``) through the
    all-to-all: the pieces received, by sender; differentiable (the backward sends the
    gradient pieces back the same way)."""

    def a2a(x: Any) -> Any:
        rows = plat.shape(x)[0] // n
        pieces = [plat.narrow(x, 0, d * rows, rows) for d in range(n)]
        return plat.cat(plat.all_to_all(pieces, ep.group), 0)

    if not plat.requires_grad(t):
        return a2a(t)
    return plat.custom_autograd(a2a, a2a, t)


def moe_forward_padded(
    plat: Runtime,
    x: Any,
    index: Any,
    weights: Any,
    experts: ExpertWeights,
    num_experts: int,
    ep: Group,
) -> Any:
    """The expert-parallel layer on this rank's tokens with static shapes (see the module
    docstring); the same contract as :func:`hyper_shard.kernels.moe.moe_forward` without
    a tensor-parallel split. Expert ids must lie in ``[0, num_experts)`` (the caller checks
    them: an id out of range here would pick a wrong row, not raise).

    Args:
        x: ``[T, H]`` this rank's tokens; index / weights: ``[T, K]`` the router's expert
            ids (global) and weights.

    Returns:
        ``[T, H]`` in ``x``'s dtype.
    """
    n = ep.size
    local = num_experts // n
    top_k = plat.shape(index)[-1] if len(plat.shape(index)) > 1 else 1
    flat = plat.reshape(index, [-1])
    p = plat.shape(flat)[0]
    with plat.no_grad():
        order = plat.argsort(flat)
        expert = plat.take_rows(flat, order)  # [P] sorted expert ids
        dest = expert // local  # [P] destination coordinate
        ranks = plat.unsqueeze(plat.arange(0, n, flat), 0)  # [1, n]
        col = plat.unsqueeze(dest, 1)  # [P, 1]
        count = plat.sum(plat.cast(col == ranks, plat.dtype_of(flat)), 0)  # [n]
        start = plat.sum(plat.cast(col < ranks, plat.dtype_of(flat)), 0)  # [n]
        j = plat.arange(0, p, flat)
        slot = dest * p + j - plat.take_rows(start, dest)  # [P] each pair's send slot
        s = plat.arange(0, n * p, flat)
        d = s // p
        r = s - d * p
        valid = r < plat.take_rows(count, d)  # [n P] slot holds a pair
        src = plat.where(valid, plat.take_rows(start, d) + r, 0)  # the sorted pair
        token = plat.take_rows(order, src) // top_k
        lid = plat.where(valid, plat.take_rows(expert, src) - d * local, -1)
        recv_lid = _even_exchange(plat, lid, n, ep)  # [n P] local ids, by sender
    rows = plat.take_rows(x, token)
    rows = rows * plat.cast(plat.unsqueeze(valid, 1), plat.dtype_of(rows))
    got = _even_exchange(plat, rows, n, ep)  # [n P, H]
    y = None
    for e in range(local):
        w = ExpertWeights(
            up=plat.narrow(experts.up, 0, e, 1),
            down=plat.narrow(experts.down, 0, e, 1),
            up_bias=None if experts.up_bias is None else plat.narrow(experts.up_bias, 0, e, 1),
            down_bias=None
            if experts.down_bias is None
            else plat.narrow(experts.down_bias, 0, e, 1),
            activation=experts.activation,
            transposed=experts.transposed,
        )
        m = plat.shape(got)[0]
        h = _project(plat, got, w.up, w.up_bias, [m], w.transposed)
        out = _project(plat, w.activation(h), w.down, w.down_bias, [m], w.transposed)
        with plat.no_grad():
            mine = plat.cast(plat.unsqueeze(recv_lid == e, 1), plat.dtype_of(out))
        y = out * mine if y is None else y + out * mine
    assert y is not None
    back = _even_exchange(plat, y, n, ep)  # [n P, H] in the send slots
    with plat.no_grad():
        unsort = plat.argsort(order)
    pairs = plat.take_rows(plat.take_rows(back, slot), unsort)  # [P, H] (token, choice)
    t = plat.shape(weights)[0]
    w8 = plat.cast(plat.reshape(weights, [t * top_k, 1]), plat.dtype_of(pairs))
    h = plat.shape(pairs)[-1]
    return plat.cast(plat.sum(plat.reshape(pairs * w8, [t, top_k, h]), 1), plat.dtype_of(x))
