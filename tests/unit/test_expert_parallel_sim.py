"""Expert parallelism's routing, permutation, token exchange and combine
(hyper_shard/kernels/moe.py) and the variable all-to-all (platform/compose.py
``all_to_all_v``) on ranks simulated by threads (the sim platform of tests/fake_platform),
against a plain torch mixture of experts on the global tokens: the output and every
gradient (tokens, router weights, every expert), on 2 and 4 ranks, top-1 and top-2, a
router biased so one expert gets most tokens and one none, every route of the exchange
(native, padded all-to-all, send/recv rounds, all-gather), the expert x tensor split on
a 2 x 2 world, and a router index out of range (every rank raises, none hangs).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hyper_shard.kernels import moe
from hyper_shard.platform import compose
from tests.fake_platform import SimPlatform, run_ranks
from tests.fake_platform.exchange import SimGroup

ALL = frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_to_all_v"})
ROUTES = {
    "native": ALL,
    "all_to_all": frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all"}),
    "send_recv": frozenset({"all_gather", "all_reduce", "send_recv"}),
    "all_gather": frozenset({"all_gather", "all_reduce"}),
}


class MoESim(SimPlatform):
    """The sim platform plus the local primitives and point-to-point exchanges the MoE
    kernel uses (torch one-liners; collectives through the thread exchange)."""

    def __init__(self, native: frozenset[str]) -> None:
        super().__init__(native)
        self.ran: list[str] = []

    def reshape(self, t: Any, shape: Sequence[int]) -> Any:
        return t.reshape(tuple(shape))

    def unsqueeze(self, t: Any, dim: int) -> Any:
        return t.unsqueeze(dim)

    def transpose(self, t: Any, a: int, b: int) -> Any:
        return t.transpose(a, b)

    def select(self, t: Any, dim: int, i: int) -> Any:
        return t.select(dim, i)

    def stack(self, ts: Sequence[Any], dim: int) -> Any:
        return torch.stack(list(ts), dim)

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def take_rows(self, t: Any, index: Any) -> Any:
        return t[index]

    def arange(self, start: int, end: int, like: Any) -> Any:
        return torch.arange(start, end)

    def full(self, shape: Sequence[int], value: Any, like: Any, dtype: Any = None) -> Any:
        return torch.full(tuple(shape), value, dtype=dtype or like.dtype)

    def argsort(self, t: Any) -> Any:
        return torch.argsort(t, stable=True)

    def tolist(self, t: Any) -> list[Any]:
        return t.tolist()  # type: ignore[no-any-return]

    def all_to_all_v(
        self, t: Any, send: Sequence[int], recv: Sequence[int], group: SimGroup
    ) -> Any:
        self.ran.append("all_to_all_v")
        every = group.exchange.gather(group, [p.clone() for p in t.detach().split(list(send))])
        got = [ps[group.coordinate] for ps in every]
        assert [g.shape[0] for g in got] == list(recv), "sizes the peers disagree on"
        return torch.cat(got)

    def all_to_all(self, pieces: Sequence[Any], group: SimGroup) -> list[Any]:
        self.ran.append("all_to_all")
        return super().all_to_all(pieces, group)

    def send_recv(self, t: Any, dst: int, like: Any, src: int, group: SimGroup) -> Any:
        assert t.shape[0] > 0 and like.shape[0] > 0, "a round sends or receives nothing"
        self.ran.append("send_recv")
        msgs = group.exchange.gather(group, (dst, t.detach().clone()))
        to, data = msgs[src]
        assert to == group.coordinate and data.shape == like.shape, "mismatched pairing"
        return data.clone()


# ---------------------------------------------------------------------- the reference
def reference(x, index, weights, up, down, up_bias=None, down_bias=None):
    """Plain torch: every token through each chosen expert (SwiGLU of the packed gate/up
    projection), weighted and summed."""
    out = torch.zeros_like(x)
    for k in range(index.shape[1]):
        e = index[:, k]
        h = torch.einsum("th,toh->to", x, up[e])
        if up_bias is not None:
            h = h + up_bias[e]
        gate, val = h.chunk(2, -1)
        y = torch.einsum("ti,thi->th", F.silu(gate) * val, down[e])
        if down_bias is not None:
            y = y + down_bias[e]
        out = out + weights[:, k, None] * y
    return out


def _silu_gate(h):
    gate, val = h.chunk(2, -1)
    return F.silu(gate) * val


def _problem(world, top_k, tokens=6, experts=4, hidden=8, inter=8, biased=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world * tokens, hidden, generator=g)
    logits = torch.randn(world * tokens, experts, generator=g)
    if biased:  # expert 0 gets (almost) every first choice, the last expert none
        logits[:, 0] += 6.0
        logits[:, -1] -= 50.0
    w, index = torch.softmax(logits, -1).topk(top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    up_b = torch.randn(experts, 2 * inter, generator=g) * 0.1
    down_b = torch.randn(experts, hidden, generator=g) * 0.1
    dy = torch.randn(world * tokens, hidden, generator=g)
    return x, index, w, up, down, up_b, down_b, dy


def _ref_grads(x, index, w, up, down, up_b, down_b, dy, bias):
    leaves = [t.clone().requires_grad_() for t in (x, w, up, down, up_b, down_b)]
    xr, wr, ur, dr, ubr, dbr = leaves
    out = reference(xr, index, wr, ur, dr, ubr if bias else None, dbr if bias else None)
    (out * dy).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _run_ep(world, native, prob, bias=False):
    x, index, w, up, down, up_b, down_b, dy = prob
    E = up.shape[0]
    T = x.shape[0] // world
    L = E // world

    def rank(r):
        plat = MoESim(native)
        group = plat.new_group(list(range(world)))
        mine = slice(r * T, (r + 1) * T)
        ex = slice(r * L, (r + 1) * L)
        leaves = [
            t.clone().requires_grad_()
            for t in (x[mine], w[mine], up[ex], down[ex], up_b[ex], down_b[ex])
        ]
        xl, wl, ul, dl, ubl, dbl = leaves
        experts = moe.ExpertWeights(
            ul, dl, ubl if bias else None, dbl if bias else None, _silu_gate
        )
        out = moe.moe_forward(plat, xl, index[mine], wl, experts, E, moe.Group(group, world, r))
        (out * dy[mine]).sum().backward()
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
        return out.detach(), grads, plat.ran

    return run_ranks(world, rank)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_ep_layer_matches_one_process(world, top_k, route):
    prob = _problem(world, top_k, seed=world * 10 + top_k)
    ref_out, ref_grads = _ref_grads(*prob, bias=True)
    res = _run_ep(world, ROUTES[route], prob, bias=True)
    T = prob[0].shape[0] // world
    L = prob[3].shape[0] // world
    for r, (out, grads, ran) in enumerate(res):
        mine, ex = slice(r * T, (r + 1) * T), slice(r * L, (r + 1) * L)
        torch.testing.assert_close(out, ref_out[mine], atol=1e-5, rtol=1e-5)
        for got, full, part in zip(grads, ref_grads, (mine, mine, ex, ex, ex, ex)):
            torch.testing.assert_close(got, full[part], atol=1e-5, rtol=1e-5)
        kind = {"native": "all_to_all_v", "all_to_all": "all_to_all"}.get(route, route)
        if route != "all_gather":
            assert kind in ran, (route, ran)
        assert route == "native" or "all_to_all_v" not in ran


@pytest.mark.parametrize("world", [2, 4])
def test_imbalance_one_expert_most_one_none(world):
    """A biased router: expert 0 takes almost every token, the last expert none (its
    rank receives nothing for it; its gradient is zero), top-2 and top-1."""
    for top_k in (1, 2):
        prob = _problem(world, top_k, biased=True, seed=3)
        index = prob[1]
        counts = torch.bincount(index.flatten(), minlength=4)
        assert counts[-1] == 0 and counts[0] >= index.shape[0] - 1
        ref_out, ref_grads = _ref_grads(*prob, bias=False)
        res = _run_ep(world, ROUTES["send_recv"], prob)
        T, L = prob[0].shape[0] // world, 4 // world
        for r, (out, grads, _) in enumerate(res):
            mine, ex = slice(r * T, (r + 1) * T), slice(r * L, (r + 1) * L)
            torch.testing.assert_close(out, ref_out[mine], atol=1e-5, rtol=1e-5)
            for got, full, part in zip(grads[:4], ref_grads[:4], (mine, mine, ex, ex)):
                torch.testing.assert_close(got, full[part], atol=1e-5, rtol=1e-5)
        last = res[-1][1][2][-1]  # the last expert's gate/up gradient on the last rank
        assert torch.count_nonzero(last) == 0


def test_a_rank_with_no_tokens_at_all():
    """Rank 1 holds no tokens: it still takes part in both exchanges and its experts
    still process the other ranks' tokens."""
    prob = list(_problem(2, 2, seed=5))
    T = prob[0].shape[0] // 2
    x, index, w, _, _, _, _, dy = prob
    keep = torch.arange(T)  # only rank 0's tokens exist: rank 1's slice is empty
    prob[0], prob[1], prob[2], prob[7] = x[keep], index[keep], w[keep], dy[keep]
    ref_out, ref_grads = _ref_grads(*prob, bias=False)

    def rank(r):
        plat = MoESim(ROUTES["send_recv"])
        group = plat.new_group([0, 1])
        mine = slice(0, T) if r == 0 else slice(0, 0)
        ex = slice(2 * r, 2 * r + 2)
        ul, dl = (prob[3][ex].clone().requires_grad_(), prob[4][ex].clone().requires_grad_())
        xl = prob[0][mine].clone().requires_grad_()
        experts = moe.ExpertWeights(ul, dl, None, None, _silu_gate)
        out = moe.moe_forward(
            plat, xl, prob[1][mine], prob[2][mine], experts, 4, moe.Group(group, 2, r)
        )
        (out * prob[7][mine]).sum().backward()
        return out.detach(), ul.grad, dl.grad

    res = run_ranks(2, rank)
    torch.testing.assert_close(res[0][0], ref_out, atol=1e-5, rtol=1e-5)
    assert res[1][0].shape == (0, 8)
    for r in range(2):
        torch.testing.assert_close(res[r][1], ref_grads[2][2 * r : 2 * r + 2], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res[r][2], ref_grads[3][2 * r : 2 * r + 2], atol=1e-5, rtol=1e-5)


