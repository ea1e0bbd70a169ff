"""Ring attention: ``scaled_dot_product_attention`` on query, key and value all sharded
along the sequence over one mesh dim, holding one key/value piece at a time.

Forward, on rank ``c`` of ``n`` (its query rows fixed): step ``i = 0 .. n-1`` attends its
query to the key/value piece of rank ``c - i`` while that piece travels on to rank
``c + 1`` and the next one arrives from ``c - 1`` (a ring shift,
:func:`hyper_shard.platform.compose.shift_start`: isend/irecv in flight during the
block's compute where the platform is asynchronous); each block's output is merged into
the running one with its log-sum-exp (online softmax,
:mod:`hyper_shard.kernels.attention_block`). Only ``q, k, v`` (the inputs), the output and
the log-sum-exp are kept for backward.

Backward recomputes each block from the saved log-sum-exp: the key/value pieces go round
the ring again, and with each piece travels the gradient of that piece accumulated by the
ranks it has visited (its own rank's contribution first); after ``n`` hops every piece's
gradient is back at its owner. Per rank and direction: ``n - 1`` shifts of one key/value
piece forward, ``n - 1`` key/value and ``n`` gradient shifts backward.

Causal masks follow the sequence layout (:mod:`hyper_shard.kernels.attention_layout`):
a rank's piece is one run of positions (plain) or two (head-tail); a run of keys is
entirely visible to a run of queries, invisible (skipped: no compute), or the same
positions (the causal diagonal), so no explicit mask is built. Uneven pieces (plain
layout, ``torch.chunk`` sizes) travel padded to the largest.

Memory: besides its inputs the kernel holds the piece it computes on and the one in
flight (two pieces; the all-gather form holds all ``n``). :func:`record_memory` lets a
test read what the kernel holds at each step.

Framework-neutral: local math through :mod:`.attention_block`, communication through
:mod:`hyper_shard.platform.compose`, one autograd node through
``plat.custom_autograd_n``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..dispatch.op import Binder
from ..platform import compose
from . import numel
from .attention_block import block_backward, block_forward, merge
from .attention_layout import SequenceLayout, current_layout

if TYPE_CHECKING:
    from ..platform.base import Runtime

__all__ = ["RingAttention", "record_memory", "block_plan"]

#: (phase, step, bytes) records while :func:`record_memory` is open (else None)
_PROBE: list[tuple[str, int, int]] | None = None


@contextmanager
def record_memory() -> Iterator[list[tuple[str, int, int]]]:
    """Record, for every ring step of every ring attention call in the block, the bytes of
    key/value data (and key/value gradients, in backward) the kernel holds beyond its
    inputs: ``("forward" | "backward", step, bytes)``; plus ``("saved", 0, bytes)``: the
    key/value bytes kept for backward. A debugging aid (tests measure memory with it)."""
    global _PROBE
    prev, _PROBE = _PROBE, []
    try:
        yield _PROBE
    finally:
        _PROBE = prev


def _nbytes(plat: Any, t: Any) -> int:
    """Bytes of a local tensor (its platform's tensor metadata: the probe runs only in
    tests, on a whole Platform)."""
    return numel(plat, t) * int(plat.tensor_meta(t).itemsize)


def block_plan(
    q_segs: Sequence[tuple[int, int]], kv_segs: Sequence[tuple[int, int]], causal: bool
) -> list[tuple[int, int, int, int, bool]]:
    """The attention calls between a query piece and a key/value piece, as
    ``(query row offset, rows, key column offset, columns, causal diagonal)``: per query
    run, each maximal run of adjacent entirely visible key runs is one call, a key run at
    the query run's own positions is one causal call, invisible key runs are skipped.

    Raises:
        ValueError: a key run partly visible but not the diagonal (the layouts never
            produce one; a causal query and key of different lengths).
    """
    calls: list[tuple[int, int, int, int, bool]] = []
    ro = 0
    for qs, ql in q_segs:
        co = 0
        run: list[int] = []  # [col offset, cols] of the pending visible run
        for ks, kl in kv_segs:
            if not causal or ks + kl - 1 <= qs:
                if run and run[0] + run[1] == co:
                    run[1] += kl
                else:
                    if run:
                        calls.append((ro, ql, run[0], run[1], False))
                    run = [co, kl]
            elif ks > qs + ql - 1:
                pass
            elif ks == qs and kl == ql:
                if run:
                    calls.append((ro, ql, run[0], run[1], False))
                    run = []
                calls.append((ro, ql, co, kl, True))
            else:
                raise ValueError(
                    f"ring attention: causal query positions [{qs}, {qs + ql}) and key "
                    f"positions [{ks}, {ks + kl}) overlap without coinciding; causal ring "
                    f"attention needs the query and key laid out alike (same length)"
                )
            co += kl
        if run:
            calls.append((ro, ql, run[0], run[1], False))
        ro += ql
    return [c for c in calls if c[1] and c[3]]


def shift_route(plat: Any) -> str:
    """How this kernel's key/value shift runs on ``plat`` (``"send_recv"`` or
    ``"all_gather"``: :func:`hyper_shard.platform.compose.shift_route`), for the rule's
    cost model, which must not import a platform."""
    return compose.shift_route(plat)


class RingAttention:
    """The local kernel of ring attention (see the module docstring); called like
    ``scaled_dot_product_attention`` with the local pieces (``attn_mask=None``,
    ``dropout_p=0``).

    Args:
        binder: the call's binder (canonical argument names).
        plat: the Platform.
        group: the process group of the sequence mesh dim.
        n: its size; coord: this rank's coordinate on it.
        q_len, kv_len: the global sequence lengths of query and key/value.
    """

    __slots__ = ("binder", "plat", "group", "n", "coord", "q_len", "kv_len")

    def __init__(
        self, binder: Binder, plat: Runtime, group: Any, n: int, coord: int, q_len: int, kv_len: int
    ) -> None:
        self.binder, self.plat, self.group = binder, plat, group
        self.n, self.coord, self.q_len, self.kv_len = n, coord, q_len, kv_len

    def __repr__(self) -> str:
        return f"RingAttention(ranks={self.n}, query {self.q_len}, key/value {self.kv_len})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b, plat = self.binder, self.plat
        q, k, v = (b.get(args, kwargs, r) for r in ("query", "key", "value"))
        causal = bool(b.get(args, kwargs, "is_causal", False))
        scale = b.get(args, kwargs, "scale")
        scale = 1.0 / math.sqrt(plat.shape(q)[-1]) if scale is None else float(scale)
        layout = current_layout()
        layout.check(self.q_len, self.n, "query")
        layout.check(self.kv_len, self.n, "key/value")
        run = _Run(self, layout, causal, scale)
        return plat.custom_autograd_n(run.forward, run.backward, (q, k, v))


class _Run:
    """One call: the geometry, the forward and the backward (which keeps the forward's
    output and log-sum-exp)."""

    def __init__(
        self,
        ring: RingAttention,
        layout: SequenceLayout,
        causal: bool,
        scale: float,
    ) -> None:
        self.ring, self.causal, self.scale = ring, causal, scale
        n, c = ring.n, ring.coord
        self.q_segs = layout.segments(ring.q_len, n, c)
        self.kv_segs = [layout.segments(ring.kv_len, n, r) for r in range(n)]
        self.kv_rows = [sum(s for _, s in segs) for segs in self.kv_segs]
        self.rows = max(self.kv_rows)
        self.plans = [block_plan(self.q_segs, self.kv_segs[r], causal) for r in range(n)]
        self.saved: tuple[Any, ...] = ()
        #: a compiled region is being traced: every received piece is tied to the result
        self.traced = ring.plat.tracing()
        self.received: list[Any] = []

    # -- the pieces in transit: padded to the largest piece, key and value two messages --
    def pad(self, t: Any) -> Any:
        plat = self.ring.plat
        if plat.shape(t)[-2] == self.rows:
            return t
        return plat.pad_dim(t, len(plat.shape(t)) - 2, self.rows)

    def unpad(self, t: Any, src: int) -> Any:
        r = self.kv_rows[src]
        return t if r == self.rows else self.ring.plat.narrow(t, -2, 0, r)

    def received_pair(self, pending: tuple[Any, Any]) -> tuple[Any, Any]:
        """Wait for a shift; in a traced region keep what arrived for :meth:`tie`."""
        got = (pending[0].wait(), pending[1].wait())
        if self.traced:
            self.received.extend(got)
        return got

    def tie(self, t: Any) -> Any:
        """[Note: traced ring shifts] In a compiled region a shift is a functional
        collective, which the graph's dead-code elimination drops where its result is
        unused: the key/value piece a causal rank skips (plain layout) or the last piece
        that arrives. The ranks' graphs then hold different collectives and hang. Each
        received piece is added to ``t`` as the sum of an empty slice of it (exactly 0:
        no value changes, no NaN from an infinite entry), so every rank keeps every
        exchange."""
        plat = self.ring.plat
        for r in self.received:
            t = t + plat.sum(plat.narrow(r, -2, 0, 0))
        self.received = []
        return t

    def shift(self, pair: tuple[Any, Any], tag: int) -> tuple[Any, Any]:
        """Start sending both tensors to the next rank (tags ``tag``, ``tag + 1``)."""
        ring = self.ring
        return (
            compose.shift_start(ring.plat, pair[0], ring.group, ring.coord, ring.n, tag),
            compose.shift_start(ring.plat, pair[1], ring.group, ring.coord, ring.n, tag + 1),
        )

    # -- forward ------------------------------------------------------------------------
    def forward(self, q: Any, k: Any, v: Any) -> Any:
        ring, plat = self.ring, self.ring.plat
        n, c = ring.n, ring.coord
        accs: dict[int, Any] = {}
        cur = (k, v)
        send = (self.pad(k), self.pad(v))
        for i in range(n):
            src = (c - i) % n
            pending = self.shift(send, 0) if i < n - 1 else None
            self._probe("forward", i, send if i else (), pending)
            for ro, rows, co, cols, diag in self.plans[src]:
                blk = block_forward(
                    plat,
                    plat.narrow(q, -2, ro, rows),
                    plat.narrow(cur[0], -2, co, cols),
                    plat.narrow(cur[1], -2, co, cols),
                    diag,
                    self.scale,
                )
                accs[ro] = merge(plat, accs.get(ro), blk)
            if pending is not None:
                send = self.received_pair(pending)
                nxt = (src - 1) % n
                cur = (self.unpad(send[0], nxt), self.unpad(send[1], nxt))
        out, lse = self._assemble(q, v, accs)
        out = plat.cast(out, plat.dtype_of(q))
        if self.traced:
            out = self.tie(out)
        self.saved = (q, k, v, out, lse)
        if _PROBE is not None:
            _PROBE.append(("saved", 0, _nbytes(plat, k) + _nbytes(plat, v)))
        return out

    def _assemble(self, q: Any, v: Any, accs: dict[int, Any]) -> tuple[Any, Any]:
        plat = self.ring.plat
        outs, lses, ro = [], [], 0
        lead = plat.shape(q)[:-1]
        ev = plat.shape(v)[-1]
        for _, ql in self.q_segs:
            acc = accs.get(ro)
            if acc is None:  # a run that sees no key (no key at all)
                z = plat.full((*lead[:-1], ql), float("-inf"), q)
                acc = (plat.full((*lead[:-1], ql, ev), 0.0, z), z)
            outs.append(acc[0])
            lses.append(acc[1])
            ro += ql
        if not outs:
            z = plat.full((*lead[:-1], 0), 0.0, q)
            return plat.full((*lead[:-1], 0, ev), 0.0, q), z
        if len(outs) == 1:
            return outs[0], lses[0]
        return plat.cat(outs, -2), plat.cat(lses, -1)

    # -- backward -----------------------------------------------------------------------
    def backward(self, dout: Any) -> tuple[Any, Any, Any]:
        ring, plat = self.ring, self.ring.plat
        n, c = ring.n, ring.coord
        q, k, v, out, lse = self.saved  # kept: a retained graph runs backward again
        dout = plat.cast(dout, plat.dtype_of(q))
        acc_dtype = plat.dtype_of(lse)
        dqs: dict[int, Any] = {}
        cur = (k, v)
        send = (self.pad(k), self.pad(v))
        grads = None  # the gradient exchange in flight
        for i in range(n):
            src = (c - i) % n
            pending = self.shift(send, 0) if i < n - 1 else None
            dk, dv = self._block_grads(src, q, dout, out, lse, cur, dqs, acc_dtype)
            mine = (self.pad(dk), self.pad(dv))
            if grads is not None:
                mine = (grads[0].wait() + mine[0], grads[1].wait() + mine[1])
            grads = self.shift(mine, 2) if n > 1 else (compose.Done(mine[0]), compose.Done(mine[1]))
            self._probe("backward", i, send if i else (), pending, mine, grads)
            if pending is not None:
                send = self.received_pair(pending)
                nxt = (src - 1) % n
                cur = (self.unpad(send[0], nxt), self.unpad(send[1], nxt))
        assert grads is not None
        dk, dv = self.unpad(grads[0].wait(), c), self.unpad(grads[1].wait(), c)
        dq = self._assemble_dq(q, dqs)
        if self.traced:
            dq = self.tie(dq)
        return (
            plat.cast(dq, plat.dtype_of(q)),
            plat.cast(dk, plat.dtype_of(k)),
            plat.cast(dv, plat.dtype_of(v)),
        )

    def _block_grads(
        self,
        src: int,
        q: Any,
        dout: Any,
        out: Any,
        lse: Any,
        cur: tuple[Any, Any],
        dqs: dict[int, Any],
        acc_dtype: Any,
    ) -> tuple[Any, Any]:
        """This rank's gradient of key/value piece ``src`` (adding the query's to ``dqs``)."""
        plat = self.ring.plat
        dk_piece, dv_piece = None, None
        rows = self.kv_rows[src]
        for ro, qr, co, cols, diag in self.plans[src]:
            dq_c, dk_c, dv_c = block_backward(
                plat,
                plat.narrow(dout, -2, ro, qr),
                plat.narrow(q, -2, ro, qr),
                plat.narrow(cur[0], -2, co, cols),
                plat.narrow(cur[1], -2, co, cols),
                plat.narrow(out, -2, ro, qr),
                plat.narrow(lse, -1, ro, qr),
                diag,
                self.scale,
            )
            dq_c = plat.cast(dq_c, acc_dtype)
            dqs[ro] = dq_c if ro not in dqs else dqs[ro] + dq_c
            ek = plat.embed(plat.cast(dk_c, acc_dtype), len(plat.shape(dk_c)) - 2, co, rows)
            ev = plat.embed(plat.cast(dv_c, acc_dtype), len(plat.shape(dv_c)) - 2, co, rows)
            dk_piece = ek if dk_piece is None else dk_piece + ek
            dv_piece = ev if dv_piece is None else dv_piece + ev
        if dk_piece is None or dv_piece is None:  # nothing of this piece is visible here
            return (
                plat.cast(plat.zeros_like(cur[0]), acc_dtype),
                plat.cast(plat.zeros_like(cur[1]), acc_dtype),
            )
        return dk_piece, dv_piece

    def _assemble_dq(self, q: Any, dqs: dict[int, Any]) -> Any:
        plat = self.ring.plat
        parts, ro = [], 0
        for _, ql in self.q_segs:
            d = dqs.get(ro)
            parts.append(d if d is not None else plat.zeros_like(plat.narrow(q, -2, ro, ql)))
            ro += ql
        if not parts:
            return plat.zeros_like(q)
        return parts[0] if len(parts) == 1 else plat.cat(parts, -2)

    def _probe(self, phase: str, step: int, *held: Any) -> None:
        """Record the key/value bytes held beyond the inputs: the received pieces computed
        on, the exchanges in flight (their receive buffers) and the gradients sent."""
        if _PROBE is None:
            return
        plat = self.ring.plat
        total = 0
        for group in held:
            for h in group or ():
                t = getattr(h, "recv", None)
                if t is None and hasattr(h, "value"):
                    t = h.value
                if t is None and plat.is_tensor(h):
                    t = h
                if t is not None:
                    total += _nbytes(plat, t)
        _PROBE.append((phase, step, total))
