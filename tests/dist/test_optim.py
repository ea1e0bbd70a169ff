"""torch.optim on DTensor parameters against the same optimizer on plain tensors: SGD
(momentum, weight decay, nesterov) and AdamW (and Adam with coupled weight decay), foreach
True and False, several steps on gradients from a real backward, Replicate / Shard(0) /
Shard(1) / uneven parameters on 2 ranks and a (2, 2) mesh. After every step each
parameter's full tensor equals the plain one (tolerance 1e-5), and the foreach ops alone
are checked element by element (mixed placements, Partial elements, in-place rules)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.errors import ShardingError
from tests._helpers import assert_close_any as _eq
from tests._helpers import assert_dtensor_close, dt_from_global
from tests._helpers import replicate as _rep
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _params(mesh):
    """(global value, placements) of every parameter: Replicate, Shard(0), Shard(1), an
    uneven Shard(0) (5 rows), a 1-D bias, and on 2-D meshes a mixed one."""
    g = torch.Generator().manual_seed(0)
    r = mesh.ndim
    specs = [
        (torch.randn(4, 3, generator=g), [Replicate()] * r),
        (torch.randn(6, 3, generator=g), [Shard(0)] * r),
        (torch.randn(3, 4, generator=g), [Shard(1)] * r),
        (torch.randn(5, 3, generator=g), [Shard(0)] + [Replicate()] * (r - 1)),
        (torch.randn(3, generator=g), [Replicate()] * r),
    ]
    if r == 2:
        specs.append((torch.randn(4, 6, generator=g), [Shard(1), Shard(0)]))
    return specs


def _loss(ps, x, step):
    """A loss touching every parameter; Replicate ones get Partial(sum) gradients through
    the sharded activations (x is Shard(0) in the DTensor run)."""
    a, b, c, d, bias = ps[:5]
    h = torch.tanh(x @ a + bias)  # (8, 3); x (8, 4)
    loss = (h * (step + 1)).pow(2).sum()
    loss = loss + (b.tanh() * 0.5).sum() + (h @ c).pow(2).mean() + (d * d).sum() * 0.1
    if len(ps) > 5:
        loss = loss + torch.tanh(ps[5]).sum()
    return loss


def _run(mesh, make_opt, steps=3):
    specs = _params(mesh)
    plain = [t.clone().requires_grad_() for t, _ in specs]
    dts = [distribute_tensor(t.clone(), mesh, pl).requires_grad_() for t, pl in specs]
    placements = [d.placements for d in dts]
    opt_p, opt_d = make_opt(plain), make_opt(dts)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(8, 4, generator=g)
        xd = distribute_tensor(x, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
        for opt, ps, xx in ((opt_p, plain, x), (opt_d, dts, xd)):
            opt.zero_grad(set_to_none=step % 2 == 0)  # odd steps: zero_ / _foreach_zero_
            _loss(ps, xx, step).backward()
        for p, d in zip(plain, dts):
            torch.testing.assert_close(d.grad.full_tensor(), p.grad, rtol=1e-5, atol=1e-5)
        opt_p.step()
        opt_d.step()
        for i, (p, d) in enumerate(zip(plain, dts)):
            assert isinstance(d, DTensor) and d.placements == placements[i]
            torch.testing.assert_close(
                d.full_tensor(), p.detach(), rtol=1e-5, atol=1e-5, msg=f"step {step} param {i}"
            )
    return steps


_OPTIMIZERS = {
    "sgd": lambda ps, fe: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, weight_decay=0.01, dampening=0.1, foreach=fe
    ),
    "sgd_nesterov": lambda ps, fe: torch.optim.SGD(
        ps, lr=0.05, momentum=0.8, weight_decay=0.02, nesterov=True, foreach=fe
    ),
    "sgd_plain": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, foreach=fe),
    "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=fe),
    "adam_l2": lambda ps, fe: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=fe),
    "adamw_amsgrad": lambda ps, fe: torch.optim.AdamW(
        ps, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=fe
    ),
}


def check_optimizers(rank, world, names, foreach):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    n = 0
    for name in names:
        make = _OPTIMIZERS[name]
        n += _run(mesh, lambda ps, make=make: make(ps, foreach))
    return n


def check_clip_grad_norm(rank, world):
    """clip_grad_norm_ (per-tensor norms + stack + norm + mul_) then an SGD step."""
    torch.set_num_threads(1)
    mesh = _mesh(world)

    def make(ps):
        return torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)

    specs = _params(mesh)
    plain = [t.clone().requires_grad_() for t, _ in specs]
    dts = [distribute_tensor(t.clone(), mesh, pl).requires_grad_() for t, pl in specs]
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    xd = distribute_tensor(x, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    opt_p, opt_d = make(plain), make(dts)
    _loss(plain, x, 0).backward()
    _loss(dts, xd, 0).backward()
    for norm_type in (2.0, float("inf")):
        tp = torch.nn.utils.clip_grad_norm_(plain, 0.5, norm_type=norm_type)
        td = torch.nn.utils.clip_grad_norm_(dts, 0.5, norm_type=norm_type)
        torch.testing.assert_close(td.full_tensor(), tp, rtol=1e-5, atol=1e-5)
        for p, d in zip(plain, dts):
            torch.testing.assert_close(d.grad.full_tensor(), p.grad, rtol=1e-5, atol=1e-5)
    opt_p.step()
    opt_d.step()
    for p, d in zip(plain, dts):
        torch.testing.assert_close(d.full_tensor(), p.detach(), rtol=1e-5, atol=1e-5)
    return 1


def _close(d, e, what):
    try:
        assert_dtensor_close(d, e)
    except AssertionError as err:
        raise AssertionError(f"{what} {list(d.placements)}: {err}") from None


def check_foreach_ops(rank, world):
    """Each foreach op on lists of mixed placements (Partial elements included) against
    the plain op, element by element; in-place ones keep every self element's placements."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    r = mesh.ndim
    g = torch.Generator().manual_seed(5)
    shapes = [(4, 3), (5, 2), (3,), (2, 5)]
    pls = [
        [Shard(0)] * r,
        [Partial()] * r,
        [Replicate()] * r,
        [Shard(1)] + [Partial()] * (r - 1),
    ]
    other_pls = [[Replicate()] * r, [Partial()] * r, [Shard(0)] * r, [Replicate()] * r]

    def make(pl_list, seed, positive=False):
        ts = [torch.randn(s, generator=g) for s in shapes]
        if positive:
            ts = [t.abs() + 0.5 for t in ts]
        dts_ = [
            dt_from_global(t, mesh, pl, seed=seed + i) for i, (t, pl) in enumerate(zip(ts, pl_list))
        ]
        return ts, dts_

    n = 0
    xs, dxs = make(pls, 0)
    ys, dys = make(other_pls, 10)
    zs, dzs = make(pls[::-1][:1] + pls[1:], 20, positive=True)
    cases = [
        ("add", lambda a, b, c: torch._foreach_add(a, b, alpha=0.5)),
        ("add_scalar", lambda a, b, c: torch._foreach_add(a, 1.5)),
        ("sub", lambda a, b, c: torch._foreach_sub(a, b)),
        ("mul", lambda a, b, c: torch._foreach_mul(a, b)),
        ("mul_scalar", lambda a, b, c: torch._foreach_mul(a, -0.3)),
        ("mul_scalarlist", lambda a, b, c: torch._foreach_mul(a, [1.0, 2.0, 3.0, 4.0])),
        ("div", lambda a, b, c: torch._foreach_div(a, c)),
        ("neg", lambda a, b, c: torch._foreach_neg(a)),
        ("sqrt", lambda a, b, c: torch._foreach_sqrt(c)),
        ("lerp", lambda a, b, c: torch._foreach_lerp(a, b, 0.25)),
        ("addcmul", lambda a, b, c: torch._foreach_addcmul(a, b, c, 0.5)),
        ("addcdiv", lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, 0.2, 0.3, 0.4])),
        ("maximum", lambda a, b, c: torch._foreach_maximum(a, b)),
        ("norm", lambda a, b, c: torch._foreach_norm(a)),
    ]
    for name, fn in cases:
        zs_local = zs
        ref = fn(xs, ys, zs_local)
        out = fn(dxs, dys, dzs)
        assert len(out) == len(ref), name
        for i, (o, e) in enumerate(zip(out, ref)):
            assert isinstance(o, DTensor), name
            _close(o, e, f"{name}[{i}]")
        n += 1
    # in place: self placements kept, values as plain
    inplace = [
        ("add_", lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.1)),
        ("mul_", lambda a, b, c: torch._foreach_mul_(a, 0.9)),
        ("lerp_", lambda a, b, c: torch._foreach_lerp_(a, b, 0.1)),
        ("addcmul_", lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.01)),
        ("addcdiv_", lambda a, b, c: torch._foreach_addcdiv_(a, b, c, 0.1)),
        ("div_", lambda a, b, c: torch._foreach_div_(a, [2.0, 3.0, 4.0, 5.0])),
        ("copy_", lambda a, b, c: torch._foreach_copy_(a, [t * 2 for t in a])),
        ("zero_", lambda a, b, c: torch._foreach_zero_(a)),
    ]
    for name, fn in inplace:
        ref_xs = [t.clone() for t in xs]
        fn(ref_xs, ys, zs)
        before = [d.placements for d in dxs]
        fn(dxs, dys, dzs)
        for i, (d, e, pl) in enumerate(zip(dxs, ref_xs, before)):
            assert d.placements == pl, (name, d.placements, pl)
            _close(d, e, f"{name}[{i}]")
        xs = ref_xs
        n += 1
    # AdamW's exp_avg_sq.addcmul_(g, g): one gradient object twice (Partial or sharded)
    gs, dgs = make([[Partial()] * r, [Shard(0)] * r, [Partial()] * r, [Replicate()] * r], 30)
    vs, dvs = make([[Replicate()] * r, [Shard(0)] * r, [Replicate()] * r, [Replicate()] * r], 40)
    torch._foreach_addcmul_(vs, gs, gs, 0.1)
    torch._foreach_addcmul_(dvs, dgs, dgs, 0.1)
    for i, (d, e) in enumerate(zip(dvs, vs)):
        _close(d, e, f"addcmul_(v, g, g)[{i}]")
    # ... but a Partial self cannot take g * g in place (g would be reduced once, not twice)
    with pytest.raises(ShardingError, match="cannot be updated in place"):
        torch._foreach_addcmul_(dgs, dgs, dgs, 0.1)
    # a python scalar term cannot be added once per rank into a Partial element in place
    with pytest.raises(ShardingError, match="scalar term"):
        torch._foreach_add_([dt_from_global(torch.ones(2), mesh, [Partial()] * r)], 1.0)
    return n


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("world", [2, 4])
def test_sgd(world, foreach, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    names = ["sgd", "sgd_nesterov", "sgd_plain"] if world == 2 else ["sgd"]
    counts = pool.run(check_optimizers, names, foreach)
    assert counts[0] == 3 * len(names) and len(set(counts)) == 1


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("world", [2, 4])
def test_adamw(world, foreach, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    names = ["adamw", "adam_l2", "adamw_amsgrad"] if world == 2 else ["adamw"]
    counts = pool.run(check_optimizers, names, foreach)
    assert counts[0] == 3 * len(names) and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_foreach_ops(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_foreach_ops)
    assert counts[0] == 22 and len(set(counts)) == 1


def test_clip_grad_norm(dist2):
    assert dist2.run(check_clip_grad_norm) == [1, 1]


# ---------------------------------------------------------------------- bug reports
def report_parameters_on_two_meshes(rank, world):
    """#180346 (fixed here): ``clip_grad_norm_`` (and a foreach optimizer) over parameters
    of two meshes raised; one-element DTensors of another mesh over the same ranks are
    taken as Replicate and foreach lists spanning meshes run per mesh. Norms, clip
    coefficients and AdamW states, both code paths, two steps, against one device."""
    mesh_a = init_device_mesh("cpu", (world,))
    mesh_b = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(0)
    # gradients through a scalar of mesh a used on mesh b
    xa, xb = torch.randn(4, generator=g), torch.randn(4, 3, generator=g)
    da = distribute_tensor(xa, mesh_a, [Shard(0)]).requires_grad_()
    db = distribute_tensor(xb, mesh_b, [Shard(1)]).requires_grad_()
    ra, rb = xa.clone().requires_grad_(), xb.clone().requires_grad_()
    y, yr = db * (da * da).sum(), rb * (ra * ra).sum()
    _eq(y, yr.detach())
    w = torch.randn(4, 3, generator=g)
    (y * _rep(w, mesh_b)).sum().backward()
    (yr * w).sum().backward()
    _eq(da.grad, ra.grad)
    _eq(db.grad, rb.grad)
    # a larger DTensor of another mesh still raises, naming both meshes
    with pytest.raises(ShardingError, match="different meshes"):
        db + _rep(xb, mesh_a)
    for foreach in (False, True):
        w1, w2 = torch.randn(4, 4, generator=g), torch.randn(6, generator=g)
        p1 = nn.Parameter(distribute_tensor(w1, mesh_a, [Shard(0)]))
        p2 = nn.Parameter(distribute_tensor(w2, mesh_b, [Shard(0)]))
        q1, q2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())
        opt = torch.optim.AdamW([p1, p2], lr=0.1, foreach=foreach)
        opt_r = torch.optim.AdamW([q1, q2], lr=0.1, foreach=foreach)
        for _ in range(2):
            opt.zero_grad()
            opt_r.zero_grad()
            ((p1 * p1).sum()).backward()
            ((p2 * 3).sum()).backward()
            ((q1 * q1).sum()).backward()
            ((q2 * 3).sum()).backward()
            n = torch.nn.utils.clip_grad_norm_([p1, p2], 0.5, foreach=foreach)
            nr = torch.nn.utils.clip_grad_norm_([q1, q2], 0.5, foreach=foreach)
            _eq(n.full_tensor(), nr)
            opt.step()
            opt_r.step()
        _eq(p1, q1.detach())
        _eq(p2, q2.detach())


def report_clip_grad_norm_of_tensor_parallel_gradients(rank, world):
    """PR #120238 / PR #120910: ``clip_grad_norm_`` of tensor-parallel gradients,
    ``foreach`` False and True, norm types 2, inf and 1."""
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(2)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    xb = torch.randn(4, 8, generator=torch.Generator().manual_seed(8))
    for foreach, norm_type in ((False, 2.0), (True, 2.0), (True, float("inf")), (False, 1.0)):
        tp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        one = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        tp.load_state_dict(base.state_dict())
        one.load_state_dict(base.state_dict())
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        tp(xb).pow(2).sum().backward()
        one(xb).pow(2).sum().backward()
        kw = {"norm_type": norm_type, "foreach": foreach}
        n = torch.nn.utils.clip_grad_norm_(tp.parameters(), 0.5, **kw)
        _eq(n, torch.nn.utils.clip_grad_norm_(one.parameters(), 0.5, **kw), atol=1e-5, rtol=1e-5)
        for a, b in zip(tp.parameters(), one.parameters()):
            _eq(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def report_other_optimizers(rank, world):
    """PyTorch's DTensor optimizer PRs, replayed with the harness above (Replicate
    parameters with Partial(sum) gradients, Shard(0)/(1), uneven): Adadelta (PR #115564:
    with ``foreach=True`` the step was silently wrong here, ``_foreach_mul_`` of a Replicate
    ``self`` by a Partial gradient kept the per-rank product; fixed), NAdam (PR #115565),
    RAdam (PR #115566), ASGD (PR #121942), Adamax (PR #119850), Adagrad, RMSprop, Rprop;
    fused Adam / AdamW / Adagrad (PR #125369, #126670). Adamax and Rprop with
    ``foreach=True`` and fused SGD update a Partial gradient (or a momentum buffer made from
    one) in place by a non-linear op: refused, the message naming ``foreach=False``."""
    optim = torch.optim
    mesh = _mesh(world)
    both = {
        "adadelta": lambda ps, **k: optim.Adadelta(ps, lr=0.5, weight_decay=0.1, **k),
        "nadam": lambda ps, **k: optim.NAdam(ps, lr=0.01, weight_decay=0.1, **k),
        "nadam_decoupled": lambda ps, **k: optim.NAdam(
            ps, lr=0.01, weight_decay=0.05, decoupled_weight_decay=True, **k
        ),
        "radam": lambda ps, **k: optim.RAdam(ps, lr=0.01, weight_decay=0.1, **k),
        "asgd": lambda ps, **k: optim.ASGD(ps, lr=0.01, **k),
        "adagrad": lambda ps, **k: optim.Adagrad(ps, lr=0.05, weight_decay=0.1, **k),
        "rmsprop": lambda ps, **k: optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True, **k),
    }
    for make in both.values():
        for fe in (False, True):
            _run(mesh, lambda ps, make=make, fe=fe: make(ps, foreach=fe), steps=2)
    _run(mesh, lambda ps: optim.Adamax(ps, lr=0.01, weight_decay=0.1, foreach=False), steps=2)
    _run(mesh, lambda ps: optim.Rprop(ps, lr=0.01, foreach=False), steps=2)
    for make in (optim.Adam, optim.AdamW, optim.Adagrad):
        _run(mesh, lambda ps, make=make: make(ps, lr=0.01, fused=True), steps=2)
    refused = (
        lambda ps: optim.Adamax(ps, lr=0.01, weight_decay=0.1, foreach=True),
        lambda ps: optim.Rprop(ps, lr=0.01, foreach=True),
        lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    )
    for make in refused:
        with pytest.raises(ShardingError, match=r"Partial\(sum\).*foreach=False"):
            _run(mesh, make, steps=1)


@reports(
    report_parameters_on_two_meshes,
    report_clip_grad_norm_of_tensor_parallel_gradients,
    report_other_optimizers,
)
def test_reports(report, dist2):
    dist2.run(report)
