"""Ops and behaviours a first user reaches for, on real gloo ranks, against plain torch:
scans, sorts, roll, einsum/dot/outer/mv, elementwise losses (exact sharded means),
``implicit_replication`` (incl. ``clip_grad_norm_`` over mixed DTensor/plain parameters)
and tensor hooks on DTensor leaves."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.errors import ShardingError
from hyper_shard.experimental import implicit_replication

pytestmark = pytest.mark.multiproc

PL = ([Shard(0)], [Shard(1)], [Replicate()])


def _check(mesh, f, inputs, placements, grads=None):
    """``f`` on DTensors equals ``f`` on plain tensors: forward, and the gradients of
    ``sum(out * w)`` w.r.t. the inputs flagged in ``grads`` (default: all float inputs)."""
    grads = grads if grads is not None else [t.is_floating_point() for t in inputs]
    xs = [
        distribute_tensor(t, mesh, p).requires_grad_(g)
        for t, p, g in zip(inputs, placements, grads)
    ]
    refs = [t.clone().requires_grad_(g) for t, g in zip(inputs, grads)]
    out, ref = f(*xs), f(*refs)
    torch.testing.assert_close(out.full_tensor(), ref, atol=1e-5, rtol=1e-5)
    if not ref.is_floating_point() or not any(grads):
        return
    w = torch.randn(ref.shape)
    (ref * w).sum().backward()
    (out * distribute_tensor(w, mesh, [Replicate()] * mesh.ndim)).sum().backward()
    for x, r, g in zip(xs, refs, grads):
        if g:
            torch.testing.assert_close(x.grad.full_tensor(), r.grad, atol=1e-5, rtol=1e-5)


def check_scans_sorts_roll(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    a = torch.randn(5, 7)  # uneven on both dims
    fns = [
        lambda x: x.cumsum(0),
        lambda x: torch.cumsum(x, 1),
        lambda x: x.cumprod(1),
        lambda x: torch.logcumsumexp(x, 0),
        lambda x: torch.cummax(x, 0).values,
        lambda x: torch.cummin(x, 1).indices,
        lambda x: torch.sort(x, 1, descending=True).values,
        lambda x: x.sort(dim=0).indices,
        lambda x: x.argsort(),
        lambda x: torch.topk(x, 3).values,
        lambda x: x.topk(2, dim=0).indices,
        lambda x: torch.roll(x, 2, 0),
        lambda x: x.roll((1, -2), (0, 1)),
        lambda x: x.roll(3),
    ]
    for f, pl in itertools.product(fns, PL):
        _check(mesh, f, [a], [pl])
    # cumsum is linear: a Partial(sum) input stays Partial, the sum of the parts is right
    p = DTensor.from_local(a * (rank + 1) / 3, mesh, [Partial()])
    c = p.cumsum(1)
    assert c.placements == (Partial(),)
    torch.testing.assert_close(c.full_tensor(), a.cumsum(1))
    # sort is not: a Partial is reduced first
    s = p.sort(1).values
    assert s.placements != (Partial(),)
    torch.testing.assert_close(s.full_tensor(), a.sort(1).values)
    return True


def test_scans_sorts_roll(dist2):
    assert dist2.run(check_scans_sorts_roll) == [True, True]


def check_products(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    a, b = torch.randn(5, 6), torch.randn(6, 3)
    v, u, c = torch.randn(6), torch.randn(5), torch.randn(2, 5, 6)
    cases = [
        (torch.dot, [v, v.flip(0)]),
        (torch.outer, [u, v]),
        (torch.mv, [a, v]),
        (lambda x, y: torch.einsum("ij,jk->ik", x, y), [a, b]),
        (lambda x, y: torch.einsum("ij,jk", [x, y]), [a, b]),
        (lambda x, y: torch.einsum("bij,j->bi", x, y), [c, v]),
        (lambda x, y: torch.einsum("...j,jk->...k", x, y), [c, b]),
        (lambda x: torch.einsum("ij->j", x), [a]),
    ]
    for f, ins in cases:
        for combo in itertools.product(PL, repeat=len(ins)):
            pls = [
                [Replicate()] if p[0] == Shard(1) and t.ndim < 2 else p for p, t in zip(combo, ins)
            ]
            _check(mesh, f, ins, pls)
    # a repeated label takes the diagonal (its dims gathered), as torch.einsum
    sq = torch.randn(4, 4)
    for eq in ("ii->i", "ii", "ij,jj->i"):
        ops = [sq] * eq.split("->")[0].count(",") + [sq]
        for p in PL:
            got = torch.einsum(eq, *(distribute_tensor(t, mesh, p) for t in ops))
            torch.testing.assert_close(got.full_tensor(), torch.einsum(eq, *ops))
    return True


def test_products(dist2):
    assert dist2.run(check_products) == [True, True]


def check_elementwise_losses(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(2)
    a, t = torch.randn(5, 7), torch.randn(5, 7)
    prob = torch.rand(5, 7) * 0.9 + 0.05
    y = (torch.rand(5, 7) > 0.5).float()
    w, pw = torch.rand(5, 7), torch.rand(7)
    cases = [
        (F.mse_loss, [a, t], 2),
        (F.l1_loss, [a, t], 2),
        (lambda x, z, **k: F.smooth_l1_loss(x, z, beta=0.5, **k), [a, t], 2),
        (lambda x, z, **k: F.huber_loss(x, z, delta=0.7, **k), [a, t], 2),
        (F.binary_cross_entropy, [prob, y], 1),
        (lambda x, z, ww, **k: F.binary_cross_entropy(x, z, weight=ww, **k), [prob, y, w], 1),
        (
            lambda x, z, p, **k: F.binary_cross_entropy_with_logits(x, z, pos_weight=p, **k),
            [a, y, pw],
            1,
        ),
        (lambda x, z, **k: F.kl_div(x.log_softmax(-1), z.softmax(-1), **k), [a, t], 2),
    ]
    for (f, ins, ng), red in itertools.product(cases, ("mean", "sum", "none")):
        for combo in itertools.product(PL, repeat=len(ins)):
            pls = [
                [Replicate()] if p[0] == Shard(1) and x.ndim < 2 else p for p, x in zip(combo, ins)
            ]
            g = [i < ng for i in range(len(ins))]
            _check(mesh, lambda *xs, f=f, red=red: f(*xs, reduction=red), ins, pls, g)
    _check(
        mesh,
        lambda x, z: F.kl_div(x.log_softmax(-1), z.softmax(-1), reduction="batchmean"),
        [a, t],
        [[Shard(0)], [Shard(0)]],
    )
    # a sharded mean is exact for uneven shards (5 rows on 2 ranks: 3 + 2)
    m = F.mse_loss(distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(t, mesh, [Shard(0)]))
    assert m.placements == (Partial(),), m.placements
    torch.testing.assert_close(m.full_tensor(), F.mse_loss(a, t))
    # torch's weighted mean divides by weight.sum(): refused with the workaround
    with pytest.raises(ShardingError, match=r"reduction='sum' and divide by weight.sum\(\)"):
        F.mse_loss(
            distribute_tensor(a, mesh, [Shard(0)]),
            distribute_tensor(t, mesh, [Shard(0)]),
            weight=distribute_tensor(w, mesh, [Shard(0)]),
        )
    return True


def test_elementwise_losses(dist2):
    assert dist2.run(check_elementwise_losses) == [True, True]


def check_implicit_replication(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(3)
    a, wv = torch.randn(5, 6), torch.randn(6)
    mask, idx = a > 0, torch.tensor([4, 0, 2])
    x = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
    with pytest.raises(ShardingError, match="implicit_replication"):
        x * wv
    with implicit_replication():
        y = (x * wv).masked_fill(mask, 0.0)
        z = x[idx]
        (y.sum() + z.sum()).backward()
    ref = a.clone().requires_grad_()
    ry, rz = (ref * wv).masked_fill(mask, 0.0), ref[idx]
    (ry.sum() + rz.sum()).backward()
    torch.testing.assert_close(y.full_tensor(), ry)
    torch.testing.assert_close(z.full_tensor(), rz)
    torch.testing.assert_close(x.grad.full_tensor(), ref.grad)
    # 0-d plain tensors: scalars as arguments (x[i, j]), tensors as members of a list
    i, j = torch.tensor(2), torch.tensor(3)
    assert x[i, j].full_tensor().item() == a[2, 3].item()
    with pytest.raises(ShardingError, match="plain tensor in a list"):
        torch.stack([x.sum(), torch.tensor(1.0)])
    with implicit_replication():
        st = torch.stack([x.sum(), torch.tensor(1.0)])
    torch.testing.assert_close(st.full_tensor(), torch.stack([a.sum(), torch.tensor(1.0)]))
    # the flag is restored on exit, also after an error inside the context
    with pytest.raises(RuntimeError), implicit_replication():
        raise RuntimeError("boom")
    with pytest.raises(ShardingError):
        x * wv
    return True


def test_implicit_replication(dist2):
    assert dist2.run(check_implicit_replication) == [True, True]


class _NormMLP(torch.nn.Module):
    """A TP-able MLP whose LayerNorm stays out of the plan (plain parameters)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)
        self.up = torch.nn.Linear(6, 10)
        self.down = torch.nn.Linear(10, 6)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))