def test_expert_tensor_split_on_a_2x2_world():
    """("ep", "tp") = (2, 2): experts sharded on ep, each expert's packed gate/up split
    column-wise and its down projection row-wise on tp, biases included; tokens the same
    on both tp ranks of an ep coordinate."""
    prob = _problem(2, 2, seed=7)
    ref_out, ref_grads = _ref_grads(*prob, bias=True)
    x, index, w, up, down, up_b, down_b, dy = prob
    T, L, inter = x.shape[0] // 2, 2, down.shape[2]

    def rank(r):
        e, t = divmod(r, 2)  # mesh ("ep", "tp") = (2, 2): rank = 2 * ep + tp
        plat = MoESim(ALL)
        ep_group = plat.new_group([t, 2 + t])
        tp_group = plat.new_group([2 * e, 2 * e + 1])
        mine, ex = slice(e * T, (e + 1) * T), slice(e * L, (e + 1) * L)
        half = inter // 2
        cols = [torch.arange(t * inter, (t + 1) * inter)]  # packed [gate; up] chunk t of 2I
        ul = up[ex][:, cols[0]].clone().requires_grad_()
        ubl = up_b[ex][:, cols[0]].clone().requires_grad_()
        dl = down[ex][:, :, t * half : (t + 1) * half].clone().requires_grad_()
        dbl = down_b[ex].clone().requires_grad_()
        xl, wl = x[mine].clone().requires_grad_(), w[mine].clone().requires_grad_()
        split = moe.TensorSplit(tp_group, 2, t, up_sizes=(inter, inter), mid_sizes=(half, half))
        experts = moe.ExpertWeights(ul, dl, ubl, dbl, _silu_gate)
        out = moe.moe_forward(
            plat, xl, index[mine], wl, experts, 4, moe.Group(ep_group, 2, e), split
        )
        (out * dy[mine]).sum().backward()
        return out.detach(), xl.grad, wl.grad, ul.grad, dl.grad, ubl.grad, dbl.grad

    res = run_ranks(4, rank)
    gx, gw, gu, gd, gub, gdb = ref_grads
    for r, (out, xg, wg, ug, dg, ubg, dbg) in enumerate(res):
        e, t = divmod(r, 2)
        mine, ex = slice(e * T, (e + 1) * T), slice(e * L, (e + 1) * L)
        half = inter // 2
        torch.testing.assert_close(out, ref_out[mine], atol=1e-5, rtol=1e-5)
        # the tokens are replicated over tp: each tp rank's input gradient is the whole one
        torch.testing.assert_close(xg, gx[mine], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(wg, gw[mine], atol=1e-5, rtol=1e-5)
        cols = slice(t * inter, (t + 1) * inter)
        torch.testing.assert_close(ug, gu[ex][:, cols], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ubg, gub[ex][:, cols], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            dg, gd[ex][:, :, t * half : (t + 1) * half], atol=1e-5, rtol=1e-5
        )
        # the down bias is added on tp rank 0: its gradient is there (a partial sum)
        if t == 0:
            torch.testing.assert_close(dbg, gdb[ex], atol=1e-5, rtol=1e-5)
        else:
            assert dbg is None


@pytest.mark.parametrize("world", [2, 4])
def test_a_router_index_out_of_range_raises_on_every_rank(world):
    """Only the last rank's router produces a bad index: every rank raises the same
    RoutingError (agreed in the count exchange, before any token moves); none hangs."""
    prob = _problem(world, 2, seed=11)
    x, index, w, up, down = prob[:5]
    T, L = x.shape[0] // world, up.shape[0] // world
    seen: list[Any] = [None] * world

    def rank(r):
        plat = MoESim(ROUTES["send_recv"])
        group = plat.new_group(list(range(world)))
        idx = index[r * T : (r + 1) * T].clone()
        if r == world - 1:
            idx[0, 1] = 4  # one past the last expert
            idx[2, 0] = -1
        experts = moe.ExpertWeights(
            up[r * L : (r + 1) * L], down[r * L : (r + 1) * L], None, None, _silu_gate
        )
        try:
            moe.moe_forward(
                plat,
                x[r * T : (r + 1) * T],
                idx,
                w[r * T : (r + 1) * T],
                experts,
                4,
                moe.Group(group, world, r),
            )
        except moe.RoutingError as e:
            seen[r] = str(e)
            return plat.ran
        raise AssertionError(f"rank {r} did not raise")

    ran = run_ranks(world, rank)
    for r in range(world):
        assert f"coordinate {world - 1}: 2" in seen[r] and "[0, 4)" in seen[r], seen[r]
        assert ran[r] == [], "a token moved before the error"


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_all_to_all_v_every_route(route):
    """Pieces of random sizes (zeros included) on 4 ranks: each route delivers what the
    plain transposition of the pieces gives."""
    world = 4
    rnd = random.Random(route)
    sizes = [[rnd.choice([0, 0, 1, 3, 5]) for _ in range(world)] for _ in range(world)]
    data = [torch.randn(sum(sizes[a]), 3) for a in range(world)]

    def rank(r):
        plat = MoESim(ROUTES[route])
        group = plat.new_group(list(range(world)))
        recv = [sizes[s][r] for s in range(world)]
        return compose.all_to_all_v(plat, data[r], sizes[r], recv, group, r)

    res = run_ranks(world, rank)
    for r in range(world):
        want = torch.cat([data[s].split(sizes[s])[r] for s in range(world)])
        torch.testing.assert_close(res[r], want, atol=0, rtol=0)


def test_all_to_all_v_refuses_sizes_that_do_not_add_up():
    with pytest.raises(ValueError, match="their sum"):
        compose.all_to_all_v(MoESim(ALL), torch.zeros(3, 2), [1, 1], [1, 1], None, 0)


def test_routes_in_order_of_preference():
    route = compose.route_for
    assert route(MoESim(ROUTES["native"]), "all_to_all_v") == "native"
    assert route(MoESim(ROUTES["all_to_all"]), "all_to_all_v") == "all_to_all"
    assert route(MoESim(ROUTES["send_recv"]), "all_to_all_v") == "send_recv"
    assert route(MoESim(ROUTES["all_gather"]), "all_to_all_v") == "all_gather"
