"""cross_entropy / nll_loss / log_softmax and loss_parallel() on real gloo ranks against
plain torch on the same global inputs (forward and input gradients): every placement
combination on 2 ranks and a fixed sample on a (2, 2) mesh; reductions none/sum/mean
(exact global mean with ignored targets, class weights, uneven and fully-ignored shards),
label smoothing, K-dimensional inputs, class-probability targets; class-sharded logits
gathered outside loss_parallel() (as PyTorch) and computed vocab-parallel inside it; log_softmax used
alone on class-sharded logits (PyTorch DTensor's loss_parallel gets its gradient wrong);
the switch's nesting and thread isolation; public bug reports on losses (``report_*``,
each naming its report).
"""

from __future__ import annotations

import random
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import (
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from hyper_shard.parallel import loss_parallel
from hyper_shard.parallel.loss import loss_parallel_enabled
from tests._helpers import all_combos, check_op
from tests._helpers import assert_close_any as _eq
from tests._reports import reports

pytestmark = pytest.mark.multiproc

R = Replicate()


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world, must=()):
    if world == 2 or len(combos) <= k:
        return combos
    return list(must) + random.Random(0).sample(combos, k)


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 6, generator=g)  # 5 samples: uneven on 2 ranks
    t = torch.tensor([-100, -100, -100, 2, 5])  # the first rank's 3 rows are all ignored
    t2 = torch.randint(0, 6, (5,), generator=g)
    t2[1] = -100
    w = torch.rand(6, generator=g) + 0.5
    return x, t, t2, w


def _targets(t, t2):
    return (t, t2, torch.where(t2 == -100, 2, t2))


def _class_sharded(combo, class_dim=1):
    return any(type(p) is Shard and p.dim == class_dim for p in combo[0])


_KWARGS = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"label_smoothing": 0.2},
    {"reduction": "none", "label_smoothing": 0.3},
    {"ignore_index": 2, "label_smoothing": 0.1},  # only for targets without -100
]


def _kwargs_for(tgt):
    """The keyword sets a target is checked with: a target whose first shard is all
    ignored checks the means; one with -100s the default ignore_index; one without them
    ignore_index=2."""
    if (tgt[:3] == -100).all():
        return [{}, {"reduction": "sum"}, {"label_smoothing": 0.2}]
    if (tgt == -100).any():
        return [kw for kw in _KWARGS if "ignore_index" not in kw]
    return [kw for kw in _KWARGS if "ignore_index" in kw]


