"""Expert parallelism's token routing, exchange, expert compute and combine, written once
against the Platform protocol (torch and MindSpore alike; the style that installs it is
:mod:`hyper_shard.parallel.expert`).

A mixture-of-experts layer of ``E`` experts whose stacked weights are sharded on the
expert dim over ``n`` ranks (``E / n`` local experts, rank ``c`` holding experts
``c * E / n ...``): every rank holds its own ``T`` tokens ``x [T, H]``, the router's
choice ``index [T, K]`` (global expert ids) and weights ``weights [T, K]``.

1. :func:`route` — this rank's ``T * K`` (token, choice) pairs sorted by expert (a stable
   sort: pairs for rank ``c``'s experts are one contiguous block), its per-expert counts,
   and the **count exchange**: one all-gather of every rank's ``E`` counts (plus its
   number of out-of-range indices), so every rank knows the whole ``n x E`` matrix: the
   rows it sends to and receives from each rank, the largest piece (for the padded
   routes), and whether some rank's router produced an index outside ``[0, E)``; then
   every rank raises the same error, before any token moves.
2. :func:`dispatch` — the sorted rows (``x`` gathered by token) through the all-to-all of
   variable pieces (:func:`hyper_shard.platform.compose.all_to_all_v`: native, or padded
   all-to-all, send/recv rounds or all-gather where the backend lacks it); the received
   rows (by sender, then by local expert) permuted to local-expert-major order.
3. :func:`run_experts` — the local experts on their row blocks: the up projection, the
   activation (gated or not, the module's own), the down projection, each a grouped
   matrix product (``plat.grouped_mm``: ``torch._grouped_mm`` where it runs, a loop over
   the local experts otherwise). With a tensor-parallel split of each expert
   (:class:`TensorSplit`), the up projection's output columns are all-gathered over the
   tp ranks (reduce-scattered in backward), each rank runs the down projection on its
   chunk of the intermediate dim, and the result is a partial sum over tp.
4. :func:`combine` — the inverse permutation, the all-to-all back (the sizes swapped),
   the pairs back in (token, choice) order, times the router weights, summed over the
   ``K`` choices: ``[T, H]`` in token order. With a tp split the tokens and router
   weights enter through :func:`copy_to_split` (their gradient summed over tp) and the
   partial result leaves through :func:`reduce_partial` (all-reduced).

Gradients: every gather's backward is the framework's scatter-add, each all-to-all's
backward is the all-to-all back (:func:`exchange`), so the tokens, the router weights and
the local experts' weights all receive their true local derivatives.

Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..platform import compose

if TYPE_CHECKING:
    from ..platform.base import CommOps, LocalOps, Runtime

__all__ = [
    "Group",
    "TensorSplit",
    "ExpertWeights",
    "Routing",
    "route",
    "exchange",
    "dispatch",
    "run_experts",
    "combine",
    "moe_forward",
    "RoutingError",
]


class RoutingError(ValueError):
    """A router produced an expert index outside ``[0, num_experts)`` on some rank (raised
    on every rank of the expert-parallel group, after the count exchange)."""


@dataclass(frozen=True)
class Group:
    """One communication group as the kernel uses it: the platform's group, its size and
    this rank's coordinate in it."""

    group: Any
    size: int
    coord: int


@dataclass(frozen=True)
class TensorSplit(Group):
    """The tensor-parallel split of every expert (:class:`~hyper_shard.parallel.expert.
    ExpertTensorParallel`): ``up_sizes[t]`` columns of the up projection's output and
    ``mid_sizes[t]`` of the intermediate dim on tp coordinate ``t``."""

    up_sizes: tuple[int, ...] = ()
    mid_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ExpertWeights:
    """The local experts of one layer as plain local tensors.

    Attributes:
        up: ``[E_l, out, H]`` (``[E_l, H, out]`` when ``transposed``): the gate and up
            projections (packed as the module packs them) or the up projection alone.
        down: ``[E_l, H, I]`` (``[E_l, I, H]`` when ``transposed``).
        up_bias: ``[E_l, out]`` or None; down_bias: ``[E_l, H]`` or None.
        activation: ``[S, out] -> [S, I]``: the module's own gating/activation.
        transposed: the weights are stored ``[in, out]`` (``x @ w``), not ``[out, in]``.
    """

    up: Any
    down: Any
    up_bias: Any
    down_bias: Any
    activation: Callable[[Any], Any]
    transposed: bool = False


@dataclass(frozen=True)
class Routing:
    """One forward's exchange plan (see :func:`route`).

    Attributes:
        order: ``[T * K]`` int64: the (token, choice) pairs sorted by expert.
        send / recv: rows to / from each expert-parallel coordinate.
        to_expert / from_expert: the received rows in local-expert-major order, and back
            (None when nothing is received).
        sizes: rows per local expert, in that order.
        max_piece: the largest piece of the whole exchange (the same on every rank).
        counts: the exchanged ``n x E`` matrix (rank, expert) -> pairs.
    """

    order: Any
    send: tuple[int, ...]
    recv: tuple[int, ...]
    to_expert: Any
    from_expert: Any
    sizes: tuple[int, ...]
    max_piece: int
    counts: tuple[tuple[int, ...], ...]


