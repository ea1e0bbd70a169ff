"""The DTensor API on MindSpore (2 mccl ranks): creation, conversion, metadata, printing,
reflected operators, in-place ops, indexing, Parameters and optimizers, and the errors
for what is not supported. Each result is compared with plain MindSpore / numpy on the
same global values. Public bug reports on the API (``report_*`` run on the ranks, each
test's docstring naming its report)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

X = np.arange(20, dtype=np.float32).reshape(5, 4) / 7.0


def _try(fn) -> object:
    try:
        return fn()
    except Exception as e:  # the test asserts on the type and message
        return f"{type(e).__name__}: {e}"


def check_api(rank: int, world: int) -> dict:
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import DTensor, Partial, Replicate, Shard
    from hyper_shard.platform.mindspore.dtensor import MindSporeDTensor

    mesh = hs.init_device_mesh("CPU", (world,))
    out: dict = {}
    d = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])
    out["types"] = (isinstance(d, DTensor), isinstance(d, Tensor), type(d) is MindSporeDTensor)
    out["meta"] = (d.shape, d.size, d.numel(), len(d), d.ndim, str(d.dtype), d.placements)
    out["local"] = d.to_local().asnumpy()
    out["local_type"] = type(d.to_local()).__name__
    out["full"] = d.full_tensor().asnumpy()
    out["asnumpy"] = d.asnumpy()  # the full tensor (a collective)
    out["np.array"] = np.asarray(d)
    out["str"] = str(d)
    out["repr"] = repr(d)
    out["item"] = hs.distribute_tensor(Tensor(np.float32(2.5)), mesh, [Replicate()]).item()
    # from_local: global shape inferred from uneven shards
    loc = Tensor(X[:3] if rank == 0 else X[3:])
    f = DTensor.from_local(loc, mesh, [Shard(0)])
    out["from_local"] = (f.shape, f.full_tensor().asnumpy())
    bad = Tensor(X[:1])  # both ranks hold 1 row: not the chunk layout of 5 rows
    out["from_local_bad"] = _try(lambda: DTensor.from_local(bad, mesh, [Shard(0)], shape=(5, 4)))
    # Partial -> Replicate
    p = DTensor.from_local(Tensor(X * (rank + 1)), mesh, [Partial()], shape=X.shape)
    out["partial_full"] = p.full_tensor().asnumpy()
    # factories: random ones equal the single-device draw for the same seed
    import mindspore as ms

    ms.set_seed(5)
    r = hs.randn(6, 3, device_mesh=mesh, placements=[Shard(0)])
    ms.set_seed(5)
    from mindspore import ops

    out["randn"] = (r.full_tensor().asnumpy(), ops.randn((6, 3)).asnumpy())
    out["zeros"] = hs.zeros(5, 3, device_mesh=mesh, placements=[Shard(0)]).to_local().asnumpy()
    out["ones"] = hs.ones((5, 3), device_mesh=mesh, placements=[Shard(1)]).full_tensor().asnumpy()
    out["full_f"] = hs.full((2, 3), 1.5, device_mesh=mesh).full_tensor().asnumpy()
    # copies and iteration
    import copy

    from mindspore import Parameter

    c = copy.deepcopy(d)
    pc = copy.deepcopy(Parameter(d, name="pd"))
    out["copies"] = (
        type(c).__name__,
        str(c.placements),
        c.full_tensor().asnumpy(),
        type(pc).__name__,
        str(pc.placements),
        pc.full_tensor().asnumpy(),
    )
    out["rows"] = [r.full_tensor().asnumpy() for r in d]  # __iter__ -> d[i]
    # value_and_grad / grad with auxiliary outputs and several positions
    from hyper_shard.platform.mindspore.autograd import grad, value_and_grad

    a = hs.distribute_tensor(Tensor(X), mesh, [Shard(1)])
    b = hs.distribute_tensor(Tensor(X), mesh, [Replicate()])

    def f(u, v):
        return (u * v).sum(), u.sum()

    (val, aux), (ga, gb) = value_and_grad(f, (0, 1), has_aux=True)(a, b)
    gs, aux2 = grad(f, 0, has_aux=True)(a, b)
    out["aux"] = (
        float(val.full_tensor().asnumpy()),
        float(aux.full_tensor().asnumpy()),
        str(ga.placements),
        str(gb.placements),
        ga.full_tensor().asnumpy(),
        gb.full_tensor().asnumpy(),
        gs.full_tensor().asnumpy(),
        float(aux2[0].full_tensor().asnumpy()),
    )
    return out


def test_api(ms2):
    res = ms2.run(check_api)
    for rank, out in enumerate(res):
        assert out["types"] == (True, True, True)
        shape, size, numel, ln, ndim, dtype, pl = out["meta"]
        assert (shape, size, numel, ln, ndim) == ((5, 4), 20, 20, 5, 2)  # global
        assert dtype == "Float32" and str(pl) == "(Shard(dim=0),)"
        np.testing.assert_array_equal(out["local"], X[:3] if rank == 0 else X[3:])
        assert out["local_type"] == "Tensor"
        for k in ("full", "asnumpy", "np.array"):
            np.testing.assert_array_equal(out[k], X)
        assert out["str"] == out["repr"] and out["str"].startswith("DTensor(local_tensor=")
        assert "placements=(Shard(dim=0),)" in out["str"] and "shape=[5, 4]" in out["str"]
        assert out["item"] == 2.5
        assert out["from_local"][0] == (5, 4)
        np.testing.assert_array_equal(out["from_local"][1], X)
        assert out["from_local_bad"].startswith("ValueError") and "(1, 4)" in out["from_local_bad"]
        np.testing.assert_allclose(out["partial_full"], 3 * X, rtol=1e-6)
        np.testing.assert_array_equal(out["randn"][0], out["randn"][1])
        assert out["zeros"].shape == ((3, 3) if rank == 0 else (2, 3)) and not out["zeros"].any()
        np.testing.assert_array_equal(out["ones"], np.ones((5, 3), np.float32))
        np.testing.assert_array_equal(out["full_f"], np.full((2, 3), 1.5, np.float32))
        ct, cp, cv, pt, pp, pv = out["copies"]
        assert (ct, cp, pt, pp) == (
            "MindSporeDTensor",
            "(Shard(dim=0),)",
            "ParameterMindSporeDTensor",
            "(Shard(dim=0),)",
        )
        np.testing.assert_array_equal(cv, X)
        np.testing.assert_array_equal(pv, X)
        np.testing.assert_array_equal(np.stack(out["rows"]), X)
        val, aux, pa, pb, ga, gb, gs, aux2 = out["aux"]
        np.testing.assert_allclose([val, aux, aux2], [(X * X).sum(), X.sum(), X.sum()], rtol=1e-5)
        assert (pa, pb) == ("(Shard(dim=1),)", "(Partial(sum),)")  # the gradient contract
        for g in (ga, gb, gs):
            np.testing.assert_allclose(g, X, rtol=1e-6)  # d/du sum(u * v) = v = X


def _full(fn) -> object:
    try:
        return fn().full_tensor().asnumpy()
    except Exception as e:  # the test asserts on the type and message
        return f"{type(e).__name__}: {e}"


def _implicit(fn):
    """``fn()`` inside hyper_shard.experimental.implicit_replication(), as full numpy."""
    from hyper_shard.experimental import implicit_replication

    with implicit_replication():
        r = fn()
    return (str(r.placements), r.full_tensor().asnumpy())


def check_operators(rank: int, world: int) -> dict:
    from mindspore import Tensor, mint, ops

    import hyper_shard as hs
    from hyper_shard import Partial, Replicate, Shard

    mesh = hs.init_device_mesh("CPU", (world,))
    d = hs.distribute_tensor(Tensor(X), mesh, [Shard(1)])
    p = hs.DTensor.from_local(Tensor(X / 2), mesh, [Partial()], shape=X.shape)
    s = Tensor(np.float32(3.0))  # a 0-d plain tensor is a scalar
    out = {
        "radd": (2 + d).full_tensor().asnumpy(),
        "rsub": (2 - d).full_tensor().asnumpy(),
        "rmul": (2 * d).full_tensor().asnumpy(),
        "rdiv": (2 / (d + 1)).full_tensor().asnumpy(),
        "rpow": (2**d).full_tensor().asnumpy(),
        "t0+d": (s + d).full_tensor().asnumpy(),
        "p+1": (p + 1).full_tensor().asnumpy(),  # the scalar is added once, not per rank
        "1-p": (1 - p).full_tensor().asnumpy(),
        "p_pl": str((p * 2).placements),
        "neg": (-d).full_tensor().asnumpy(),
        "cmp": (d > 1).full_tensor().asnumpy(),
        "plain_mixed": _try(lambda: Tensor(X) + d),
        "implicit": _try(lambda: _implicit(lambda: (Tensor(X) + d) * Tensor(X[0]))),
        "rmatmul": _try(
            lambda: Tensor(X) @ hs.distribute_tensor(Tensor(X.T.copy()), mesh, [Replicate()])
        ),
    }
    e = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])
    r = e.add_(hs.distribute_tensor(Tensor(X), mesh, [Shard(0)]))
    out["add_"] = (r is e, e.full_tensor().asnumpy())
    e2 = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])
    e2 *= 3
    out["imul"] = e2.full_tensor().asnumpy()
    e3 = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])
    out["add_partial"] = e3.add_(p).full_tensor().asnumpy()  # p is reduce-scattered to S(0)
    out["getitem"] = [
        _full(lambda: d[0]),
        _full(lambda: d[1:4, ::2]),
        _full(lambda: d[None, -1]),
        _full(lambda: e[..., 2]),
        _full(lambda: p[2]),
    ]
    s_dt = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])
    s_dt[1] = 5.0
    s_dt[3:, 1] = -2.0
    out["setitem"] = _full(lambda: s_dt)
    # the legacy Tril Primitive is unbound (its diagonal is an attribute; ops.tril is bound)
    out["unregistered"] = _try(lambda: ops.Tril(1)(d))
    # DTensors inside a tuple argument of a legacy Primitive (MindSpore's C++ hands only
    # top-level DTensors to __fallback__): dispatched, never run on the local shards
    c1 = hs.distribute_tensor(Tensor(X), mesh, [Shard(1)])
    st = ops.stack((d, c1), 1)  # mixed layouts: the rule moves them to one
    out["stack"] = (type(st).__name__, str(st.placements), _full(lambda: st))
    out["legacy_stack"] = _try(lambda: ops.Stack(0)((d, d)))  # the bare Primitive: unbound
    out["addn"] = _try(lambda: ops.addn((d, d)))
    from hyper_shard.dispatch.dispatcher import config

    config.fallback = "replicate"  # gather the inputs, run the plain op, warn once
    try:
        fb = ops.Tril(1)(d)
        out["fallback"] = (
            str(fb.placements),
            fb.full_tensor().asnumpy(),
            ops.Tril(1)(Tensor(X)).asnumpy(),
        )
    finally:
        config.fallback = "error"
    out["no_kernel"] = _try(
        lambda: mint.mm(d, hs.distribute_tensor(Tensor(X.T.copy()), mesh, [Replicate()]))
    )
    out["mixed_mesh"] = _try(
        lambda: (
            d
            + hs.distribute_tensor(
                Tensor(X),
                hs.init_device_mesh("CPU", (world,), mesh_dim_names=("x",)),
                [Replicate()],
            )
        )
    )
    return out


def test_operators(ms2):
    res = ms2.run(check_operators)
    for out in res:
        np.testing.assert_allclose(out["radd"], 2 + X, rtol=1e-6)
        np.testing.assert_allclose(out["rsub"], 2 - X, rtol=1e-6)
        np.testing.assert_allclose(out["rmul"], 2 * X, rtol=1e-6)
        np.testing.assert_allclose(out["rdiv"], 2 / (X + 1), rtol=1e-6)
        np.testing.assert_allclose(out["rpow"], 2**X, rtol=1e-5)
        np.testing.assert_allclose(out["t0+d"], 3 + X, rtol=1e-6)
        np.testing.assert_allclose(out["p+1"], X + 1, rtol=1e-6)
        np.testing.assert_allclose(out["1-p"], 1 - X, rtol=1e-6, atol=1e-6)
        assert out["p_pl"] == "(Partial(sum),)"
        np.testing.assert_allclose(out["neg"], -X)
        np.testing.assert_array_equal(out["cmp"], X > 1)
        assert (
            out["plain_mixed"].startswith("ShardingError")
            and "distribute_tensor" in out["plain_mixed"]
        )
        assert not isinstance(out["implicit"], str), out["implicit"]
        assert out["implicit"][0] == "(Shard(dim=1),)"
        np.testing.assert_allclose(out["implicit"][1], (X + X) * X[0], rtol=1e-6)
        assert out["rmatmul"].startswith("ShardingError")
        assert out["add_"][0] is True
        np.testing.assert_allclose(out["add_"][1], 2 * X, rtol=1e-6)  # written in place on CPU
        np.testing.assert_allclose(out["imul"], 3 * X, rtol=1e-6)
        np.testing.assert_allclose(out["add_partial"], 2 * X, rtol=1e-6)
        for got, want in zip(
            out["getitem"],
            [X[0], X[1:4, ::2], X[None, -1], (2 * X)[..., 2], X[2]],  # e = 2X
        ):
            assert not isinstance(got, str), got
            np.testing.assert_allclose(got, want, rtol=1e-6)
        want = X.copy()
        want[1] = 5.0
        want[3:, 1] = -2.0
        assert not isinstance(out["setitem"], str), out["setitem"]
        np.testing.assert_allclose(out["setitem"], want)
        assert (
            out["unregistered"].startswith("OpNotRegisteredError")
            and "'Tril'" in out["unregistered"]
        )
        assert out["stack"][0] == "MindSporeDTensor", out["stack"]
        np.testing.assert_allclose(out["stack"][2], np.stack([X, X], 1), rtol=1e-6)
        for k, name in (("legacy_stack", "'Stack'"), ("addn", "'AddN'")):
            assert out[k].startswith("OpNotRegisteredError") and name in out[k], out[k]
        assert out["fallback"][0] == "(Replicate(),)"
        np.testing.assert_allclose(out["fallback"][1], out["fallback"][2], rtol=1e-6)
        assert out["no_kernel"].startswith("HyperShardError")
        assert "no kernel" in out["no_kernel"] and "mint.matmul" in out["no_kernel"]
        assert (
            out["mixed_mesh"].startswith("ShardingError")
            and "different meshes" in out["mixed_mesh"]
        )


def check_parameters(rank: int, world: int, opt_name: str) -> dict:
    """A mint.nn.Linear whose weight/bias are Parameter(DTensor) (Shard(0)), trained by a
    MindSpore optimizer, against the same Linear with plain parameters."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, mint, nn

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    w0 = np.random.RandomState(1).randn(4, 4).astype(np.float32) / 2
    b0 = np.random.RandomState(2).randn(4).astype(np.float32)
    opt_cls = {"SGD": nn.SGD, "Adam": nn.Adam}[opt_name]

    def make(dt: bool):
        net = mint.nn.Linear(4, 4)
        if dt:
            net.weight = Parameter(
                hs.distribute_tensor(Tensor(w0), mesh, [Shard(0)]), name="weight"
            )
            net.bias = Parameter(hs.distribute_tensor(Tensor(b0), mesh, [Replicate()]), name="bias")
        else:
            net.weight = Parameter(Tensor(w0), name="weight")
            net.bias = Parameter(Tensor(b0), name="bias")
        return net, opt_cls(net.trainable_params(), learning_rate=0.05)

    net, opt = make(True)
    xin = hs.distribute_tensor(Tensor(X), mesh, [Replicate()])
    vg = value_and_grad(lambda x: (net(x) ** 2).mean(), None, opt.parameters)
    ref_net, ref_opt = make(False)
    ref_vg = ms.value_and_grad(lambda x: (ref_net(x) ** 2).mean(), None, ref_opt.parameters)
    losses, ref_losses, gpl = [], [], None
    for _ in range(3):
        loss, grads = vg(xin)
        gpl = [str(g.placements) for g in grads]
        losses.append(float(loss.full_tensor().asnumpy()))
        opt(optimizer_grads(grads, opt.parameters))
        rl, rg = ref_vg(Tensor(X))
        ref_losses.append(float(rl.asnumpy()))
        ref_opt(rg)
    p = net.weight
    return {
        "losses": losses,
        "ref": ref_losses,
        "grad_placements": gpl,
        "param": (type(p).__name__, p.name, p.shape, str(p.placements)),
        "weight": p.full_tensor().asnumpy(),
        "ref_weight": ref_net.weight.asnumpy(),
    }


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_parameters_and_optimizers(ms2, opt_name):
    res = ms2.run(check_parameters, opt_name)
    for out in res:
        np.testing.assert_allclose(out["losses"], out["ref"], rtol=1e-5)
        assert out["losses"][2] != out["losses"][0]  # the optimizer did update
        assert out["grad_placements"] == ["(Shard(dim=0),)", "(Partial(sum),)"]
        assert out["param"] == ("ParameterMindSporeDTensor", "weight", (4, 4), "(Shard(dim=0),)")
        np.testing.assert_allclose(out["weight"], out["ref_weight"], rtol=1e-5, atol=1e-6)


