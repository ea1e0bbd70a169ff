"""``fully_shard`` on MindSpore Cells (2 mccl ranks) with a ``MixedPrecisionPolicy`` and
with gradient accumulation without sync, against one plain MindSpore process computing the
same thing (a float16 copy of the weights computing, float32 master weights; the summed
gradients of the micro-batches)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _model(seed: int, compute_dtype=None):
    """Three linear Cells; ``compute_dtype``: the plain reference casts its inputs and
    weights to it in ``construct`` (what FSDP's ``param_dtype`` does), the output back to
    float32."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, mint, nn

    rs = np.random.RandomState(seed)

    class Lin(nn.Cell):
        def __init__(self, i: int, o: int, relu: bool) -> None:
            super().__init__()
            w = rs.randn(o, i).astype(np.float32) / np.sqrt(i)
            self.weight = Parameter(Tensor(w))
            self.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.1))
            self.relu = relu
            self.seen: list = []

        def construct(self, x):
            w, b = self.weight, self.bias
            if compute_dtype is not None:
                x, w, b = x.astype(compute_dtype), w.astype(compute_dtype), b.astype(compute_dtype)
            self.seen.append((str(x.dtype), str(w.dtype)))
            y = mint.nn.functional.linear(x, w, b)
            return mint.nn.functional.relu(y) if self.relu else y

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.b1 = Lin(8, 12, True)
            self.b2 = Lin(12, 7, True)  # 7 rows over 2 ranks: 4/3
            self.head = Lin(7, 5, False)

        def construct(self, x):
            y = self.head(self.b2(self.b1(x)))
            return y.astype(ms.float32) if compute_dtype is not None else y

    return Net()


def _collectives(since: int) -> list[tuple[str, str]]:
    from hyper_shard.debug import recent_ops

    return [(r.collective, str(r.dtype)) for r in recent_ops()[since:]]