def _blocks_index(plat: LocalOps, blocks: Sequence[tuple[int, int]], like: Any) -> Any:
    """The int64 index that lists rows ``start .. start + length`` of every block in turn."""
    parts = [plat.arange(s, s + n, like) for s, n in blocks if n]
    if not parts:
        return plat.arange(0, 0, like)
    return parts[0] if len(parts) == 1 else plat.cat(parts, 0)


def route(plat: CommOps, index: Any, num_experts: int, ep: Group) -> Routing:
    """Sort this rank's (token, choice) pairs by expert and exchange the counts.

    Args:
        index: ``[T, K]`` integer expert ids (global, ``0 <= id < num_experts``).
        num_experts: ``E``, a multiple of ``ep.size``.
        ep: the expert-parallel group (``E / ep.size`` experts per coordinate).

    Raises:
        RoutingError: some rank's ``index`` holds ids outside ``[0, E)`` (every rank raises
            it, naming the ranks and how many ids each had out of range).
    """
    n, me = ep.size, ep.coord
    local = num_experts // n
    flat = plat.reshape(index, [-1])
    with plat.no_grad():
        counts = plat.bincount(flat, num_experts)  # ids out of range are not counted
        total = plat.full([1], plat.shape(flat)[0], counts)
        payload = plat.cat([counts, total - plat.reshape(plat.sum(counts), [1])], 0)
        rows = (
            [plat.tolist(r) for r in plat.all_gather(payload, ep.group, n)]
            if n > 1
            else [plat.tolist(payload)]
        )
    wrong = [(r, int(row[-1])) for r, row in enumerate(rows) if int(row[-1])]
    if wrong:
        where = ", ".join(f"coordinate {r}: {k}" for r, k in wrong)
        raise RoutingError(
            f"expert parallelism: the router produced expert indices outside [0, "
            f"{num_experts}) ({where} of the expert-parallel group; this rank is coordinate "
            f"{me}); every index of top_k_index must name one of the layer's {num_experts} "
            f"experts"
        )
    m = tuple(tuple(int(v) for v in row[:-1]) for row in rows)

    def piece(a: int, b: int) -> int:  # pairs rank a sends to rank b
        return sum(m[a][b * local : (b + 1) * local])

    send = tuple(piece(me, c) for c in range(n))
    recv = tuple(piece(s, me) for s in range(n))
    mine = [[m[s][me * local + e] for e in range(local)] for s in range(n)]
    sizes = tuple(sum(mine[s][e] for s in range(n)) for e in range(local))
    # received rows: sender-major blocks (s, e); experts need local-expert-major (e, s)
    src_start, off = {}, 0
    for s in range(n):
        for e in range(local):
            src_start[s, e] = off
            off += mine[s][e]
    dst_start, off = {}, 0
    for e in range(local):
        for s in range(n):
            dst_start[s, e] = off
            off += mine[s][e]
    with plat.no_grad():
        order = plat.argsort(flat)
        if sum(recv) and n > 1 and local > 1:  # else the two orders are the same
            to_e = [(src_start[s, e], mine[s][e]) for e in range(local) for s in range(n)]
            back = [(dst_start[s, e], mine[s][e]) for s in range(n) for e in range(local)]
            to_expert = _blocks_index(plat, to_e, counts)
            from_expert = _blocks_index(plat, back, counts)
        else:
            to_expert = from_expert = None
    biggest = max((piece(a, b) for a in range(n) for b in range(n)), default=0)
    return Routing(order, send, recv, to_expert, from_expert, sizes, biggest, m)


def exchange(
    plat: Runtime, x: Any, send: Sequence[int], recv: Sequence[int], ep: Group, biggest: int
) -> Any:
    """The all-to-all of ``x``'s rows in pieces of ``send`` (receiving pieces of ``recv``),
    differentiable: its backward sends the gradient back (the sizes swapped)."""
    if ep.size == 1:
        return x

    def fwd(t: Any) -> Any:
        return compose.all_to_all_v(plat, t, send, recv, ep.group, ep.coord, biggest)

    def bwd(g: Any) -> Any:
        return compose.all_to_all_v(plat, g, recv, send, ep.group, ep.coord, biggest)

    if not plat.requires_grad(x):
        return fwd(x)
    return plat.custom_autograd(fwd, bwd, x)


def dispatch(plat: Runtime, x: Any, routing: Routing, top_k: int, ep: Group) -> Any:
    """This rank's tokens ``x [T, H]`` to the ranks of their experts: ``[R, H]``, the rows
    this rank's local experts process, in local-expert-major order (``routing.sizes``)."""
    with plat.no_grad():
        token = routing.order // top_k
    rows = plat.take_rows(x, token)
    got = exchange(plat, rows, routing.send, routing.recv, ep, routing.max_piece)
    return got if routing.to_expert is None else plat.take_rows(got, routing.to_expert)