def check_local_map(rank: int, world: int) -> tuple:
    from mindspore import Tensor, mint

    import hyper_shard as hs
    from hyper_shard import Partial, Replicate, Shard
    from hyper_shard.experimental import local_map
    from hyper_shard.platform.mindspore.autograd import grad

    mesh = hs.init_device_mesh("CPU", (world,))
    B = np.arange(12, dtype=np.float32).reshape(4, 3) / 5.0
    mm = local_map(
        mint.matmul,
        out_placements=[Shard(0)],
        in_placements=([Shard(0)], [Replicate()]),
        in_grad_placements=([Shard(0)], [Partial()]),
    )
    a = hs.distribute_tensor(Tensor(X), mesh, [Shard(0)])  # 5 rows: uneven
    b = hs.distribute_tensor(Tensor(B), mesh, [Replicate()])
    out = mm(a, b)
    ga, gb = grad(lambda u, v: mm(u, v).sum(), (0, 1))(a, b)  # DTensor gradients
    mismatch = _try(lambda: local_map(mint.neg, [Shard(0)], in_placements=([Shard(1)],))(a))
    from hyper_shard.debug import CommDebugMode

    with CommDebugMode() as comm:  # PyTorch's interface, on MindSpore too
        a.full_tensor()
    counts = (comm.get_total_counts(), comm.get_comm_counts()["all_gather"])
    return (
        counts,
        tuple(out.shape),
        str(out.placements),
        out.full_tensor().asnumpy(),
        ga.full_tensor().asnumpy(),
        gb.full_tensor().asnumpy(),
        mismatch,
    )


