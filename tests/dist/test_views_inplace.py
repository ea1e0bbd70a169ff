"""In-place writes through views of DTensors land in the base, as in plain torch: every view
kind (basic indexing, narrow, select, split/chunk/unbind pieces, diagonal, view/reshape,
transpose, unsqueeze, a view of a view) x every placement of the base (Shard of the viewed
dim, Shard of another dim, Replicate, Partial) x several in-place ops, compared with plain
torch on the same global values; autograd through the written views; in-place ops on the
results of from_local / redistribute / to_local; nn.Module dtype conversions of a
parallelized model; public bug reports on writes through views (``report_*``)."""

from __future__ import annotations

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._helpers import assert_close_any, dt_from_global
from tests._reports import reports

pytestmark = pytest.mark.multiproc

#: view name -> the view of a (7, 6) tensor (uneven over 2 ranks along dim 0)
VIEWS = {
    "getitem rows": lambda x: x[1:5],
    "getitem cols": lambda x: x[:, 1:4],
    "getitem int row": lambda x: x[3],
    "getitem step": lambda x: x[::2],
    "getitem both": lambda x: x[2:6, 1:5],
    "narrow dim 0": lambda x: x.narrow(0, 2, 4),
    "narrow dim 1": lambda x: x.narrow(1, 1, 3),
    "select dim 1": lambda x: x.select(1, 2),
    "split piece": lambda x: x.split(3, 0)[1],
    "chunk piece dim 1": lambda x: x.chunk(2, 1)[1],
    "unbind piece": lambda x: x.unbind(0)[4],
    "diagonal": lambda x: x.diagonal(),
    "diagonal offset": lambda x: x.diagonal(1),
    "view -1": lambda x: x.view(-1),
    "reshape": lambda x: x.reshape(7, 3, 2),
    "transpose": lambda x: x.t(),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "view of a view": lambda x: x[1:6][:, 2],
    "view of a view 2": lambda x: x.t()[1:3],
}
#: in-place op name -> op on the view
WRITES = {
    "mul_": lambda v: v.mul_(3.0),
    "add_": lambda v: v.add_(1.5),
    "fill_": lambda v: v.fill_(-7.0),
    "zeros_": lambda v: torch.nn.init.zeros_(v),
}
PLACEMENTS = {"S(0)": Shard(0), "S(1)": Shard(1), "R": Replicate(), "P": Partial()}


def check_writes_through_views(rank: int, world: int) -> list[str]:
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(42, dtype=torch.float32).reshape(7, 6) / 5.0
    bad = []
    n = 0
    for vname, view in VIEWS.items():
        for wname, write in WRITES.items():
            ref = full.clone()
            write(view(ref))
            for pname, pl in PLACEMENTS.items():
                x = dt_from_global(full, mesh, [pl], seed=n)
                n += 1
                try:
                    with torch.no_grad():
                        write(view(x))
                    got = x.full_tensor()
                    if not torch.allclose(got, ref, rtol=1e-5, atol=1e-5):
                        bad.append(f"{vname} {wname} on {pname}: base differs from torch")
                    elif x.placements != (pl,):
                        bad.append(f"{vname} {wname} on {pname}: base placements {x.placements}")
                except Exception as e:  # reported with the case
                    bad.append(f"{vname} {wname} on {pname}: {type(e).__name__}: {e}")
    return bad


