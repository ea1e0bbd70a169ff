"""FSDP over tensor parallelism on a ("dp", "tp") = (2, 2) mesh (4 gloo ranks):
``parallelize_module(model, mesh["tp"], plan)`` then ``fully_shard(block, mesh=mesh["dp"])``
against the same model trained in one process on the whole batch.

Column-parallel weights and the vocab-parallel embedding/head are ``Shard(0)`` on tp and
sharded again along dim 0 over dp: tp splits first (``shard_order`` ``0: [1, 0]``), so the
2-D DTensor keeps the true global element order — every gradient's and parameter's
``full_tensor()``, ``redistribute``, the optimizer's foreach ops, ``clip_grad_norm_``, meta
init through the RNG tracker and full/sharded state dicts are exact. Shapes are uneven
(vocab 11, MLP width 5)."""

from __future__ import annotations

import pytest
import torch

from tests.dist._fsdp_models import TinyNet, assert_same_training, batches, make_net, train
from tests.dist.test_fsdp import _init_weights, _mean_over, _shard

pytestmark = pytest.mark.multiproc


def _plan(hp, Replicate):  # noqa: ANN001, ANN202, N803
    return {
        "emb": hp.RowwiseParallel(input_layouts=Replicate()),
        "blocks.*.up": hp.ColwiseParallel(),
        "blocks.*.down": hp.RowwiseParallel(),
        "head": hp.ColwiseParallel(output_layouts=Replicate()),
    }


def check_fsdp_tp(rank, world, hsdp):
    from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    if hsdp:  # 4 ranks: ("rep", "shard", "tp") = (2, 1, 2), the HSDP mesh composed with tp
        mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("rep", "shard", "tp"))
        dp_mesh = mesh[("rep", "shard")]
        dp_rank = mesh.get_coordinate()[0]
        dp_group = dp_mesh.get_group("rep")
    else:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dp_mesh = mesh["dp"]
        dp_rank = mesh.get_coordinate()[0]
        dp_group = dp_mesh.get_group()
    data = batches(2, 2)
    ref_model = make_net()
    ref = train(ref_model, data, 0, 1)
    model = make_net()
    hp.parallelize_module(model, mesh["tp"], _plan(hp, Replicate))
    _shard(model, dp_mesh)
    w = model.blocks[0].up.weight
    assert w.device_mesh == mesh and w.placements[-1] == Shard(0)
    if not hsdp:
        assert w._spec.split_order(0) == (1, 0)
    got = train(model, data, dp_rank, 2, mean_loss=_mean_over(2, dp_group))
    assert_same_training(got, ref)
    if hsdp:
        return got["loss"]
    # ---- FSDP along dim 1 (shard_placement_fn) over tensor parallelism
    m1 = make_net()
    hp.parallelize_module(m1, mesh["tp"], _plan(hp, Replicate))
    _shard(m1, dp_mesh, shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 else None)
    up, down = m1.blocks[0].up.weight, m1.blocks[0].down.weight
    assert up.placements == (Shard(1), Shard(0)), up.placements  # colwise: rows over tp
    assert down.placements == (Shard(1), Shard(1)), down.placements  # rowwise: both on dim 1
    assert_same_training(train(m1, data, dp_rank, 2, mean_loss=_mean_over(2, dp_group)), ref)

    # ---- the ordered layout through DTensor ops
    params = dict(model.named_parameters())
    assert all(isinstance(q, DTensor) for q in params.values())
    for name in ("emb.weight", "blocks.1.up.weight", "head.weight"):
        q = params[name]
        full = q.full_tensor()
        for target in ([Replicate(), Shard(0)], [Shard(1), Shard(0)], [Shard(0), Shard(0)]):
            moved = q.redistribute(q.device_mesh, target)
            assert torch.equal(moved.full_tensor(), full), (name, target)
        assert torch.equal((q * 2 + 1).full_tensor(), full * 2 + 1)
        assert torch.equal(torch.zeros_like(q).full_tensor(), torch.zeros_like(full))
        torch.testing.assert_close(q.sum(0).full_tensor(), full.sum(0), rtol=1e-5, atol=1e-6)
    # clip_grad_norm_ over the 2-D parameters (one mesh), against the same on one device
    ids, y = data[0]
    from tests.dist._fsdp_models import loss_of

    ref_model.zero_grad()
    loss_of(ref_model(ids), y).backward()
    loss_of(model(ids.chunk(2)[dp_rank]), y.chunk(2)[dp_rank]).backward()
    names = [n for n, p in model.named_parameters() if p.device_mesh == mesh]
    rparams = dict(ref_model.named_parameters())
    nr = torch.nn.utils.clip_grad_norm_([rparams[n] for n in names], 0.05)
    nt = torch.nn.utils.clip_grad_norm_([params[n] for n in names], 0.05)
    torch.testing.assert_close(nt.full_tensor(), nr, rtol=1e-5, atol=1e-6)
    for n in names:
        torch.testing.assert_close(
            params[n].grad.full_tensor(), rparams[n].grad, rtol=1e-5, atol=1e-6
        )
    # ---- state dicts: sharded and full round trips, and meta-device init
    sd = model.state_dict()
    full = {k: v.full_tensor() for k, v in sd.items()}
    for source in (sd, full):
        other = make_net(seed=7)
        hp.parallelize_module(other, mesh["tp"], _plan(hp, Replicate))
        _shard(other, dp_mesh)
        other.load_state_dict(source)
        for k, v in other.state_dict().items():
            assert v._spec == sd[k]._spec, (k, v._spec, sd[k]._spec)
            assert torch.equal(v.full_tensor(), full[k]), (k, type(source[k]).__name__)
    with torch.device("meta"):
        lazy = TinyNet()
    hp.parallelize_module(lazy, mesh["tp"], _plan(hp, Replicate), src_data_rank=None)
    _shard(lazy, dp_mesh)
    lazy.to_empty(device="cpu")
    torch.manual_seed(3)
    _init_weights(lazy)
    with torch.device("meta"):
        one = TinyNet()
    one.to_empty(device="cpu")
    torch.manual_seed(3)
    _init_weights(one)
    for (n, p), q in zip(lazy.named_parameters(), one.parameters()):
        assert p._spec == params[n]._spec, n
        assert torch.equal(p.full_tensor(), q), n
    assert_same_training(
        train(lazy, data[:1], dp_rank, 2, mean_loss=_mean_over(2, dp_group)),
        train(one, data[:1], 0, 1),
    )
    return got["loss"]


