"""Public bug reports on FSDP (``hyper_shard.fsdp.fully_shard``, docs/fsdp.md), each
replaying the report's program on 2 real gloo ranks against the same module in one
process: outputs, every gradient's ``full_tensor()`` and the units' sharded state (each
``report_*`` names its report; ``report_*_regressions`` in test_fsdp_regressions.py)."""

from __future__ import annotations

import copy
from collections import namedtuple

import pytest
import torch
import torch.nn as nn

from hyper_shard import DTensor, distribute_tensor, init_device_mesh
from hyper_shard.fsdp import MixedPrecisionPolicy, fully_shard
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _eq(got, ref, **kw):
    torch.testing.assert_close(got, ref, **(kw or {"rtol": 1e-5, "atol": 1e-6}))


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))


def _shard_mlp(m, mesh, **kw):
    units = [m[0], m[2], m]
    for u in units:
        fully_shard(u, mesh=mesh, **kw)
    return units


def _unsharded(units):
    return [u._fsdp_state().group.unsharded for u in units]


def _grads_equal(m, ref, **kw):
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert p.grad is not None, name
        _eq(_full(p.grad), q.grad, **kw)


def report_root_reshard_after_forward(rank, world):
    """#154655 / PR #154704: ``fully_shard(root, reshard_after_forward=True)`` kept the
    root's parameters unsharded after forward (multi-root models: CLIP, T5, FLUX); the
    default (None) and False keep them for the backward to come."""
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    for raf in (True, None, False):
        m = _mlp()
        ref = copy.deepcopy(m)
        fully_shard(m, mesh=mesh, reshard_after_forward=raf)
        out = m(x)
        assert _unsharded([m]) == [raf is not True], raf
        out.sum().backward()
        ref(x).sum().backward()
        _eq(out, ref(x))
        _grads_equal(m, ref)


def report_checkpointed_root_with_mixed_precision(rank, world):
    """#150140: ``checkpoint(model, x)`` over an FSDP root with a nested unit and a bf16
    ``MixedPrecisionPolicy``: a dtype error in the recomputed forward. Here the recompute
    (inside backward, before the nested unit's own backward began) tracked a call that
    never completed: the unit stayed unsharded and its module showed the unsharded
    parameters, without gradients. fp32 (exact, reentrant too) and bf16."""
    from torch.utils.checkpoint import checkpoint

    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    for mp, reentrant in ((None, False), (None, True), (torch.bfloat16, False)):
        m = _mlp()
        ref = copy.deepcopy(m)
        policy = MixedPrecisionPolicy(param_dtype=mp, reduce_dtype=torch.float32)
        units = _shard_mlp(m, mesh, mp_policy=policy)
        xi = x.clone().requires_grad_(reentrant)  # the reentrant form needs an input that does
        for _ in range(2):
            out = checkpoint(m, xi, use_reentrant=reentrant)
            out.float().sum().backward()
        assert not any(_unsharded(units[:2])), reentrant
        r = ref if mp is None else copy.deepcopy(ref).to(mp)
        for _ in range(2):
            r(x.to(r[0].weight.dtype)).float().sum().backward()
        tol = {} if mp is None else {"rtol": 3e-2, "atol": 3e-2}
        _eq(out.float(), r(x.to(r[0].weight.dtype)).float().detach(), **tol)
        for p, q in zip(m.parameters(), r.parameters()):
            _eq(_full(p.grad).float(), q.grad.float(), **tol)


def report_unit_whose_parameters_are_unused(rank, world):
    """#83107: a unit whose parameters forward does not use (it returns its inputs, a
    namedtuple of tensors requiring grad) crashed in backward; twice, gradients of the
    inputs right and none for the parameters."""
    mesh = init_device_mesh("cpu", (world,))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def forward(self, x):
            return x

    m = M()
    fully_shard(m, mesh=mesh)
    t = torch.ones(1, requires_grad=True)
    Out = namedtuple("Out", ["a", "b", "c", "d"], defaults=(t, t, t, t))
    for step in (1, 2):
        torch.cat(list(m(Out()))).sum().backward()
        _eq(t.grad, torch.full((1,), 4.0 * step))
    assert m.lin.weight.grad is None