def check_batch_sharded_losses(rank, world):
    """Outside loss_parallel: every combination whose logits are not class-sharded; the
    class-sharded ones raise a ShardingError saying what to do."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x, t, t2, w = _data()
    n = 0
    combos2 = all_combos([x, t2], mesh.ndim)
    combos3 = _sample(all_combos([x, t2, w], mesh.ndim), 20, world)
    ok2 = [c for c in combos2 if not _class_sharded(c)]
    ok3 = [c for c in combos3 if not _class_sharded(c)]
    for tgt in _targets(t, t2):
        for kw in _kwargs_for(tgt):
            n += check_op(lambda a, b, kw=kw: F.cross_entropy(a, b, **kw), [x, tgt], mesh, ok2)
            n += check_op(
                lambda a, b, c, kw=kw: F.cross_entropy(a, b, c.detach(), **kw),
                [x, tgt, w],
                mesh,
                ok3,
            )
    t2i = torch.where(t2 == -100, 2, t2)  # ignore class 2 instead
    for kw in ({}, {"reduction": "sum"}, {"reduction": "none"}):
        n += check_op(
            lambda a, b, c, kw=kw: F.nll_loss(a, b, c.detach(), **kw), [x, t2, w], mesh, ok3
        )
        n += check_op(
            lambda a, b, kw=kw: F.nll_loss(torch.log_softmax(a, 1), b, **kw), [x, t2], mesh, ok2
        )
    n += check_op(lambda a, b: F.nll_loss(a, b, ignore_index=2), [x, t2i], mesh, ok2)
    # the module form and the legacy flags
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    n += check_op(lambda a, b: crit(a, b), [x, t2], mesh, ok2)
    with warnings.catch_warnings():  # the legacy flags' deprecation warning
        warnings.simplefilter("ignore", UserWarning)
        n += check_op(lambda a, b: F.cross_entropy(a, b, reduce=False), [x, t2], mesh, ok2[::3])
    # K-dimensional input (N, C, d) and class-probability targets
    g = torch.Generator().manual_seed(3)
    x3, t3 = torch.randn(3, 4, 5, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    c3 = [c for c in _sample(all_combos([x3, t3], mesh.ndim), 20, world) if not _class_sharded(c)]
    n += check_op(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), [x3, t3], mesh, c3)
    tp = torch.softmax(torch.randn(5, 6, generator=g), 1)
    cp = [c for c in _sample(all_combos([x, tp, w], mesh.ndim), 20, world) if not _class_sharded(c)]
    for kw in ({}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.2}):
        n += check_op(
            lambda a, b, c, kw=kw: F.cross_entropy(a, b, c.detach(), **kw), [x, tp, w], mesh, cp
        )
    # class-sharded logits outside loss_parallel: computed as PyTorch (the classes gathered),
    # every time (the cached decision too); the hint that loss_parallel() avoids the gather
    # is a one-time warning (tests/dist/test_dropin_ops.py checks it)
    dx = distribute_tensor(x, mesh, [Shard(1)] + [R] * (mesh.ndim - 1))
    dt = distribute_tensor(t2, mesh, [R] * mesh.ndim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(2):
            for fn in (F.cross_entropy, F.nll_loss):
                torch.testing.assert_close(fn(dx, dt).full_tensor(), fn(x, t2))
                n += 1
    return n


def check_mean_is_global(rank, world):
    """The batch-sharded mean divides by the global count, not the local one: with the
    first rank's rows all ignored a per-rank mean would be NaN there and wrong overall."""
    mesh = init_device_mesh("cpu", (world,))
    x, t, _, w = _data()
    dx = distribute_tensor(x, mesh, [Shard(0)])
    dt = distribute_tensor(t, mesh, [Shard(0)])
    for kw in ({}, {"weight": distribute_tensor(w, mesh, [R])}):
        out = F.cross_entropy(dx, dt, **kw)
        assert out.placements == (Partial(),)
        ref = F.cross_entropy(x, t, **{k: w for k in kw})
        torch.testing.assert_close(out.full_tensor(), ref)
        assert not torch.isnan(out.to_local()).any()
    return 1


