"""Collectives a platform lacks, composed once from those it has, for every platform.

A platform implements only its native collectives (``Comm.native_collectives``: always
``all_gather`` and ``all_reduce``, where the backend has them ``reduce_scatter``,
``all_to_all`` and ``send_recv``). Everything that communicates — the redistribution
executor, the neutral kernels, FSDP's flat buffers — calls the functions here, which run
the native collective where it exists and otherwise the cheapest composition:

* reduce-scatter = all-reduce + narrow, or all-gather of every rank's input + a local sum;
* all-to-all = ``n - 1`` rounds of paired send/recv, or all-gather + a local pick;
* the all-to-all of rows in pieces of any sizes (:func:`all_to_all_v`, expert
  parallelism's token exchange) = the even all-to-all of pieces padded to the largest,
  ``n - 1`` send/recv rounds of the rows, or an all-gather of the padded pieces + a pick.
* a ring shift (every rank sends to the next coordinate and receives from the previous
  one: ring attention's key/value rotation) = one paired send/recv, started and waited
  on later where the platform is asynchronous, or all-gather + a pick.

Which composition runs is the step table's (:mod:`hyper_shard.redistribute.steps`: the
routes in order of preference, each priced as what it runs): the executor passes the route
the plan was priced with; other callers let :func:`route_for` choose with the platform's
native set. Pieces are in mesh-coordinate order; uneven pieces (``torch.chunk``
sizes) are padded to the largest for a native collective and trimmed after.

Framework-neutral: every tensor operation goes through the platform passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..redistribute.steps import EXCHANGES, STEPS

if TYPE_CHECKING:
    from .base import Comm, CommOps, FlatBuffers, LocalOps

__all__ = [
    "route_for",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_v",
    "reduce_scatter_flat",
    "all_gather_flat",
    "Done",
    "shift_route",
    "shift_start",
]


def route_for(plat: Comm, kind: str) -> str:
    """The route ``kind`` (``"reduce_scatter"``/``"all_to_all"``) runs by on ``plat``:
    ``"native"`` where the platform has it, else the first composition its native set
    allows (see :meth:`~hyper_shard.redistribute.steps.StepKind.route`)."""
    if plat.has(kind):
        return "native"
    return (STEPS.get(kind) or EXCHANGES[kind]).route(plat.native_collectives)


def _pad_to(plat: LocalOps, t: Any, d: int, size: int) -> Any:
    return t if plat.shape(t)[d] == size else plat.pad_dim(t, d, size)


def _split(plat: LocalOps, t: Any, d: int, sizes: Sequence[int]) -> list[Any]:
    out, start = [], 0
    for s in sizes:
        out.append(plat.narrow(t, d, start, s))
        start += s
    return out


def reduce_scatter(
    plat: CommOps,
    t: Any,
    dim: int,
    sizes: Sequence[int],
    op: str,
    group: Any,
    coord: int,
    route: str | None = None,
) -> Any:
    """This rank's piece of ``t`` reduced over ``group``: ``t`` (the same shape on every
    rank) is cut along ``dim`` into pieces of ``sizes`` (one per mesh coordinate), piece
    ``c`` is reduced with ``op`` (``sum``/``avg``) over the group and kept by coordinate
    ``c``; this rank is coordinate ``coord``.

    Args:
        route: ``"native"``, ``"all_reduce"`` or ``"all_gather"`` (None: :func:`route_for`).

    Raises:
        ValueError: ``op`` other than sum/avg.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"reduce_scatter: reduce op {op!r} (use 'sum' or 'avg')")
    n = len(sizes)
    if route is None:
        route = route_for(plat, "reduce_scatter")
    if route == "native":
        pieces = [_pad_to(plat, p, dim, sizes[0]) for p in _split(plat, t, dim, sizes)]
        out = plat.reduce_scatter(pieces, op, group)
        return plat.narrow(out, dim, 0, sizes[coord])
    start = sum(sizes[:coord])
    if route == "all_reduce":
        return plat.narrow(plat.all_reduce(t, op, group), dim, start, sizes[coord])
    parts = plat.all_gather(t, group, n)  # every rank's whole input: sum my piece of each
    acc = plat.narrow(parts[0], dim, start, sizes[coord])
    for p in parts[1:]:
        acc = acc + plat.narrow(p, dim, start, sizes[coord])
    if op == "avg":
        dtype = plat.dtype_of(acc)
        acc = plat.cast(plat.scale(acc, 1.0 / n), dtype)
    return acc


