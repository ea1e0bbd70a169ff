"""The torch platform's collectives while a compiled region is traced: ``_c10d_functional``
ops (out of place, one ``wait_tensor`` each), so the graph holds the collectives and the
compiler may move them against compute ([Note: compiled DTensor] in ``compiled.py``).

Same contract as the eager ones in ``platform/torch/__init__.py`` (pieces in mesh
coordinate order, ``avg`` as sum then divide). All-to-all and the paired exchange are
``all_to_all_single`` (gloo runs it, with split sizes too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_F = torch.ops._c10d_functional
_OPS = {"sum": "sum", "avg": "sum", "max": "max", "min": "min", "prod": "product"}


def _name(group: Any) -> str:
    return str(group.pg.group_name)


def all_gather(t: torch.Tensor, group: Any, n: int) -> list[torch.Tensor]:
    """``n`` pieces of shape ``t.shape``, one per group member, in coordinate order."""
    shape = tuple(t.shape)
    flat = t.contiguous().reshape(1, -1)
    out = _F.wait_tensor(_F.all_gather_into_tensor(flat, n, _name(group)))
    pieces = [p.reshape(shape) for p in out.unbind(0)]
    return group.to_coord_order(pieces)  # type: ignore[no-any-return]


def all_reduce(t: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    out = _F.wait_tensor(_F.all_reduce(t.contiguous(), _OPS[op], _name(group)))
    if op == "avg":
        n = len(group.ranks)
        out = out / n if out.is_floating_point() else out // n
    return out  # type: ignore[no-any-return]


def reduce_scatter(pieces: Sequence[torch.Tensor], op: str, group: Any) -> torch.Tensor:
    """This member's piece of the elementwise reduction of every member's ``pieces``."""
    n = len(group.ranks)
    shape = tuple(pieces[0].shape)
    inp = torch.stack([p.contiguous() for p in group.to_group_order(list(pieces))])
    out = _F.wait_tensor(_F.reduce_scatter_tensor(inp.reshape(n, -1), _OPS[op], n, _name(group)))
    out = out.reshape(shape)
    if op == "avg":
        out = out / n
    return out  # type: ignore[no-any-return]


def all_to_all(pieces: Sequence[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Piece ``j`` of every member, for this member ``j``: one ``all_to_all_single`` of
    equal pieces (gloo runs it; each piece crosses the wire once, where the all-gather
    composition moved every member's pieces to every member)."""
    n = len(group.ranks)
    ordered = group.to_group_order(list(pieces))
    shape = tuple(ordered[0].shape)
    stacked = torch.stack([p.contiguous() for p in ordered]).reshape(n, -1)
    out = _F.wait_tensor(_F.all_to_all_single(stacked, [1] * n, [1] * n, _name(group)))
    got = list(out.reshape(n, *shape).unbind(0))  # by source member
    return group.to_coord_order(got)  # type: ignore[no-any-return]


def broadcast(t: torch.Tensor, src_group_rank: int, group: Any) -> torch.Tensor:
    src = group.ranks[src_group_rank]
    out = _F.wait_tensor(_F.broadcast(t.contiguous(), src, _name(group)))
    return out  # type: ignore[no-any-return]


class PendingShift:
    """A functional exchange in flight: ``wait()`` places the ``wait_tensor`` (where the
    caller asks for the result: a graph run eagerly overlaps the exchange with the work
    traced before it) and gives the received tensor."""

    __slots__ = ("out", "shape")

    def __init__(self, out: torch.Tensor, shape: tuple) -> None:
        self.out, self.shape = out, shape

    def wait(self) -> torch.Tensor:
        return _F.wait_tensor(self.out).reshape(self.shape)  # type: ignore[no-any-return]


def send_recv_start(
    t: torch.Tensor, dst: int, like: torch.Tensor, src: int, group: Any
) -> PendingShift:
    """``t`` to coordinate ``dst``, a tensor shaped like ``like`` from coordinate ``src``:
    one ``all_to_all_single`` whose only non-empty pieces are those two (PyTorch's
    ``permute_tensor``, which its ring attention rotates key/value with under compile).
    Point-to-point (``isend``/``irecv``) is not traceable; the all-to-all runs on gloo and
    moves the piece once, where an all-gather would move it ``n - 1`` times."""
    n = len(group.ranks)
    rank_of = torch.distributed.get_group_rank
    send = t.contiguous().reshape(-1)
    ins, outs = [0] * n, [0] * n
    ins[rank_of(group.pg, group.ranks[dst])] = send.numel()
    outs[rank_of(group.pg, group.ranks[src])] = like.numel()
    return PendingShift(_F.all_to_all_single(send, outs, ins, _name(group)), tuple(like.shape))


def send_recv(t: torch.Tensor, dst: int, like: torch.Tensor, src: int, group: Any) -> torch.Tensor:
    """:func:`send_recv_start`, waited on at once."""
    return send_recv_start(t, dst, like, src, group).wait()
