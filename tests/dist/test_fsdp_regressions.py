"""Public bug reports on FSDP (next to the ``test_fsdp*.py`` files, which others are
changing now), replayed on hyper_shard's torch platform with real gloo ranks against the
same model in one process: training, gradients, gradient norms, state dicts and metadata.

* mindspore-ai/hyper-parallel's FSDP reports that are not MindSpore-specific
  (:func:`test_fsdp_reports`, one batched worker call whose docstring names them);
* PyTorch FSDP2 reports (``report_*``, each naming its report).
"""

from __future__ import annotations

import pytest
import torch

from tests._helpers import assert_close_any as _eq
from tests._reports import reports
from tests._scenarios import guard as _guard
from tests._scenarios import ok as _ok
from tests.dist._fsdp_models import (
    TinyNet,
    assert_same_training,
    batches,
    full,
    loss_of,
    make_net,
    train,
)

pytestmark = pytest.mark.multiproc


def _shard_all(net, mesh, fully_shard):
    for b in net.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


class _ChunkedLoss(TinyNet):
    """The LM head applied to two chunks of the sequence, one loss per chunk."""

    def forward(self, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        h = self.norm(x)
        parts = [loss_of(self.head(hc), yc) for hc, yc in zip(h.chunk(2, 1), y.chunk(2, 1))]
        return sum(parts) / len(parts)


def _copy_from(net, ref) -> None:
    """Fill ``net``'s (sharded) parameters with ``ref``'s values, each rank its box."""
    from hyper_shard import DTensor, distribute_tensor

    with torch.no_grad():
        for (_, p), (_, r) in zip(net.named_parameters(), ref.named_parameters()):
            if isinstance(p, DTensor):
                box = distribute_tensor(r.detach(), p.device_mesh, p.placements).to_local()
                p.to_local().copy_(box)
            else:
                p.copy_(r)


def _mean_loss(x: torch.Tensor) -> float:
    import torch.distributed as dist

    y = x.clone()
    dist.all_reduce(y)
    return float(y) / dist.get_world_size()


def _grad_norm(model, data, rank, world) -> float:
    ids, y = data[0]
    ids, y = ids.chunk(world)[rank], y.chunk(world)[rank]
    loss_of(model(ids), y).backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters()], 1e9)
    return float(full(norm))