def report_frozen_unit_with_unused_grad_input(rank, world):
    """#117510: a frozen unit with an input that requires grad but that its forward does
    not use resharded in backward without having unsharded ("Expects storage to be
    allocated"); two steps, the input's and the trained unit's gradients."""
    mesh = init_device_mesh("cpu", (world,))

    class Frozen(nn.Linear):
        def __init__(self):
            super().__init__(4, 4)
            for p in self.parameters():
                p.requires_grad = False

        def forward(self, frozen_in, learnable_in):
            return super().forward(frozen_in)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer1, self.layer2 = Frozen(), nn.Linear(4, 4)

        def forward(self, frozen_in, learnable_in):
            return self.layer2(self.layer1(frozen_in, learnable_in)) + learnable_in

    torch.manual_seed(0)
    m = Model()
    ref = copy.deepcopy(m)
    for u in (m.layer1, m.layer2, m):
        fully_shard(u, mesh=mesh)
    fi, li = torch.randn(2, 4), torch.randn(2, 4, requires_grad=True)
    rli = li.detach().clone().requires_grad_()
    for _ in range(2):
        m(fi, li).sum().backward()
        ref(fi, rli).sum().backward()
    _eq(li.grad, rli.grad)
    _eq(_full(m.layer2.weight.grad), ref.layer2.weight.grad)


