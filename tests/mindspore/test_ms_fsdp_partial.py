"""FSDP unit lifetime on MindSpore Cells (issue 28; 2 mccl ranks) against one plain
process, where the torch patterns apply to functional autograd: a module of a unit used
outside the unit's forward (the head of ``fully_shard([b2, head])`` called per chunk
after the forward that ran ``b2``), two forward passes through every unit in one loss,
and a Cell shared by two ``fully_shard`` calls (the error names it and how to group it).
Every gradient (``full_tensor``) and the loss over SGD steps equal one process's."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _model(seed: int):
    """``construct`` stops before the head: the loss applies it (per chunk)."""
    from mindspore import Parameter, Tensor, mint, nn

    rs = np.random.RandomState(seed)

    class Lin(nn.Cell):
        def __init__(self, i: int, o: int, relu: bool) -> None:
            super().__init__()
            self.weight = Parameter(Tensor(rs.randn(o, i).astype(np.float32) / np.sqrt(i)))
            self.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.1))
            self.relu = relu

        def construct(self, x):
            y = mint.nn.functional.linear(x, self.weight, self.bias)
            return mint.nn.functional.relu(y) if self.relu else y

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.b1 = Lin(8, 12, True)
            self.b2 = Lin(12, 7, True)  # 7 rows over 2 ranks: 4/3
            self.head = Lin(7, 5, False)

        def construct(self, x):
            return self.b2(self.b1(x))

    return Net()


def _loss(net, pattern: str):  # noqa: ANN001, ANN202
    from mindspore import mint

    def chunked(x, t):  # noqa: ANN001, ANN202
        h = net(x)  # b1, b2: the unit [b2, head] starts its forward cycle
        total = 0.0
        for hc, tc in zip(mint.chunk(h, 3, 1), mint.chunk(t, 3, 1)):
            total = total + ((net.head(hc) - tc) ** 2).sum()  # the head, outside it
        return total / t.size

    def two_forwards(x, t):  # noqa: ANN001, ANN202
        a = ((net.head(net(x)) - t) ** 2).mean()
        b = ((net.head(net(x * 0.5)) - t) ** 2).mean()
        return a + b

    return {"chunked": chunked, "two_forwards": two_forwards}[pattern]


def check_partial(rank: int, world: int, pattern: str, steps: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    data = np.random.RandomState(3).randn(steps, 4, 6, 8).astype(np.float32)
    target = np.random.RandomState(4).randn(steps, 4, 6, 5).astype(np.float32)
    half = 4 // world
    ref = _model(0)
    ref_opt = nn.SGD(ref.trainable_params(), learning_rate=0.1)
    ref_vg = ms.value_and_grad(_loss(ref, pattern), None, ref_opt.parameters)
    net = _model(0)
    fully_shard(net.b1, mesh=mesh)
    fully_shard([net.b2, net.head], mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    vg = value_and_grad(_loss(net, pattern), None, opt.parameters)
    losses, ref_losses, grad_err = [], [], 0.0
    sl = slice(rank * half, (rank + 1) * half)
    for i in range(steps):
        loss, grads = vg(Tensor(data[i][sl]), Tensor(target[i][sl]))
        rl, rg = ref_vg(Tensor(data[i]), Tensor(target[i]))
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for g, r in zip(grads, rg):
            grad_err = max(grad_err, float(np.abs(g.full_tensor().asnumpy() - r.asnumpy()).max()))
        opt(optimizer_grads(grads, opt.parameters))
        ref_opt(rg)
    shown = [isinstance(net.head.weight, hs.DTensor), isinstance(net.b2.weight, hs.DTensor)]
    return {"losses": losses, "ref": ref_losses, "grad_err": grad_err, "shown": shown}


@pytest.mark.parametrize("pattern", ["chunked", "two_forwards"])
def test_partial_forward_cycles_match_one_process(ms2, pattern):
    steps = 2
    outs = ms2.run(check_partial, pattern, steps)
    for k in range(steps):
        mean = sum(o["losses"][k] for o in outs) / len(outs)
        assert mean == pytest.approx(outs[0]["ref"][k], rel=1e-5)
    for o in outs:
        assert o["grad_err"] < 1e-5, o["grad_err"]
        # after the step the Cells show their sharded DTensor parameters again
        assert o["shown"] == [True, True], o["shown"]


def check_shared_cell(rank: int, world: int) -> str:
    from mindspore import mint, nn

    import hyper_shard as hs
    from hyper_shard.fsdp import fully_shard

    class Shared(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            shared = mint.nn.Linear(4, 4)
            self.x = nn.SequentialCell([mint.nn.Linear(4, 4), shared])
            self.y = nn.SequentialCell([shared, mint.nn.Linear(4, 4)])

        def construct(self, t):
            return self.y(self.x(t))

    mesh = hs.init_device_mesh("CPU", (world,))
    net = Shared()
    fully_shard(net.x, mesh=mesh)
    try:
        fully_shard(net.y, mesh=mesh)
    except ValueError as e:
        return str(e)
    return "no error"


def test_shared_cell_error_names_it(ms2):
    msg = ms2.run(check_shared_cell)[0]
    assert "shared" in msg and "one unit" in msg and "submodule '0'" in msg, msg
    assert "bottom-up" not in msg, msg
