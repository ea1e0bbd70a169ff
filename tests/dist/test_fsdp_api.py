"""FSDP2's ``FSDPModule`` knobs and module-level helpers on ``hyper_shard.fsdp`` (2 gloo
ranks), each against the same model trained in one process on the whole batch:
``set_gradient_divide_factor``, ``set_force_sum_reduction_for_comms``,
``set_all_reduce_hook``, ``set_unshard_in_backward``, ``set_reduce_scatter_unused_params``
(ranks using different blocks), ``set_reduce_scatter_max_input_buffers``,
``register_fsdp_forward_method``, ``reset_iter_state`` after a forward that raised,
``share_comm_ctx``, units of several modules (``fully_shard([norm, head])``),
``shard_placement_fn`` (parameters sharded along dim 1), and the forms that are refused
with a clear error."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.dist._fsdp_models import (
    TinyNet,
    assert_same_training,
    batches,
    loss_of,
    make_net,
    train,
)
from tests.dist.test_fsdp import _mean_over, _shard

pytestmark = pytest.mark.multiproc


def _units(model):  # noqa: ANN001, ANN202
    from hyper_shard.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _step0_grads(model, data, rank, world):  # noqa: ANN001, ANN202
    return train(model, data[:1], rank, world, sgd=True)["grads"][0]


def _check_scaled(got, ref, factor):  # noqa: ANN001, ANN202
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        torch.testing.assert_close(
            g, r * factor, rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"{i} {m}"
        )


def _norm_only(block, x):  # noqa: ANN001, ANN202
    return x + block.norm(x)


def _skip_mlp(net, i):  # noqa: ANN001, ANN202
    """Rank-dependent control flow: block ``i`` runs its norm but not its MLP (the MLP's
    parameters get no gradient on this rank)."""
    b = net.blocks[i]
    b.forward = functools.partial(_norm_only, b)
    return net


class _Branchy(TinyNet):
    def last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """A second entry point using the root's own parameters (emb, norm, head)."""
        return self.head(self.norm(self.emb(ids)))[:, -1]