def check_loss_parallel(rank, world):
    """Inside loss_parallel: every combination, class-sharded ones computed without
    gathering the logits (their placements are kept), forward and backward exact."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x, t, t2, w = _data(1)
    S0, S1 = Shard(0), Shard(1)
    must2 = [
        ((S0, S1), (S0, R)),
        ((S1, S1), (R, R)),
        ((S1, S0), (R, S0)),
        ((Partial(), S1), (R, R)),
    ]
    must3 = [((S0, S1), (S0, R), (R, S0)), ((S1, S1), (R, R), (S0, S0))]
    combos2 = _sample(all_combos([x, t2], mesh.ndim), 16, world, must2)
    combos3 = _sample(all_combos([x, t2, w], mesh.ndim), 16, world, must3)
    n = 0
    with loss_parallel():
        for tgt in _targets(t, t2):
            for kw in _kwargs_for(tgt):
                n += check_op(
                    lambda a, b, kw=kw: F.cross_entropy(a, b, **kw), [x, tgt], mesh, combos2
                )
                n += check_op(
                    lambda a, b, c, kw=kw: F.cross_entropy(a, b, c.detach(), **kw),
                    [x, tgt, w],
                    mesh,
                    combos3,
                )
        for kw in ({}, {"reduction": "none"}):
            n += check_op(
                lambda a, b, c, kw=kw: F.nll_loss(torch.log_softmax(a, -1), b, c.detach(), **kw),
                [x, t2, w],
                mesh,
                combos3,
            )
        # (N, C, d) logits sharded on C, and class-probability targets sharded with them
        g = torch.Generator().manual_seed(4)
        x3, t3 = torch.randn(3, 5, 2, generator=g), torch.randint(0, 5, (3, 2), generator=g)
        c3 = _sample(all_combos([x3, t3], mesh.ndim), 12, world, [((S1, S0), (R, S0))])
        n += check_op(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1), [x3, t3], mesh, c3)
        tp = torch.softmax(torch.randn(5, 6, generator=g), 1)
        cp = _sample(all_combos([x, tp], mesh.ndim), 12, world, [((S1, S0), (S1, S0))])
        for kw in ({}, {"reduction": "none", "label_smoothing": 0.2}):
            n += check_op(lambda a, b, kw=kw: F.cross_entropy(a, b, **kw), [x, tp], mesh, cp)
        if world == 4:  # 3 classes nested over (2, 2): one rank owns no class at all
            x3c, w3c = x[:, :3], w[:3]
            t3c = torch.tensor([0, 2, -100, 1, 2])
            few = [((S1, S1), (R, R), (S0, S0)), ((S0, S1), (S0, R), (R, S0))]
            for kw in ({}, {"reduction": "none", "label_smoothing": 0.3}):
                n += check_op(
                    lambda a, b, c, kw=kw: F.cross_entropy(a, b, c.detach(), **kw),
                    [x3c, t3c, w3c],
                    mesh,
                    few,
                )
    # the class-sharded decision keeps the logits sharded: no gather of the logits
    xs = distribute_tensor(x, mesh, [S1] + [R] * (mesh.ndim - 1)).requires_grad_()
    ts = distribute_tensor(t2, mesh, [R] * mesh.ndim)
    with loss_parallel():
        loss = F.cross_entropy(xs, ts)
        assert loss.placements[0] == R  # the fused vocab-parallel loss is Replicate
        loss.backward()  # backward inside the context
    assert xs.grad.placements[0] == S1
    ref = x.clone().requires_grad_()
    F.cross_entropy(ref, t2).backward()
    torch.testing.assert_close(xs.grad.full_tensor(), ref.grad)
    return n


def check_log_softmax_alone(rank, world):
    """x (4, 16) Shard(1): (log_softmax(x, -1) * w).sum().backward() gives the true gradient
    (PyTorch DTensor's loss_parallel returns the wrong one here), in and outside the
    context; the output stays class-sharded."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    ref = x.clone().requires_grad_()
    (F.log_softmax(ref, -1) * w).sum().backward()
    n = 0
    S1 = Shard(1)
    layouts = [[S1], [R]] if world == 2 else [[S1, S1], [Shard(0), S1], [S1, Shard(0)], [R, S1]]
    for pl in layouts:
        for ctx in (True, False):
            dx = distribute_tensor(x, mesh, pl).requires_grad_()
            dw = distribute_tensor(w, mesh, pl)
            if ctx:
                with loss_parallel():
                    y = F.log_softmax(dx, -1)
                    (y * dw).sum().backward()
            else:
                y = dx.log_softmax(dim=1)
                (y * dw).sum().backward()
            assert y.placements == dx.placements  # no gather
            torch.testing.assert_close(y.full_tensor(), F.log_softmax(x, -1))
            torch.testing.assert_close(dx.grad.full_tensor(), ref.grad)
            n += 1
    # every placement combination, forward and backward, dtype= included
    combos = _sample(all_combos([x], mesh.ndim), 10, world)
    n += check_op(lambda a: F.log_softmax(a, -1), [x], mesh, combos)
    n += check_op(lambda a: torch.log_softmax(a, 1, torch.float64), [x], mesh, combos)
    return n


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(
    "fn", [check_batch_sharded_losses, check_loss_parallel, check_log_softmax_alone]
)
def test_losses(fn, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(fn)
    assert counts[0] > 0 and len(set(counts)) == 1


def test_mean_is_global(dist2):
    assert dist2.run(check_mean_is_global) == [1, 1]


def test_loss_parallel_switch_nests_and_is_thread_local():
    assert not loss_parallel_enabled()
    seen = {}

    def other_thread():
        seen["thread"] = loss_parallel_enabled()

    with loss_parallel():
        assert loss_parallel_enabled()
        with loss_parallel():
            assert loss_parallel_enabled()
        assert loss_parallel_enabled()  # the inner exit keeps the outer context
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
    assert seen["thread"] is False  # another thread does not see this thread's switch
    assert not loss_parallel_enabled()
    with pytest.raises(RuntimeError):
        with loss_parallel():
            raise RuntimeError("boom")
    assert not loss_parallel_enabled()  # reset on error too


# ---------------------------------------------------------------------- bug reports
def _rep(t, mesh):
    return distribute_tensor(t, mesh, [R] * mesh.ndim)


def report_vocab_parallel_cross_entropy_options(rank, world):
    """NVIDIA/Megatron-LM#737: vocab-parallel cross-entropy with label smoothing,
    ``ignore_index`` and class weights."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
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


def report_log_softmax_not_consumed_by_a_loss(rank, world):
    """#190746: inside ``loss_parallel()``, a ``log_softmax`` not consumed by
    ``cross_entropy`` got an identity gradient in PyTorch (DPO-style
    ``(log_softmax(x) * w).sum()``)."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    lg, wt = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    dl, rl = distribute_tensor(lg, mesh, [Shard(1)]).requires_grad_(), lg.clone().requires_grad_()
    with loss_parallel():
        (F.log_softmax(dl, -1) * distribute_tensor(wt, mesh, [Shard(1)])).sum().backward()
    (F.log_softmax(rl, -1) * wt).sum().backward()
    _eq(dl.grad, rl.grad, atol=1e-5, rtol=1e-4)


def report_weighted_mean_over_batch_shards(rank, world):
    """#185167: ``nll_loss(weight=, reduction="mean")`` over a batch-sharded input took the
    mean of per-shard weighted means (the weights' sums differ between the shards); the
    same through ``cross_entropy``, with ignored targets and label smoothing."""
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    tgt = torch.tensor([0, 0, 0, 1, 2, 3, 4, 4])
    w = torch.rand(5, generator=torch.Generator().manual_seed(1)) + 0.1
    for red in ("mean", "sum", "none"):
        dx, rx = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_(), x.clone().requires_grad_()
        o = F.nll_loss(dx, _rep(tgt, mesh), weight=_rep(w, mesh), reduction=red)
        ro = F.nll_loss(rx, tgt, weight=w, reduction=red)
        _eq(o, ro.detach())
        o.sum().backward()
        ro.sum().backward()
        _eq(dx.grad, rx.grad)
        dt = distribute_tensor(tgt, mesh, [Shard(0)])
        ce = F.cross_entropy(dx.detach(), dt, weight=_rep(w, mesh), reduction=red)
        _eq(ce, F.cross_entropy(x, tgt, weight=w, reduction=red))
    ign = tgt.clone()
    ign[:3] = -100
    di = distribute_tensor(ign, mesh, [Shard(0)])
    dx = distribute_tensor(x, mesh, [Shard(0)])
    _eq(F.cross_entropy(dx, di, weight=_rep(w, mesh)), F.cross_entropy(x, ign, weight=w))
    _eq(F.cross_entropy(dx, di, label_smoothing=0.1), F.cross_entropy(x, ign, label_smoothing=0.1))


@reports(
    report_vocab_parallel_cross_entropy_options,
    report_log_softmax_not_consumed_by_a_loss,
    report_weighted_mean_over_batch_shards,
)
def test_reports(report, dist2):
    dist2.run(report)