def check_clip_grad_norm_mixed(rank, world):
    """A TP model whose norm layer stays plain: clip_grad_norm_ over DTensor and plain
    parameters works under implicit_replication (PyTorch DTensor fails here without it)."""
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref = _NormMLP()
    tp = _NormMLP()
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt_r = torch.optim.AdamW(ref.parameters(), lr=0.05)
    opt_t = torch.optim.AdamW(tp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        xb, yb = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
        lr_ = F.mse_loss(ref(xb), yb)
        opt_r.zero_grad()
        lr_.backward()
        nr = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
        opt_r.step()
        lt = F.mse_loss(tp(xb), yb)
        opt_t.zero_grad()
        lt.backward()
        with implicit_replication():
            nt = torch.nn.utils.clip_grad_norm_(tp.parameters(), 0.1)
        opt_t.step()
        nt = nt.full_tensor() if isinstance(nt, DTensor) else nt
        torch.testing.assert_close(lt, lr_, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(nt, nr, atol=1e-5, rtol=1e-5)
    return True


def test_clip_grad_norm_mixed(dist2):
    assert dist2.run(check_clip_grad_norm_mixed) == [True, True]


def check_foreach_optimizers_mixed(rank, world, opt_name):
    """torch.optim with foreach=True over a TP model whose LayerNorm stays plain: the foreach
    lists mix DTensor and plain tensors; each element is its own op, so plain elements are
    taken as Replicate (PyTorch DTensor raises here). Gradient clipping with foreach too.
    Losses, total norms and parameters equal the single-device run."""
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref, tp = _NormMLP(), _NormMLP()
    tp.load_state_dict(ref.state_dict())
    parallelize_module(tp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    make = {
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=True),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    }[opt_name]
    opt_r, opt_t = make(ref.parameters()), make(tp.parameters())
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        xb, yb = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
        for m, opt in ((ref, opt_r), (tp, opt_t)):
            opt.zero_grad()
            F.mse_loss(m(xb), yb).backward()
            n = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, foreach=True)
            opt.step()
            if m is ref:
                nr = n
            else:
                nt = n.full_tensor() if isinstance(n, DTensor) else n
        torch.testing.assert_close(nt, nr, atol=1e-5, rtol=1e-5)
    for (name, p), (_, q) in zip(ref.named_parameters(), tp.named_parameters()):
        qf = q.full_tensor() if isinstance(q, DTensor) else q
        torch.testing.assert_close(qf.detach(), p.detach(), atol=1e-5, rtol=1e-5, msg=name)
    return True


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_foreach_optimizers_mixed(dist2, opt_name):
    assert dist2.run(check_foreach_optimizers_mixed, opt_name) == [True, True]


def check_tensor_hooks(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(4)
    a, wt = torch.randn(4, 3), torch.randn(3, 5)
    x = distribute_tensor(a, mesh, [Shard(0)])
    w = distribute_tensor(wt, mesh, [Replicate()]).requires_grad_()
    seen = []

    def hook(grad):
        seen.append(type(grad))
        return grad * 0.5  # DTensor arithmetic inside the hook

    w.register_hook(hook)
    (x @ w).pow(2).sum().backward()
    ref = wt.clone().requires_grad_()
    ref.register_hook(lambda g_: g_ * 0.5)
    (a @ ref).pow(2).sum().backward()
    assert seen and all(issubclass(t, DTensor) for t in seen)
    torch.testing.assert_close(w.grad.full_tensor(), ref.grad)
    return True


def test_tensor_hooks(dist2):
    assert dist2.run(check_tensor_hooks) == [True, True]


def check_factories_and_compat(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(6)
    a = torch.randn(5, 3)
    x = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
    # new_* factories (as PyTorch DTensor: the input's shards when size is its shape)
    z = x.new_zeros(5, 3)
    assert z.placements == (Shard(0),)
    torch.testing.assert_close(z.full_tensor(), torch.zeros(5, 3))
    o = x.new_ones((2, 2))
    assert o.placements == (Replicate(),)
    torch.testing.assert_close(o.full_tensor(), torch.ones(2, 2))
    torch.testing.assert_close(x.new_full((5, 3), 7.0).full_tensor(), torch.full((5, 3), 7.0))
    assert tuple(x.new_empty([5, 3]).to_local().shape) == (3 - rank, 3)
    t = x.new_tensor([1.0, 2.0])
    assert not isinstance(t, DTensor) and t.tolist() == [1.0, 2.0]
    torch.testing.assert_close(x.cpu().full_tensor(), a)
    # nn.init on DTensor parameters (a Partial target is written once)
    w = distribute_tensor(torch.randn(4, 6), mesh, [Shard(1)])
    torch.nn.init.constant_(w, 0.5)
    torch.testing.assert_close(w.full_tensor(), torch.full((4, 6), 0.5))
    p = DTensor.from_local(torch.ones(2, 2), mesh, [Partial()])
    torch.nn.init.constant_(p, 3.0)
    torch.testing.assert_close(p.full_tensor(), torch.full((2, 2), 3.0))
    torch.nn.init.zeros_(w)
    torch.testing.assert_close(w.full_tensor(), torch.zeros(4, 6))
    # redistribute(forward_dtype=, backward_dtype=) as PyTorch DTensor
    y = x.redistribute(
        mesh, [Replicate()], forward_dtype=torch.float64, backward_dtype=torch.float16
    )
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.full_tensor(), a.double())
    (y * 2).sum().backward()
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.full_tensor(), torch.full((5, 3), 2.0))
    # _local_tensor: the plain local shard, an alias
    lt = x._local_tensor
    assert type(lt) is torch.Tensor and tuple(lt.shape) == (3 - rank, 3)
    return True


def test_factories_and_compat(dist2):
    assert dist2.run(check_factories_and_compat) == [True, True]


def check_rule_shape_guard(rank, world, spec_dir):
    """A user entry whose rule does not describe its op (pad declared pointwise, a user
    directory of specs) raises on the first call, naming the entry; the decision is not
    cached, the group stays usable."""
    from hyper_shard.registry import reload

    reload(extra_dirs=[spec_dir])
    try:
        mesh = init_device_mesh("cpu", (world,))
        x = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
        for _ in range(2):
            with pytest.raises(ShardingError, match=r"entry 'badpad'.*\(2, 5\)"):
                F.pad(x, (1, 1))
        torch.testing.assert_close((x + 1).full_tensor(), x.full_tensor() + 1)
    finally:
        reload()  # the built-in specs again, for the pool's next tests
    return True


def test_rule_shape_guard(dist2):
    from pathlib import Path

    d = Path(__file__).parent / "data" / "badpad"
    assert dist2.run(check_rule_shape_guard, str(d)) == [True, True]


def check_replicate_fallback(rank, world):
    """``hyper_shard.config.fallback = "replicate"`` (the name the not-registered error
    gives): an op with no rule runs on the gathered inputs, warns once per op, returns a
    Replicate DTensor, and gradients flow back to the sharded input."""
    import warnings

    import hyper_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(7)
    a = torch.randn(5, 6)
    x = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
    # the error names the op, the input placements and the YAML entry to add
    # (Tensor.adjoint, unbound; Tensor.unfold, the example before, has a rule now)
    with pytest.raises(hyper_shard.OpNotRegisteredError) as ei:
        x.adjoint()
    msg = str(ei.value)
    for part in ("'Tensor.adjoint'", "DTensor[5, 6][S(0)]", "torch: [Tensor.adjoint]", "fallback"):
        assert part in msg, (part, msg)
    # a composite torch function is run as its parts; the error points to the public name
    # (torch.stft, the example before, is bound now)
    with pytest.raises(hyper_shard.OpNotRegisteredError, match=r"torch: \[torch.histogramdd\]"):
        torch.histogramdd(x[:, :2].detach(), bins=3)
    old = hyper_shard.config.fallback
    hyper_shard.config.fallback = "replicate"
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            d1 = x.adjoint()
            d2 = x[1:].adjoint()
        assert sum("no sharding rule" in str(w.message) for w in rec) == 1
    finally:
        hyper_shard.config.fallback = old
    assert d1.placements == (Replicate(),)
    torch.testing.assert_close(d1.full_tensor(), a.adjoint())
    torch.testing.assert_close(d2.full_tensor(), a[1:].adjoint())
    (d1 * 3).sum().backward()
    ref = a.clone().requires_grad_()
    (ref.adjoint() * 3).sum().backward()
    torch.testing.assert_close(x.grad.full_tensor(), ref.grad)
    return True


def test_replicate_fallback(dist2):
    assert dist2.run(check_replicate_fallback) == [True, True]


def check_activation_checkpointing(rank, world, reentrant):
    """torch.utils.checkpoint (both forms) around TP blocks: losses and gradients equal the
    un-checkpointed single-device model (the recomputation in backward dispatches through
    hyper_shard like the forward did; the reentrant form calls torch.autograd.backward on
    DTensor outputs with plain local gradients)."""
    from torch.utils.checkpoint import checkpoint

    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(6, 10)
            self.down = torch.nn.Linear(10, 6)

        def forward(self, x):
            return x + self.down(torch.tanh(self.up(x)))

    class Net(torch.nn.Module):
        def __init__(self, ckpt):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.ckpt = ckpt

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=reentrant) if self.ckpt else b(x)
            return x

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref = Net(False)
    tp = Net(True)
    tp.load_state_dict(ref.state_dict())
    plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
    parallelize_module(tp, mesh, plan)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        xb, yb = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
        # the reentrant form needs an input that requires grad (a PyTorch rule)
        xb.requires_grad_(reentrant)
        lr_ = F.mse_loss(ref(xb), yb)
        lt = F.mse_loss(tp(xb), yb)
        ref.zero_grad()
        tp.zero_grad()
        lr_.backward()
        lt.backward()
        torch.testing.assert_close(lt, lr_)
        for (n, p), (_, q) in zip(ref.named_parameters(), tp.named_parameters()):
            gq = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
            torch.testing.assert_close(gq, p.grad, atol=1e-6, rtol=1e-5, msg=n)
    return True


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing(dist2, reentrant):
    assert dist2.run(check_activation_checkpointing, reentrant) == [True, True]


