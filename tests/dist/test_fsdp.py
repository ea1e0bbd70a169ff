"""``hyper_shard.fsdp.fully_shard`` on 2 and 4 gloo ranks against the same model trained in
one process on the whole batch: the loss (mean over the data-parallel ranks), every
gradient's ``full_tensor()`` and every parameter after each of several AdamW steps.

Covered: FSDP on 2 ranks and HSDP on a (2, 2) mesh with uneven shapes (vocab 11, MLP width
5), tied weights inside one unit, frozen parameters, gradient accumulation with
``set_requires_gradient_sync(False)``, ``reshard_after_forward=False``, activation
checkpointing inside units, meta-device init through the RNG tracker, bf16 ``param_dtype``
with fp32 ``reduce_dtype`` (against the same mixed precision on one device), sharded and
full state dicts, one all-gather / reduce-scatter per unit, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.dist._fsdp_models import (
    assert_same_training,
    batches,
    make_net,
    train,
)

pytestmark = pytest.mark.multiproc


def _mean_over(group_size: int, group: object = None):  # noqa: ANN202
    def f(x: torch.Tensor) -> float:
        y = x.clone()
        dist.all_reduce(y, group=group)
        return float(y) / group_size

    return f


def _shard(model, mesh, **kw):  # noqa: ANN001, ANN202
    from hyper_shard.fsdp import fully_shard

    for b in model.blocks:
        fully_shard(b, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def check_fsdp_matches_single_process(rank, world):
    """FSDP (2 ranks) and HSDP ((2, 2) on 4 ranks): three AdamW steps; tied weights and
    frozen parameters in a second run."""
    from hyper_shard import DTensor, Replicate, Shard, init_device_mesh

    if world == 4:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        want = (Replicate(), Shard(0))
    else:
        mesh = init_device_mesh("cpu", (world,))
        want = (Shard(0),)
    data = batches(3, world)
    results = []
    for kw in ({}, {"tie": True}):
        ref = train(make_net(**kw), data, 0, 1)
        model = _shard(make_net(**kw), mesh)
        for _, p in model.named_parameters():
            assert isinstance(p, DTensor) and p.placements == want, p
        got = train(model, data, rank, world, mean_loss=_mean_over(world))
        assert_same_training(got, ref)
        if kw.get("tie"):
            assert model.head.weight is model.emb.weight
        for _, p in model.named_parameters():
            assert p.grad is None or p.grad.placements == want
        results.append(got["loss"])

    # frozen parameters (the norms) are gathered for forward but get no gradient
    def freeze(m):  # noqa: ANN001, ANN202
        for n, p in m.named_parameters():
            if "norm" in n:
                p.requires_grad_(False)
        return m

    ref = train(freeze(make_net()), data, 0, 1)
    got = train(freeze(_shard(make_net(), mesh)), data, rank, world, mean_loss=_mean_over(world))
    assert_same_training(got, ref)
    if world == 4:  # HSDP accumulation: reduce-scatter each micro-batch, all-reduce once
        model = _shard(make_net(), mesh)

        def all_reduce_last(k):  # noqa: ANN001, ANN202
            model.set_requires_all_reduce(k == 1)

        ref = train(make_net(), data[:2], 0, 1, micro=2)
        got = train(
            model,
            data[:2],
            rank,
            world,
            micro=2,
            before_micro=all_reduce_last,
            mean_loss=_mean_over(world),
        )
        assert_same_training(got, ref)
        counts = model._fsdp_state().comm.counts
        assert counts["reduce_scatter"] == 2 * 3 * 2 and counts["all_reduce"] == 3 * 2, counts
    return results


def test_fsdp_matches_single_process(dist2):
    out = dist2.run(check_fsdp_matches_single_process)
    assert out[0] == out[1]  # every rank reports the same mean loss


def test_hsdp_matches_single_process(dist4):
    out = dist4.run(check_fsdp_matches_single_process)
    assert all(o == out[0] for o in out)


def check_accumulation_and_options(rank, world):
    """Gradient accumulation over 2 micro-batches with ``set_requires_gradient_sync(False)``
    on the first (no collective in its backward), ``reshard_after_forward=False``,
    ``set_reshard_after_backward(False)``, and activation checkpointing inside the units:
    each equals the single-process run; collectives per step are counted."""
    from hyper_shard import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    data = batches(2, world, per_rank=4)
    ref = train(make_net(), data, 0, 1, micro=2)
    model = _shard(make_net(), mesh)
    counts = []

    def sync_last(k):  # noqa: ANN001, ANN202
        model.set_requires_gradient_sync(k == 1)
        if k == 1:
            counts.append(dict(model._fsdp_state().comm.counts))

    got = train(
        model, data, rank, world, micro=2, before_micro=sync_last, mean_loss=_mean_over(world)
    )
    assert_same_training(got, ref)
    # micro-batch 1 (no sync) ran 3 forward all-gathers + 2 backward ones (the root keeps
    # its parameters), no reduce-scatter
    first = counts[0]
    assert first.get("reduce_scatter", 0) == 0 and first["all_gather"] == 5, first
    total = model._fsdp_state().comm.counts
    # per step: 3 reduce-scatters (one per unit); all-gathers per micro-batch: 5 in the
    # first iteration, then 4: the last block ran last in the previous forward, so it keeps
    # its parameters after forward (reshard_after_forward=None), its backward being next
    assert total["reduce_scatter"] == 3 * len(data), total
    assert total["all_gather"] == 5 + 4 * (2 * len(data) - 1), total
    # the next unit's all-gather starts ahead of its hook (async on gloo): in forward from
    # the second pass on (the order of the pass before), in backward from the first
    assert total["prefetch_forward"] >= 1 and total["prefetch_backward"] >= 1, total

    ref1 = train(make_net(), data, 0, 1)
    for variant in ("keep", "no_reshard_backward", "checkpoint", "offload"):
        if variant == "checkpoint":
            model = _shard(make_net(checkpoint=True), mesh)
        elif variant == "offload":  # on a CPU mesh the shards already live on the host
            from hyper_shard.fsdp import CPUOffloadPolicy

            model = _shard(make_net(), mesh, offload_policy=CPUOffloadPolicy())
        else:
            model = _shard(make_net(), mesh, reshard_after_forward=variant != "keep")
            if variant == "no_reshard_backward":
                model.set_reshard_after_backward(False)
        got = train(model, data, rank, world, mean_loss=_mean_over(world))
        assert_same_training(got, ref1)
        if variant == "keep":  # nothing gathered again in backward: 3 per step
            assert model._fsdp_state().comm.counts["all_gather"] == 3 * len(data)
    # unsharded parameters kept past backward serve the next micro-batch's forward (no
    # all-gather) and are gathered again once the optimizer changed the shards
    model = _shard(make_net(), mesh)
    model.set_reshard_after_backward(False)
    got = train(model, data, rank, world, micro=2, mean_loss=_mean_over(world))
    assert_same_training(got, ref)
    # step 1: micro-batch 1: 3 forward + 2 backward all-gathers, micro-batch 2: 1 backward
    # (blocks[0]; blocks[1] kept its parameters as the last unit of the forward); then per
    # step 3 forward + 1 backward, and 1 backward
    assert model._fsdp_state().comm.counts["all_gather"] == 6 + 5 * (len(data) - 1)
    return True


def test_fsdp_accumulation_options_checkpointing(dist2):
    assert dist2.run(check_accumulation_and_options) == [True, True]


def _init_weights(m):  # noqa: ANN001, ANN202
    """The model's own init, as a user runs it after ``to_empty``."""
    from torch import nn

    for mod in m.modules():
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.5, 0.5)


