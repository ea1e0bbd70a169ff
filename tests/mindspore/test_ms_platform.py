"""The MindSpore platform on 2 real mccl ranks (and a world of one): process groups,
collectives, local primitives, custom gradients, capabilities and errors.

Every check runs in the spawned MindSpore workers and returns plain values; the
assertions compare them, in the pytest process, with values computed by numpy on the
same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _data(rank: int, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    return np.random.RandomState(rank + 10).randn(*shape).astype(np.float32)


# ---------------------------------------------------------------------- collectives
def check_collectives(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from tests.mindspore._ms_helpers import mesh_1d

    mesh = mesh_1d(world)
    plat = mesh.platform
    g = mesh.get_group(0)
    x = Tensor(_data(rank))
    out: dict = {"platform": plat.name, "group": g.name, "native": sorted(plat.native_collectives)}
    out["all_gather"] = [t.asnumpy() for t in plat.all_gather(x, g, world)]
    for op in ("sum", "max", "min", "avg", "prod"):
        out[f"all_reduce_{op}"] = plat.all_reduce(x, op, g).asnumpy()
    out["all_reduce_keeps_input"] = x.asnumpy()
    # a view as input (MindSpore's in-place collectives skip views: the platform copies)
    big = Tensor(np.arange(24, dtype=np.float32).reshape(6, 4) * (rank + 1))
    out["all_reduce_view"] = plat.all_reduce(plat.narrow(big, 0, 2, 3), "sum", g).asnumpy()
    out["broadcast"] = plat.broadcast(x, 1, g).asnumpy()
    out["all_gather_int"] = [
        t.asnumpy() for t in plat.all_gather(Tensor(np.array([rank, 7], np.int32)), g, world)
    ]
    out["objects"] = plat.all_gather_object({"r": rank}, g, world)
    for name, call in (
        ("reduce_scatter", lambda: plat.reduce_scatter([x, x], "sum", g)),
        ("all_to_all", lambda: plat.all_to_all([x, x], g)),
    ):
        try:
            call()
            out[name] = "ran"
        except NotImplementedError as e:  # no kernel on CPU: never attempted, never a hang
            out[name] = str(e)
    peer = 1 - rank  # a paired exchange with the other rank (isend/irecv)
    out["send_recv"] = plat.send_recv(x, peer, x, peer, g).asnumpy()
    cm = plat.cost_model(mesh)
    from hyper_shard.redistribute.steps import STEPS

    rs = STEPS["reduce_scatter"]
    routes = {r: rs.route_cost(r, cm, 0, 2, 4096, 2048) for r in rs.routes}
    # priced as the composition that runs (all-reduce + narrow), dearer than native
    out["cost_rs_composed"] = (
        rs.route(plat.native_collectives) == "all_reduce"
        and cm.step_cost("reduce_scatter", 0, 2, 4096, 2048) == routes["all_reduce"]
        and routes["native"] < routes["all_reduce"]
    )
    out["dtype_f16"] = plat.all_reduce(x.astype(ms.float16), "sum", g).dtype == ms.float16
    return out


def test_collectives(ms2):
    res = ms2.run(check_collectives)
    xs = [_data(r) for r in range(2)]
    for rank, out in enumerate(res):
        assert out["platform"] == "mindspore"
        assert out["group"] == "mccl_world_group"  # the CPU world group, passed explicitly
        assert out["native"] == ["all_gather", "all_reduce", "send_recv"]
        for r in range(2):
            np.testing.assert_allclose(out["all_gather"][r], xs[r])
        np.testing.assert_allclose(out["all_reduce_sum"], xs[0] + xs[1], rtol=1e-6)
        np.testing.assert_allclose(out["all_reduce_max"], np.maximum(xs[0], xs[1]))
        np.testing.assert_allclose(out["all_reduce_min"], np.minimum(xs[0], xs[1]))
        np.testing.assert_allclose(out["all_reduce_avg"], (xs[0] + xs[1]) / 2, rtol=1e-6)
        np.testing.assert_allclose(out["all_reduce_prod"], xs[0] * xs[1], rtol=1e-6)
        np.testing.assert_allclose(out["all_reduce_keeps_input"], xs[rank])
        base = np.arange(24, dtype=np.float32).reshape(6, 4)
        np.testing.assert_allclose(out["all_reduce_view"], (base * 1 + base * 2)[2:5])
        np.testing.assert_allclose(out["broadcast"], xs[1])
        assert [a.tolist() for a in out["all_gather_int"]] == [[0, 7], [1, 7]]
        assert out["objects"] == [{"r": 0}, {"r": 1}]
        assert "composes it from all_reduce" in out["reduce_scatter"]
        assert "composes it from send_recv rounds or all_gather" in out["all_to_all"]
        np.testing.assert_allclose(out["send_recv"], xs[1 - rank])
        assert out["cost_rs_composed"]
        assert out["dtype_f16"]


# ---------------------------------------------------------------------- local primitives
def check_primitives(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from tests.mindspore._ms_helpers import mesh_1d

    plat = mesh_1d(world).platform
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    return {
        "shape": plat.shape(x),
        "narrow": plat.narrow(x, 1, 1, 2).asnumpy(),
        "cat": plat.cat([x, x], 0).asnumpy(),
        "pad": plat.pad_dim(x, 0, 5).asnumpy(),
        "embed": plat.embed(x, 1, 2, 7).asnumpy(),
        "zeros": plat.zeros_like(x).asnumpy(),
        "ones_i": plat.ones_like(Tensor(np.zeros(2, np.int32))).asnumpy(),
        "scale": plat.scale(x, 0.5).asnumpy(),
        "eq": plat.eq_mask(x, Tensor(np.full((3, 4), 5.0, np.float32))).asnumpy(),
        "mul": plat.mul(x, x).asnumpy(),
        "div": plat.div(x, x + 1).asnumpy(),
        "full": plat.new_tensor("full", (2,), 3.5, ms.float32).asnumpy(),
        "meta": tuple(plat.tensor_meta(x, (6, 4))[:2]),
        "is_tensor": (plat.is_tensor(x), plat.is_tensor(x.asnumpy())),
    }


def test_local_primitives(ms2):
    out = ms2.run(check_primitives)[0]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert out["shape"] == (3, 4)
    np.testing.assert_array_equal(out["narrow"], x[:, 1:3])
    np.testing.assert_array_equal(out["cat"], np.concatenate([x, x]))
    np.testing.assert_array_equal(out["pad"], np.concatenate([x, np.zeros((2, 4), np.float32)]))
    emb = np.zeros((3, 7), np.float32)
    emb[:, 2:6] = x
    np.testing.assert_array_equal(out["embed"], emb)
    np.testing.assert_array_equal(out["zeros"], np.zeros_like(x))
    np.testing.assert_array_equal(out["ones_i"], np.ones(2, np.int32))
    np.testing.assert_array_equal(out["scale"], x * 0.5)
    np.testing.assert_array_equal(out["eq"], (x == 5).astype(np.float32))
    np.testing.assert_array_equal(out["mul"], x * x)
    np.testing.assert_allclose(out["div"], x / (x + 1), rtol=1e-6)
    np.testing.assert_array_equal(out["full"], [3.5, 3.5])
    assert out["meta"] == ((6, 4), (4, 1))
    assert out["is_tensor"] == (True, False)


# ---------------------------------------------------------------------- custom gradients
def check_custom_autograd(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from tests.mindspore._ms_helpers import mesh_1d

    plat = mesh_1d(world).platform
    x = Tensor(_data(rank))
    group = plat.new_group(list(range(world)))

    def f_identity(a):  # fwd returns its input: the custom backward must still run
        return (plat.custom_autograd(lambda t: t, lambda d: d * 3.0, a) ** 2).sum()

    def f_allreduce(a):  # d/da_r of sum over ranks of (sum_r a_r)^2 = 2 * world * sum_r a_r
        tot = plat.custom_autograd(
            lambda t: plat.all_reduce(t, "sum", group),
            lambda d: plat.all_reduce(d, "sum", group),
            a,
        )
        return (tot**2).sum()

    inside: list = []

    def f_probe(a):
        inside.append(plat.requires_grad(a))
        return a.sum()

    ms.grad(f_probe)(x)
    return {
        "identity": ms.grad(f_identity)(x).asnumpy(),
        "requires_grad": (inside[0], plat.requires_grad(x)),
        "allreduce": ms.grad(f_allreduce)(x).asnumpy(),
    }


def test_custom_autograd(ms2):
    res = ms2.run(check_custom_autograd)
    xs = [_data(r) for r in range(2)]
    for rank, out in enumerate(res):
        np.testing.assert_allclose(out["identity"], 6 * xs[rank], rtol=1e-5)
        assert out["requires_grad"] == (True, False)  # recorded inside ms.grad only
        np.testing.assert_allclose(out["allreduce"], 2 * 2 * (xs[0] + xs[1]), rtol=1e-5)


# ---------------------------------------------------------------------- selection & world
def check_select_and_errors(rank: int, world: int) -> dict:
    import hyper_shard as hs
    from hyper_shard.platform.mindspore import MindSporePlatform

    mesh = hs.init_device_mesh("CPU", (world,))  # no platform=: "CPU" names MindSpore
    out = {
        "type": type(mesh.platform).__name__,
        "rank": mesh.get_rank(),
        "ws": mesh.platform.get_world_size(),
    }
    try:
        MindSporePlatform().ensure_initialized("tpu")
    except ValueError as e:
        out["bad_device"] = str(e)
    try:
        hs.init_device_mesh("CPU", (world + 1,))
    except ValueError as e:
        out["bad_shape"] = str(e)
    # torch's spelling in a program that initialised MindSpore communication (issue 15):
    # the mesh is MindSpore's, over the real world
    lower = hs.init_device_mesh("cpu", (world,))
    out["lower"] = (type(lower.platform).__name__, lower.platform.get_world_size())
    return out


def test_select_platform(ms2):
    res = ms2.run(check_select_and_errors)
    for rank, out in enumerate(res):
        assert out["type"] == "MindSporePlatform"
        assert (out["rank"], out["ws"]) == (rank, 2)
        assert "use 'CPU', 'Ascend' or 'GPU'" in out["bad_device"]
        assert "the world has 2" in out["bad_shape"]
        assert out["lower"] == ("MindSporePlatform", 2)


def check_world_of_one(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, mint

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    mesh = hs.init_device_mesh("CPU", (1,))
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    w = Tensor(np.ones((4, 2), np.float32))
    d = hs.distribute_tensor(x, mesh, [Shard(0)])
    y = mint.matmul(d, hs.distribute_tensor(w, mesh, [Replicate()]))

    def f(a):
        return (a * a).sum()

    _, g = value_and_grad(f)(d)
    import sys

    from hyper_shard.platform.select import platform_for_device

    saved = sys.modules.pop("torch", None)  # as in a MindSpore-only program
    try:  # only MindSpore imported, no communication: "cpu" is ambiguous
        platform_for_device("cpu")
        ambiguous = "no error"
    except ValueError as e:
        ambiguous = str(e)
    finally:
        if saved is not None:
            sys.modules["torch"] = saved
    return {
        "ambiguous": ambiguous,
        "world": mesh.platform.get_world_size(),
        "group": mesh.get_group(0).name,
        "y": y.full_tensor().asnumpy(),
        "y_pl": str(y.placements),
        "g": g.full_tensor().asnumpy(),
        "ref_g": ms.grad(f)(x).asnumpy(),
    }


def test_world_of_one(ms1):
    out = ms1.run(check_world_of_one)[0]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert out["world"] == 1 and out["group"] is None  # no communication at all
    np.testing.assert_allclose(out["y"], x @ np.ones((4, 2), np.float32))
    assert out["y_pl"] == "(Shard(dim=0),)"
    np.testing.assert_allclose(out["g"], out["ref_g"])
    np.testing.assert_allclose(out["g"], 2 * x)
    msg = out["ambiguous"]
    assert "ambiguous" in msg and "'CPU'" in msg and "platform='mindspore'" in msg, msg


# ---------------------------------------------------------------------- sub-groups (4 ranks)
def check_subgroups(rank: int, world: int) -> dict:
    from mindspore import Tensor

    import hyper_shard as hs

    mesh = hs.init_device_mesh("CPU", (2, 2), mesh_dim_names=("dp", "tp"))
    out = {"coord": mesh.get_coordinate()}
    x = Tensor(np.array([float(rank)], np.float32))
    for d in range(2):
        grp = mesh.get_group(d)
        out[f"ranks{d}"] = list(grp.ranks)
        out[f"sum{d}"] = float(mesh.platform.all_reduce(x, "sum", grp).asnumpy()[0])
        out[f"gather{d}"] = [float(t.asnumpy()[0]) for t in mesh.platform.all_gather(x, grp, 2)]
    return out


def test_mesh_subgroups(ms4):
    res = ms4.run(check_subgroups)
    mesh = [[0, 1], [2, 3]]
    for rank, out in enumerate(res):
        i, j = out["coord"]
        assert mesh[i][j] == rank
        col = [mesh[0][j], mesh[1][j]]
        row = mesh[i]
        assert out["ranks0"] == col and out["ranks1"] == row
        assert out["sum0"] == sum(col) and out["sum1"] == sum(row)
        assert out["gather0"] == col and out["gather1"] == row