def all_to_all(
    plat: CommOps,
    t: Any,
    src_dim: int,
    dst_dim: int,
    src_sizes: Sequence[int],
    dst_sizes: Sequence[int],
    group: Any,
    coord: int,
    route: str | None = None,
) -> Any:
    """Move the split of ``t`` from ``src_dim`` to ``dst_dim``: ``t`` holds piece
    ``coord`` of ``src_dim`` (of ``src_sizes``) and the whole of ``dst_dim``; the result
    holds the whole of ``src_dim`` and piece ``coord`` of ``dst_dim`` (of ``dst_sizes``).

    Args:
        route: ``"native"``, ``"send_recv"`` or ``"all_gather"`` (None: :func:`route_for`).
    """
    d, e, c = src_dim, dst_dim, coord
    n = len(dst_sizes)
    if route is None:
        route = route_for(plat, "all_to_all")
    if route == "all_gather":
        everyone = plat.all_gather(_pad_to(plat, t, d, src_sizes[0]), group, n)
        start = sum(dst_sizes[:c])
        recv = [plat.narrow(x, e, start, dst_sizes[c]) for x in everyone]
    else:
        pieces = [
            _pad_to(plat, _pad_to(plat, p, e, dst_sizes[0]), d, src_sizes[0])
            for p in _split(plat, t, e, dst_sizes)
        ]
        if route == "native":
            recv = plat.all_to_all(pieces, group)
        else:  # n - 1 rounds: send to coordinate c + k, receive from c - k
            recv = list(pieces)
            for k in range(1, n):
                to, frm = (c + k) % n, (c - k) % n
                recv[frm] = plat.send_recv(pieces[to], to, pieces[to], frm, group)
    return plat.cat(
        [plat.narrow(plat.narrow(r, e, 0, dst_sizes[c]), d, 0, s) for r, s in zip(recv, src_sizes)],
        d,
    )


def all_to_all_v(
    plat: CommOps,
    t: Any,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group: Any,
    coord: int,
    max_size: int | None = None,
    route: str | None = None,
) -> Any:
    """The all-to-all of rows in pieces of any sizes (``all_to_all_single`` with splits):
    ``t`` holds, along dim 0, ``send_sizes[c]`` rows for each mesh coordinate ``c`` in
    turn; the result holds ``recv_sizes[c]`` rows from each coordinate ``c`` in turn
    (the ``send_sizes[coord]`` rows of this rank's own piece included). Every rank passes
    the sizes that match its peers' (rank ``a``'s ``send_sizes[b]`` is rank ``b``'s
    ``recv_sizes[a]``): the callers exchange the counts first.

    Args:
        max_size: the largest piece of the whole exchange (the same on every rank), for the
            padded routes; None: one small all-gather finds it when such a route runs.
        route: ``"native"``, ``"all_to_all"`` (pieces padded to ``max_size``),
            ``"send_recv"`` (``n - 1`` rounds; a piece of no rows travels as one padding
            row, so a round never sends or receives nothing) or ``"all_gather"`` (padded
            pieces gathered, this rank's picked); None: :func:`route_for`.

    Raises:
        ValueError: ``t``'s rows are not ``sum(send_sizes)``, or the sizes are not one per
            rank of the group.
    """
    n = len(send_sizes)
    rows = plat.shape(t)[0]
    if rows != sum(send_sizes) or len(recv_sizes) != n:
        raise ValueError(
            f"all_to_all_v: {rows} rows to send in pieces of {list(send_sizes)} (their sum "
            f"must be the rows), receiving pieces of {list(recv_sizes)} (one per rank)"
        )
    if n == 1:
        return t
    if route is None:
        route = route_for(plat, "all_to_all_v")
    if route == "native":
        return plat.all_to_all_v(t, send_sizes, recv_sizes, group)
    pieces = _split(plat, t, 0, send_sizes)
    if route == "send_recv":  # n - 1 rounds: send to coordinate c + k, receive from c - k
        recv = list(pieces)
        for k in range(1, n):
            to, frm = (coord + k) % n, (coord - k) % n
            out = _pad_to(plat, pieces[to], 0, max(send_sizes[to], 1))
            like = _pad_to(plat, plat.narrow(t, 0, 0, 0), 0, max(recv_sizes[frm], 1))
            got = plat.send_recv(out, to, like, frm, group)
            recv[frm] = plat.narrow(got, 0, 0, recv_sizes[frm])
        return plat.cat(recv, 0)
    if max_size is None:  # the largest piece any rank sends
        mine = max(max(send_sizes), 1)
        every = plat.all_gather(plat.arange(mine, mine + 1, t), group, n)
        max_size = max(int(plat.tolist(x)[0]) for x in every)
    size = max(max_size, 1)
    padded = [_pad_to(plat, p, 0, size) for p in pieces]
    if route == "all_to_all":
        got = all_to_all_pieces(plat, padded, group, coord)
    else:  # every rank's padded pieces; keep the pieces addressed to this coordinate
        everyone = plat.all_gather(plat.cat(padded, 0), group, n)
        got = [plat.narrow(x, 0, coord * size, size) for x in everyone]
    return plat.cat([plat.narrow(g, 0, 0, r) for g, r in zip(got, recv_sizes)], 0)