def check_mixed_precision(rank: int, world: int, steps: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.fsdp import MixedPrecisionPolicy, fully_shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad
    from tests.mindspore._ms_helpers import fresh_record, max_param_err

    mesh = hs.init_device_mesh("CPU", (world,))
    data = np.random.RandomState(3).randn(steps, 6, 8).astype(np.float32)
    target = np.random.RandomState(4).randn(steps, 6, 5).astype(np.float32)
    half = 6 // world

    ref = _model(0, ms.float16)
    ref_opt = nn.SGD(ref.trainable_params(), learning_rate=0.1)
    ref_vg = ms.value_and_grad(lambda x, t: ((ref(x) - t) ** 2).mean(), None, ref_opt.parameters)

    net = _model(0)
    mp = MixedPrecisionPolicy(param_dtype=ms.float16, reduce_dtype=ms.float32)
    fully_shard(net.b1, mesh=mesh, mp_policy=mp)
    fully_shard(net.b2, mesh=mesh, mp_policy=mp)
    root_mp = MixedPrecisionPolicy(
        param_dtype=ms.float16, reduce_dtype=ms.float32, output_dtype=ms.float32
    )
    fully_shard(net, mesh=mesh, mp_policy=root_mp)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    vg = value_and_grad(lambda x, t: ((net(x) - t) ** 2).mean(), None, opt.parameters)

    losses, ref_losses, grad_err, grad_dtypes, colls = [], [], 0.0, set(), set()
    for i in range(steps):
        x, t = data[i], target[i]
        sl = slice(rank * half, (rank + 1) * half)
        n0 = fresh_record()
        loss, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
        colls.update(_collectives(n0))
        rl, rg = ref_vg(Tensor(x), Tensor(t))
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for g, r in zip(grads, rg):
            grad_dtypes.add(str(g.dtype))
            r = r.asnumpy()
            err = np.abs(g.full_tensor().asnumpy() - r).max() / (np.abs(r).max() + 1e-6)
            grad_err = max(grad_err, float(err))
        opt(optimizer_grads(grads, opt.parameters))
        ref_opt(rg)
    werr = max_param_err(net, ref)
    return {
        "losses": losses,
        "ref": ref_losses,
        "grad_err": grad_err,
        "werr": werr,
        "grad_dtypes": sorted(grad_dtypes),
        "param_dtypes": sorted({str(p.dtype) for p in net.trainable_params()}),
        "seen": sorted(set(net.b1.seen + net.b2.seen + net.head.seen)),
        "ref_seen": sorted(set(ref.b1.seen + ref.head.seen)),
        "collectives": sorted(colls),
        "out_dtype": str(net(Tensor(data[0][:half])).dtype),
    }


def test_fully_shard_cell_mixed_precision_matches_one_process(ms2):
    """param_dtype float16 (all-gather and compute), reduce_dtype float32, output_dtype
    float32 on the root, against the same float16 compute on one process (MindSpore CPU has
    float16 matmul kernels, no bfloat16 ones)."""
    steps = 3
    outs = ms2.run(check_mixed_precision, steps)
    for k in range(steps):
        mean = sum(o["losses"][k] for o in outs) / len(outs)
        assert mean == pytest.approx(outs[0]["ref"][k], rel=2e-3)
    for o in outs:
        assert o["grad_err"] < 5e-3, o["grad_err"]  # float16 rounding of the half batches
        assert o["werr"] < 2e-3, o["werr"]
        assert o["grad_dtypes"] == ["Float32"] and o["param_dtypes"] == ["Float32"]
        assert o["seen"] == o["ref_seen"] == [("Float16", "Float16")]
        # the all-gathers run in float16, the gradient reductions in float32
        assert ("all_gather", "Float16") in o["collectives"]
        assert ("all_reduce", "Float32") in o["collectives"]
        assert ("all_gather", "Float32") not in o["collectives"]
        assert o["out_dtype"] == "Float32"


def check_no_sync(rank: int, world: int, micro: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests.mindspore._ms_helpers import fresh_record

    mesh = hs.init_device_mesh("CPU", (world,))
    data = np.random.RandomState(5).randn(micro, 4, 8).astype(np.float32)
    target = np.random.RandomState(6).randn(micro, 4, 5).astype(np.float32)
    half = 4 // world

    ref = _model(1)
    ref_vg = ms.value_and_grad(
        lambda x, t: ((ref(x) - t) ** 2).mean(), None, ref.trainable_params()
    )
    ref_sum = None
    for i in range(micro):  # the reference: the sum of the micro-batches' gradients
        _, rg = ref_vg(Tensor(data[i]), Tensor(target[i]))
        ref_sum = rg if ref_sum is None else [a + b for a, b in zip(ref_sum, rg)]

    net = _model(1)
    fully_shard(net.b1, mesh=mesh)
    fully_shard(net.b2, mesh=mesh)
    fully_shard(net, mesh=mesh)
    params = net.trainable_params()
    vg = value_and_grad(lambda x, t: ((net(x) - t) ** 2).mean(), None, params)
    sl = slice(rank * half, (rank + 1) * half)
    summed, last, no_sync_reduces = None, None, 0
    for i in range(micro):
        net.set_requires_gradient_sync(i == micro - 1)  # recurse: every unit
        n0 = fresh_record()
        _, grads = vg(Tensor(data[i][sl]), Tensor(target[i][sl]))
        if i < micro - 1:
            no_sync_reduces += sum(1 for c, _ in _collectives(n0) if c == "all_reduce")
        local = [g.to_local() for g in grads]
        summed = local if summed is None else [a + b for a, b in zip(summed, local)]
        last = grads
    err_sum = err_last = 0.0
    for g, s, r in zip(last, summed, ref_sum):
        full = g.full_tensor().asnumpy()
        err_last = max(err_last, float(np.abs(full - r.asnumpy()).max()))
        box = hs.DTensor.from_local(s, g.device_mesh, g.placements, shape=g.shape)
        err_sum = max(err_sum, float(np.abs(box.full_tensor().asnumpy() - r.asnumpy()).max()))
    # HSDP (replicate 2, shard 1): set_requires_all_reduce(False) on the first micro-batches
    hmesh = hs.init_device_mesh("CPU", (world, 1), mesh_dim_names=("replicate", "shard"))
    hnet = _model(1)
    for cell in (hnet.b1, hnet.b2, hnet):
        fully_shard(cell, mesh=hmesh)
    hvg = value_and_grad(lambda x, t: ((hnet(x) - t) ** 2).mean(), None, hnet.trainable_params())
    deferred = 0
    for i in range(micro):
        hnet.set_requires_all_reduce(i == micro - 1)
        n0 = fresh_record()
        _, hgrads = hvg(Tensor(data[i][sl]), Tensor(target[i][sl]))
        if i < micro - 1:
            deferred += len(_collectives(n0))
    err_hsdp = max(
        float(np.abs(g.full_tensor().asnumpy() - r.asnumpy()).max())
        for g, r in zip(hgrads, ref_sum)
    )
    return {
        "err_last": err_last,
        "err_sum": err_sum,
        "no_sync_reduces": no_sync_reduces,
        "reduces": [
            net.b1._fsdp_state().group.counts["reduce_scatter"],
            net._fsdp_state().group.counts["reduce_scatter"],
        ],
        "deferred_collectives": deferred,
        "err_hsdp": err_hsdp,
    }


def test_fully_shard_cell_gradient_accumulation_without_sync(ms2):
    """set_requires_gradient_sync(False) on the first micro-batches: no reduction runs for
    them; the synchronised last backward reduces the sum of all micro-batches' gradients
    (equal to one process's summed gradients), and summing the returned gradients over the
    micro-batches gives the same. HSDP's set_requires_all_reduce(False) defers the
    replicate all-reduce the same way."""
    micro = 3
    for o in ms2.run(check_no_sync, micro):
        assert o["no_sync_reduces"] == 0
        assert o["reduces"] == [1, 1]
        assert o["err_last"] < 1e-5, o["err_last"]
        assert o["err_sum"] < 1e-5, o["err_sum"]
        assert o["deferred_collectives"] == 0  # HSDP: the all-reduce waits for the last
        assert o["err_hsdp"] < 1e-5, o["err_hsdp"]


def check_state_dict(rank: int, world: int, ckpt: str) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    import hyper_shard as hs
    import hyper_shard.checkpoint as hc
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests.mindspore.test_ms_fsdp import _model

    mesh = hs.init_device_mesh("CPU", (world,))

    def fsdp(seed: int):
        net = _model(seed)
        for cell in (net.b1, net.b2, net):
            fully_shard(cell, mesh=mesh)
        return net

    x = Tensor(np.random.RandomState(7).randn(4, 8).astype(np.float32))
    net = fsdp(0)
    vg = value_and_grad(lambda x: (net(x) ** 2).mean(), None, net.trainable_params())
    _, grads = vg(x)  # a step, so the values differ from any fresh init
    for p, g in zip(net.trainable_params(), grads):
        p.assign_value(
            hs.DTensor.from_local(
                p.to_local() - 0.1 * g.to_local(), mesh, p.placements, shape=p.shape
            )
        )
    sd = net.state_dict()
    full = {k: v.full_tensor().asnumpy() for k, v in sd.items()}
    out = {
        "keys": sorted(sd),
        "plain_keys": sorted(_model(0).state_dict()),
        "kinds": sorted({(type(v).__name__, str(v.placements)) for v in sd.values()}),
    }

    def err(m) -> float:
        return max(
            float(np.abs(v.full_tensor().asnumpy() - full[k]).max())
            if isinstance(v, hs.DTensor)
            else float(np.abs(v.asnumpy() - full[k]).max())
            for k, v in m.state_dict().items()
        )

    # sharded round trip, and full (plain, every rank the whole value) into a fresh FSDP net
    a = fsdp(1)
    a.load_state_dict(net.state_dict())
    b = fsdp(2)
    b.load_state_dict({k: Tensor(v) for k, v in full.items()})
    out["sharded_rt"], out["full_rt"] = err(a), err(b)
    out["forward"] = float(np.abs(b(x).asnumpy() - net(x).asnumpy()).max())
    out["still_sharded"] = str(b.b2.lin.weight.placements), tuple(b.b2.lin.weight.to_local().shape)
    # hyper_shard.checkpoint: save sharded, load into a plain model and a TP model
    hc.save(net.parameters_dict(), ckpt)
    plain = _model(3)
    hc.load(plain.parameters_dict(), ckpt)
    out["ckpt_plain"] = err(plain)
    tp = parallelize_module(
        _model(4), mesh, {"b1.lin": ColwiseParallel(), "b2.lin": RowwiseParallel()}
    )
    hc.load(tp.parameters_dict(), ckpt)
    out["ckpt_tp"] = err(tp)
    del ms
    return out


def test_fully_shard_cell_state_dict_round_trips(ms2, tmp_path):
    """Cell.state_dict() of FSDP Cells holds the sharded DTensors under the plain keys;
    load_state_dict takes them back, or full plain tensors; hyper_shard.checkpoint saves
    the sharded parameters and loads them into a plain and a tensor-parallel model."""
    for o in ms2.run(check_state_dict, str(tmp_path / "ckpt")):
        assert o["keys"] == o["plain_keys"]
        assert o["kinds"] == [("ParameterMindSporeDTensor", "(Shard(dim=0),)")]
        assert o["sharded_rt"] == 0.0 and o["full_rt"] == 0.0
        assert o["forward"] < 1e-6
        assert o["still_sharded"] in [("(Shard(dim=0),)", (4, 12)), ("(Shard(dim=0),)", (3, 12))]
        assert o["ckpt_plain"] == 0.0 and o["ckpt_tp"] == 0.0


def check_fsdp2_knobs(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard.fsdp import fully_shard, register_fsdp_forward_method
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    x = np.random.RandomState(5).randn(4, 8).astype(np.float32)
    t = np.random.RandomState(6).randn(4, 5).astype(np.float32)
    half = 4 // world
    sl = slice(rank * half, (rank + 1) * half)
    ref = _model(1)
    _, ref_g = ms.value_and_grad(
        lambda a, b: ((ref(a) - b) ** 2).mean(), None, ref.trainable_params()
    )(Tensor(x), Tensor(t))
    out = {}
    for mode in ("divide_1", "force_sum"):
        net = _model(1)
        for cell in (net.b1, net.b2, net):
            fully_shard(cell, mesh=mesh)
            if mode == "divide_1":
                cell.set_gradient_divide_factor(1.0)  # the sum over ranks, not the mean
            else:
                cell.set_force_sum_reduction_for_comms(True)
        vg = value_and_grad(
            lambda a, b, net=net: ((net(a) - b) ** 2).mean(), None, net.trainable_params()
        )
        _, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
        scale = float(world) if mode == "divide_1" else 1.0
        out[mode] = max(
            float(np.abs(g.full_tensor().asnumpy() - scale * r.asnumpy()).max())
            for g, r in zip(grads, ref_g)
        )
    # shard_placement_fn: the weights sharded along dim 1 (head: 7 columns, 4/3)
    net = _model(1)
    by_columns = lambda q: hs.Shard(1) if q.ndim == 2 else None  # noqa: E731
    for cell in (net.b1, net.b2, net):
        fully_shard(cell, mesh=mesh, shard_placement_fn=by_columns)
    out["placements"] = [str(p.placements) for p in net.trainable_params()]
    out["head_local"] = tuple(net.head.weight.to_local().shape)
    vg = value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, net.trainable_params())
    _, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
    out["dim1"] = max(
        float(np.abs(g.full_tensor().asnumpy() - r.asnumpy()).max()) for g, r in zip(grads, ref_g)
    )
    out["dim1_grad_placements"] = [str(g.placements) for g in grads]
    # one unit of two Cells (b2 and head): one all-gather per forward for both
    net = _model(1)
    fully_shard(net.b1, mesh=mesh)
    group = [net.b2, net.head]
    assert fully_shard(group, mesh=mesh) is group
    fully_shard(net, mesh=mesh)
    unit = net.b2._fsdp_state().group
    out["group_shared"] = unit is net.head._fsdp_state().group and len(unit.params) == 4
    vg = value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, net.trainable_params())
    _, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
    out["group"] = max(
        float(np.abs(g.full_tensor().asnumpy() - r.asnumpy()).max()) for g, r in zip(grads, ref_g)
    )
    out["group_gathers"] = unit.counts["all_gather"]
    # another entry point of the root Cell runs with its gathered parameters
    net = _model(1)
    fully_shard(net, mesh=mesh)
    register_fsdp_forward_method(net, "construct")
    got = net.construct(Tensor(x))
    out["forward_method"] = float(np.abs(got.asnumpy() - ref(Tensor(x)).asnumpy()).max())
    net.reset_iter_state()
    return out


def test_fully_shard_cell_fsdp2_knobs(ms2):
    """set_gradient_divide_factor(1.0) gives the sum of the ranks' gradients (world x one
    process's mean-loss gradient); set_force_sum_reduction_for_comms gives the mean as by
    default; register_fsdp_forward_method runs a method with the unit's hooks;
    shard_placement_fn shards the weights along dim 1 with the same gradients; a list of
    Cells makes one unit (one all-gather per forward)."""
    outs = ms2.run(check_fsdp2_knobs)
    for o in outs:
        assert o["divide_1"] < 1e-5, o
        assert o["force_sum"] < 1e-5, o
        assert o["forward_method"] < 1e-5, o
        assert o["dim1"] < 1e-5, o
        assert o["group"] < 1e-5 and o["group_shared"] and o["group_gathers"] == 1, o
        assert o["placements"] == ["(Shard(dim=1),)", "(Shard(dim=0),)"] * 3, o["placements"]
        assert o["dim1_grad_placements"] == o["placements"]
    assert [o["head_local"] for o in outs] == [(5, 4), (5, 3)]