def check_autograd_through_views(rank: int, world: int) -> list[str]:
    """y = w * 1 (non-leaf), an in-place write through a view of y, a loss of y: the
    gradient of w equals plain torch's."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(7, 6, generator=g)
    c = torch.randn(7, 6, generator=g)
    bad = []
    for vname in ("getitem rows", "getitem cols", "narrow dim 0", "select dim 1", "diagonal",
                  "view -1", "transpose", "view of a view"):  # fmt: skip
        view = VIEWS[vname]
        for pname in ("S(0)", "S(1)", "R"):
            wp = w0.clone().requires_grad_()
            yp = wp * 1
            view(yp).mul_(2.0)
            (yp * c).sum().backward()
            w = distribute_tensor(w0.clone(), mesh, [PLACEMENTS[pname]]).requires_grad_()
            try:
                y = w * 1
                view(y).mul_(2.0)
                cd = distribute_tensor(c, mesh, [PLACEMENTS[pname]])
                (y * cd).sum().backward()
                if not torch.allclose(y.full_tensor(), yp.detach(), atol=1e-5):
                    bad.append(f"{vname} on {pname}: forward differs")
                if not torch.allclose(w.grad.full_tensor(), wp.grad, atol=1e-5):
                    bad.append(f"{vname} on {pname}: gradient differs")
            except Exception as e:
                bad.append(f"{vname} on {pname}: {type(e).__name__}: {e}")
    return bad


def check_inplace_on_api_results(rank: int, world: int) -> dict:
    """In-place ops on from_local / redistribute / to_local results, as in plain torch."""
    mesh = init_device_mesh("cpu", (world,))
    out: dict = {}
    # from_local of a tensor that requires grad (a non-leaf and a leaf), then fill_/zero_
    for leaf in (False, True):
        t = torch.randn(3, 4, requires_grad=True)
        src = t if leaf else t * 1
        dt = DTensor.from_local(src, mesh, [Shard(0)])
        torch.fill_(dt, 42.0)
        out[f"fill leaf={leaf}"] = bool((dt.to_local() == 42).all())
        dt2 = DTensor.from_local(src, mesh, [Shard(0)])
        dt2.zero_()
        out[f"zero leaf={leaf}"] = bool((dt2.to_local() == 0).all())
    # gradient through from_local then an in-place op
    t = torch.randn(3, 4, requires_grad=True)
    dt = DTensor.from_local(t * 1, mesh, [Shard(0)])
    dt.mul_(3.0)
    dt.sum().backward()
    out["from_local grad"] = bool(torch.allclose(t.grad, torch.full((3, 4), 3.0)))
    # redistribute R -> S keeps a chunk locally: its result is a tensor of its own
    full = torch.arange(24.0).reshape(6, 4)
    r = distribute_tensor(full, mesh, [Replicate()])
    s = r.redistribute(mesh, [Shard(0)])
    s.mul_(0.0)
    out["redistribute leaves source"] = bool(torch.equal(r.to_local(), full))
    rg = distribute_tensor(full, mesh, [Replicate()]).requires_grad_()
    s2 = (rg * 1).redistribute(mesh, [Shard(0)])
    s2.add_(1.0)
    s2.sum().backward()
    out["redistribute grad"] = bool(torch.allclose(rg.grad.full_tensor(), torch.ones(6, 4)))
    # to_local of a Shard DTensor is the local data itself: in place lands in the DTensor
    x = distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
    y = x * 1
    y.to_local().mul_(2.0)
    out["to_local lands"] = bool(torch.allclose(y.full_tensor(), full * 2))
    y.sum().backward()
    out["to_local grad"] = bool(torch.allclose(x.grad.full_tensor(), torch.full((6, 4), 2.0)))
    return out


def check_module_conversions(rank: int, world: int) -> list[str]:
    """nn.Module.to(dtype)/.half()/.bfloat16()/.double()/.float()/.requires_grad_()/
    zero_grad(set_to_none=False) on a parallelized model keep every placement and train as
    the same conversions of the plain model."""
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 6))
    tp = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 6))
    tp.load_state_dict(plain.state_dict())
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    want = {n: p.placements for n, p in tp.named_parameters()}
    x = torch.randn(5, 6)
    bad = []
    tp(x).sum().backward()  # gradients exist while converting
    plain(x).sum().backward()
    steps = [
        ("double", lambda m: m.double(), torch.float64),
        ("to(float32)", lambda m: m.to(torch.float32), torch.float32),
        ("half", lambda m: m.half(), torch.float16),
        ("bfloat16", lambda m: m.bfloat16(), torch.bfloat16),
        ("to(float64)", lambda m: m.to(torch.float64), torch.float64),
        ("float", lambda m: m.float(), torch.float32),
    ]
    for name, conv, dtype in steps:
        conv(tp)
        conv(plain)
        for (n, p), (_, q) in zip(tp.named_parameters(), plain.named_parameters()):
            if p.placements != want[n] or p.dtype != dtype or p._spec.dtype != dtype:
                bad.append(f"{name}: {n} is {p.dtype} {p.placements}")
            if not torch.equal(p.full_tensor(), q.detach()):
                bad.append(f"{name}: {n} values differ")
            if p.grad is not None and p.grad.dtype != q.grad.dtype:
                bad.append(f"{name}: {n}.grad is {p.grad.dtype}, torch {q.grad.dtype}")
    tp.requires_grad_(False)
    plain.requires_grad_(False)
    if any(p.requires_grad for p in tp.parameters()):
        bad.append("requires_grad_(False) left a parameter requiring grad")
    tp.requires_grad_(True)
    plain.requires_grad_(True)
    tp.zero_grad(set_to_none=False)
    plain.zero_grad(set_to_none=False)
    for n, p in tp.named_parameters():
        if p.grad is None or p.grad.full_tensor().abs().sum() != 0:
            bad.append(f"zero_grad(set_to_none=False): {n}.grad not zeros")
    out_tp = tp(x)
    out_pl = plain(x)
    out_tp.sum().backward()
    out_pl.sum().backward()
    if not torch.allclose(out_tp, out_pl, atol=1e-5):  # RowwiseParallel: a local output
        bad.append("forward after the conversions differs")
    for (n, p), (_, q) in zip(tp.named_parameters(), plain.named_parameters()):
        if not torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-5):
            bad.append(f"gradient of {n} after the conversions differs")
    return bad


def test_writes_through_views(dist2):
    for bad in dist2.run(check_writes_through_views):
        assert not bad, "\n".join(bad)


def test_autograd_through_views(dist2):
    for bad in dist2.run(check_autograd_through_views):
        assert not bad, "\n".join(bad)


def test_inplace_on_api_results(dist2):
    for out in dist2.run(check_inplace_on_api_results):
        assert all(out.values()), out


def test_module_conversions(dist2):
    for bad in dist2.run(check_module_conversions):
        assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------- bug reports
def report_init_through_a_slice(rank, world):
    """#139735: ``nn.init`` on a slice / an index of a row-sharded tensor writes through to
    the base."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.rand(10, 8, generator=torch.Generator().manual_seed(0))
    for idx in (slice(None, 2), 0, (slice(None), slice(1, 3)), (slice(None), 5)):
        d, ref = distribute_tensor(t.clone(), mesh, [Shard(0)]), t.clone()
        torch.nn.init.constant_(d[idx], 3.0)
        torch.nn.init.constant_(ref[idx], 3.0)
        assert_close_any(d, ref)


@reports(report_init_through_a_slice)
def test_reports(report, dist2):
    dist2.run(report)
