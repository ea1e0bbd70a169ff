"""Redistribution on MindSpore: every placement pair on a (2,) mesh (even and uneven
shapes) and a fixed random sample on a (2, 2) mesh; ``full_tensor()`` equals the source
and the gradients equal single-process MindSpore's (``ms.grad`` of the same loss on the
plain tensor).

The reduce-scatter and all-to-all steps these plans use are composed
(hyper_shard/platform/compose.py: mccl on CPU has neither kernel): reduce-scatter from
all-reduce or all-gather, all-to-all from rounds of isend/irecv. Public bug reports on
redistribution (``report_*`` run on the ranks, each test's docstring naming its report).
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


# ---------------------------------------------------------------------- bug reports
def report_source_untouched(rank: int, world: int) -> dict:
    import hyper_shard as hs
    from hyper_shard import DTensor, Partial, Replicate, Shard
    from tests.mindspore._ms_helpers import dt_from_numpy

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    x = rs.randn(6, 4).astype(np.float32)
    s = dt_from_numpy(x, mesh, [Shard(0)])
    s2 = DTensor.from_local(s.to_local(), mesh, [Shard(0)], shape=x.shape)  # same spec
    local0 = s.to_local().asnumpy().copy()
    r = s.redistribute(mesh, [Replicate()])
    p = dt_from_numpy(x, mesh, [Partial()], seed=3)
    plocal0 = p.to_local().asnumpy().copy()
    pr = p.redistribute(mesh, [Replicate()])
    ps = p.redistribute(mesh, [Shard(1)])
    return {
        "s": (str(s.placements), np.abs(s.to_local().asnumpy() - local0).max()),
        "s2": str(s2.placements),
        "r": (str(r.placements), r.to_local().asnumpy(), x),
        "p": (str(p.placements), np.abs(p.to_local().asnumpy() - plocal0).max()),
        "p_full": (p.full_tensor().asnumpy(), x),
        "pr": (pr.to_local().asnumpy(), x),
        "ps": (str(ps.placements), ps.full_tensor().asnumpy(), x),
    }


def test_report_source_untouched(ms2):
    """mindspore-ai/hyper-parallel#764 "CC分析fully_shard/DTensor相关编码问题", item 1:
    ``from_layout.is_partial`` (a method, not called) made every redistribution reset the
    source layout's partial state and run the partial reduction even when nothing was
    Partial, corrupting DTensors that share the layout. Single-device answer: the source
    DTensor keeps its placements and local data; the result is the global value."""
    for s in ms2.run(report_source_untouched):
        assert s["s"] == ("(Shard(dim=0),)", 0.0) and s["s2"] == "(Shard(dim=0),)"
        assert s["r"][0] == "(Replicate(),)"
        np.testing.assert_allclose(s["r"][1], s["r"][2], rtol=1e-6)
        assert s["p"] == ("(Partial(sum),)", 0.0)
        for a, b in (s["p_full"], s["pr"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert s["ps"][0] == "(Shard(dim=1),)"
        np.testing.assert_allclose(s["ps"][1], s["ps"][2], rtol=1e-5, atol=1e-5)


def report_partial_to_shard(rank: int, world: int) -> dict:
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import DTensor, Partial, Shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests.mindspore._ms_helpers import dt_from_numpy

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    res = {}
    x = rs.randn(5, 6).astype(np.float32)  # 5 rows: uneven over 2 ranks
    w = rs.randn(5, 6).astype(np.float32)
    for d in (0, 1):
        p = dt_from_numpy(x, mesh, [Partial()], seed=d)
        s = p.redistribute(mesh, [Shard(d)])
        wd = hs.distribute_tensor(Tensor(w), mesh, [Shard(d)])

        def f(a, _wd=wd, _d=d):
            return (a.redistribute(mesh, [Shard(_d)]) * _wd).sum()

        _, g = value_and_grad(f, 0)(p)
        res[d] = (
            str(s.placements),
            tuple(s.to_local().shape),
            s.full_tensor().asnumpy(),
            g.full_tensor().asnumpy(),
        )
    res["x"], res["w"] = x, w
    # the other reduce ops: max and avg partials reduced onto shards
    pm = DTensor.from_local(Tensor(x - rank), mesh, [Partial("max")], shape=x.shape)
    pa = DTensor.from_local(Tensor(x * (rank + 1)), mesh, [Partial("avg")], shape=x.shape)
    res["max"] = (pm.redistribute(mesh, [Shard(0)]).full_tensor().asnumpy(), x)
    res["avg"] = (
        pa.redistribute(mesh, [Shard(1)]).full_tensor().asnumpy(),
        x * sum(range(1, world + 1)) / world,
    )
    return res


def test_report_partial_to_shard(ms2):
    """mindspore-ai/hyper-parallel#764, item 2: ``self.platform`` undefined in the
    reduce-scatter path, so every ``Partial -> Shard(d)`` redistribution crashed. Answer:
    the global sum, sharded on ``d`` (uneven rows included), gradient = the upstream
    gradient, replicated; ``Partial("max")`` / ``Partial("avg")`` reduce with their own op."""
    for rank, ps in enumerate(ms2.run(report_partial_to_shard)):
        for d in (0, 1):
            pl, _, full, grad = ps[d]
            assert pl == f"(Shard(dim={d}),)"
            np.testing.assert_allclose(full, ps["x"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(grad, ps["w"], rtol=1e-6)
        assert ps[0][1] == ((3, 6), (2, 6))[rank] and ps[1][1] == (5, 3)
        for got, want in (ps["max"], ps["avg"]):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def report_reshape_redistribute(rank: int, world: int) -> dict:
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard

    mesh = hs.init_device_mesh("CPU", (world,))
    res = {}
    x = np.random.RandomState(11).randn(4, 6).astype(np.float32)
    d = hs.distribute_tensor(Tensor(x), mesh, [Shard(0)])
    a = d.reshape(4, 2, 3)
    res["split"] = (str(a.placements), tuple(a.shape), a.full_tensor().asnumpy(),
                    x.reshape(4, 2, 3))  # fmt: skip
    b = d.reshape(24).redistribute(mesh, [Replicate()])
    res["flat"] = (tuple(b.shape), b.to_local().asnumpy(), x.reshape(24))
    d1 = hs.distribute_tensor(Tensor(x), mesh, [Shard(1)])
    c = d1.reshape(2, 12)
    res["merge"] = (tuple(c.shape), c.full_tensor().asnumpy(), x.reshape(2, 12))
    e = a.redistribute(mesh, [Shard(2)])
    res["rs"] = (str(e.placements), tuple(e.to_local().shape), e.full_tensor().asnumpy(),
                 x.reshape(4, 2, 3))  # fmt: skip
    return res


def test_report_reshape_redistribute(ms2):
    """mindspore-ai/hyper-parallel#763 "GLM4.7分析fully_shard&DTensor相关编码问题", item
    1.1 "Reshape 支持不完整": redistribution around a reshape of a sharded tensor could
    give wrong shards. Answer: reshapes that split/merge a sharded dim, then redistribute,
    equal numpy."""
    for rank, rr in enumerate(ms2.run(report_reshape_redistribute)):
        for key in ("split", "rs"):
            np.testing.assert_allclose(rr[key][2], rr[key][3], rtol=1e-6)
        assert rr["split"][:2] == ("(Shard(dim=0),)", (4, 2, 3))
        assert rr["rs"][:2] == ("(Shard(dim=2),)", ((4, 2, 2), (4, 2, 1))[rank])
        assert rr["flat"][0] == (24,)
        np.testing.assert_allclose(rr["flat"][1], rr["flat"][2], rtol=1e-6)
        assert rr["merge"][0] == (2, 12)
        np.testing.assert_allclose(rr["merge"][1], rr["merge"][2], rtol=1e-6)