def check_fsdp_reports(rank: int, world: int) -> dict:
    from hyper_shard import DTensor, init_device_mesh
    from hyper_shard.fsdp import fully_shard

    out: dict = {}
    data = batches(2, world)
    ref = train(make_net(), data, 0, 1)

    # #541: dp_shard == 1 (a size-1 shard mesh): unshard, to_empty() after meta init and
    # the leaf check of torch optimizers must all still work.
    def dp_shard_one():
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        res = {}
        with torch.device("meta"):
            net = make_net()
        _shard_all(net, mesh["shard"], fully_shard)
        net.to_empty(device="cpu")
        _copy_from(net, make_net())
        seen = []
        net.blocks[0].register_forward_pre_hook(
            lambda m, a: seen.append(isinstance(m.up.weight, DTensor))
        )
        res["leaf"] = all(p.is_leaf for p in net.parameters())
        res["local_meta"] = any(p.to_local().is_meta for p in net.parameters())
        res["placements"] = sorted({str(p.placements) for p in net.parameters()})
        res["train"] = train(net, data, 0, 1)  # every rank: the whole batch (dp = 1)
        res["seen"] = sorted(set(seen))
        # HSDP with a shard dim of 1: replicated parameters, gradients all-reduced
        hsdp = _shard_all(make_net(), mesh, fully_shard)
        res["hsdp"] = train(hsdp, data, rank, world, mean_loss=_mean_loss)
        res["hsdp_placements"] = sorted({str(p.placements) for p in hsdp.parameters()})
        return res

    _guard(out, "541", dp_shard_one)

    # #302: a DeviceMesh built inside a meta-device context (deferred init) crashed once
    # its metadata tensors were used.
    def mesh_in_meta():
        with torch.device("meta"):
            mesh = init_device_mesh("cpu", (world,))
            net = make_net()
        _shard_all(net, mesh, fully_shard)
        net.to_empty(device="cpu")
        _copy_from(net, make_net())
        return train(net, data, rank, world, mean_loss=_mean_loss)

    _guard(out, "302", mesh_in_meta)

    # #324 / #443: the LM head applied to chunks of the hidden states (chunked loss):
    # hyper-parallel's unit found unsharded_param.grad None when dW arrived after the
    # last dX. Single-device answer: the same chunked loss on one device.
    def chunk_loss():
        mesh = init_device_mesh("cpu", (world,))
        net = make_net()
        net.__class__ = _ChunkedLoss
        for b in net.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(net.head, mesh=mesh)
        fully_shard(net, mesh=mesh)
        ref_net = make_net()
        ref_net.__class__ = _ChunkedLoss
        recs = []
        for model, r, w in ((net, rank, world), (ref_net, 0, 1)):
            opt = torch.optim.AdamW(model.parameters(), lr=0.05)
            rec: dict = {"loss": [], "grads": [], "params": []}
            for ids, y in data:
                ids, y = ids.chunk(w)[r], y.chunk(w)[r]
                loss = model(ids, y)
                loss.backward()
                rec["loss"].append(_mean_loss(loss.detach()) if w > 1 else loss.item())
                rec["grads"].append([full(p.grad) for p in model.parameters()])
                opt.step()
                opt.zero_grad()
                rec["params"].append([full(p) for p in model.parameters()])
            recs.append(rec)
        return recs

    _guard(out, "324", chunk_loss)

    # #735: the first step's grad norm with part of the parameters replicated was 48.5
    # instead of 29.0. Single-device answer: clip_grad_norm_'s total norm.
    def grad_norms():
        ref_norm = _grad_norm(make_net(), data, 0, 1)
        mesh1 = init_device_mesh("cpu", (world,))
        mesh2 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        fsdp = _grad_norm(_shard_all(make_net(), mesh1, fully_shard), data, rank, world)
        hsdp = _grad_norm(_shard_all(make_net(), mesh2, fully_shard), data, rank, world)
        # blocks sharded, the root's own parameters (emb, norm, head) replicated (HSDP (2, 1))
        mixed = make_net()
        for b in mixed.blocks:
            fully_shard(b, mesh=mesh1)
        fully_shard(mixed, mesh=mesh2)
        mixed_norm = _grad_norm(mixed, data, rank, world)
        return ref_norm, fsdp, hsdp, mixed_norm

    _guard(out, "735", grad_norms)

    # #229 (FSDP refactor): fully_shard(mesh=None) on parameters that already are
    # DTensors on a tensor-parallel mesh must not silently treat the TP mesh as the DP
    # mesh: an early error, or the same training.
    def mesh_none_dtensor():
        from hyper_shard.parallel import ColwiseParallel, parallelize_module

        tp = init_device_mesh("cpu", (world,))
        net = make_net()
        parallelize_module(net.blocks[0], tp, {"up": ColwiseParallel()})
        try:
            fully_shard(net.blocks[0])
        except (ValueError, NotImplementedError) as e:
            return "raised " + type(e).__name__ + ": " + str(e)
        return "accepted " + str(
            sorted(
                {str(p.placements) for p in net.blocks[0].parameters() if isinstance(p, DTensor)}
            )
        )

    _guard(out, "229", mesh_none_dtensor)
    out["ref"] = ref
    return out


def test_fsdp_reports(dist2):
    """Replays, with FSDP on 2 ranks vs. one process (losses, gradients, parameters):

    * mindspore-ai/hyper-parallel#541 "fully_shard: dp_shard==1 path skips unshard /
      reset / grad-plumbing": with a shard mesh of size 1, DTensors reached forward,
      ``to_empty()`` left the local tensors on meta and the sharded parameters were not
      leaves (torch optimizers refused them). Answer: forward sees plain tensors, the
      parameters are leaves on CPU, and AdamW training equals one process; HSDP with a
      shard dim of 1 too.
    * #302 "[bug] DeviceMesh 在 ms.DeviceCtx("meta") 上下文内构造时崩溃": a mesh built
      inside a meta-device context put its metadata on meta and crashed later (the torch
      analogue: ``with torch.device("meta")``). Answer: the same training as one process.
    * #324 / #443 "[fully_shard]处理chunk_loss时，报错unsharded_param.grad is none": a
      unit called on several chunks in one forward (chunked loss). Answer: training equals
      the same chunked loss on one process.
    * #735 "[Bug]在fully_shard接口传入replicate_params时，第一个step grad_norm异常比baseline大":
      with some parameters replicated, the first grad norm was 48.5 instead of 29.0.
      Answer: ``clip_grad_norm_``'s total norm equals one process (FSDP, HSDP (2, 1), and
      sharded blocks under a replicated root).
    * #229 "[Refatcor]HyperParallel-FSDP 代码重构" (decision: ``mesh=None`` with DTensor
      parameters fails early, not by treating the TP mesh as the DP mesh). Answer here: an
      early error naming the mesh.
    """
    outs = dist2.run(check_fsdp_reports)
    for out in outs:
        ref = out["ref"]
        r541 = _ok(out, "541")
        assert r541["leaf"] and not r541["local_meta"]
        assert r541["placements"] == ["(Shard(dim=0),)"]
        assert r541["seen"] == [False]  # plain tensors in forward, not DTensors
        assert_same_training(r541["train"], ref)
        assert r541["hsdp_placements"] == ["(Replicate(), Shard(dim=0))"]
        assert_same_training(r541["hsdp"], ref)

        assert_same_training(_ok(out, "302"), ref)

        got, want = _ok(out, "324")
        assert_same_training(got, want)

        ref_norm, *norms = _ok(out, "735")
        for n in norms:
            assert n == pytest.approx(ref_norm, rel=1e-5)

        msg = _ok(out, "229")
        assert msg.startswith("raised"), msg
        assert "mesh" in msg