def test_local_map(ms2):
    """hyper_shard.experimental.local_map on MindSpore (as on torch, tests/dist/test_local_map.py):
    values and gradients of a local matmul equal plain numpy's."""
    B = np.arange(12, dtype=np.float32).reshape(4, 3) / 5.0
    for counts, shape, pl, full, ga, gb, mismatch in ms2.run(check_local_map):
        assert counts == (1, 1)  # full_tensor of a Shard(0) tensor: one all-gather
        assert shape == (5, 3) and pl == "(Shard(dim=0),)"
        np.testing.assert_allclose(full, X @ B, rtol=1e-5)
        np.testing.assert_allclose(ga, np.ones((5, 3), np.float32) @ B.T, rtol=1e-5)
        np.testing.assert_allclose(gb, X.T @ np.ones((5, 3), np.float32), rtol=1e-5)
        assert mismatch.startswith("ValueError") and "redistribute_inputs=True" in mismatch


# ---------------------------------------------------------------------- bug reports
def report_dim_map(rank: int, world: int) -> dict:
    from mindspore import Parameter, Tensor

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    res = {}
    w = rs.randn(2, 3, 4).astype(np.float32)
    dw = hs.distribute_tensor(Tensor(w), mesh, [Shard(2)])
    pw = Parameter(dw, name="w3")
    res["w3"] = (
        tuple(pw.shape),
        str(pw.placements),
        tuple(pw.to_local().shape),
        pw.full_tensor().asnumpy(),
        w,
    )
    mesh2 = hs.init_device_mesh("CPU", (world, 1), mesh_dim_names=("a", "b"))
    b = rs.randn(6).astype(np.float32)
    db = hs.distribute_tensor(Tensor(b), mesh2, [Shard(0), Replicate()])
    pb = Parameter(db, name="b1")
    res["b1"] = (
        tuple(pb.shape),
        str(pb.placements),
        tuple(pb.to_local().shape),
        pb.full_tensor().asnumpy(),
        b,
    )
    z = hs.zeros(5, device_mesh=mesh2, placements=[Replicate(), Shard(0)])
    res["z"] = (tuple(z.shape), tuple(z.to_local().shape))
    return res


