"""softmax/log_softmax and layer_norm/rms_norm on real gloo ranks against plain torch on
the same global input (forward and backward, weight and bias gradients included): every
placement combination on 2 ranks, a fixed sample on a (2, 2) mesh, uneven and empty shards,
Partial inputs; public bug reports on norms (``report_*``, each naming its report).
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyper_shard import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    ShardingError,
    distribute_tensor,
    init_device_mesh,
)
from tests._helpers import all_combos, check_op, dt_from_global
from tests._helpers import assert_close_any as _eq
from tests._reports import reports

pytestmark = pytest.mark.multiproc

S0, S1, S2 = Shard(0), Shard(1), Shard(2)


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world, must=()):
    """Every combination on the 1-D mesh; on (2, 2) ``must`` plus a fixed sample of ``k``."""
    if world == 2 or len(combos) <= k:
        return combos
    return list(must) + random.Random(0).sample(combos, k)


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_softmax(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _randn(5, 3, 2, seed=0)
    nested = [((S0, S0),), ((S1, S1),), ((S2, S0),), ((Partial(), S1),)]
    combos = _sample(all_combos([x], mesh.ndim, ("sum", "max")), 12, world, nested)
    fns = [
        lambda a: torch.softmax(a, -1),
        lambda a: a.softmax(0),
        lambda a: F.softmax(a, dim=1),
        lambda a: F.softmax(a, 2, dtype=torch.float64),
        lambda a: torch.log_softmax(a, 1),
        lambda a: a.log_softmax(dim=-3),
        lambda a: F.log_softmax(a, 0),
        lambda a: torch.special.softmax(a, 1),
        lambda a: F.softmin(a, 2),
        lambda a: F.softmax(a),  # legacy implicit dim (0 for a 3-d input)
    ]
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the implicit-dim deprecation
        for fn in fns:
            n += check_op(fn, [x], mesh, combos)
    return n


def check_layer_norm(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _randn(5, 3, 4, seed=1)
    w, b = _randn(4, seed=2) + 1, _randn(4, seed=3)
    nested = [((S0, S0), (Replicate(),) * 2, (Replicate(),) * 2), ((S1, S0), (S0, S0), (S0,) * 2)]
    # a 3-input search miss costs ~0.1 s per rank on (2, 2): sample lightly there
    combos = _sample(all_combos([x, w, b], mesh.ndim), 8, world, nested)
    n = check_op(lambda a, c, d: F.layer_norm(a, (4,), c, d), [x, w, b], mesh, combos)
    n += check_op(
        lambda a, c, d: torch.layer_norm(a, [4], c, d, 1e-3), [x, w, b], mesh, combos[::3]
    )
    # two normalised dims, weight and bias of shape (3, 4)
    w2, b2 = _randn(3, 4, seed=4), _randn(3, 4, seed=5)
    combos2 = _sample(all_combos([x, w2, b2], mesh.ndim), 5, world)
    n += check_op(lambda a, c, d: F.layer_norm(a, x.shape[1:], c, d), [x, w2, b2], mesh, combos2)
    # no affine parameters
    xs = _sample(all_combos([x], mesh.ndim), 8, world)
    n += check_op(lambda a: F.layer_norm(a, [4]), [x], mesh, xs)
    n += check_op(lambda a: F.layer_norm(a, (3, 4), eps=1e-2), [x], mesh, xs)
    return n


def check_rms_norm(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _randn(5, 3, 4, seed=6)
    w = _randn(4, seed=7)
    combos = _sample(all_combos([x, w], mesh.ndim), 16, world, [((S0, S0), (S0, Replicate()))])
    n = check_op(lambda a, c: F.rms_norm(a, [4], c), [x, w], mesh, combos)
    n += check_op(lambda a, c: F.rms_norm(a, (4,), c, 1e-3), [x, w], mesh, combos[::2])
    n += check_op(lambda a, c: torch.rms_norm(a, [4], weight=c), [x, w], mesh, combos[::3])
    w2 = _randn(3, 4, seed=8)
    combos2 = _sample(all_combos([x, w2], mesh.ndim), 8, world)
    n += check_op(lambda a, c: F.rms_norm(a, (3, 4), c), [x, w2], mesh, combos2)
    n += check_op(
        lambda a: F.rms_norm(a, [4]), [x], mesh, _sample(all_combos([x], mesh.ndim), 6, world)
    )
    return n


def check_norm_errors(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = dt_from_global(_randn(5, 3, 4, seed=1), mesh, [S0] * mesh.ndim)
    w = dt_from_global(_randn(3, seed=2), mesh, [Replicate()] * mesh.ndim)
    msgs = []
    for fn in (lambda: F.layer_norm(x, (3,)), lambda: F.layer_norm(x, (4,), w)):
        with pytest.raises(ShardingError) as info:
            fn()
        msgs.append(str(info.value))
    assert "normalized_shape=[3]" in msgs[0] and "[5, 3, 4]" in msgs[0], msgs[0]
    assert "weight" in msgs[1] and "[3]" in msgs[1], msgs[1]
    with pytest.raises(IndexError, match="out of range"):
        torch.softmax(x, 3)
    return len(msgs)


def _run(pool, fn):
    counts = pool.run(fn)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_softmax(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_softmax)


@pytest.mark.parametrize("world", [2, 4])
def test_layer_norm(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_layer_norm)


@pytest.mark.parametrize("world", [2, 4])
def test_rms_norm(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_rms_norm)


def test_norm_errors(dist2):
    _run(dist2, check_norm_errors)


# ---------------------------------------------------------------------- bug reports
def _rep(t, mesh):
    return distribute_tensor(t, mesh, [Replicate()] * mesh.ndim)


def report_layer_norm_of_a_sharded_normalized_dim(rank, world):
    """#174276 / PR #115250: ``layer_norm`` with the normalized dim sharded, and a cached
    decision reused for another ``normalized_shape``; forward and every gradient."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    xl = torch.randn(3, 4, 8, generator=g)
    wl, bl = torch.randn(8, generator=g), torch.randn(8, generator=g)
    for pl in (Shard(2), Shard(1)):
        d = distribute_tensor(xl, mesh, [pl]).requires_grad_()
        dw, db = _rep(wl, mesh).requires_grad_(), _rep(bl, mesh).requires_grad_()
        r, rw, rb = (t.clone().requires_grad_() for t in (xl, wl, bl))
        o, ro = F.layer_norm(d, (8,), dw, db), F.layer_norm(r, (8,), rw, rb)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
        o.pow(2).sum().backward()
        ro.pow(2).sum().backward()
        for a, b in ((d, r), (dw, rw), (db, rb)):
            _eq(a.grad, b.grad, atol=1e-4, rtol=1e-4)
        _eq(F.layer_norm(d, (4, 8)), F.layer_norm(xl, (4, 8)), atol=1e-5, rtol=1e-5)
        _eq(F.layer_norm(d, (8,)), F.layer_norm(xl, (8,)), atol=1e-5, rtol=1e-5)


