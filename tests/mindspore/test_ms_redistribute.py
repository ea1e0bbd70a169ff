"""Redistribution on MindSpore: every placement pair on a (2,) mesh (even and uneven
shapes) and a fixed random sample on a (2, 2) mesh; ``full_tensor()`` equals the source
and the gradients equal single-process MindSpore's (``ms.grad`` of the same loss on the
plain tensor).

The reduce-scatter and all-to-all steps these plans use are composed
(hyper_shard/platform/compose.py: mccl on CPU has neither kernel): reduce-scatter from
all-reduce or all-gather, all-to-all from rounds of isend/irecv.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

SHAPES = [(5, 4), (4, 6)]  # uneven and even on 2 ranks


def _x(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.RandomState(3).randn(*shape).astype(np.float32)


def _w(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.RandomState(4).randn(*shape).astype(np.float32)


def _pl(name: str):
    from hyper_shard import Partial, Replicate, Shard

    if name == "R":
        return Replicate()
    if name == "P":
        return Partial()
    if name.startswith("P"):
        return Partial(name[2:-1])
    return Shard(int(name[2:-1]))


def _run_pairs(rank: int, mesh, shape, pairs) -> list:
    """For each (src, dst): the max abs error of full_tensor() after redistribute, and of
    the gradient of sum((redistribute(x) * W)^2) (a DTensor loss) against ms.grad."""
    import mindspore as ms
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import Replicate
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests._move import move
    from tests.mindspore._ms_helpers import dt_from_numpy

    x, w = _x(shape), _w(shape)
    wt = Tensor(w)
    gref = ms.grad(lambda a: ((a * wt) ** 2).sum())(Tensor(x)).asnumpy()
    w_dt = hs.distribute_tensor(wt, mesh, [Replicate()] * mesh.ndim)
    out = []
    for src, dst in pairs:
        s_pl, d_pl = [_pl(p) for p in src], [_pl(p) for p in dst]
        d = dt_from_numpy(x, mesh, s_pl, seed=len(out))
        e = move(d, d_pl)  # a Partial target through the executor (internal-only API)
        fwd = float(np.abs(e.full_tensor().asnumpy() - x).max())
        placed = tuple(e.placements) == tuple(d_pl)

        def loss(a, d_pl=d_pl):
            return ((move(a, d_pl) * w_dt) ** 2).sum()

        val, g = value_and_grad(loss)(d)
        gerr = float(np.abs(g.full_tensor().asnumpy() - gref).max() / np.abs(gref).max())
        verr = abs(float(val.full_tensor().asnumpy()) - float(((x * w) ** 2).sum()))
        out.append((src, dst, fwd, gerr, verr, placed))
    return out


def check_pairs_1d(rank: int, world: int, shape: tuple[int, ...]) -> list:
    from tests.mindspore._ms_helpers import mesh_1d

    names = [f"S({d})" for d in range(len(shape))] + ["R", "P"]
    pairs = [((a,), (b,)) for a in names for b in names]
    return _run_pairs(rank, mesh_1d(world), shape, pairs)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_pair_1d(ms2, shape):
    res = ms2.run(check_pairs_1d, shape)
    assert res[0] == res[1]  # every rank saw the same global values
    assert len(res[0]) == 16
    for src, dst, fwd, gerr, verr, placed in res[0]:
        assert placed, (src, dst)
        assert fwd < 1e-5, (src, dst, fwd)
        assert gerr < 1e-5, (src, dst, gerr)
        assert verr < 1e-3 * max(1.0, float(((_x(shape) * _w(shape)) ** 2).sum())), (src, dst)


def _sample_2d(n: int = 14) -> list:
    names = ["S(0)", "S(1)", "R", "P"]
    states = list(itertools.product(names, repeat=2))
    rng = random.Random(7)
    pairs = [(a, b) for a in states for b in states if a != b]
    return rng.sample(pairs, n)


def check_pairs_2d(rank: int, world: int, pairs: list) -> list:
    import hyper_shard as hs

    mesh = hs.init_device_mesh("CPU", (2, 2))
    return _run_pairs(rank, mesh, (5, 6), pairs)


def test_sample_2d(ms4):
    pairs = _sample_2d()
    res = ms4.run(check_pairs_2d, pairs)
    assert all(r == res[0] for r in res)
    assert len(res[0]) == len(pairs)
    for src, dst, fwd, gerr, _verr, placed in res[0]:
        assert placed, (src, dst)
        assert fwd < 1e-5, (src, dst, fwd)
        assert gerr < 1e-5, (src, dst, gerr)


def check_composed_ring(rank: int, world: int) -> dict:
    """On a 1-D mesh of 4 (a ring: each send/recv round sends to c + k and receives from
    c - k), the moves whose steps are composed, values and gradients, and which step
    kinds ran."""
    from hyper_shard.debug import comm_counter
    from tests.mindspore._ms_helpers import mesh_1d

    mesh = mesh_1d(world)
    pairs = [
        (("S(0)",), ("S(1)",)),
        (("S(1)",), ("S(0)",)),
        (("P",), ("S(0)",)),
        (("P",), ("S(1)",)),
    ]
    with comm_counter() as counts:
        res = _run_pairs(rank, mesh, (7, 9), pairs)
    return {
        "pairs": res,
        "counts": dict(counts),
        "native": sorted(mesh.platform.native_collectives),
    }


def test_composed_collectives_on_a_ring_of_4(ms4):
    res = ms4.run(check_composed_ring)
    assert all(r["pairs"] == res[0]["pairs"] for r in res)
    assert "all_to_all" not in res[0]["native"] and "reduce_scatter" not in res[0]["native"]
    assert res[0]["counts"].get("all_to_all", 0) >= 2  # forward and backward, composed
    assert res[0]["counts"].get("reduce_scatter", 0) >= 2
    for src, dst, fwd, gerr, _verr, placed in res[0]["pairs"]:
        assert placed, (src, dst)
        assert fwd < 1e-5, (src, dst, fwd)
        assert gerr < 1e-5, (src, dst, gerr)
