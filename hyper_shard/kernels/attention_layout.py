"""Sequence layouts of context parallelism and its options.

[Note: sequence layouts] A sequence of ``S`` positions sharded over the ``n`` ranks of a
mesh dim is a *laid-out* sequence: the global tensor a ``Shard(seq)`` DTensor describes
is the sequence in the layout's order, and rank ``c`` holds its ``c``-th ``torch.chunk``
piece. Two layouts:

* ``plain`` — natural order: rank ``c`` holds positions ``[c * k, c * k + size_c)``
  (``k = ceil(S / n)``, uneven pieces allowed, as ``torch.chunk``);
* ``head_tail`` — load-balanced for causal masks: the sequence is cut into ``2 n`` equal
  chunks and rank ``c`` holds chunks ``c`` and ``2 n - 1 - c`` (in that order), so every
  rank's causal work is the same (chunk ``c`` sees ``c + 1`` chunks, chunk ``2 n - 1 - c``
  sees ``2 n - c``: ``2 n + 1`` in all). ``S`` must be a multiple of ``2 n``. This is
  PyTorch's head-tail load balancer
  (``torch.distributed.tensor.experimental._context_parallel._load_balancer``).

A layout is a small immutable value; :meth:`SequenceLayout.segments` gives a rank's
piece as contiguous runs of natural positions, which is what the attention kernels mask
with (a run of keys is fully visible, invisible, or the same run as the queries: the
causal diagonal). :func:`hyper_shard.experimental.context_parallel` lays its buffers out
with one (``head_tail`` by default where ``2 n`` divides the length, as PyTorch) and
runs attention inside :func:`using_layout`; DTensors outside it are ``plain``.

The options (which context-parallel attention to run, whether to load-balance) are
process-wide values set through :mod:`hyper_shard.experimental` (as PyTorch's
``_cp_options``), read by the attention rule when it decides and by ``context_parallel``.

Framework-neutral: positions are python ints; :func:`positions` builds them as a tensor
through the platform passed in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..platform.base import LocalOps

__all__ = [
    "SequenceLayout",
    "PLAIN",
    "HEAD_TAIL",
    "using_layout",
    "current_layout",
    "CPOptions",
    "cp_options",
    "METHODS",
    "positions",
    "local_piece",
    "natural_order",
    "laid_out",
    "check_buffers",
    "layout_of",
]

#: the context-parallel attention methods (``auto``: the cost model picks)
METHODS = ("auto", "allgather", "ring", "ulysses")


@dataclass(frozen=True)
class SequenceLayout:
    """How a sequence is laid out over the ranks of one mesh dim (see the module note).

    Attributes:
        kind: ``"plain"`` or ``"head_tail"``.
    """

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in ("plain", "head_tail"):
            raise ValueError(f"sequence layout {self.kind!r}: use 'plain' or 'head_tail'")

    @property
    def balanced(self) -> bool:
        return self.kind == "head_tail"

    def check(self, length: int, n: int, what: str = "sequence") -> None:
        """Raise if a sequence of ``length`` cannot be laid out over ``n`` ranks.

        Raises:
            ValueError: ``head_tail`` and ``length`` not a multiple of ``2 n``.
        """
        if self.kind == "head_tail" and length % (2 * n):
            raise ValueError(
                f"the load-balanced (head-tail) sequence layout cuts the {what} into 2 x {n} "
                f"= {2 * n} equal chunks, but its length is {length} (not a multiple of "
                f"{2 * n}); pad the sequence to a multiple of {2 * n}, or turn load balancing "
                f"off (hyper_shard.experimental.set_load_balance(False)) for contiguous "
                f"pieces"
            )

    def sizes(self, length: int, n: int) -> list[int]:
        """Every rank's piece length, in mesh-coordinate order (``torch.chunk`` sizes)."""
        k = -(-length // n) if length else 0
        return [max(0, min(k, length - c * k)) for c in range(n)]

    def segments(self, length: int, n: int, coord: int) -> tuple[tuple[int, int], ...]:
        """Rank ``coord``'s piece as runs ``(natural start, length)``, in local order."""
        if self.kind == "plain":
            k = -(-length // n) if length else 0
            size = max(0, min(k, length - coord * k))
            return ((coord * k, size),) if size else ()
        self.check(length, n)
        c = length // (2 * n)
        if not c:
            return ()
        return ((coord * c, c), ((2 * n - 1 - coord) * c, c))

    def order(self, length: int, n: int) -> list[int]:
        """The natural position of every position of the laid-out sequence (the
        permutation ``laid_out = natural[order]``)."""
        out: list[int] = []
        for c in range(n):
            for start, size in self.segments(length, n, c):
                out.extend(range(start, start + size))
        return out

    def inverse(self, length: int, n: int) -> list[int]:
        """The permutation back: ``natural = laid_out[inverse]``."""
        inv = [0] * length
        for i, p in enumerate(self.order(length, n)):
            inv[p] = i
        return inv

    def inverse_runs(self, length: int, n: int) -> list[tuple[int, int]]:
        """:meth:`inverse` as runs ``(laid-out start, length)`` in natural order."""
        runs: list[tuple[int, int]] = []
        for i in self.inverse(length, n):
            if runs and runs[-1][0] + runs[-1][1] == i:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((i, 1))
        return runs


PLAIN = SequenceLayout("plain")
HEAD_TAIL = SequenceLayout("head_tail")

_LAYOUT: ContextVar[SequenceLayout | None] = ContextVar("hyper_shard_sequence_layout", default=None)


def current_layout() -> SequenceLayout:
    """The layout of sequence-sharded attention inputs in this context (``plain`` outside
    :func:`using_layout`)."""
    return _LAYOUT.get() or PLAIN


@contextmanager
def using_layout(layout: SequenceLayout) -> Iterator[None]:
    """Sequence-sharded attention inside the block reads its inputs as laid out by
    ``layout`` (a ``ContextVar``: per thread and task; restored on exit)."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def _runs(plat: LocalOps, t: Any, dim: int, runs: Any) -> Any:
    parts = [plat.narrow(t, dim, s, k) for s, k in runs]
    if not parts:
        return plat.narrow(t, dim, 0, 0)
    return parts[0] if len(parts) == 1 else plat.cat(parts, dim)


def local_piece(
    plat: LocalOps, t: Any, dim: int, layout: SequenceLayout, n: int, coord: int
) -> Any:
    """Rank ``coord``'s piece of the whole (natural-order) tensor ``t`` laid out along
    ``dim`` (a view for one run; a new tensor for two).

    Raises:
        ValueError: the layout cannot split ``t``'s length (:meth:`SequenceLayout.check`).
    """
    length = plat.shape(t)[dim]
    layout.check(length, n)
    return _runs(plat, t, dim, layout.segments(length, n, coord))


def laid_out(plat: LocalOps, t: Any, dim: int, layout: SequenceLayout, n: int) -> Any:
    """The whole natural-order tensor ``t`` laid out along ``dim`` (every rank's piece, in
    mesh-coordinate order); the inverse of :func:`natural_order`."""
    if not layout.balanced:
        return t
    length = plat.shape(t)[dim]
    return _runs(plat, t, dim, [s for c in range(n) for s in layout.segments(length, n, c)])


def natural_order(plat: LocalOps, t: Any, dim: int, layout: SequenceLayout, n: int) -> Any:
    """The whole laid-out tensor ``t`` (every rank's piece, in mesh-coordinate order,
    along ``dim``) back in natural order."""
    if not layout.balanced:
        return t
    return _runs(plat, t, dim, layout.inverse_runs(plat.shape(t)[dim], n))


# ---------------------------------------------------------------------- context_parallel
def check_buffers(
    buffers: Sequence[Any], seq_dims: Sequence[int], keep: Any, param_type: type | None
) -> None:
    """PyTorch's argument checks of ``context_parallel`` (its messages where it has them),
    for every platform's ``context_parallel`` (``param_type``: the framework's Parameter).

    Raises:
        ValueError: lengths differ, ``no_restore_buffers`` not a subset of ``buffers``, a
            Parameter among the buffers.
    """
    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    for b in keep:
        if not any(b is x for x in buffers):
            raise ValueError("`no_restore_buffers` must be a subset of `buffers`.")
    for b in buffers:
        if param_type is not None and isinstance(b, param_type):
            raise ValueError(
                "context_parallel: `buffers` may not contain a Parameter (its shape would "
                "change under the optimizer); pass activations, labels, position ids"
            )


def layout_of(buffers: Sequence[Any], seq_dims: Sequence[int], n: int) -> SequenceLayout:
    """The context's sequence layout, from the first buffer's length (as PyTorch's load
    balancer), checked against every buffer before anything changes.

    Raises:
        ValueError: load balancing forced on (``set_load_balance(True)``) and a length the
            head-tail layout cannot split; a length that leaves a rank no token (shorter
            than the ranks, or ``torch.chunk`` making fewer pieces: 5 over 4 is 2, 2, 1, 0),
            which a model's forward on that rank would fail on while the others wait in
            attention's collectives. Every rank raises (the lengths are the same on every
            rank), before any buffer changes.
    """
    if not buffers:
        return cp_options().layout_for(0, n) if cp_options().load_balance else PLAIN
    layout = cp_options().layout_for(int(buffers[0].shape[seq_dims[0]]), n)
    for i, (b, d) in enumerate(zip(buffers, seq_dims)):
        length = int(b.shape[d])
        what = f"sequence of buffers[{i}] (dim {d})"
        layout.check(length, n, what)
        sizes = layout.sizes(length, n)
        if 0 in sizes:
            raise ValueError(
                f"context_parallel: the {what} has length {length}, which torch.chunk splits "
                f"over {n} ranks as {sizes}: rank {sizes.index(0)} would hold no token; use "
                f"a length of at least {n} whose torch.chunk pieces are all non-empty (a "
                f"multiple of {n}, or of {2 * n} for the load-balanced layout)"
            )
    return layout


def positions(plat: LocalOps, segs: tuple[tuple[int, int], ...], like: Any) -> Any:
    """The natural positions of a piece's runs as an int64 tensor on ``like``'s device."""
    if not segs:
        return plat.arange(0, 0, like)
    parts = [plat.arange(s, s + n, like) for s, n in segs]
    return parts[0] if len(parts) == 1 else plat.cat(parts, 0)


@dataclass
class CPOptions:
    """Process-wide context-parallel options (set through :mod:`hyper_shard.experimental`).

    Attributes:
        method: ``"auto"`` (the attention rule's cost model picks), ``"allgather"``,
            ``"ring"`` or ``"ulysses"``.
        load_balance: ``None`` (head-tail where ``2 n`` divides the sequence, else
            contiguous pieces, as PyTorch), True (head-tail; a length it cannot split is
            an error) or False (contiguous pieces).
    """

    method: str = "auto"
    load_balance: bool | None = None

    def layout_for(self, length: int, n: int) -> SequenceLayout:
        """The layout ``context_parallel`` gives a sequence of ``length`` on ``n`` ranks.

        Raises:
            ValueError: load balancing forced on and ``length`` not a multiple of ``2 n``.
        """
        if self.load_balance is False or n == 1:
            return PLAIN
        if self.load_balance is True:
            HEAD_TAIL.check(length, n)
            return HEAD_TAIL
        return HEAD_TAIL if length % (2 * n) == 0 else PLAIN


_OPTIONS = CPOptions()


def cp_options() -> CPOptions:
    """The process-wide :class:`CPOptions`."""
    return _OPTIONS


def output_piece(out: Any, mesh: Any, layout: SequenceLayout, causal: bool, kv_len: int) -> Any:
    """The local sequence piece of a context-parallel attention's output DTensor, whatever
    placement the attention rule left it in (a query shorter than the key and value on the
    all-gather form comes back replicated), for every platform's ``context_parallel``.

    Raises:
        NotImplementedError: ``causal`` on such a gathered form in the load-balanced
            layout (the plain causal mask there does not follow the layout), on every rank.
    """
    from ..placement import Shard

    piece = [Shard(out.ndim - 2)]
    if tuple(out.placements) != tuple(piece):
        if causal and layout.balanced:
            raise NotImplementedError(
                f"context_parallel: causal attention of a query of length {out.shape[-2]} "
                f"on keys of length {kv_len} (the load-balanced layout) ran gathered, where "
                f"the causal mask does not follow the layout; call set_load_balance(False) "
                f"before the context, or set_context_parallel_method('ulysses')"
            )
        out = out.redistribute(mesh, piece)
    return out.to_local()


def attend_pieces(
    sdpa: Any,
    view: Any,
    query: Any,
    key: Any,
    value: Any,
    args: tuple,
    kwargs: dict,
    mesh: Any,
    layout: SequenceLayout,
) -> Any:
    """Every platform's ``context_parallel`` attention on this rank's sequence pieces:
    ``view(t)`` makes a piece (local ``(..., L_i, E)``) the sequence-sharded DTensor it is,
    ``sdpa`` (the framework's ``scaled_dot_product_attention``, called as the user called
    it) runs on them under ``layout``, and the output's local piece is returned
    (:func:`output_piece`).

    Raises:
        NotImplementedError: an explicit ``attn_mask`` (as PyTorch's ``context_parallel``),
            on every rank; see :func:`output_piece`.
    """
    mask = kwargs.get("attn_mask", args[0] if args else None)
    if mask is not None:
        raise NotImplementedError(
            "context_parallel: scaled_dot_product_attention with an explicit attn_mask "
            "on sequence pieces is not supported (as PyTorch's context_parallel); use "
            "is_causal=True, or call it outside the context"
        )
    dq, dk, dv = view(query), view(key), view(value)
    with using_layout(layout):
        out = sdpa(dq, dk, dv, *args, **kwargs)
    causal = bool(kwargs.get("is_causal", args[2] if len(args) > 2 else False))
    return output_piece(out, mesh, layout, causal, dk.shape[-2])