def _steps(model, opt, data, rank, world):  # noqa: ANN001, ANN202
    for ids, y in data:
        loss_of(model(ids.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        opt.step()
        opt.zero_grad()


def check_fsdp_api(rank, world, ckpt):
    from hyper_shard import DTensor, init_device_mesh
    from hyper_shard.fsdp import (
        DataParallelMeshDims,
        fully_shard,
        register_fsdp_forward_method,
        share_comm_ctx,
    )

    mesh = init_device_mesh("cpu", (world,))
    data = batches(3, world)
    ref = train(make_net(), data, 0, 1)
    ref_g0 = _step0_grads(make_net(), data, 0, 1)
    mean = _mean_over(world)

    # ---- divide factor 1: the sum over the ranks instead of the mean
    model = _shard(make_net(), mesh)
    for m in _units(model):
        m.set_gradient_divide_factor(1.0)
    _check_scaled(_step0_grads(model, data, rank, world), ref_g0, float(world))
    with pytest.warns(FutureWarning):
        model.set_reduce_scatter_divide_factor(2.0)
    with pytest.raises(ValueError, match="positive"):
        model.set_gradient_divide_factor(0)

    # ---- sum-only collectives, and two reductions in flight: the same training
    model = _shard(make_net(), mesh)
    for m in _units(model):
        m.set_force_sum_reduction_for_comms(True)
    model.set_reduce_scatter_max_input_buffers(2)
    assert_same_training(train(model, data, rank, world, mean_loss=mean), ref)

    # ---- the all-reduce hook sees each unit's reduced buffer once per backward
    model = _shard(make_net(), mesh)
    seen = []

    def hook(t: torch.Tensor) -> None:
        assert type(t) is torch.Tensor and t.dim() == 1
        seen.append(t.numel())
        t.mul_(3)  # lands in the gradients

    for m in _units(model):
        m.set_all_reduce_hook(hook)
    _check_scaled(_step0_grads(model, data, rank, world), ref_g0, 3.0)
    assert len(seen) == 3, seen  # two blocks and the root
    with pytest.raises(NotImplementedError, match="stream"):
        model.set_all_reduce_hook(hook, stream=object())
    with pytest.raises(ValueError, match="callable"):
        model.set_all_reduce_hook(3)

    # ---- an embedding unit whose backward needs no parameter is not gathered again
    model = make_net()
    fully_shard(model.emb, mesh=mesh)
    _shard(model, mesh)
    model.emb.set_unshard_in_backward(False)
    got = train(model, data, rank, world, mean_loss=mean)
    assert_same_training(got, ref)
    gathers = model._fsdp_state().comm.counts["all_gather"]
    model2 = make_net()
    fully_shard(model2.emb, mesh=mesh)
    _shard(model2, mesh)
    train(model2, data, rank, world)
    assert gathers < model2._fsdp_state().comm.counts["all_gather"], gathers

    # ---- ranks that run different blocks: zeros joined for the unused parameters
    torch.manual_seed(0)
    plain = [make_net() for _ in range(world)]
    _skip_mlp(plain[1], 1)
    ids, y = data[0]
    for r, p in enumerate(plain):
        loss_of(p(ids.chunk(world)[r]), y.chunk(world)[r]).backward()
    want = [
        sum(q.grad if q.grad is not None else torch.zeros_like(q) for q in qs) / world
        for qs in zip(*(p.parameters() for p in plain))
    ]
    from hyper_shard.debug import check_consistency
    from hyper_shard.errors import DivergenceError

    model = make_net()
    if rank == 1:
        _skip_mlp(model, 1)
    _shard(model, mesh)
    # without the setting the ranks' reduce-scatters differ: the consistency mode names
    # the unit, its parameters on each rank and the fix, on every rank, before it runs
    with check_consistency(), pytest.raises(DivergenceError) as err:
        loss_of(model(ids.chunk(world)[rank]), y.chunk(world)[rank]).backward()
    msg = str(err.value)
    assert "'blocks.1'" in msg and "set_reduce_scatter_unused_params(True)" in msg, msg
    assert "6 parameters: norm.weight, norm.bias, up.weight" in msg, msg  # rank 0
    model.reset_iter_state()
    model.set_reduce_scatter_unused_params(True)
    loss_of(model(ids.chunk(world)[rank]), y.chunk(world)[rank]).backward()
    for (n, p), w in zip(model.named_parameters(), want):
        torch.testing.assert_close(p.grad.full_tensor(), w, msg=lambda m, n=n: f"{n}: {m}")

    # ---- another forward method gathers the root's parameters around it
    model = make_net()
    model.__class__ = _Branchy
    _shard(model, mesh)
    register_fsdp_forward_method(model, "last_logits")
    register_fsdp_forward_method(make_net(), "forward")  # not an FSDP module: a no-op
    with pytest.raises(ValueError, match="does not have a method"):
        register_fsdp_forward_method(model, "generate")
    plain = make_net()
    plain.__class__ = _Branchy
    with torch.no_grad():
        got = model.last_logits(ids)
    torch.testing.assert_close(got, plain.last_logits(ids))
    assert all(isinstance(p, DTensor) for p in model.parameters())  # resharded after it
    out = model.last_logits(ids)  # with grad: the backward reduces the root's gradients
    out.pow(2).mean().backward()
    plain.last_logits(ids).pow(2).mean().backward()
    for (n, p), q in zip(model.named_parameters(), plain.parameters()):
        if q.grad is not None:
            # every rank ran the whole batch: the mean over ranks is the plain gradient
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=lambda m, n=n: n + m)

    # ---- reset_iter_state after a forward that raised mid-way: training goes on exactly
    model = _shard(make_net(), mesh)
    train(model, data[:1], rank, world)  # lazy init, one step
    ref2 = make_net()
    train(ref2, data[:1], 0, 1)

    def boom(*_a):  # noqa: ANN002, ANN202
        raise RuntimeError("injected")

    h = model.blocks[1].register_forward_pre_hook(boom)
    ids0, y0 = data[1]
    with pytest.raises(RuntimeError, match="injected"):
        loss_of(model(ids0.chunk(world)[rank]), y0.chunk(world)[rank]).backward()
    h.remove()
    with pytest.raises(RuntimeError, match="not the root"):
        model.blocks[0].reset_iter_state()
    model.reset_iter_state()
    assert all(isinstance(p, DTensor) for p in model.parameters())
    # the optimizer is new in train(): compare with a reference that also restarts it
    got = train(model, data[1:], rank, world, mean_loss=mean)
    assert_same_training(got, train(ref2, data[1:], 0, 1))

    # ---- one unit of several modules: adjacent ones, and the two ends of the model
    for names, raf in ((("norm", "head"), True), (("emb", "head"), True), (("emb", "head"), False)):
        model = make_net()
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        group = [getattr(model, n) for n in names]
        assert fully_shard(group, mesh=mesh, reshard_after_forward=raf) is group
        fully_shard(model, mesh=mesh)
        st = group[0]._fsdp_state()
        assert group[1]._fsdp_state() is st and len(st.group.params) == 3 - (names[0] == "emb")
        assert_same_training(train(model, data, rank, world, mean_loss=mean), ref)
        assert all(isinstance(p, DTensor) for p in model.parameters())
    with pytest.raises(ValueError, match="listed twice"):
        fully_shard([model.norm, model.norm], mesh=mesh)
    with pytest.raises(ValueError, match="non-empty"):
        fully_shard([], mesh=mesh)

    # ---- shard_placement_fn: matrices sharded along dim 1 (uneven: down is 6 x 5)
    from hyper_shard import Shard

    def by_columns(p):  # noqa: ANN001, ANN202
        return Shard(1) if p.dim() == 2 else None

    for fn in (by_columns, lambda p: Shard(-1)):
        model = _shard(make_net(), mesh, shard_placement_fn=fn)
        for n, p in model.named_parameters():
            want = Shard(1) if p.dim() == 2 else Shard(0)  # Shard(-1) is normalized
            assert p.placements == (want,), (n, p.placements)
        down = model.blocks[0].down.weight
        assert down.to_local().shape == ((6, 3) if rank == 0 else (6, 2)), down.to_local().shape
        assert_same_training(train(model, data, rank, world, mean_loss=mean), ref)
        for n, p in model.named_parameters():
            assert p.grad is None or p.grad.placements == p.placements, n
    sd = {k: v.full_tensor() for k, v in model.state_dict().items()}
    other = _shard(make_net(seed=4), mesh, shard_placement_fn=by_columns)
    other.load_state_dict(sd)
    for k, v in other.state_dict().items():
        assert torch.equal(v.full_tensor(), sd[k]), k
    # a dim-1 checkpoint (model and AdamW state) resumes on dim-0 FSDP, as one process would
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import hyper_shard.checkpoint as hc

    plain = make_net()
    popt = torch.optim.AdamW(plain.parameters(), lr=0.05, weight_decay=0.01)
    _steps(plain, popt, data, 0, 1)
    model = _shard(make_net(), mesh, shard_placement_fn=by_columns)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    _steps(model, opt, data[:2], rank, world)
    msd, osd = get_state_dict(model, opt)
    hc.save({"model": msd, "optim": osd}, ckpt)
    model = _shard(make_net(seed=9), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    hc.load(state, ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    _steps(model, opt, data[2:], rank, world)
    for (n, p), q in zip(model.named_parameters(), plain.parameters()):
        assert p.placements == (Shard(0),), n
        torch.testing.assert_close(
            p.full_tensor(), q, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: n + m
        )
    with pytest.raises(TypeError, match="Shard"):
        fully_shard(make_net(), mesh=mesh, shard_placement_fn=lambda p: "rows")
    with pytest.raises(ValueError, match="Shard"):
        fully_shard(make_net(), mesh=mesh, shard_placement_fn=lambda p: Shard(p.dim()))

    # ---- share_comm_ctx, the CUDA-only knobs and the refused forms
    share_comm_ctx(_units(model))
    with pytest.raises(ValueError, match="not a fully_shard module"):
        share_comm_ctx([torch.nn.Linear(2, 2)])
    model.set_allocate_memory_from_process_group_for_comm(True)
    model.set_separate_reduce_scatter_group(True)
    for name in ("set_symm_mem_for_comm", "set_custom_all_gather", "set_custom_reduce_scatter"):
        with pytest.raises(NotImplementedError):
            getattr(model, name)(*(() if name == "set_symm_mem_for_comm" else (None,)))
    with pytest.raises(NotImplementedError, match="mesh=spmd_mesh"):
        fully_shard(make_net(), mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    assert DataParallelMeshDims(shard=("a", "b")).shard_names == ("a", "b")
    return True


def test_fsdp2_module_api(dist2, tmp_path):
    assert dist2.run(check_fsdp_api, str(tmp_path / "ckpt")) == [True, True]
