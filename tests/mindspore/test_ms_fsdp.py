"""``hyper_shard.fsdp.fully_shard`` on MindSpore Cells (2 mccl ranks) against one process:
each rank trains on its half of the batch; the mean loss, the gradients (``full_tensor``)
and the parameters after optimizer steps equal the single-process run on the whole batch;
between steps the parameters are ``Shard(0)`` DTensors (uneven dim 0 included)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _model(seed: int):
    from mindspore import Parameter, Tensor, mint, nn

    class Block(nn.Cell):
        def __init__(self, i: int, o: int) -> None:
            super().__init__()
            self.lin = mint.nn.Linear(i, o)

        def construct(self, x):
            return mint.nn.functional.relu(self.lin(x))

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.b1 = Block(8, 12)
            self.b2 = Block(12, 7)  # 7 rows over 2 ranks: 4/3
            self.head = nn.Dense(7, 5)  # a legacy Cell: FSDP alone computes on plain tensors

        def construct(self, x):
            return self.head(self.b2(self.b1(x)))

    net = Net()
    rs = np.random.RandomState(seed)
    for cell, (w, b) in (
        (net.b1.lin, ("weight", "bias")),
        (net.b2.lin, ("weight", "bias")),
        (net.head, ("weight", "bias")),
    ):
        o, i = getattr(cell, w).shape
        old_w, old_b = getattr(cell, w), getattr(cell, b)
        setattr(
            cell,
            w,
            Parameter(Tensor(rs.randn(o, i).astype(np.float32) / np.sqrt(i)), name=old_w.name),
        )
        setattr(cell, b, Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.1), name=old_b.name))
    return net


def check_fsdp_training(rank: int, world: int, steps: int, opt_name: str) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.fsdp import FSDPModule, fully_shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad
    from tests.mindspore._ms_helpers import max_param_err

    def make_opt(params):
        if opt_name == "adam":
            return nn.Adam(params, learning_rate=0.05)
        return nn.SGD(params, learning_rate=0.1)

    mesh = hs.init_device_mesh("CPU", (world,))
    data = np.random.RandomState(3).randn(steps, 6, 8).astype(np.float32)
    target = np.random.RandomState(4).randn(steps, 6, 5).astype(np.float32)
    half = 6 // world

    ref = _model(0)
    ref_opt = make_opt(ref.trainable_params())
    ref_vg = ms.value_and_grad(lambda x, t: ((ref(x) - t) ** 2).mean(), None, ref_opt.parameters)

    net = _model(0)
    fully_shard(net.b1, mesh=mesh)
    fully_shard(net.b2, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = make_opt(net.trainable_params())
    vg = value_and_grad(lambda x, t: ((net(x) - t) ** 2).mean(), None, opt.parameters)

    losses, ref_losses, grad_err = [], [], 0.0
    grad_placements = set()
    for i in range(steps):
        x, t = data[i], target[i]
        sl = slice(rank * half, (rank + 1) * half)
        loss, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
        rl, rg = ref_vg(Tensor(x), Tensor(t))
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for g, r in zip(grads, rg):
            grad_placements.add(str(g.placements))
            grad_err = max(grad_err, float(np.abs(g.full_tensor().asnumpy() - r.asnumpy()).max()))
        opt(optimizer_grads(grads, opt.parameters))
        ref_opt(rg)
    params = {
        p.name: (type(p).__name__, str(p.placements), tuple(p.to_local().shape))
        for p in net.trainable_params()
    }
    werr = max_param_err(net, ref)
    # outside forward the Cells show their sharded parameters (nothing gathered is kept)
    shown = type(net.b2.lin.weight).__name__, tuple(net.b2.lin.weight.to_local().shape)
    return {
        "losses": losses,
        "ref": ref_losses,
        "grad_err": grad_err,
        "grad_placements": sorted(grad_placements),
        "params": params,
        "werr": werr,
        "shown": shown,
        "cls": (type(net).__name__, isinstance(net, FSDPModule), isinstance(net.b1, FSDPModule)),
        "gathers": [
            net.b1._fsdp_state().group.counts["all_gather"],
            net._fsdp_state().group.counts["all_gather"],
        ],
        "n_root": len(net._fsdp_state().group.params),
    }


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_fully_shard_cell_matches_one_process(ms2, opt_name):
    steps = 3
    outs = ms2.run(check_fsdp_training, steps, opt_name)
    for k in range(steps):
        mean = sum(o["losses"][k] for o in outs) / len(outs)  # equal halves: the batch mean
        assert mean == pytest.approx(outs[0]["ref"][k], rel=1e-5)
    for o in outs:
        assert o["grad_err"] < 1e-5, o["grad_err"]
        assert o["werr"] < 1e-5, o["werr"]
        assert o["grad_placements"] == ["(Shard(dim=0),)"]
        assert o["cls"] == ("FSDPNet", True, True)
        assert o["gathers"] == [steps, steps]  # one all-gather per unit and forward
        assert o["n_root"] == 2  # the head's weight and bias; blocks are their own units
    p0, p1 = outs[0]["params"], outs[1]["params"]
    assert p0["b2.lin.weight"][1:] == ("(Shard(dim=0),)", (4, 12))
    assert p1["b2.lin.weight"][1:] == ("(Shard(dim=0),)", (3, 12))
    assert p1["head.bias"][2] == (2,) and p0["head.bias"][2] == (3,)
    assert outs[1]["shown"] == (outs[1]["params"]["b2.lin.weight"][0], (3, 12))


def _mixed_dtypes():
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    cell = nn.Cell()
    cell.a = Parameter(Tensor(np.ones((4, 2), np.float32)), name="a")
    cell.b = Parameter(Tensor(np.ones((4,), np.float16)).astype(ms.float16), name="b")
    return cell


def check_fsdp_errors(rank: int, world: int) -> dict:
    from mindspore import nn

    import hyper_shard as hs
    from hyper_shard.fsdp import CPUOffloadPolicy, fully_shard

    mesh = hs.init_device_mesh("CPU", (world,))
    out = {}
    net = _model(0)
    fully_shard(net.b1, mesh=mesh)
    for key, fn in {
        "twice": lambda: fully_shard(net.b1, mesh=mesh),
        "dtypes": lambda: fully_shard(_mixed_dtypes(), mesh=mesh),
        "not_cell": lambda: fully_shard(object(), mesh=mesh),
    }.items():
        try:
            fn()
            out[key] = "no error"
        except Exception as e:  # noqa: BLE001 - the type is asserted by the test
            out[key] = f"{type(e).__name__}: {e}"
    # CPUOffloadPolicy on CPU: accepted (everything already lives in host memory)
    fully_shard(net.b2, mesh=mesh, offload_policy=CPUOffloadPolicy())
    out["offload"] = str(net.b2.lin.weight.placements), tuple(net.b2.lin.weight.to_local().shape)
    # unshard(): the Cell shows the full weight (a plain tensor) until reshard()
    net.b1.unshard()
    w = net.b1.lin.weight
    out["unsharded"] = (isinstance(w, hs.DTensor), tuple(w.shape))
    net.b1.reshard()
    w = net.b1.lin.weight
    out["resharded"] = (isinstance(w, hs.DTensor), str(w.placements), tuple(w.to_local().shape))
    try:
        net.b1.set_reshard_after_forward(True)
        out["raf"] = "no error"
    except NotImplementedError as e:
        out["raf"] = str(e)
    del nn
    return out


def test_fully_shard_cell_errors(ms2):
    out = ms2.run(check_fsdp_errors)[0]
    assert out["twice"].startswith("ValueError") and "already applied" in out["twice"]
    assert out["offload"] in [("(Shard(dim=0),)", (4, 12)), ("(Shard(dim=0),)", (3, 12))]
    assert out["dtypes"].startswith("ValueError") and "several dtypes" in out["dtypes"]
    assert out["not_cell"].startswith("TypeError") and "mindspore.nn.Cell" in out["not_cell"]
    assert out["unsharded"] == (False, (12, 8))
    assert out["resharded"] == (True, "(Shard(dim=0),)", (6, 8))
    assert "set_reshard_after_forward" in out["raf"] and "MindSpore" in out["raf"]


def llama_fsdp_losses(rank: int, world: int, dp: int) -> list[float]:
    """The MindSpore main job's ``train`` (examples/mindspore_llama_tp.py): FSDP over the
    world when ``dp`` > 1, else the plain single process; a tiny config, a tied LM head
    (one weight at two sites of the root unit)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import mindspore_llama_tp as ex

    flags = ["--hidden", "32", "--ffn", "64", "--seq", "8", "--batch", "4", "--heads", "2"]
    flags += ["--kv-heads", "1", "--steps", "4", "--tie", "--no-plot", "--dp", str(dp)]
    args = ex.parse_args(flags)
    return ex.train(rank, world, args, ex.load_data(), dp > 1)["losses"]


def test_llama_job_fsdp_matches_one_process(ms1, ms2):
    f0, f1 = ms2.run(llama_fsdp_losses, 2, timeout=300)
    (single,) = ms1.run(llama_fsdp_losses, 1, timeout=300)
    assert f0 == f1  # the reported loss is the mean over the dp ranks
    assert len(f0) == len(single) == 4
    for a, b in zip(f0, single):
        assert abs(a - b) <= 1e-5 * abs(b), (f0, single)
    assert single[-1] < single[0]