def all_to_all_pieces(plat: CommOps, pieces: Sequence[Any], group: Any, coord: int) -> list[Any]:
    """The even all-to-all of ``n`` equally shaped pieces (piece ``c`` to coordinate
    ``c``; returns the pieces received, by sender), native or by the platform's
    composition; this rank is coordinate ``coord``."""
    n = len(pieces)
    t = plat.unsqueeze(plat.stack(pieces, 0), 1)  # [n (to), 1 (mine), ...]
    out = plat.select(all_to_all(plat, t, 1, 0, [1] * n, [1] * n, group, coord), 0, 0)
    return [plat.select(out, 0, c) for c in range(n)]


def _coord(plat: CommOps, group: Any) -> int:
    ranks = getattr(group, "ranks", None)
    return list(ranks).index(plat.get_rank()) if ranks else 0


def reduce_scatter_flat(plat: FlatBuffers, out: Any, inp: Any, op: str, group: Any) -> None:
    """FSDP's flat reduce-scatter, composed: flat ``inp`` (``n * k`` elements, chunk ``c``
    for mesh coordinate ``c``) reduced (``sum``/``avg``) over ``group``; this rank's chunk
    lands in flat ``out`` (``k``). Synchronous.

    Raises:
        ValueError: ``op`` other than sum/avg.
    """
    k = plat.shape(out)[0]
    n = plat.shape(inp)[0] // k if k else len(getattr(group, "ranks", (0,)))
    piece = reduce_scatter(plat, inp, 0, [k] * n, op, group, _coord(plat, group))
    plat.copy_flat(out, piece)


def all_gather_flat(plat: FlatBuffers, out: Any, inp: Any, group: Any) -> None:
    """FSDP's flat all-gather by the list form: flat ``inp`` (``k`` elements) of every
    rank into flat ``out`` (``n * k``), chunk ``c`` from mesh coordinate ``c``."""
    k = plat.shape(inp)[0]
    n = plat.shape(out)[0] // k if k else len(getattr(group, "ranks", (0,)))
    for c, p in enumerate(plat.all_gather(inp, group, n)):
        plat.copy_flat(plat.narrow(out, 0, c * k, k), p)


class Done:
    """A completed exchange: ``wait()`` gives its result (the handle of a synchronous
    :meth:`~hyper_shard.platform.base.Comm.send_recv_start`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


def shift_route(plat: Comm) -> str:
    """How a ring shift runs on ``plat``: ``"send_recv"`` (one paired exchange, native
    point-to-point) or ``"all_gather"`` (every rank's tensor gathered, the previous one
    picked: ``n - 1`` times the bytes)."""
    return "send_recv" if plat.has("send_recv") else "all_gather"


def shift_start(
    plat: CommOps, t: Any, group: Any, coord: int, n: int, tag: int = 0, route: str | None = None
) -> Any:
    """Start a ring shift: send ``t`` to mesh coordinate ``coord + 1`` (mod ``n``) and
    receive the tensor coordinate ``coord - 1`` sends (shaped like ``t`` on every rank).
    Returns a handle whose ``wait()`` gives the received tensor; the exchange overlaps the
    caller's work until then where the platform is asynchronous
    (:attr:`~hyper_shard.platform.base.Comm.async_point_to_point`). ``tag`` tells two
    concurrent shifts over the same group apart (every rank starts them in the same
    order).

    Args:
        route: ``"send_recv"`` or ``"all_gather"`` (None: :func:`shift_route`).
    """
    if n == 1:
        return Done(t)
    if route is None:
        route = shift_route(plat)
    if route == "all_gather":
        return Done(plat.all_gather(t, group, n)[(coord - 1) % n])
    return plat.send_recv_start(t, (coord + 1) % n, t, (coord - 1) % n, group, tag)