def check_autograd_backward(rank, world):
    """torch.autograd.backward / torch.autograd.grad on DTensors, as on plain tensors: DTensor
    gradients are read by their placements, a scalar loss needs none."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(8)
    a, w = torch.randn(5, 3), torch.randn(3, 4)
    x = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
    y = x @ distribute_tensor(w, mesh, [Replicate()])
    gy = torch.randn(5, 4)
    torch.autograd.backward([y], [distribute_tensor(gy, mesh, [Shard(1)])])
    ref = a.clone().requires_grad_()
    torch.autograd.backward([ref @ w], [gy])
    torch.testing.assert_close(x.grad.full_tensor(), ref.grad)
    x.grad = None
    torch.autograd.backward((x * x).sum())
    torch.testing.assert_close(x.grad.full_tensor(), 2 * a)
    (gx,) = torch.autograd.grad((x.sin()).sum(), [x])
    assert isinstance(gx, DTensor)
    torch.testing.assert_close(gx.full_tensor(), a.cos())
    # backward(inputs=[...]) accumulates into the named leaves only
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    x.grad = None
    (x @ wd).pow(2).sum().backward(inputs=[x])
    ref = a.clone().requires_grad_()
    (ref @ w).pow(2).sum().backward()
    torch.testing.assert_close(x.grad.full_tensor(), ref.grad)
    assert wd.grad is None
    return True


def test_autograd_backward(dist2):
    assert dist2.run(check_autograd_backward) == [True, True]


def check_autocast_loss_parallel(rank, world):
    """Under torch.autocast (CPU, bfloat16) the vocab-parallel cross_entropy runs in float32,
    as autocast runs torch's cross_entropy: same dtype and value as plain autocast."""
    from hyper_shard.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    x, w, t = torch.randn(16, 8), torch.randn(50, 8) * 0.3, torch.randint(0, 50, (16,))
    xr = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lr = F.cross_entropy(F.linear(xr, w), t)
        xd = distribute_tensor(x, mesh, [Replicate()]).requires_grad_()
        logits = F.linear(xd, distribute_tensor(w, mesh, [Shard(0)]))
        with loss_parallel():
            ld = F.cross_entropy(logits, distribute_tensor(t, mesh, [Replicate()]))
            ld.backward()
    lr.backward()
    assert ld.dtype == lr.dtype == torch.float32
    torch.testing.assert_close(ld.full_tensor(), lr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xd.grad.full_tensor().float(), xr.grad, atol=1e-3, rtol=1e-2)
    return True


def test_autocast_loss_parallel(dist2):
    assert dist2.run(check_autocast_loss_parallel) == [True, True]


def check_mesh_groups_and_shape_errors(rank, world):
    """DeviceMesh.get_group() is a torch ProcessGroup (as PyTorch's), usable with
    torch.distributed directly; a rule's shape error names the call and its placements."""
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    t = torch.tensor([float(rank + 1)])
    torch.distributed.all_reduce(t, group=mesh.get_group())
    assert t.item() == sum(range(1, world + 1))
    assert isinstance(mesh["tp"].get_group(), torch.distributed.ProcessGroup)
    a = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    with pytest.raises(ValueError, match=r"mse_loss\(input=DTensor\[8, 8\]\[S\(0\)\].*broadcast"):
        F.mse_loss(a, b)
    return True


def test_mesh_groups_and_shape_errors(dist2):
    assert dist2.run(check_mesh_groups_and_shape_errors) == [True, True]