def test_report_dim_map(ms2):
    """mindspore-ai/hyper-parallel#711 "[bug] mf联调发现，参数初始化时，dim_map[shard_dim]
    index越界": the dim map was sized by the mesh ndim instead of the tensor ndim, so a
    parameter whose ndim differs from the mesh's raised IndexError at init. Answer: a 3-D
    ``Shard(2)`` parameter on a 1-D mesh and a 1-D bias on a 2-D mesh keep their global
    shapes and values."""
    for dm in ms2.run(report_dim_map):
        assert dm["w3"][:2] == ((2, 3, 4), "(Shard(dim=2),)") and dm["w3"][2] == (2, 3, 2)
        np.testing.assert_array_equal(dm["w3"][3], dm["w3"][4])
        assert dm["b1"][:3] == ((6,), "(Shard(dim=0), Replicate())", (3,))
        np.testing.assert_array_equal(dm["b1"][3], dm["b1"][4])
        assert dm["z"] == ((5,), (5,))  # Shard(0) over the size-1 mesh dim: all of it


def report_chained_matmul(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, mint

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    x = rs.randn(4, 6).astype(np.float32)
    a = rs.randn(3, 6).astype(np.float32)
    bm = rs.randn(5, 3).astype(np.float32)
    wt = rs.randn(4, 5).astype(np.float32)

    def ref_f(x_, a_, b_):
        return (mint.matmul(mint.matmul(x_, a_.T), b_.T) * Tensor(wt)).sum()

    ref_grads = ms.grad(ref_f, (0, 1, 2))(Tensor(x), Tensor(a), Tensor(bm))
    dx = hs.distribute_tensor(Tensor(x), mesh, [Shard(-1)])
    da = hs.distribute_tensor(Tensor(a), mesh, [Shard(1)])
    db = hs.distribute_tensor(Tensor(bm), mesh, [Replicate()])
    dwt = hs.distribute_tensor(Tensor(wt), mesh, [Replicate()])
    tmp = mint.matmul(dx, da.T)
    o = mint.matmul(tmp, db.T)

    def f(x_, a_, b_):
        return (mint.matmul(mint.matmul(x_, a_.T), b_.T) * dwt).sum()

    _, grads = value_and_grad(f, (0, 1, 2))(dx, da, db)
    return {
        "tmp": str(tmp.placements),
        "o": (str(o.placements), o.full_tensor().asnumpy(), x @ a.T @ bm.T),
        "grads": [g.full_tensor().asnumpy() for g in grads],
        "ref": [g.asnumpy() for g in ref_grads],
    }


def test_report_chained_matmul(ms2):
    """mindspore-ai/hyper-parallel#685 "[Bug] 分布式 MatMul 的 layout 推断不传播输入的
    Partial 状态...": in ``(x @ A^T) @ B^T`` (x ``Shard(-1)``, A ``Shard(1)``, B Replicate)
    the second matmul dropped the first's Partial: wrong forward, B's gradient 1/N of the
    true one. Answer: the intermediate is Partial(sum), the output and all three gradients
    equal one device."""
    for cm in ms2.run(report_chained_matmul):
        assert cm["tmp"] == "(Partial(sum),)"
        np.testing.assert_allclose(cm["o"][1], cm["o"][2], rtol=1e-5, atol=1e-5)
        for g, r in zip(cm["grads"], cm["ref"]):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def report_local_map_nested_placements(rank: int, world: int) -> dict:
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import Shard
    from hyper_shard.experimental import local_map

    mesh = hs.init_device_mesh("CPU", (world,))
    a, b, c = (np.random.RandomState(i).randn(4, 3).astype(np.float32) for i in range(3))

    def f(xs, y):
        return {"sum": xs[0] + xs[1] * y, "pair": (y * 2, y - xs[0])}

    ds = [hs.distribute_tensor(Tensor(t), mesh, [Shard(0)]) for t in (a, b, c)]
    out = local_map(
        f,
        out_placements={"sum": [Shard(0)], "pair": ([Shard(0)], [Shard(0)])},
        in_placements=([[Shard(0)], [Shard(0)]], [Shard(0)]),
    )(ds[:2], ds[2])
    return {
        "sum": out["sum"].full_tensor().asnumpy(),
        "diff": out["pair"][1].full_tensor().asnumpy(),
        "ref": (a + b * c, c - a),
    }


def test_report_local_map_nested_placements(ms2):
    """pytorch/pytorch#182031 on MindSpore: ``local_map`` placements mirroring a list
    argument and a dict output (as on torch, tests/dist/test_local_map.py)."""
    for o in ms2.run(report_local_map_nested_placements):
        np.testing.assert_allclose(o["sum"], o["ref"][0], rtol=1e-6)
        np.testing.assert_allclose(o["diff"], o["ref"][1], rtol=1e-6)