def check_meta_init_mixed_precision_state_dict(rank, world):
    """Meta-device init (``to_empty`` then ``reset_parameters`` through the RNG tracker)
    equals the same init on one device; bf16 ``param_dtype`` / fp32 ``reduce_dtype``
    training equals the same mixed precision on one device at bf16 tolerance;
    ``state_dict()`` is sharded and ``load_state_dict`` takes sharded or full ones."""
    from hyper_shard import DTensor, init_device_mesh
    from hyper_shard.fsdp import MixedPrecisionPolicy
    from tests.dist._fsdp_models import TinyNet, train_mixed_reference

    mesh = init_device_mesh("cpu", (world,))
    data = batches(2, world)
    # ---- meta-device init
    with torch.device("meta"):
        ref = TinyNet()
    ref.to_empty(device="cpu")
    torch.manual_seed(3)
    _init_weights(ref)
    with torch.device("meta"):
        model = TinyNet()
    _shard(model, mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    _init_weights(model)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert isinstance(p, DTensor) and p.to_local().device.type == "cpu", n
        assert torch.equal(p.full_tensor(), q), n
    assert_same_training(
        train(model, data, rank, world, mean_loss=_mean_over(world)), train(ref, data, 0, 1)
    )
    # ---- mixed precision
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _shard(make_net(), mesh, mp_policy=mp)
    model.blocks[0].unshard(async_op=True).wait()
    assert model.blocks[0].up.weight.dtype == torch.bfloat16
    assert not isinstance(model.blocks[0].up.weight, DTensor)
    model.blocks[0].reshard()
    assert model.blocks[0].up.weight.dtype == torch.float32
    got = train(model, data, rank, world, lr=0.5, sgd=True, mean_loss=_mean_over(world))
    for _, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is None
    mref = train_mixed_reference(make_net(), data, lr=0.5)
    assert_same_training(got, mref, rtol=2e-2, atol=2e-3)
    # ---- state dicts
    model = _shard(make_net(), mesh)
    train(model, data[:1], rank, world)
    sd = model.state_dict()
    plain = make_net()
    assert list(sd) == list(plain.state_dict())
    for k, v in sd.items():
        assert isinstance(v, DTensor) and v.placements == model.get_parameter(k).placements, k
        assert v.to_local().shape[0] == -(-v.shape[0] // world) or rank == world - 1, k
    full = {k: v.full_tensor() for k, v in sd.items()}
    for source in (sd, full):  # sharded, then full tensors (every rank holds the value)
        other = _shard(make_net(seed=5), mesh)
        other.load_state_dict(source)
        for k, v in other.state_dict().items():
            assert torch.equal(v.full_tensor(), full[k]), k
        # it trains on from there exactly like the original
        a = train(other, data[1:], rank, world)
        b = train(model, data[1:], rank, world)
        assert_same_training(a, b, rtol=0, atol=0)
        model = _shard(make_net(), mesh)
        model.load_state_dict(full)
    model.blocks[0].unshard()
    assert isinstance(model.state_dict()["blocks.0.up.weight"], DTensor)  # resharded first
    plain.load_state_dict(full)
    return True


def test_fsdp_meta_init_mixed_precision_state_dict(dist2):
    assert dist2.run(check_meta_init_mixed_precision_state_dict) == [True, True]


def check_collectives_and_errors(rank, world):
    """The unit collectives as plain functions (no model), on a mesh whose coordinate
    order is not the backend's rank order; bad input raises on the ranks that see it,
    before any collective."""
    from hyper_shard import DeviceMesh, init_device_mesh
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.fsdp._collectives import (
        all_gather_unit,
        copy_out,
        reduce_scatter_unit,
        shard_views,
    )
    from hyper_shard.fsdp._layout import FlatLayout

    mesh = DeviceMesh("cpu", list(reversed(range(world))))  # coordinate c = rank world-1-c
    plat, group = mesh.platform, mesh._group(0)
    c = mesh.get_coordinate()[0]
    g = torch.Generator().manual_seed(0)
    full = [
        torch.randn(5, 3, generator=g),
        torch.randn(2, generator=g),
        torch.randn(7, 1, 2, generator=g),
    ]
    layout = FlatLayout([t.shape for t in full], world)
    shards = [t.chunk(world)[c] if c < len(t.chunk(world)) else t[:0] for t in full]
    res = all_gather_unit(plat, group, c, layout, shards, torch.float32, full[0])
    flat = res.wait()
    outs = [torch.empty(world * s.slot_numel) for s in layout.slots]
    copy_out(plat, layout, flat, outs)
    for t, o in zip(full, outs):
        assert torch.equal(o[: t.numel()].view(t.shape), t)
    grads = [(t * (rank + 1)).to(torch.bfloat16) for t in full]  # per-rank gradients
    red = reduce_scatter_unit(plat, group, layout, grads, torch.float32, full[0], "avg").wait()
    mean = [
        sum((t * (r + 1)).to(torch.bfloat16).float() for r in range(world)) / world for t in full
    ]
    for m, v, slot in zip(mean, shard_views(plat, layout, c, red), layout.slots):
        want = m[slot.row_start(c) : slot.row_start(c) + slot.rows[c]]
        torch.testing.assert_close(v.view(slot.shard_shape(c)), want)
    # a whole model on that mesh
    data = batches(2, world)
    model = _shard(make_net(), mesh)
    got = train(model, data, c, world, mean_loss=_mean_over(world))
    assert_same_training(got, train(make_net(), data, 0, 1))

    # ---- bad input
    dp = init_device_mesh("cpu", (world,))
    errors = []

    def expect(exc, words, fn):  # noqa: ANN001, ANN202
        with pytest.raises(exc) as info:
            fn()
        for w in words:
            assert w in str(info.value), (w, str(info.value))
        errors.append(type(info.value).__name__)

    net = make_net()
    fully_shard(net.blocks[0], mesh=dp)
    expect(ValueError, ["already applied"], lambda: fully_shard(net.blocks[0], mesh=dp))
    tied = make_net(tie=True)
    fully_shard(tied.emb, mesh=dp)
    expect(
        ValueError,
        ["Linear.weight", "Embedding.weight", "tied"],
        lambda: fully_shard(tied.head, mesh=dp),
    )
    top = make_net()
    fully_shard(top, mesh=dp)
    expect(ValueError, ["bottom-up"], lambda: fully_shard(top.blocks[1], mesh=dp))
    alone = DeviceMesh("cpu", [0])  # built by every rank; rank 0 only is in it
    if rank != 0:
        expect(
            ValueError, ["not in the mesh", str(rank)], lambda: fully_shard(make_net(), mesh=alone)
        )
    scalar = torch.nn.Module()
    scalar.s = torch.nn.Parameter(torch.tensor(1.0))
    expect(ValueError, ["0-d", "ignored_params"], lambda: fully_shard(scalar, mesh=dp))
    expect(
        NotImplementedError,
        ["smaller mesh"],
        lambda: fully_shard(make_net(), mesh=dp, reshard_after_forward=2),
    )
    from tests.dist._fsdp_models import TinyNet

    with torch.device("meta"):
        lazy = TinyNet()
    _shard(lazy, dp)
    ids = torch.zeros(1, 3, dtype=torch.long)
    expect(RuntimeError, ["meta device", "to_empty"], lambda: lazy(ids))
    return errors


def test_fsdp_collectives_and_errors(dist2):
    out = dist2.run(check_collectives_and_errors)
    assert len(out[0]) == 6 and len(out[1]) == 7  # rank 1 is not in the one-rank mesh


class _Twice(torch.nn.Module):
    """A unit (``a``) called twice in one forward, in the ways autograd orders its
    backward differently; its inputs require grad through the root's ``scale``."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.a = torch.nn.Linear(5, 5)
        self.b = torch.nn.Linear(5, 1)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 5).view(1, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        if self.mode == "sum":  # both calls' gradients arrive together
            h = self.a(x) + self.a(2 * x)
        elif self.mode == "nested":  # the outer call's backward runs first
            h = self.a(torch.tanh(self.a(x)))
        elif self.mode == "first_no_grad":  # one call has no post-backward hook
            h = self.a(x.detach()) + self.a(x)
        else:
            h = self.a(x) + self.a(x.detach())
        return self.b(h)


def check_unit_called_twice(rank, world):
    """A unit called twice in one forward (as FSDP2 supports): two SGD steps, every
    gradient and parameter against one process on the whole batch, with and without
    ``reshard_after_forward``; one reduce-scatter per unit and step when every call's
    input requires grad."""
    from hyper_shard import init_device_mesh
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(4 * world, 5, generator=g) for _ in range(2)]
    done = []
    for mode in ("sum", "nested", "first_no_grad", "last_no_grad"):
        for raf in (True, False):
            torch.manual_seed(0)
            ref = _Twice(mode)
            torch.manual_seed(0)
            model = _Twice(mode)
            fully_shard(model.a, mesh=mesh, reshard_after_forward=raf)
            fully_shard(model, mesh=mesh)
            opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in data:
                ref(x).pow(2).mean().backward()
                model(x.chunk(world)[rank]).pow(2).mean().backward()
                for (n, p), q in zip(model.named_parameters(), ref.parameters()):
                    torch.testing.assert_close(
                        p.grad.full_tensor(), q.grad, msg=f"{mode} {raf} grad {n}"
                    )
                opt_ref.step()
                opt.step()
                opt_ref.zero_grad()
                opt.zero_grad()
                for (n, p), q in zip(model.named_parameters(), ref.parameters()):
                    torch.testing.assert_close(p.full_tensor(), q, msg=f"{mode} {raf} param {n}")
            if mode in ("sum", "nested"):
                counts = model._fsdp_state().comm.counts
                assert counts["reduce_scatter"] == 2 * len(data), (mode, raf, counts)
            done.append((mode, raf))
    return done


def test_fsdp_unit_called_twice_in_forward(dist2):
    out = dist2.run(check_unit_called_twice)
    assert out[0] == out[1] and len(out[0]) == 8


def check_no_grad_forward_first(rank, world):
    """A no_grad forward (an eval pass) before the optimizer is built: the module's
    parameters are the sharded DTensors afterwards, and two SGD steps equal one process
    (FSDP2 leaves the root unsharded there, and the optimizer steps copies)."""
    from hyper_shard import DTensor, init_device_mesh
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * world, 5, generator=g), torch.randn(4 * world, 1, generator=g)

    def make():  # noqa: ANN202
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 1))

    ref, model = make(), make()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    with torch.no_grad():
        model(x[:2])
    assert all(isinstance(p, DTensor) for p in model.parameters())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        torch.nn.functional.mse_loss(ref(x), y).backward()
        torch.nn.functional.mse_loss(model(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        opt_ref.step()
        opt.step()
        opt_ref.zero_grad()
        opt.zero_grad()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.full_tensor(), q, msg=f"param {n}")
    return True


def test_fsdp_no_grad_forward_before_optimizer(dist2):
    assert dist2.run(check_no_grad_forward_first) == [True, True]


def check_profiler_ranges(rank, world):
    """Every collective of a training step runs inside an FSDP profiler range named as
    FSDP2 names them (``FSDP::all_gather``, ``FSDP::reduce_scatter``), and the forward
    prefetch is issued ahead: the root's pre-forward issues its own all-gather and the
    next unit's before waiting (two all-gathers inside one ``FSDP::pre_forward``)."""
    from torch.profiler import ProfilerActivity, profile

    from hyper_shard import init_device_mesh
    from tests.dist._fsdp_models import loss_of

    mesh = init_device_mesh("cpu", (world,))
    model = _shard(make_net(), mesh)
    data = batches(2, world)
    train(model, data[:1], rank, world)  # the forward order of an iteration
    ids, y = data[1][0].chunk(world)[rank], data[1][1].chunk(world)[rank]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss_of(model(ids), y).backward()
    names: dict[str, int] = {}
    outside = []
    gathers_per_pre_forward = []

    def gathers_in(e) -> int:  # noqa: ANN001
        own = e.name == "c10d::_allgather_base_"
        return int(own) + sum(gathers_in(c) for c in e.children)

    stack = [(e, ()) for e in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        e, path = stack.pop()
        stack.extend((c, (*path, e.name)) for c in e.children)
        if e.name.startswith("FSDP::"):
            names[e.name] = names.get(e.name, 0) + 1
        if e.name == "FSDP::pre_forward":
            gathers_per_pre_forward.append(gathers_in(e))
        if e.name in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_"):
            if not any(p in ("FSDP::all_gather", "FSDP::reduce_scatter") for p in path):
                outside.append((e.name, path))
    assert not outside, outside
    for want in ("FSDP::all_gather", "FSDP::reduce_scatter", "FSDP::post_forward"):
        assert names.get(want, 0) >= 1, (want, names)
    return sorted(gathers_per_pre_forward, reverse=True)[:2]


def test_fsdp_profiler_ranges_name_every_collective(dist2):
    out = dist2.run(check_profiler_ranges)
    # the root's pre-forward: its own all-gather and blocks[0]'s; blocks[0]'s: blocks[1]'s
    assert out == [[2, 1], [2, 1]], out