# ---------------------------------------------------------------------- PyTorch FSDP2 reports
def report_writes_and_state_dicts_of_sharded_weights(rank, world):
    """#147570: an in-place multiply through a view of an FSDP-sharded weight; #136228: a
    full state dict loaded into an FSDP model whose dim 0 (3) does not divide evenly."""
    import torch.nn as nn

    from hyper_shard import Replicate, distribute_tensor, init_device_mesh
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    with torch.device("meta"):
        fl = nn.Linear(9, 8, bias=False)
    fully_shard(fl, mesh=mesh)
    fl.to_empty(device="cpu")
    nn.init.ones_(fl.weight)
    with torch.no_grad():
        fl.weight.view(4, 2, 9).mul_(
            distribute_tensor(torch.arange(4.0).view(4, 1, 1), mesh, [Replicate()])
        )
    _eq(fl.weight, torch.ones(8, 9).view(4, 2, 9).mul(torch.arange(4.0).view(4, 1, 1)).view(8, 9))
    full_m, m = nn.Linear(17, 3), nn.Linear(17, 3)
    fully_shard(m, mesh=mesh)
    m.load_state_dict(
        {
            k: distribute_tensor(v, mesh, m.state_dict()[k].placements)
            for k, v in full_m.state_dict().items()
        }
    )
    xf = torch.randn(2, 17)
    _eq(m(xf), full_m(xf).detach())


class _Tied(torch.nn.Module):
    def __init__(self, vocab: int = 15, hidden: int = 4) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.mid = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return self.out(torch.tanh(self.mid(self.emb(x))))


def report_tied_weights_in_one_unit(rank, world):
    """#176076 (fixed here): tied embedding / output weights with vocab 15 on 2 ranks
    (uneven shards); PyTorch never updated the last rank's rows. ``fully_shard([emb,
    out])`` sharded the tied weight for ``emb`` only and the root call refused ``out``'s
    copy; now both modules share it, and training matches one process in every grouping."""
    import torch.nn.functional as F

    from hyper_shard import init_device_mesh
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for group in ("root", "inner", "list"):
        torch.manual_seed(0)
        m, r = _Tied(), _Tied()
        r.load_state_dict(m.state_dict())
        if group == "inner":
            fully_shard(m.mid, mesh=mesh)
        elif group == "list":
            fully_shard([m.emb, m.out], mesh=mesh)
        fully_shard(m, mesh=mesh)
        assert m.out.weight is m.emb.weight
        opt, ropt = torch.optim.SGD(m.parameters(), lr=0.5), torch.optim.SGD(r.parameters(), lr=0.5)
        for step in range(3):
            x = torch.randint(0, 15, (world * 2, 3), generator=torch.Generator().manual_seed(step))
            y = torch.randint(
                0, 15, (world * 2, 3), generator=torch.Generator().manual_seed(10 + step)
            )
            xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]
            F.cross_entropy(m(xl).flatten(0, 1), yl.flatten()).backward()
            F.cross_entropy(r(x).flatten(0, 1), y.flatten()).backward()
            for o in (opt, ropt):
                o.step()
                o.zero_grad()
        sd, rsd = m.state_dict(), r.state_dict()
        for key, val in rsd.items():
            _eq(sd[key], val, atol=1e-5, rtol=1e-4)


@reports(report_writes_and_state_dicts_of_sharded_weights, report_tied_weights_in_one_unit)
def test_reports(report, dist2):
    dist2.run(report)


def report_fsdp_over_tensor_parallel_gradients(rank, world):
    """#129206 / #129229: TP + FSDP2 on a (dp, tp) mesh: ``full_tensor`` of parameters and
    gradients equal one process's (FSDP averages over the 2 dp ranks)."""
    import torch.nn as nn

    from hyper_shard import init_device_mesh
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    ref.load_state_dict(model.state_dict())
    parallelize_module(model, mesh2["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh2["dp"])
    xb = torch.randn(4, 8)
    model(xb.chunk(2)[mesh2.get_coordinate()[0]]).sum().backward()
    (ref(xb).sum() / 2).backward()  # FSDP averages over the 2 dp ranks
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        _eq(p.full_tensor(), q.detach(), msg=n)
        _eq(p.grad.full_tensor(), q.grad, msg=n)


@reports(report_fsdp_over_tensor_parallel_gradients)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