def report_one_element_parameter_in_nested_unit(rank, world):
    """#144045: a shape-(1,) parameter (a log multiplier) in nested units kept a zero
    gradient; every gradient, that one non-zero."""
    mesh = init_device_mesh("cpu", (world,))

    class Sub(nn.Module):
        def __init__(self):
            super().__init__()
            self.log_multiplier = nn.Parameter(torch.zeros(1))
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * self.log_multiplier.exp()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Sub(), Sub()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self.b(self.a(x)) * self.scale

    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    for u in (m.a, m.b, m):
        fully_shard(u, mesh=mesh)
    x = torch.randn(3, 4)
    m(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    _grads_equal(m, ref)
    assert float(_full(m.a.log_multiplier.grad).abs()) > 0


def report_no_grad_forward_reshards(rank, world):
    """#149029 / PR #149103: with ``reshard_after_forward=True`` a ``no_grad`` forward (a
    text encoder) left parameters unsharded; ``set_reshard_after_forward(False)`` then
    keeps every unit unsharded until backward."""
    mesh = init_device_mesh("cpu", (world,))
    m = _mlp()
    ref = copy.deepcopy(m)
    units = _shard_mlp(m, mesh, reshard_after_forward=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        _eq(m(x), ref(x))
    assert not any(_unsharded(units))
    m.set_reshard_after_forward(False)
    out = m(x)
    assert all(_unsharded(units))
    out.sum().backward()
    ref(x).sum().backward()
    _grads_equal(m, ref)


def report_loss_on_returned_cache(rank, world):
    """#148756: the loss uses only tensors the units return beside their main output (a
    key/value cache): "expected to be in states FORWARD_BACKWARD but IDLE"; two steps."""
    mesh = init_device_mesh("cpu", (world,))

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.k, self.v, self.o = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            k, v = self.k(x), self.v(x)
            return self.o(k * v), (k, v)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Attn(), Attn()

        def forward(self, x):
            h, c1 = self.a(x)
            out, c2 = self.b(h)
            return out, (c1, c2)

    torch.manual_seed(0)
    m = Net()
    ref = copy.deepcopy(m)
    for u in (m.a, m.b, m):
        fully_shard(u, mesh=mesh)
    x = torch.randn(3, 4)
    for model in (m, ref):
        for _ in range(2):
            cache = model(x)[-1][-1]
            (cache[0] + cache[1]).sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        if q.grad is None:  # b.o: not on the loss's path
            assert p.grad is None or not _full(p.grad).any(), name
        else:
            _eq(_full(p.grad), q.grad)


def report_plain_state_dict_loads(rank, world):
    """#136336: loading a plain full state dict (``from_pretrained``'s) into an FSDP2
    model failed (PyTorch: only a sharded state dict loads); values and output after."""
    mesh = init_device_mesh("cpu", (world,))
    m, ref = _mlp(), _mlp()
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(2).add_(0.5)
    _shard_mlp(m, mesh)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(3, 4)
    _eq(m(x), ref(x))
    for p, q in zip(m.parameters(), ref.parameters()):
        _eq(_full(p), q.detach())


def report_manual_reshard_and_unshard(rank, world):
    """PR #126892 / #164775: ``reshard_after_forward=False`` with ``reshard()`` called by
    hand after forward (pipeline schedules), and ``unshard(async_op=True)`` of one unit
    before forward; the gradients of two steps."""
    mesh = init_device_mesh("cpu", (world,))
    m = _mlp()
    ref = copy.deepcopy(m)
    units = _shard_mlp(m, mesh, reshard_after_forward=False)
    x = torch.randn(3, 4)
    for step in range(2):
        if step:
            m[2].unshard(async_op=True).wait()
        out = m(x)
        for u in units:
            u.reshard()
        assert not any(_unsharded(units))
        out.sum().backward()
        ref(x).sum().backward()
        _grads_equal(m, ref)


def report_shard_dim_of_one(rank, world):
    """mindspore-ai/hyper-parallel#541: ``fully_shard`` on a shard dim of size 1 (a
    ``(2, 1)`` replicate x shard mesh): parameters left on meta after ``to_empty``,
    non-leaf sharded parameters refused by torch optimizers; meta init, ``to_empty``,
    ``reset_parameters``, two AdamW steps against one process."""
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    ref = _mlp()
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    _shard_mlp(m, mesh)
    m.to_empty(device="cpu")
    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            mod.reset_parameters()
    with torch.no_grad():
        for p, q in zip(m.parameters(), ref.parameters()):
            p.copy_(distribute_tensor(q.detach(), mesh, p.placements))
    assert all(p.is_leaf for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(4, 4, generator=g)
        m(x.chunk(world)[rank]).pow(2).mean().backward()
        ref(x).pow(2).mean().backward()
        for o in (opt, ropt):
            o.step()
            o.zero_grad()
    for p, q in zip(m.parameters(), ref.parameters()):
        _eq(p.full_tensor(), q.detach())


def report_module_to_dtype_after_fully_shard(rank, world):
    """#138467: ``get_model_state_dict`` failed after ``model.to(dtype)`` of an FSDP
    model; here ``.to(torch.float64)`` (before the first forward, and again after one)
    left the units gathering float32 parameters (a dtype error in forward). Output,
    gradients and the full state dict in float64 against one process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    for warm in (False, True):
        m = _mlp()
        ref = copy.deepcopy(m).to(torch.float64)
        _shard_mlp(m, mesh)
        if warm:
            m(x).sum().backward()
            m.zero_grad()
        m.to(torch.float64)
        out = m(x.double())
        out.sum().backward()
        r = ref(x.double())
        r.sum().backward()
        _eq(out, r.detach())
        assert all(p.dtype == torch.float64 for p in m.parameters())
        _grads_equal(m, ref)
        sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
        for k, v in ref.state_dict().items():
            _eq(_full(sd[k]), v)


class _SACBlock(nn.Module):
    """A residual MLP whose MLP runs under selective activation checkpointing (the
    matmuls' outputs saved, the rest recomputed)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(6, 8), nn.Linear(8, 6)

    def mlp(self, x):
        return self.down(torch.tanh(self.up(x)))

    def forward(self, x):
        from torch.utils.checkpoint import (
            CheckpointPolicy,
            checkpoint,
            create_selective_checkpoint_contexts,
        )

        def policy(ctx, op, *args, **kwargs):
            mm = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
            return CheckpointPolicy.MUST_SAVE if op in mm else CheckpointPolicy.PREFER_RECOMPUTE

        def context_fn():
            return create_selective_checkpoint_contexts(policy)

        return x + checkpoint(self.mlp, x, use_reentrant=False, context_fn=context_fn)


def report_selective_checkpoint_varying_lengths_clipped(rank, world):
    """mindspore-ai/hyper-parallel#448 (its FSDP cases): selective activation
    checkpointing inside the units, five steps of different sequence lengths (no hang),
    ``clip_grad_norm_`` of the DTensor gradients (the global norm, not each shard's);
    norms and parameters after SGD against one process."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    m = nn.Sequential(_SACBlock(), _SACBlock())
    ref = copy.deepcopy(m)
    for u in (m[0], m[1], m):
        fully_shard(u, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for t in (3, 5, 4, 7, 2):
        x = torch.randn(2 * world, t, 6, generator=g)
        m(x.chunk(world)[rank]).pow(2).mean().backward()
        ref(x).pow(2).mean().backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3)
        _eq(_full(norm), torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.3))
        for o in (opt, ropt):
            o.step()
            o.zero_grad()
    for p, q in zip(m.parameters(), ref.parameters()):
        _eq(_full(p), q.detach(), rtol=1e-5, atol=1e-5)


def report_ignored_params_and_reduce_dtype(rank, world):
    """mindspore-ai/hyper-parallel#749 "没参与切分的Tensor无法获取layout信息": a parameter
    left out by ``ignored_params`` had no layout, so saving and loading the model's
    checkpoint failed: here it stays a plain tensor in the state dict and the checkpoint
    round trip restores every value; mindspore-ai/hyper-parallel#629: with a
    ``reduce_dtype`` equal to the gradients' dtype, FSDP freed the caller's gradient
    storage: three SGD steps with ``reduce_dtype`` float32 (and bfloat16 on a bfloat16
    model) equal one process."""
    import hyper_shard.checkpoint as hc

    mesh = init_device_mesh("cpu", (world,))
    m, ref = _mlp(), _mlp()
    fully_shard(m[0], mesh=mesh)
    fully_shard(m, mesh=mesh, ignored_params={m[2].weight})
    sd = m.state_dict()
    assert not isinstance(sd["2.weight"], DTensor) and isinstance(sd["0.weight"], DTensor)
    path = _shared_tmp("hp749", rank)
    hc.save({"model": sd}, path)
    m2 = _mlp()
    with torch.no_grad():
        for p in m2.parameters():
            p.zero_()
    fully_shard(m2[0], mesh=mesh)
    fully_shard(m2, mesh=mesh, ignored_params={m2[2].weight})
    hc.load({"model": m2.state_dict()}, path)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    _eq(m2(x), ref(x))
    for dtype, tol in ((torch.float32, {}), (torch.bfloat16, {"rtol": 2e-2, "atol": 2e-2})):
        m, ref = _mlp().to(dtype), _mlp().to(dtype)
        _shard_mlp(m, mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=dtype))
        opt, ropt = (
            torch.optim.SGD(m.parameters(), lr=0.1),
            torch.optim.SGD(ref.parameters(), lr=0.1),
        )
        for step in range(3):
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(step)).to(dtype)
            m(x[rank * 2 : rank * 2 + 2]).pow(2).mean().backward()
            ref(x).pow(2).mean().backward()
            for o in (opt, ropt):
                o.step()
                o.zero_grad()
        for p, q in zip(m.parameters(), ref.parameters()):
            _eq(p.full_tensor(), q.detach(), **tol)


def _shared_tmp(name, rank):
    """A directory every rank of the pool names alike (rank 0 empties it first)."""
    import os
    import shutil
    import tempfile

    import torch.distributed as dist

    path = os.path.join(tempfile.gettempdir(), f"hs_reports_{name}_{os.getppid()}")
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    return path


@reports(
    report_module_to_dtype_after_fully_shard,
    report_selective_checkpoint_varying_lengths_clipped,
    report_root_reshard_after_forward,
    report_checkpointed_root_with_mixed_precision,
    report_unit_whose_parameters_are_unused,
    report_frozen_unit_with_unused_grad_input,
    report_one_element_parameter_in_nested_unit,
    report_no_grad_forward_reshards,
    report_loss_on_returned_cache,
    report_plain_state_dict_loads,
    report_manual_reshard_and_unshard,
    report_shard_dim_of_one,
    report_ignored_params_and_reduce_dtype,
)
def test_reports(report, dist2):
    dist2.run(report)
