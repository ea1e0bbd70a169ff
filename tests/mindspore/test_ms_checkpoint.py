"""One checkpoint format for torch and MindSpore: a torch model sharded FSDP-style
(every parameter ``Shard(0)``, 2 gloo ranks) saves with ``hyper_shard.checkpoint``; the
same architecture in MindSpore, tensor-parallel on 2 mccl ranks (vocab-parallel
embedding, column/row-parallel linears: other placements, so the load reshards), loads it
with a ``key_map`` (MindSpore's ``embed.embedding_table`` is torch's ``embed.weight``),
gives the same forward output, takes an SGD step and saves (under torch's names, with a
``Partial`` DTensor reduced before saving and a python value); the torch model loads that
in one plain process and matches MindSpore's parameters exactly.
MindSpore errors (missing key, shape) are raised on every rank and change nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

VOCAB, DIM, HID = 7, 4, 6
IDS = np.array([1, 2, 3, 6, 0], dtype=np.int64)
KEY_MAP = {"embed.embedding_table": "embed.weight"}  # MindSpore name -> checkpoint (torch) name


def _torch_net():
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, DIM)
            self.up = torch.nn.Linear(DIM, HID)
            self.down = torch.nn.Linear(HID, DIM)

        def forward(self, ids):
            return self.down(torch.tanh(self.up(self.embed(ids))))

    torch.manual_seed(3)
    return Net()


def torch_save(rank: int, world: int, d: str) -> tuple[dict, np.ndarray]:
    import torch

    import hyper_shard.checkpoint as hc
    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
    from hyper_shard.parallel import distribute_module

    net = _torch_net()
    mesh = init_device_mesh("cpu", (world,))

    def partition(name, mod, mesh):
        for pn, p in list(mod.named_parameters(recurse=False)):
            mod.register_parameter(
                pn, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]))
            )

    def inputs(mod, args, mesh):
        return tuple(DTensor.from_local(a, mesh, [Replicate()]) for a in args)

    distribute_module(net, mesh, partition, input_fn=inputs)
    out = net(torch.from_numpy(IDS)).full_tensor().detach().numpy()
    hc.save(net.state_dict(), d)
    full = {k: v.full_tensor().detach().numpy() for k, v in net.state_dict().items()}
    return full, out


def _ms_net():
    from mindspore import mint, nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.up = mint.nn.Linear(DIM, HID)
            self.down = mint.nn.Linear(HID, DIM)

        def construct(self, ids):
            return self.down(mint.tanh(self.up(self.embed(ids))))

    return Net()


def _try(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def ms_load_step_save(rank: int, world: int, src: str, dst: str) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    import hyper_shard.checkpoint as hc
    from hyper_shard import Replicate
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    net = _ms_net()
    mesh = hs.init_device_mesh("CPU", (world,))
    parallelize_module(
        net,
        mesh,
        {
            "embed": RowwiseParallel(input_layouts=Replicate()),
            "up": ColwiseParallel(),
            "down": RowwiseParallel(),
        },
    )
    params = net.parameters_dict()
    out: dict = {"placements": {k: str(v.placements) for k, v in params.items()}}
    before = {k: v.full_tensor().asnumpy() for k, v in params.items()}
    # bad inputs first: each raises on every rank and leaves the parameters as they were
    out["missing"] = _try(lambda: hc.load(params, src))  # embed.embedding_table unmapped
    out["unknown_map"] = _try(lambda: hc.load(params, src, key_map={"nope": "x"}))
    small = {"down.bias": Tensor(np.zeros(3, np.float32))}
    out["shape"] = _try(lambda: hc.load(small, src, key_map={}, strict=False))
    out["unchanged"] = all(
        np.array_equal(before[k], v.full_tensor().asnumpy()) for k, v in params.items()
    )
    hc.load(params, src, key_map=KEY_MAP)
    out["loaded"] = {KEY_MAP.get(k, k): v.full_tensor().asnumpy() for k, v in params.items()}
    ids = Tensor(IDS.astype(np.int32))
    out["forward"] = net(ids).asnumpy()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)

    def loss_fn(x):
        return (net(x) ** 2).mean()

    step = value_and_grad(loss_fn, None, opt.parameters)
    _, grads = step(ids)
    opt(optimizer_grads(grads, opt.parameters))
    # the parameters, and a Partial DTensor (reduced before saving) with a python value
    from hyper_shard import DTensor, Partial

    part = DTensor.from_local(Tensor(np.full((3, 2), rank + 1.0, np.float32)), mesh, [Partial()])
    hc.save({**params, "extra": {"p": part, "step": 7}}, dst, key_map=KEY_MAP)
    out["stepped"] = {KEY_MAP.get(k, k): v.full_tensor().asnumpy() for k, v in params.items()}
    out["dtype"] = str(ms.float32)
    return out


def test_torch_mindspore_round_trip(dist2, ms2, tmp_path: Path) -> None:
    import torch

    import hyper_shard.checkpoint as hc

    a, b = str(tmp_path / "torch"), str(tmp_path / "ms")
    (full, fwd), _ = dist2.run(torch_save, a)
    res = ms2.run(ms_load_step_save, a, b, timeout=240)
    for r in res:
        assert "CheckpointError" in r["missing"] and "embed.embedding_table" in r["missing"]
        assert "hyper_shard.json" in r["missing"]
        assert "CheckpointError" in r["unknown_map"] and "nope" in r["unknown_map"]
        assert "CheckpointError" in r["shape"] and "down.bias" in r["shape"]
        assert "[4]" in r["shape"] and "[3]" in r["shape"]
        assert r["unchanged"]
    r0 = res[0]
    assert "Shard(dim=1)" in r0["placements"]["down.weight"]  # saved Shard(0): the load resharded
    for k, v in full.items():
        np.testing.assert_array_equal(r0["loaded"][k], v)
    np.testing.assert_allclose(r0["forward"], fwd, rtol=1e-5, atol=1e-6)
    assert any(not np.array_equal(r0["stepped"][k], full[k]) for k in full)  # SGD moved them
    # MindSpore -> torch, one plain process
    net = _torch_net()
    extra = {"p": torch.zeros(3, 2), "step": 0}
    hc.load({**net.state_dict(), "extra": extra}, b)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), r0["stepped"][k])
    assert torch.equal(extra["p"], torch.full((3, 2), 3.0)) and extra["step"] == 7
    ref = _torch_net()
    assert not torch.equal(ref.up.weight, net.up.weight)
