"""The context-parallel cost model (hyper_shard/rules/attention_cp.py), in one process: the
per-rank seconds of ring and all-to-all attention against the all-gather form's (the
planner's price of gathering key and value, and of the backward reduce-scatter), with the
default alpha-beta constants. Checked against the numbers written out by hand from the
module's table, and for the choices they imply: overlap makes the ring pay latency only;
without it the all-gather form wins on 2 ranks and the all-to-all form on 4 large ones."""

from __future__ import annotations

import pytest

from hyper_shard.redistribute.cost import DEFAULT_COST_MODEL as CM
from hyper_shard.rules.attention_cp import FLOP_SECONDS, cp_costs

A, B, P = CM.alpha, CM.beta, CM.step_penalty


def _allgather(n: int, kv_bytes: int) -> float:
    """Forward: all-gather of key and value (each ``kv_bytes / 2`` per rank); backward the
    same bytes reduce-scattered (priced as the forward, as the rule does)."""
    one = P + (n - 1) * A + (n - 1) * (kv_bytes // 2) * B
    return 2 * 2 * one


def _costs(n: int, kv: int, flops: float, async_p2p: bool) -> dict[str, float]:
    return cp_costs(
        CM, 0, n, kv // 2, kv, kv // 2, flops, async_p2p=async_p2p, shift_by="send_recv",
        ulysses_kv_bytes=kv,
    )  # fmt: skip


def test_ring_by_hand():
    n, kv = 4, 1 << 20
    shift = P + A + kv * B
    c = _costs(n, kv, 0.0, async_p2p=False)
    assert c["ring"] == pytest.approx((n - 1) * shift + (n - 1) * 2 * shift + shift)
    # with overlap and a block's compute longer than a shift: only latency, plus the last
    # gradient hop
    flops = 10 * shift / FLOP_SECONDS
    c = _costs(n, kv, flops, async_p2p=True)
    assert c["ring"] == pytest.approx((n - 1) * A + (n - 1) * A + shift)


def test_ulysses_by_hand():
    n, kv = 4, 1 << 20
    q = kv // 2
    a2a = P + (n - 1) * A + (n - 1) / n * q * B  # every tensor here is q bytes
    assert _costs(n, kv, 0.0, False)["ulysses"] == pytest.approx(2 * 4 * a2a)
    gathered = cp_costs(
        CM, 0, n, q, kv, q, 0.0, async_p2p=False, shift_by="all_gather", ulysses_kv_bytes=None
    )
    assert "ulysses" not in gathered  # heads that do not split: no all-to-all form
    assert gathered["ring"] == pytest.approx(
        (3 * n - 2) * (P + (n - 1) * (A + kv * B))
    )  # each shift an all-gather


@pytest.mark.parametrize("n", [2, 4, 8])
def test_choices(n):
    big, small = 8 << 20, 64
    flops = 1e12  # a long block: every shift hidden
    for kv in (big, small):
        asyn = _costs(n, kv, flops, async_p2p=True)
        sync = _costs(n, kv, flops, async_p2p=False)
        ag = _allgather(n, kv)
        if kv == big:  # overlapped ring beats gathering large pieces; unhidden, it moves
            assert asyn["ring"] < ag  # more bytes (3n-2 pieces against 2n-2)
            assert sync["ring"] > ag
        if n >= 4 and kv == big:  # all-to-all: (n-1)/n of a piece per tensor, not n-1 pieces
            assert sync["ulysses"] < ag
        if n == 2:
            assert sync["ulysses"] >= ag  # the same bytes, twice the latencies