def report_layer_norm_weight_sharded_like_its_input(rank, world):
    """#128699: ``layer_norm`` backward with its weight and bias sharded like a
    column-parallel output (``Shard(0)``)."""
    from hyper_shard.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    rmlp = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    rmlp.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(use_local_output=False)})
    for name in ("weight", "bias"):
        full = getattr(mlp[1], name).detach()
        setattr(mlp[1], name, nn.Parameter(distribute_tensor(full, mesh, [Shard(0)])))
    xl = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    o, ro = mlp(xl), rmlp(xl)
    _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
    o.full_tensor().sum().backward()
    ro.sum().backward()
    for a, b in zip(mlp.parameters(), rmlp.parameters()):
        _eq(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def report_batch_and_group_norm_backward(rank, world):
    """#182739 (PR #182743): ``native_batch_norm_backward`` of a channel-sharded input had
    no strategy (its decomposition looped for ever: a hang); PR #184825:
    ``native_group_norm_backward`` of a batch-sharded input, with and without the affine
    parameters; instance norm. Training-mode statistics, every input placement; output,
    input gradient and parameter gradients against plain torch, and a BatchNorm2d's running
    statistics after one batch-sharded step."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 5, 5, generator=g)
    w, b = torch.randn(6, generator=g), torch.randn(6, generator=g)
    seed = torch.randn(4, 6, 5, 5, generator=g)
    cases = (
        (lambda t, w, b: F.batch_norm(t, None, None, w, b, training=True), [w, b]),
        (lambda t, w, b: F.group_norm(t, 3, w, b), [w, b]),
        (lambda t: F.group_norm(t, 3), []),
        (lambda t, w, b: F.instance_norm(t, weight=w, bias=b), [w, b]),
    )
    for f, params in cases:
        for pl in (Shard(0), Shard(1), Shard(2)):
            dx = distribute_tensor(x, mesh, [pl]).requires_grad_()
            dp = [distribute_tensor(p, mesh, [Replicate()]).requires_grad_() for p in params]
            rx, rp = x.clone().requires_grad_(), [p.clone().requires_grad_() for p in params]
            o, ro = f(dx, *dp), f(rx, *rp)
            _eq(o, ro.detach(), atol=1e-4, rtol=1e-4)
            (o * distribute_tensor(seed, mesh, [Replicate()])).sum().backward()
            (ro * seed).sum().backward()
            for a, r in zip([dx, *dp], [rx, *rp]):
                _eq(a.grad, r.grad, atol=1e-4, rtol=1e-4)
    from hyper_shard import distribute_module

    m, ref = nn.BatchNorm2d(6), nn.BatchNorm2d(6)
    distribute_module(m, mesh)
    _eq(m(distribute_tensor(x, mesh, [Shard(0)])), ref(x).detach(), atol=1e-5, rtol=1e-5)
    _eq(m.running_mean, ref.running_mean, atol=1e-6, rtol=1e-5)
    _eq(m.running_var, ref.running_var, atol=1e-5, rtol=1e-5)


@reports(
    report_layer_norm_of_a_sharded_normalized_dim,
    report_layer_norm_weight_sharded_like_its_input,
    report_batch_and_group_norm_backward,
)
def test_reports(report, dist2):
    dist2.run(report)


def report_replicated_rms_norm_weight_on_a_2d_mesh(rank, world):
    """pytorch/torchtitan#2217: a Replicate RMSNorm weight on a (dp, tp) mesh: its gradient
    is reduced over both dims; ``to_local(grad_placements=[Partial(), Partial()])`` too."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    w = torch.randn(8, generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))
    dx = distribute_tensor(x, mesh, [Shard(0), Shard(1)])
    rw = w.clone().requires_grad_()
    ro = F.rms_norm(x, (8,), rw)
    ro.sum().backward()
    dw = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
    o = F.rms_norm(dx, (8,), dw)
    _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
    o.sum().backward()
    _eq(dw.grad, rw.grad, atol=1e-4, rtol=1e-4)
    dw2 = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
    lo = F.rms_norm(dx.to_local(), (8,), dw2.to_local(grad_placements=[Partial(), Partial()]))
    DTensor.from_local(lo, mesh, [Shard(0), Shard(1)]).sum().backward()
    _eq(dw2.grad, rw.grad, atol=1e-4, rtol=1e-4)


@reports(report_replicated_rms_norm_weight_on_a_2d_mesh)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
