"""Context parallelism's neutral pieces on thread-simulated ranks (the sim platform,
tests/fake_platform), against plain torch on the whole tensors:

* the sequence layouts (plain ``torch.chunk`` pieces, head-tail load balancing): every
  position once, the balanced causal work, the permutation and its inverse;
* the block plan of a query piece against a key/value piece (visible, skipped, diagonal);
* a block's attention with its log-sum-exp and the online-softmax merge (the math form,
  which MindSpore runs), forward and backward, grouped-query heads included;
* the ring attention kernel on 2, 3 and 4 ranks — causal or not, plain or head-tail,
  even and uneven pieces, grouped-query heads, a platform with native send/recv and one
  that shifts by all-gather — forward and the query/key/value gradients equal
  ``torch.nn.functional.scaled_dot_product_attention`` on the laid-out sequence;
* the all-to-all (Ulysses) kernel the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hyper_shard.dispatch.op import Binder
from hyper_shard.kernels.attention_alltoall import AllToAllAttention
from hyper_shard.kernels.attention_block import block_backward, block_forward, merge
from hyper_shard.kernels.attention_layout import (
    HEAD_TAIL,
    PLAIN,
    CPOptions,
    SequenceLayout,
    using_layout,
)
from hyper_shard.kernels.ring_attention import RingAttention, block_plan, record_memory
from hyper_shard.redistribute.cost import COLLECTIVES
from tests.fake_platform import SimPlatform, run_ranks, sim_mesh

SDPA = Binder(
    ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
)


class CPSim(SimPlatform):
    """The sim platform plus the local math the attention kernels use (torch ops; no fused
    attention, so the kernels compose the math form)."""

    def unsqueeze(self, t: Any, dim: int) -> Any:
        return t.unsqueeze(dim)

    def squeeze(self, t: Any, dim: int) -> Any:
        return t.squeeze(dim)

    def transpose(self, t: Any, a: int, b: int) -> Any:
        return t.transpose(a, b)

    def reshape(self, t: Any, shape: Sequence[int]) -> Any:
        return t.reshape(tuple(shape))

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return torch.where(c, a, b)

    def isfinite(self, t: Any) -> Any:
        return torch.isfinite(t)

    def full(self, shape: Sequence[int], value: Any, like: Any, dtype: Any = None) -> Any:
        return torch.full(tuple(shape), value, dtype=dtype or like.dtype)

    def arange(self, start: int, end: int, like: Any) -> Any:
        return torch.arange(start, end)

    def stack(self, ts: Sequence[Any], dim: int) -> Any:
        return torch.stack(list(ts), dim)

    def select(self, t: Any, dim: int, index: int) -> Any:
        return t.select(dim, index)

    def repeat_interleave(self, t: Any, repeats: int, dim: int) -> Any:
        return t.repeat_interleave(repeats, dim)


P2P = CPSim(native=COLLECTIVES | {"send_recv"})
GATHER_ONLY = CPSim(native=frozenset({"all_gather", "all_reduce"}))


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------------- layouts
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [0, 1, 5, 8, 16, 24])
def test_layout_covers_every_position_once(n, length):
    for layout in (PLAIN, HEAD_TAIL):
        if layout is HEAD_TAIL and length % (2 * n):
            with pytest.raises(ValueError, match=f"multiple of {2 * n}"):
                layout.segments(length, n, 0)
            continue
        order = layout.order(length, n)
        assert sorted(order) == list(range(length))
        assert [order[i] for i in layout.inverse(length, n)] == list(range(length))
        sizes = layout.sizes(length, n)
        assert (
            sizes
            == [len(c) for c in torch.arange(length).chunk(n)]
            + [0] * (n - len(torch.arange(length).chunk(n)))
            or length == 0
        )
        for c in range(n):  # a rank's runs are its chunk of the laid-out order
            runs = [p for s, k in layout.segments(length, n, c) for p in range(s, s + k)]
            start = sum(sizes[:c])
            assert runs == order[start : start + sizes[c]]


def test_head_tail_balances_causal_work():
    n, length = 4, 32
    for layout, balanced in ((PLAIN, False), (HEAD_TAIL, True)):
        work = [
            sum(p + 1 for s, k in layout.segments(length, n, c) for p in range(s, s + k))
            for c in range(n)
        ]
        assert (len(set(work)) == 1) is balanced, work
    assert HEAD_TAIL.order(8, 2) == [0, 1, 6, 7, 2, 3, 4, 5]  # PyTorch's head-tail order


def test_options_choose_the_layout_as_pytorch():
    assert CPOptions().layout_for(16, 4) == HEAD_TAIL
    assert CPOptions().layout_for(12, 4) == PLAIN  # 2n does not divide: contiguous pieces
    assert CPOptions(load_balance=False).layout_for(16, 4) == PLAIN
    with pytest.raises(ValueError, match="multiple of 8"):
        CPOptions(load_balance=True).layout_for(12, 4)
    with pytest.raises(ValueError, match="'plain' or 'head_tail'"):
        SequenceLayout("zigzag")


def test_block_plan():
    # head-tail on 2 ranks, chunks of 2: rank 0 holds [0,2) + [6,8), rank 1 [2,4) + [4,6)
    r0, r1 = HEAD_TAIL.segments(8, 2, 0), HEAD_TAIL.segments(8, 2, 1)
    assert block_plan(r0, r0, True) == [(0, 2, 0, 2, True), (2, 2, 0, 2, False), (2, 2, 2, 2, True)]
    assert block_plan(r0, r1, True) == [(2, 2, 0, 4, False)]  # the tail sees both, merged
    assert block_plan(r1, r0, True) == [(0, 2, 0, 2, False), (2, 2, 0, 2, False)]
    assert block_plan(r0, r1, False) == [(0, 2, 0, 4, False), (2, 2, 0, 4, False)]
    with pytest.raises(ValueError, match="overlap without coinciding"):
        block_plan(((0, 4),), ((2, 4),), True)


# ---------------------------------------------------------------------- blocks and merge
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (3, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_blocks_merge_to_attention(hq, hkv, causal):
    plat = P2P
    q = _randn(2, hq, 6, 4, seed=0).requires_grad_()
    k = _randn(2, hkv, 6, 4, seed=1).requires_grad_()
    v = _randn(2, hkv, 6, 3, seed=2).requires_grad_()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    g = _randn(*ref.shape, seed=3)
    ref.backward(g)
    scale = 1 / math.sqrt(4)
    # keys [0, 2) are visible to every row of query rows [2, 6): a full block; [2, 6)
    # against itself: the diagonal (causal) or full
    with torch.no_grad():
        qa, qb = q[..., :2, :], q[..., 2:, :]
        top = block_forward(plat, qa, k[..., :2, :], v[..., :2, :], causal, scale)
        if not causal:
            top = merge(
                plat, top, block_forward(plat, qa, k[..., 2:, :], v[..., 2:, :], False, scale)
            )
        bot = block_forward(plat, qb, k[..., :2, :], v[..., :2, :], False, scale)
        bot = merge(plat, bot, block_forward(plat, qb, k[..., 2:, :], v[..., 2:, :], causal, scale))
        out = torch.cat([top[0], bot[0]], -2)
        lse = torch.cat([top[1], bot[1]], -1)
        torch.testing.assert_close(out, ref.detach())
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        calls = [(0, 2, 0, 2, causal), (2, 4, 0, 2, False), (2, 4, 2, 4, causal)]
        if not causal:
            calls.append((0, 2, 2, 4, False))
        for r0, rn, c0, cn, diag in calls:
            a, b, c = block_backward(
                plat, g[..., r0 : r0 + rn, :], q[..., r0 : r0 + rn, :], k[..., c0 : c0 + cn, :],
                v[..., c0 : c0 + cn, :], out[..., r0 : r0 + rn, :], lse[..., r0 : r0 + rn],
                diag, scale,
            )  # fmt: skip
            dq[..., r0 : r0 + rn, :] += a
            dk[..., c0 : c0 + cn, :] += b
            dv[..., c0 : c0 + cn, :] += c
    torch.testing.assert_close(dq, q.grad)
    torch.testing.assert_close(dk, k.grad)
    torch.testing.assert_close(dv, v.grad)


def test_merge_keeps_rows_that_see_nothing():
    o = torch.ones(1, 2, 3)
    empty = (torch.zeros(1, 2, 3), torch.full((1, 2), float("-inf")))
    out, lse = merge(P2P, empty, empty)
    assert torch.equal(out, torch.zeros(1, 2, 3)) and torch.isneginf(lse).all()
    out, lse = merge(P2P, empty, (o, torch.zeros(1, 2)))
    assert torch.equal(out, o) and torch.equal(lse, torch.zeros(1, 2))


# ---------------------------------------------------------------------- the kernels
def _case(n, length, hq, hkv, seed=0):
    q = _randn(2, hq, length, 4, seed=seed)
    k = _randn(2, hkv, length, 4, seed=seed + 1)
    v = _randn(2, hkv, length, 3, seed=seed + 2)
    return q, k, v


def _run_kernel(make, plat, n, layout, q, k, v, causal, gqa):
    """Every rank runs the kernel on its pieces of the laid-out q/k/v; returns each rank's
    (output piece, gradients of its pieces) for a fixed upstream gradient."""
    length = q.shape[-2]
    order = torch.tensor(layout.order(length, n), dtype=torch.long)
    lq, lk, lv = (t.index_select(-2, order) for t in (q, k, v))
    sizes = layout.sizes(length, n)
    g = _randn(*q.shape[:-1], v.shape[-1], seed=9)

    def rank(r):
        mesh = sim_mesh((n,), platform=plat)
        group = mesh._group(0)
        start = sum(sizes[:r])
        pieces = [t.narrow(-2, start, sizes[r]).clone().requires_grad_() for t in (lq, lk, lv)]
        kern = make(plat, group, n, r, length)
        with using_layout(layout):
            out = kern(*pieces, is_causal=causal, enable_gqa=gqa)
        out.backward(g.index_select(-2, order).narrow(-2, start, sizes[r]))
        return out.detach(), [p.grad for p in pieces]

    return run_ranks(n, rank), order, g


def _check_kernel(make, plat, n, layout, q, k, v, causal):
    gqa = q.shape[1] != k.shape[1]
    results, order, g = _run_kernel(make, plat, n, layout, q, k, v, causal, gqa)
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=causal, enable_gqa=gqa)
    ref.backward(g)
    inv = torch.tensor(layout.inverse(q.shape[-2], n), dtype=torch.long)
    out = torch.cat([r[0] for r in results], -2).index_select(-2, inv)
    torch.testing.assert_close(out, ref.detach())
    for i, t in enumerate(refs):
        grad = torch.cat([r[1][i] for r in results], -2).index_select(-2, inv)
        torch.testing.assert_close(grad, t.grad)


def _ring(plat, group, n, r, length):
    return RingAttention(SDPA, plat, group, n, r, length, length)


def _alltoall(plat, group, n, r, length):
    return AllToAllAttention(
        F.scaled_dot_product_attention, SDPA, plat, group, n, r, length, length
    )


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("balanced", [False, True])
def test_ring_kernel(n, causal, balanced):
    layout = HEAD_TAIL if balanced else PLAIN
    for length, hq, hkv in ((4 * n, 2, 2), (4 * n, 4, 2), (2 * n + 1, 2, 1)):
        if balanced and length % (2 * n):
            continue
        _check_kernel(_ring, P2P, n, layout, *_case(n, length, hq, hkv), causal)


def test_ring_kernel_shifting_by_all_gather():
    _check_kernel(_ring, GATHER_ONLY, 3, HEAD_TAIL, *_case(3, 12, 2, 2), True)
    _check_kernel(_ring, GATHER_ONLY, 2, PLAIN, *_case(2, 7, 2, 2), False)


def test_ring_kernel_holds_two_pieces():
    n, length = 4, 16
    q, k, v = _case(n, length, 2, 2)
    with record_memory() as rec:
        _run_kernel(_ring, P2P, n, PLAIN, q, k, v, True, False)
    piece = (k.numel() + v.numel()) // n * k.element_size()
    fwd = [b for phase, _, b in rec if phase == "forward"]
    bwd = [b for phase, _, b in rec if phase == "backward"]
    saved = [b for phase, _, b in rec if phase == "saved"]
    assert len(fwd) == n * n and max(fwd) == 2 * piece  # the one computed on + one in flight
    assert max(bwd) == 4 * piece  # key/value and their gradients: current + in flight
    assert saved == [piece] * n  # only the rank's own piece (its inputs) is kept


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("balanced", [False, True])
def test_alltoall_kernel(n, balanced):
    layout = HEAD_TAIL if balanced else PLAIN
    for causal in (False, True):
        _check_kernel(_alltoall, P2P, n, layout, *_case(n, 4 * n, 4, 4), causal)
    # grouped-query heads: key/value heads split over n (4/2) or repeated (1 head)
    _check_kernel(_alltoall, P2P, n, layout, *_case(n, 4 * n, 4, 4 // n * 1), True)
    _check_kernel(_alltoall, P2P, n, layout, *_case(n, 4 * n, 4, 1), True)
    if not balanced:  # uneven pieces
        _check_kernel(_alltoall, GATHER_ONLY, n, layout, *_case(n, 4 * n + 1, 4, 4), True)