@pytest.mark.parametrize("hsdp", [False, True], ids=["fsdp_tp", "hsdp_tp"])
def test_fsdp_over_tensor_parallel_matches_single_process(dist4, hsdp):
    out = dist4.run(check_fsdp_tp, hsdp)
    assert all(o == out[0] for o in out)


def check_fsdp_tp_on_torch_mesh(rank, world):
    """Code written for FSDP2 x TP with its imports switched: the ("dp", "tp") mesh is
    torch's ``init_device_mesh``; ``mesh["tp"]`` and ``mesh["dp"]`` (torch sub-meshes) go to
    ``parallelize_module`` and ``fully_shard`` as they are, and compose into one 2-D mesh.
    Also: each original parameter is told apart from another unit's whose address it
    reuses once freed (no false "shared with ... of another unit")."""
    from torch.distributed.device_mesh import init_device_mesh

    from hyper_shard import Replicate, Shard
    from hyper_shard import parallel as hp

    tmesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = tmesh["dp"].get_local_rank()
    data = batches(2, 2)
    ref = train(make_net(), data, 0, 1)
    model = make_net()
    hp.parallelize_module(model, tmesh["tp"], _plan(hp, Replicate))
    _shard(model, tmesh["dp"])
    w = model.blocks[0].up.weight
    assert w.device_mesh.mesh_dim_names == ("dp", "tp"), w.device_mesh
    assert w.placements == (Shard(0), Shard(0)), w.placements
    got = train(model, data, dp_rank, 2, mean_loss=_mean_over(2, tmesh["dp"].get_group()))
    assert_same_training(got, ref)
    # clip_grad_norm_ over parameters on two meshes (the 2-D TP ones, the 1-D dp ones):
    # docs/fsdp.md's recipe, against clip_grad_norm_ on one device
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    from tests.dist._fsdp_models import loss_of

    one = make_net()  # the trained parameters, in one process
    one.load_state_dict({k: v.full_tensor() for k, v in model.state_dict().items()})
    ids, y = data[0]
    loss_of(one(ids), y).backward()
    loss_of(model(ids.chunk(2)[dp_rank]), y.chunk(2)[dp_rank]).backward()
    groups: dict = {}
    for p in model.parameters():
        groups.setdefault(p.device_mesh, []).append(p)
    assert len(groups) == 2
    norms = [get_total_norm([p.grad for p in ps]).full_tensor() for ps in groups.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for ps in groups.values():
        clip_grads_with_norm_(ps, 0.05, total)
    want = torch.nn.utils.clip_grad_norm_(one.parameters(), 0.05)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(model.named_parameters(), one.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-6, msg=n)
    # plain FSDP on a 1-D torch mesh
    flat = init_device_mesh("cpu", (world,))
    m1 = make_net()
    _shard(m1, flat)
    assert_same_training(train(m1, data, rank, world, mean_loss=_mean_over(world)), ref)
    return got["loss"]


def test_fsdp_over_tensor_parallel_on_torch_mesh(dist4):
    out = dist4.run(check_fsdp_tp_on_torch_mesh)
    assert all(o == out[0] for o in out)


def check_fsdp_tp_flattened_dp(rank, world):
    """torchtitan's FSDP x TP x CP meshes: FSDP over a flattened ``("dp_shard", "cp")`` mesh
    composed with ``mesh["tp"]`` into one 2-D mesh, on hyper_shard's mesh (2, 1, 2): the
    flattened dim merges two root dims; and on torch's ``init_device_mesh`` (1, 2, 2)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    from hyper_shard import Replicate, init_device_mesh
    from hyper_shard import parallel as hp

    data = batches(2, 2)
    ref = train(make_net(), data, 0, 1)
    names = ("dp_shard", "cp", "tp")
    out = []
    for mesh in (init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=names),
                 torch_mesh("cpu", (1, 2, 2), mesh_dim_names=names)):  # fmt: skip
        dp = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        model = make_net()
        hp.parallelize_module(model, mesh["tp"], _plan(hp, Replicate))
        _shard(model, mesh["dp_shard_cp"])
        w = model.blocks[0].up.weight
        assert w.device_mesh.ndim == 2 and w.device_mesh.shape == (2, 2), w.device_mesh
        dp_rank = dp.get_local_rank()
        got = train(model, data, dp_rank, 2, mean_loss=_mean_over(2, dp.get_group()))
        assert_same_training(got, ref)
        out.append(got["loss"])
    return out


def test_fsdp_over_tensor_parallel_flattened_dp_mesh(dist4):
    out = dist4.run(check_fsdp_tp_flattened_dp)
    assert all(o == out[0] for o in out)


def check_hsdp_tp_flattened_shard(rank, world):
    """torchtitan's HSDP x TP x CP meshes: ``mesh["rep", "shard_cp"]`` (a slice naming a
    flattened dim, as PyTorch) as the HSDP mesh over ``mesh["tp"]``, on hyper_shard's mesh
    (2, 1, 1, 2) and on torch's (1, 2, 1, 2)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    from hyper_shard import Replicate, init_device_mesh
    from hyper_shard import parallel as hp

    data = batches(2, 2)
    ref = train(make_net(), data, 0, 1)
    names = ("rep", "shard", "cp", "tp")
    out = []
    for mesh in (init_device_mesh("cpu", (2, 1, 1, 2), mesh_dim_names=names),
                 torch_mesh("cpu", (1, 2, 1, 2), mesh_dim_names=names)):  # fmt: skip
        mesh["shard", "cp"]._flatten("shard_cp")
        dp = mesh["rep", "shard_cp"]
        model = make_net()
        hp.parallelize_module(model, mesh["tp"], _plan(hp, Replicate))
        _shard(model, dp)
        w = model.blocks[0].up.weight
        assert w.device_mesh.shape == (*dp.shape, 2), w.device_mesh  # (rep, shard_cp, tp)
        c = dp.get_coordinate()
        group = dp.get_group(0) if dp.shape[0] == 2 else dp.get_group(1)
        got = train(model, data, c[0] * dp.shape[1] + c[1], 2, mean_loss=_mean_over(2, group))
        assert_same_training(got, ref)
        out.append(got["loss"])
    return out


def test_hsdp_over_tensor_parallel_flattened_shard_mesh(dist4):
    out = dist4.run(check_hsdp_tp_flattened_shard)
    assert all(o == out[0] for o in out)
