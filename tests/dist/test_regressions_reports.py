"""Public DTensor bug reports (PyTorch DTensor / TP / FSDP2 / DCP, MindSpore hyper-parallel)
whose programs hyper_shard already runs right: kept as regression checks, each against plain
torch on the same values (``pytorch/pytorch#N`` unless another repository is named). The
reports hyper_shard also got wrong are in ``test_regressions_fixes.py``; issue 4's list in
``test_regressions_loss.py`` / ``test_regressions_tensor.py``.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep

pytestmark = pytest.mark.multiproc


def check_values(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    # #153603: a reduction times a python scalar, several scalars in a row
    for i in range(1, 4):
        dy = DTensor.from_local(torch.tensor([1.0 + rank]), mesh, [Shard(0)]).mean()
        _eq((dy * i).full_tensor(), torch.tensor(1.5 * i))
        _eq((i - dy).full_tensor(), torch.tensor(i - 1.5))
    # #145218: in-place += 2 of a norm (python scalar and tensor)
    t = torch.rand(10, 8, generator=g)
    for two in (2, torch.tensor(2)):
        n = torch.linalg.vector_norm(distribute_tensor(t, mesh, [Shard(0)]))
        n += two
        _eq(n.full_tensor(), torch.linalg.vector_norm(t) + 2)
    # #139735: nn.init on a slice / an index of a row-sharded tensor writes through
    for idx in (slice(None, 2), 0, (slice(None), slice(1, 3)), (slice(None), 5)):
        d, ref = distribute_tensor(t.clone(), mesh, [Shard(0)]), t.clone()
        nn.init.constant_(d[idx], 3.0)
        nn.init.constant_(ref[idx], 3.0)
        _eq(d, ref)
    # #117728 / #118043: addmm / mm with zero-size contraction
    a, b, c = torch.randn(12, 0), torch.randn(0, 4), torch.randn(4, generator=g)
    da = distribute_tensor(a, mesh, [Shard(0)])
    _eq(torch.addmm(_rep(c, mesh), da, _rep(b, mesh)), torch.addmm(c, a, b))
    # #158538: copy_ with broadcasting between different placements
    src = torch.randn(4, generator=g)
    for pd, ps in ((Shard(0), Shard(0)), (Shard(1), Shard(0)), (Replicate(), Shard(0))):
        d = distribute_tensor(torch.zeros(4, 4), mesh, [pd])
        d.copy_(distribute_tensor(src, mesh, [ps]))
        assert d.placements == (pd,)
        _eq(d, torch.zeros(4, 4).copy_(src))
    # #129018: stack / cat of sharded tensors on every dim
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    for p in (Shard(0), Shard(1)):
        dx, dy2 = distribute_tensor(x, mesh, [p]), distribute_tensor(y, mesh, [p])
        for dim in (0, 1, 2):
            _eq(torch.stack([dx, dy2], dim), torch.stack([x, y], dim))
    # #711 (mindspore-ai/hyper-parallel): a 1-d tensor on a 2-d mesh (world, 1)
    mesh2 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    v = torch.arange(6.0)
    for pl in ([Shard(0), Replicate()], [Replicate(), Shard(0)], [Shard(0), Shard(0)]):
        _eq(distribute_tensor(v, mesh2, pl) * 2 + 1, v * 2 + 1)
    # #144054: item() / float() of a Partial reduction is the global value
    s = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]).sum()
    assert s.placements == (Partial(),) and s.item() == 28.0 and float(s) == 28.0
    # #186149: MoE routing zeros_like(scores).scatter_(-1, topk_ids, 1) on token shards
    scores = torch.randn(6, 8, generator=g)
    ids = scores.topk(2, dim=-1).indices
    ds, di = distribute_tensor(scores, mesh, [Shard(0)]), distribute_tensor(ids, mesh, [Shard(0)])
    out = torch.zeros_like(ds).scatter_(-1, di, 1.0)
    assert out.placements == (Shard(0),)
    _eq(out, torch.zeros_like(scores).scatter_(-1, ids, 1.0))
    # #135054: view of an uneven (1, 2) S(0) keeps the shard; (3, 2) too
    for n in (1, 3):
        p = torch.randn(n, 2, generator=g)
        t2 = distribute_tensor(p, mesh, [Shard(0)]).view(n, 2)
        assert t2.placements == (Shard(0),)
        _eq(t2, p)
    # #110762: from_local of torch.chunk shards infers the uneven global shape
    full = torch.arange(10.0).reshape(5, 2)
    d = DTensor.from_local(full.chunk(world, 0)[rank], mesh, [Shard(0)])
    assert tuple(d.shape) == (5, 2)
    _eq(d, full)
    # #163320: expand of a (1, 4) S(0) tensor held by one rank
    e = torch.randn(1, 4, generator=g)
    _eq(distribute_tensor(e, mesh, [Shard(0)]).expand(4, 4), e.expand(4, 4))
    # #143748 / #173041: uneven S(1) -> R leaves a contiguous local tensor; view works
    u = torch.randn(4, 31, 10, generator=g)
    r = distribute_tensor(u, mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
    assert r.to_local().is_contiguous()
    _eq(r.view(-1, 10), u.view(-1, 10))
    # #170934 / #172350: index_put into the indexed, sharded dim with sharded index/values
    vals, idx = torch.arange(16.0) + 1, torch.arange(16).flip(0)
    dd = distribute_tensor(torch.zeros(16), mesh, [Shard(0)])
    dd[distribute_tensor(idx, mesh, [Shard(0)])] = distribute_tensor(vals, mesh, [Shard(0)])
    _eq(dd, torch.zeros(16).index_put((idx,), vals))
    return 1


def check_gradients(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    # #179136: x[:, idx] with a DTensor index, backward (replicated and sharded x)
    idx = _rep(torch.tensor([1, 3, 5]), mesh)
    for pl in (Replicate(), Shard(1)):
        base = torch.arange(16.0).reshape(2, 8)
        x, rx = distribute_tensor(base, mesh, [pl]).requires_grad_(), base.clone().requires_grad_()
        x[:, idx].sum().backward()
        rx[:, torch.tensor([1, 3, 5])].sum().backward()
        _eq(x.grad, rx.grad)
    # #170147 / #115967: Partial -> Partial -> Shard, and Partial -> Shard then to_local
    leaf = (torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])).requires_grad_()
    q = DTensor.from_local(leaf, mesh, [Partial()]).redistribute(mesh, [Partial()])
    (q.redistribute(mesh, [Shard(0)]).full_tensor() * torch.tensor([2.0, 5.0])).sum().backward()
    _eq(leaf.grad, torch.tensor([2.0, 5.0]))
    leaf2 = torch.full((4, 2), float(rank + 1), requires_grad=True)
    w = torch.arange(8.0).reshape(4, 2)
    s = DTensor.from_local(leaf2, mesh, [Partial()]).redistribute(mesh, [Shard(0)])
    (s.to_local() * w.chunk(world, 0)[rank]).sum().backward()
    _eq(leaf2.grad, w)
    # #175867: from_local(grad_placements=[Partial()]) keeps the gradient partial
    leaf3 = torch.ones(3, requires_grad=True)
    x3 = DTensor.from_local(leaf3, mesh, [Replicate()], grad_placements=[Partial()])
    (x3 * _rep(torch.tensor([1.0, 2.0, 3.0]), mesh)).sum().backward()
    tot = leaf3.grad.clone()
    dist.all_reduce(tot)
    _eq(tot, torch.tensor([1.0, 2.0, 3.0]))
    # #685 (hyper-parallel): chained (x @ A^T) @ B^T through a Partial intermediate
    # #494 (hyper-parallel): Add(Partial, Replicate) must not scale the replicate's gradient
    xv, A, B, R = (torch.randn(*s, generator=g) for s in ((3, 8), (2, 8), (5, 2), (3, 5)))
    dx = distribute_tensor(xv, mesh, [Shard(1)]).requires_grad_()
    dA = distribute_tensor(A, mesh, [Shard(1)]).requires_grad_()
    dB, dR = (_rep(t, mesh).requires_grad_() for t in (B, R))
    rx, rA, rB, rR = (t.clone().requires_grad_() for t in (xv, A, B, R))
    out = (dx @ dA.t()) @ dB.t() + dR
    ref = (rx @ rA.t()) @ rB.t() + rR
    _eq(out.full_tensor(), ref.detach())
    wt = torch.randn(3, 5, generator=g)
    (out * _rep(wt, mesh)).sum().backward()
    (ref * wt).sum().backward()
    for d, r in ((dx, rx), (dA, rA), (dB, rB), (dR, rR)):
        _eq(d.grad.full_tensor(), r.grad)
    # #172102: linear on a sequence-sharded input with Replicate weight, then view/transpose
    xs, W, bb = torch.randn(2, 8, 4, generator=g), torch.ones(4, 4), torch.ones(4)
    ds = distribute_tensor(xs, mesh, [Shard(1)]).requires_grad_()
    dW, db = _rep(W, mesh).requires_grad_(), _rep(bb, mesh).requires_grad_()
    rs, rW, rb = (t.clone().requires_grad_() for t in (xs, W, bb))
    o, ro = F.linear(ds, dW, db), F.linear(rs, rW, rb)
    o2 = o.view(2, 8, 2, 2).transpose(1, 2).reshape(2, 2, 16)
    ro2 = ro.view(2, 8, 2, 2).transpose(1, 2).reshape(2, 2, 16)
    _eq(o2, ro2.detach())
    o2.sum().backward()
    ro2.sum().backward()
    for d, r in ((ds, rs), (dW, rW), (db, rb)):
        _eq(d.grad.full_tensor(), r.grad)
    # #173123: the unused output of a multi-output op gets a DTensor (zero) gradient
    base = torch.randn(4, 6, generator=g)
    d, r = distribute_tensor(base, mesh, [Shard(0)]).requires_grad_(), base.clone().requires_grad_()
    (d.split(3, dim=1)[0] * 2).sum().backward()
    (r.split(3, dim=1)[0] * 2).sum().backward()
    assert isinstance(d.grad, DTensor)
    _eq(d.grad, r.grad)
    return 1


def check_modules(rank, world):
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    # #118836: an uneven RowwiseParallel Linear(9, 3): contiguous local weight, right output
    lin, ref = nn.Linear(9, 3), nn.Linear(9, 3)
    ref.load_state_dict(lin.state_dict())
    parallelize_module(lin, mesh, RowwiseParallel())
    assert lin.weight.to_local().is_contiguous()
    x = torch.randn(2, 9)
    _eq(lin(x.chunk(world, -1)[rank]), ref(x))
    # #144359: Colwise -> GELU(tanh) -> Rowwise MLP equals the plain one, gradients too
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU("tanh"), nn.Linear(16, 8))
    rmlp = nn.Sequential(nn.Linear(8, 16), nn.GELU("tanh"), nn.Linear(16, 8))
    rmlp.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    xb = torch.randn(2, 5, 8)
    out, rout = mlp(xb), rmlp(xb)
    _eq(out, rout.detach())
    out.sum().backward()
    rout.sum().backward()
    _eq(mlp[0].weight.grad.full_tensor(), rmlp[0].weight.grad)
    _eq(mlp[2].bias.grad.full_tensor(), rmlp[2].bias.grad)
    # torchtitan#2217: SequenceParallel LayerNorm / RMSNorm weight gradients are the
    # full-sequence ones
    blk = nn.ModuleDict(
        {
            "norm": nn.LayerNorm(8),
            "up": nn.Linear(8, 16),
            "down": nn.Linear(16, 8),
            "rms": nn.RMSNorm(8),
        }
    )
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rblk = nn.ModuleDict(
        {
            "norm": nn.LayerNorm(8),
            "up": nn.Linear(8, 16),
            "down": nn.Linear(16, 8),
            "rms": nn.RMSNorm(8),
        }
    )
    rblk.load_state_dict(blk.state_dict())
    parallelize_module(
        blk,
        mesh,
        {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "rms": SequenceParallel(),
        },
    )

    def run(m, h):
        return m["rms"](m["down"](torch.relu(m["up"](m["norm"](h)))))

    xs = torch.randn(2, 6, 8)
    o, ro = run(blk, xs.chunk(world, 1)[rank]), run(rblk, xs)
    _eq(o, ro.detach())
    ws = torch.randn(2, 6, 8)
    (o * distribute_tensor(ws, mesh, [Shard(1)])).sum().backward()
    (ro * ws).sum().backward()
    for (n, p), (_, q) in zip(blk.named_parameters(), rblk.named_parameters()):
        _eq(p.grad.full_tensor(), q.grad, atol=1e-5, rtol=1e-4, msg=n)
    # Megatron-LM#737: vocab-parallel cross-entropy with label smoothing, ignore_index, weight
    logits, tgt = torch.randn(6, 10), torch.tensor([1, 9, -100, 3, 0, 5])
    cw = torch.rand(10) + 0.5
    for kw in ({"label_smoothing": 0.2}, {"weight": cw, "label_smoothing": 0.3}):
        dl = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
        kw2 = {k: (_rep(v, mesh) if k == "weight" else v) for k, v in kw.items()}
        with loss_parallel():
            loss = F.cross_entropy(dl, _rep(tgt, mesh), **kw2)
            loss.backward()
        rl = logits.clone().requires_grad_()
        rloss = F.cross_entropy(rl, tgt, **kw)
        rloss.backward()
        _eq(loss.full_tensor(), rloss.detach())
        _eq(dl.grad, rl.grad)
    # torchtitan#4637 / Automodel#1675: vocab-parallel embedding with padding_idx, and
    # writing rows of its row-sharded weight
    for pad in (1, 7):
        emb, remb = nn.Embedding(10, 4, padding_idx=pad), nn.Embedding(10, 4, padding_idx=pad)
        remb.load_state_dict(emb.state_dict())
        parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
        with torch.no_grad():
            emb.weight[3] = 0
            remb.weight[3] = 0
            emb.weight[-1].zero_()
            remb.weight[-1].zero_()
        ids = torch.tensor([[0, 1, 7, 8], [pad, 3, 9, 1]])
        o, ro = emb(ids), remb(ids)
        _eq(o, ro.detach())
        o.sum().backward()
        ro.sum().backward()
        _eq(emb.weight.grad.full_tensor(), remb.weight.grad)
    # #147570: in-place multiply through a view of an FSDP-sharded weight
    with torch.device("meta"):
        fl = nn.Linear(9, 8, bias=False)
    fully_shard(fl, mesh=mesh)
    fl.to_empty(device="cpu")
    nn.init.ones_(fl.weight)
    with torch.no_grad():
        fl.weight.view(4, 2, 9).mul_(_rep(torch.arange(4.0).view(4, 1, 1), mesh))
    _eq(fl.weight, torch.ones(8, 9).view(4, 2, 9).mul(torch.arange(4.0).view(4, 1, 1)).view(8, 9))
    # #136228: a full state dict into an FSDP model whose dim 0 (3) does not divide evenly
    full, m = nn.Linear(17, 3), nn.Linear(17, 3)
    fully_shard(m, mesh=mesh)
    m.load_state_dict(
        {
            k: distribute_tensor(v, mesh, m.state_dict()[k].placements)
            for k, v in full.state_dict().items()
        }
    )
    xf = torch.randn(2, 17)
    _eq(m(xf), full(xf).detach())
    return 1


def check_mesh_of_4(rank, world):
    import hyper_shard.checkpoint as hc
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    # #143372: R -> S(0) of (6, 4) on 4 ranks (2, 2, 2, 0 rows), then view(-1); (5, 4) too
    for n in (6, 5):
        x = torch.arange(n * 4.0).reshape(n, 4)
        d = DTensor.from_local(x, mesh, [Replicate()]).redistribute(mesh, [Shard(0)])
        _eq(d.view(-1), x.view(-1))
        _eq(d.reshape(2 * n, 2), x.reshape(2 * n, 2))
    # #179502: (12, 8) S(1) -> view(16, 6) needs a redistribution
    t = torch.randn(12, 8, generator=g)
    _eq(distribute_tensor(t, mesh, [Shard(1)]).view(16, 6), t.view(16, 6))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    # #161368 / #194457: 2-d uneven sharding (5, 3) [S(0), S(0)] -> [R, R] and back
    t2 = torch.arange(15.0).reshape(5, 3)
    d2 = distribute_tensor(t2, mesh2, [Shard(0), Shard(0)])
    _eq(d2.redistribute(mesh2, [Replicate(), Replicate()]).to_local(), t2)
    _eq(d2.redistribute(mesh2, [Shard(1), Shard(0)]), t2)
    # #166598: A [S(1), S(1)] @ B [S(0), S(0)] / [S(0), R] on the 2-d mesh
    A = torch.arange(16.0).view(4, 4)
    dA = distribute_tensor(A, mesh2, [Shard(1), Shard(1)])
    for pl in ([Shard(0), Shard(0)], [Shard(0), Replicate()], [Replicate(), Shard(0)]):
        _eq((dA @ distribute_tensor(A, mesh2, pl)).full_tensor(), A @ A)
    # #129206 / #129229: TP + FSDP2 on (dp, tp): full_tensor of parameters and gradients
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
    # #108869 / #150862: save (6,) and (5, 3) with empty shards (2, 2, 2, 0 / 2, 2, 1, 0),
    # load into other layouts, with hyper_shard.checkpoint and with DCP
    import torch.distributed.checkpoint as dcp

    base = [tempfile.mkdtemp(prefix="hs_regr_") if rank == 0 else None]
    dist.broadcast_object_list(base, src=0)
    a, b = torch.arange(6.0), torch.arange(15.0).reshape(5, 3)
    sd = {"a": distribute_tensor(a, mesh, [Shard(0)]), "b": distribute_tensor(b, mesh, [Shard(0)])}
    hc.save(sd, os.path.join(base[0], "hc"))
    dcp.save(sd, checkpoint_id=os.path.join(base[0], "dcp"))
    for pa, pb in (([Replicate()], [Shard(1)]), ([Shard(0)], [Replicate()])):
        for load in (
            lambda s: hc.load(s, os.path.join(base[0], "hc")),
            lambda s: dcp.load(s, checkpoint_id=os.path.join(base[0], "dcp")),
        ):
            tgt = {
                "a": distribute_tensor(torch.zeros(6), mesh, pa),
                "b": distribute_tensor(torch.zeros(5, 3), mesh, pb),
            }
            load(tgt)
            _eq(tgt["a"], a)
            _eq(tgt["b"], b)
    dist.barrier()
    return 1


def check_mesh_of_2(rank, world):
    return [check_values(rank, world), check_gradients(rank, world), check_modules(rank, world)]


def test_reports_mesh_of_2(dist2):
    assert dist2.run(check_mesh_of_2) == [[1, 1, 1]] * 2


def test_reports_mesh_of_4(dist4):
    assert dist4.run(check_mesh_of_4) == [1] * 4
