"""``fully_shard`` on MindSpore Cells over 2-D meshes (4 mccl ranks) against one process:
HSDP on a ``("replicate", "shard")`` mesh, and FSDP over tensor parallelism (Cells
parallelized on ``mesh["tp"]``, then ``fully_shard`` on ``mesh["dp"]``). Losses, gradients
(``full_tensor``) and parameters after optimizer steps equal the single-process run on the
whole batch; the layouts are the torch FSDP ones (docs/fsdp.md)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _tp_model(seed: int):
    """An MLP block (column- then row-parallel under TP) and a plain head."""
    from mindspore import Parameter, Tensor, mint, nn

    rs = np.random.RandomState(seed)

    def init(cell):
        o, i = cell.weight.shape
        w = rs.randn(o, i).astype(np.float32) / np.sqrt(i)
        cell.weight = Parameter(Tensor(w), name=cell.weight.name)
        cell.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.1), name=cell.bias.name)

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.up = mint.nn.Linear(8, 12)
            self.down = mint.nn.Linear(12, 8)

        def construct(self, x):
            return self.down(mint.nn.functional.relu(self.up(x)))

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.blk = MLP()
            self.head = mint.nn.Linear(8, 5)  # left plain by the plan: FSDP on dp alone

        def construct(self, x):
            return self.head(self.blk(x))

    net = Net()
    for cell in (net.blk.up, net.blk.down, net.head):
        init(cell)
    return net


def _train(net, ref, opt, ref_opt, vg, ref_vg, data, target, sl) -> dict:
    from mindspore import Tensor

    from tests.mindspore._ms_helpers import max_param_err

    losses, ref_losses, grad_err, placements = [], [], 0.0, {}
    params = opt.parameters
    for i in range(len(data)):
        loss, grads = vg(Tensor(data[i][sl]), Tensor(target[i][sl]))
        rl, rg = ref_vg(Tensor(data[i]), Tensor(target[i]))
        loss = loss.to_local() if hasattr(loss, "to_local") else loss
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for p, g, r in zip(params, grads, rg):
            placements[p.name] = (str(p.placements), str(g.placements), str(p._spec.shard_order))
            full = g.full_tensor().asnumpy()
            grad_err = max(grad_err, float(np.abs(full - r.asnumpy()).max()))
        from hyper_shard.platform.mindspore.autograd import optimizer_grads

        opt(optimizer_grads(grads, params))
        ref_opt(rg)
    werr = max_param_err(net, ref)
    return {
        "losses": losses,
        "ref": ref_losses,
        "grad_err": grad_err,
        "werr": werr,
        "placements": placements,
        "local": {p.name: tuple(p.to_local().shape) for p in net.trainable_params()},
    }


def check_fsdp_2d(rank: int, world: int, steps: int) -> dict:
    import mindspore as ms
    from mindspore import nn

    import hyper_shard as hs
    from hyper_shard.debug import recent_ops
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests.mindspore._ms_helpers import fresh_record
    from tests.mindspore.test_ms_fsdp import _model

    out = {}
    data = np.random.RandomState(3).randn(steps, 8, 8).astype(np.float32)
    target = np.random.RandomState(4).randn(steps, 8, 5).astype(np.float32)

    def loss_of(m):
        return lambda x, t: ((m(x) - t) ** 2).mean()

    # ---- HSDP: (replicate, shard) = (2, 2); every rank its quarter of the batch
    mesh = hs.init_device_mesh("CPU", (2, 2), mesh_dim_names=("replicate", "shard"))
    ref, net = _model(0), _model(0)
    for cell in (net.b1, net.b2, net):
        fully_shard(cell, mesh=mesh)
    opt, ref_opt = nn.SGD(net.trainable_params(), 0.1), nn.SGD(ref.trainable_params(), 0.1)
    vg = value_and_grad(loss_of(net), None, opt.parameters)
    ref_vg = ms.value_and_grad(loss_of(ref), None, ref_opt.parameters)
    n0 = fresh_record()
    sl = slice(2 * rank, 2 * rank + 2)
    out["hsdp"] = _train(net, ref, opt, ref_opt, vg, ref_vg, data, target, sl)
    out["hsdp"]["groups"] = sorted(
        {(r.collective, tuple(r.ranks)) for r in recent_ops()[n0:] if r.collective != "all_gather"}
    )

    # ---- FSDP x TP: (dp, tp) = (2, 2); the tp ranks of one dp coordinate share a batch half
    mesh = hs.init_device_mesh("CPU", (2, 2), mesh_dim_names=("dp", "tp"))
    ref, net = _tp_model(1), _tp_model(1)
    plan = {"blk.up": ColwiseParallel(), "blk.down": RowwiseParallel()}
    parallelize_module(net, mesh["tp"], plan)
    fully_shard(net.blk, mesh=mesh["dp"])
    fully_shard(net, mesh=mesh["dp"])
    opt, ref_opt = nn.SGD(net.trainable_params(), 0.1), nn.SGD(ref.trainable_params(), 0.1)
    vg = value_and_grad(loss_of(net), None, opt.parameters)
    ref_vg = ms.value_and_grad(loss_of(ref), None, ref_opt.parameters)
    dp = mesh.get_coordinate()[0]
    out["tp"] = _train(net, ref, opt, ref_opt, vg, ref_vg, data, target, slice(4 * dp, 4 * dp + 4))
    out["tp"]["shown"] = type(net.blk.up.weight).__name__
    return out


def test_hsdp_and_fsdp_over_tp_cells_match_one_process(ms4):
    steps = 2
    outs = ms4.run(check_fsdp_2d, steps, timeout=240)
    # HSDP: four quarters; the mean of the four losses is the batch loss
    for k in range(steps):
        mean = sum(o["hsdp"]["losses"][k] for o in outs) / 4
        assert mean == pytest.approx(outs[0]["hsdp"]["ref"][k], rel=1e-5)
    for rank, o in enumerate(outs):
        h = o["hsdp"]
        assert h["grad_err"] < 1e-5 and h["werr"] < 1e-5, (h["grad_err"], h["werr"])
        pl = set(h["placements"].values())
        assert pl == {("(Replicate(), Shard(dim=0))", "(Replicate(), Shard(dim=0))", "None")}
        # reduce over the shard group (this rank's row), then all-reduce over its column
        row, col = (rank // 2 * 2, rank // 2 * 2 + 1), (rank % 2, rank % 2 + 2)
        assert ("all_reduce", row) in h["groups"] and ("all_reduce", col) in h["groups"]
        assert h["local"]["b2.lin.weight"] == ((4, 12) if rank % 2 == 0 else (3, 12))
    # FSDP x TP: the two dp halves
    for k in range(steps):
        mean = (outs[0]["tp"]["losses"][k] + outs[2]["tp"]["losses"][k]) / 2
        assert mean == pytest.approx(outs[0]["tp"]["ref"][k], rel=1e-5)
    for o in outs:
        t = o["tp"]
        assert t["grad_err"] < 1e-5 and t["werr"] < 1e-5, (t["grad_err"], t["werr"])
        pl = {
            k.split(".", 1)[1] if k.startswith("net") else k: v for k, v in t["placements"].items()
        }
        pl = {".".join(k.split(".")[-3:]): v for k, v in pl.items()}
        # column-parallel weight: dim 0 split by tp first, then by dp (shard order 0: [1, 0])
        assert pl["blk.up.weight"] == ("(Shard(dim=0), Shard(dim=0))",) * 2 + (
            "(ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),)",
        )
        assert pl["blk.down.weight"][:2] == ("(Shard(dim=0), Shard(dim=1))",) * 2
        # a Replicate tensor-parallel bias: its gradient is Partial on tp, as in plain TP
        assert pl["blk.down.bias"][:2] == (
            "(Shard(dim=0), Replicate())",
            "(Shard(dim=0), Partial(sum))",
        )
        assert pl["head.weight"][:2] == ("(Shard(dim=0),)",) * 2
        assert t["shown"] == "ParameterMindSporeDTensor"


def llama_losses(rank: int, world: int, dp: int) -> list[float]:
    """The MindSpore main job's ``train`` (examples/mindspore_llama_tp.py): FSDP (dp) over
    the tensor-parallel plan (world // dp) when ``dp`` > 1, else one plain process; a tiny
    config, a tied LM head (vocab-parallel embedding and head: one weight at two sites)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import mindspore_llama_tp as ex

    flags = ["--hidden", "16", "--ffn", "32", "--seq", "8", "--batch", "4", "--heads", "2"]
    flags += ["--kv-heads", "2", "--steps", "2", "--tie", "--no-plot", "--dp", str(dp)]
    args = ex.parse_args(flags)
    return ex.train(rank, world, args, ex.load_data(), dp > 1)["losses"]


def test_llama_job_fsdp_over_tp_matches_one_process(ms1, ms4):
    """``examples/mindspore_llama_tp.py --dp 2 --tp 2``: every rank reports the dp-mean
    loss, equal to one process's on the whole batch."""
    outs = ms4.run(llama_losses, 2, timeout=300)
    (single,) = ms1.run(llama_losses, 1, timeout=300)
    assert all(o == outs[0] for o in outs)
    for a, b in zip(outs[0], single, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (outs[0], single)
