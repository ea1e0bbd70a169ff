"""Tensor parallelism on MindSpore Cells (2 mccl ranks): ``parallelize_module`` with the
same ``ColwiseParallel``/``RowwiseParallel`` plan classes as torch, on ``mint.nn.Linear``;
training losses, gradients and updated weights equal the single-process run. Public bug
reports on the styles (``report_*`` run on the ranks, each test's docstring naming its
report)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _mlp(seed: int):
    from mindspore import Parameter, Tensor, mint, nn

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.up = mint.nn.Linear(8, 12)
            self.down = mint.nn.Linear(12, 8)

        def construct(self, x):
            return self.down(mint.nn.functional.relu(self.up(x)))

    net = MLP()
    rs = np.random.RandomState(seed)
    for cell in (net.up, net.down):
        o, i = cell.weight.shape
        cell.weight = Parameter(
            Tensor(rs.randn(o, i).astype(np.float32) / np.sqrt(i)), name=cell.weight.name
        )
        cell.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.1), name=cell.bias.name)
    return net


def check_tp_training(rank: int, world: int, steps: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad
    from tests.mindspore._ms_helpers import max_param_err

    mesh = hs.init_device_mesh("CPU", (world,))
    data = np.random.RandomState(3).randn(steps, 6, 8).astype(np.float32)
    target = np.random.RandomState(4).randn(steps, 6, 8).astype(np.float32)

    ref = _mlp(0)
    ref_opt = nn.SGD(ref.trainable_params(), learning_rate=0.1)
    ref_vg = ms.value_and_grad(lambda x, t: ((ref(x) - t) ** 2).mean(), None, ref_opt.parameters)
    net = parallelize_module(_mlp(0), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    vg = value_and_grad(lambda x, t: ((net(x) - t) ** 2).mean(), None, opt.parameters)
    losses, ref_losses, grad_err = [], [], 0.0
    for i in range(steps):
        x, t = Tensor(data[i % 2]), Tensor(target[i % 2])
        loss, grads = vg(x, t)
        rl, rg = ref_vg(x, t)
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for g, r in zip(grads, rg):
            full = g.full_tensor().asnumpy()
            grad_err = max(grad_err, float(np.abs(full - r.asnumpy()).max()))
        opt(optimizer_grads(grads, opt.parameters))
        ref_opt(rg)
    params = {
        p.name: (type(p).__name__, str(p.placements), tuple(p.to_local().shape))
        for p in net.trainable_params()
    }
    werr = max_param_err(net, ref)
    return {
        "losses": losses,
        "ref": ref_losses,
        "grad_err": grad_err,
        "params": params,
        "werr": werr,
    }


def test_colwise_rowwise_mlp(ms2):
    res = ms2.run(check_tp_training, 4)
    for out in res:
        np.testing.assert_allclose(out["losses"], out["ref"], rtol=1e-5)
        assert out["losses"][-2] < out["losses"][0]  # same batch at steps 0 and 2: it learned
        assert out["grad_err"] < 1e-5 and out["werr"] < 1e-5
        pl = {k.split(".")[-2] + "." + k.split(".")[-1]: v for k, v in out["params"].items()}
        assert pl["up.weight"] == ("ParameterMindSporeDTensor", "(Shard(dim=0),)", (6, 8))
        assert pl["up.bias"][1:] == ("(Shard(dim=0),)", (6,))
        assert pl["down.weight"][1:] == ("(Shard(dim=1),)", (8, 6))
        assert pl["down.bias"][1:] == ("(Replicate(),)", (8,))


def check_plan_errors(rank: int, world: int) -> dict:
    from mindspore import nn

    import hyper_shard as hs
    from hyper_shard.parallel import ColwiseParallel, parallelize_module

    mesh = hs.init_device_mesh("CPU", (world,))
    out = {}
    try:
        parallelize_module(nn.Dense(4, 4), mesh, ColwiseParallel())
    except NotImplementedError as e:
        out["dense"] = str(e)
    import warnings

    with warnings.catch_warnings(record=True) as rec:  # as PyTorch: warned and skipped
        warnings.simplefilter("always")
        parallelize_module(_mlp(0), mesh, {"upp": ColwiseParallel()})
    out["key"] = "; ".join(f"{type(w.message).__name__}: {w.message}" for w in rec)
    return out


def test_plan_errors(ms2):
    out = ms2.run(check_plan_errors)[0]
    assert "mint.nn.Linear" in out["dense"]
    assert out["key"].startswith("PlanKeyWarning") and "'upp' could not be resolved" in out["key"]
    assert "closest module names" in out["key"]


# ---------------------------------------------------------------------- bug reports
def report_rowwise_bias(rank: int, world: int) -> dict:
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad
    from tests.mindspore._ms_helpers import (
        chunked_two_layer,
        chunked_two_layer_one_process,
        max_param_err,
    )

    mesh = hs.init_device_mesh("CPU", (world,))
    x = np.random.RandomState(5).randn(4, 8).astype(np.float32)
    t = np.random.RandomState(6).randn(4, 5).astype(np.float32)
    ref, losses, ref_grads = chunked_two_layer_one_process(x, t, 2)
    net = parallelize_module(
        chunked_two_layer(0), mesh, {"up": ColwiseParallel(), "head": RowwiseParallel()}
    )
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    vg = value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, opt.parameters)
    got, grads = [], None
    for _ in range(2):
        loss, grads = vg(Tensor(x), Tensor(t))
        got.append(float(loss.asnumpy()))
        opt(optimizer_grads(grads, opt.parameters))
    return {
        "losses": (got, losses),
        "grads": [g.full_tensor().asnumpy() for g in grads],
        "ref_grads": ref_grads,
        "werr": max_param_err(net, ref),
        "bias": str(net.head.bias.placements),
    }


def test_report_rowwise_bias(ms2):
    """mindspore-ai/hyper-parallel#756 "ColwiseParallel、RowwiseParallel 实现问题":
    RowwiseParallel did not handle the bias parameter. Answer: a row-parallel
    ``mint.nn.Linear`` with a bias (replicated, added once) trains as one process (the
    head called on two chunks of the rows)."""
    for rb in ms2.run(report_rowwise_bias):
        np.testing.assert_allclose(*rb["losses"], rtol=1e-5)
        for g, r in zip(rb["grads"], rb["ref_grads"]):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
        assert rb["werr"] < 1e-5 and rb["bias"] == "(Replicate(),)"