def combine(plat: Runtime, y: Any, routing: Routing, weights: Any, ep: Group) -> Any:
    """The experts' rows ``y [R, H]`` back to their tokens' ranks, weighted by the router
    and summed over the ``K`` choices: ``[T, H]`` in token order."""
    if routing.from_expert is not None:
        y = plat.take_rows(y, routing.from_expert)
    back = exchange(plat, y, routing.recv, routing.send, ep, routing.max_piece)
    with plat.no_grad():
        unsort = plat.argsort(routing.order)
    pairs = plat.take_rows(back, unsort)  # [T * K, H] in (token, choice) order
    t, k = plat.shape(weights)[0], plat.shape(weights)[1]
    w = plat.cast(plat.reshape(weights, [t * k, 1]), plat.dtype_of(pairs))
    h = plat.shape(pairs)[-1]
    return plat.sum(plat.reshape(pairs * w, [t, k, h]), 1)


def _project(
    plat: LocalOps, x: Any, w: Any, bias: Any, sizes: Sequence[int], transposed: bool
) -> Any:
    out = plat.grouped_mm(x, w if transposed else plat.transpose(w, 1, 2), sizes)
    if bias is None:
        return out
    like = plat.arange(0, 1, bias)
    rows = [plat.full([s], g, like) for g, s in enumerate(sizes) if s]
    if not rows:
        return out
    return out + plat.take_rows(bias, rows[0] if len(rows) == 1 else plat.cat(rows, 0))


def _gather_columns(plat: Runtime, h: Any, tp: TensorSplit) -> Any:
    """The up projection's output columns of every tp rank, side by side (forward an
    all-gather, backward a reduce-scatter of each rank's contribution)."""

    def fwd(t: Any) -> Any:
        return plat.cat(plat.all_gather(t, tp.group, tp.size), 1)

    def bwd(g: Any) -> Any:
        return compose.reduce_scatter(plat, g, 1, tp.up_sizes, "sum", tp.group, tp.coord)

    if not plat.requires_grad(h):
        return fwd(h)
    return plat.custom_autograd(fwd, bwd, h)


def copy_to_split(plat: Runtime, t: Any, tp: TensorSplit) -> Any:
    """A value every tp rank holds and uses for its part of the result: the identity
    forward, the sum of the tp ranks' gradient contributions backward (Megatron's "f")."""
    if not plat.requires_grad(t):
        return t
    return plat.custom_autograd(lambda x: x, lambda g: plat.all_reduce(g, "sum", tp.group), t)


def reduce_partial(plat: Runtime, t: Any, tp: TensorSplit) -> Any:
    """The sum of the tp ranks' partial results, used identically by every tp rank after:
    all-reduce forward, the gradient unchanged backward (Megatron's "g")."""
    if not plat.requires_grad(t):
        return plat.all_reduce(t, "sum", tp.group)
    return plat.custom_autograd(lambda x: plat.all_reduce(x, "sum", tp.group), lambda g: g, t)


def run_experts(
    plat: Runtime, x: Any, sizes: Sequence[int], w: ExpertWeights, tp: TensorSplit | None = None
) -> Any:
    """The local experts on their row blocks: ``x [R, H]`` holds ``sizes[e]`` rows for
    local expert ``e`` in turn; returns ``[R, H]`` (a partial sum over ``tp`` when given)."""
    h = _project(plat, x, w.up, w.up_bias, sizes, w.transposed)
    if tp is not None and tp.size > 1:
        h = _gather_columns(plat, h, tp)
    a = w.activation(h)
    if tp is not None and tp.size > 1:
        a = plat.narrow(a, 1, sum(tp.mid_sizes[: tp.coord]), tp.mid_sizes[tp.coord])
    bias = w.down_bias if tp is None or tp.coord == 0 else None
    return _project(plat, a, w.down, bias, sizes, w.transposed)


def moe_forward(
    plat: Runtime,
    x: Any,
    index: Any,
    weights: Any,
    experts: ExpertWeights,
    num_experts: int,
    ep: Group,
    tp: TensorSplit | None = None,
) -> Any:
    """The whole expert-parallel layer on this rank's tokens: :func:`route`,
    :func:`dispatch`, :func:`run_experts`, :func:`combine` (and the tp reduction).

    Args:
        x: ``[T, H]`` this rank's tokens; index / weights: ``[T, K]`` the router's expert
            ids (global) and weights.

    Returns:
        ``[T, H]``: ``sum_k weights[t, k] * expert_{index[t, k]}(x[t])``, in ``x``'s dtype.

    Raises:
        RoutingError: an index outside ``[0, num_experts)`` on any rank of ``ep``.
    """
    split = tp is not None and tp.size > 1
    if split:
        assert tp is not None
        x, weights = copy_to_split(plat, x, tp), copy_to_split(plat, weights, tp)
    routing = route(plat, index, num_experts, ep)
    top_k = plat.shape(index)[-1] if len(plat.shape(index)) > 1 else 1
    rows = dispatch(plat, x, routing, top_k, ep)
    y = run_experts(plat, rows, routing.sizes, experts, tp)
    out = combine(plat, y, routing, plat.reshape(weights, [-1, top_k]), ep)
    if split:
        assert tp is not None
        out = reduce_partial(plat, out, tp)
    return plat.cast(out, plat.dtype_of(x))
