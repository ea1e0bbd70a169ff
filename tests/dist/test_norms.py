"""Vector norms of sharded DTensors without gathering them (``rules/vector_norm.py``,
``kernels/vector_norm.py``, the foreach rule's ``norm``/``powsum`` modes), and the ops
whose op dims must be whole following their input (PyTorch DTensor's placements).

Every value and gradient is compared with plain torch on the same global tensor; the
placements are PyTorch DTensor's (``Partial(max)``/``Partial(min)`` for the ``+-inf``
norms, ``Partial(sum)`` for ``ord`` 1 and 0 and for ``_foreach_powsum``, ``Replicate``
from one all-reduce for other orders), and ``CommDebugMode`` shows that no all-gather
runs (the gradients' bytes never move for ``clip_grad_norm_``).
"""

from __future__ import annotations

import math

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.debug import CommDebugMode

multiproc = pytest.mark.multiproc

ORDS = (math.inf, -math.inf, 0, 1, 2, 3.5)


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True, msg=what)


def _vector_norms(rank: int, world: int) -> bool:
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * world + 1, 6, generator=g)  # uneven rows
    x[1, 2] = 0.0
    x[0, 0] = x.abs().max() + 1  # one extremum, on the first rank
    w = torch.randn(2 * world + 6, generator=g)
    for shard in (Shard(0), Shard(1)):
        for ord_ in ORDS:
            for dim in (None, 0, 1, (0, 1)):
                what = f"vector_norm(ord={ord_}, dim={dim}) of {shard}"
                ref = x.clone().requires_grad_()
                want = torch.linalg.vector_norm(ref, ord_, dim)
                dx = distribute_tensor(x, mesh, [shard]).requires_grad_()
                with CommDebugMode() as cm:
                    got = torch.linalg.vector_norm(dx, ord_, dim)
                assert "all_gather" not in cm.get_comm_counts(), (what, cm.get_comm_counts())
                _close(got.full_tensor(), want, what)
                reduced = dim is None or shard.dim in ((dim,) if isinstance(dim, int) else dim)
                if reduced:
                    expect = {math.inf: Partial("max"), -math.inf: Partial("min")}.get(ord_)
                    if ord_ in (0, 1):
                        expect = Partial("sum")
                    assert got.placements[0] == (expect or Replicate()), (what, got.placements)
                if ord_ == 0:
                    continue  # no gradient
                wt = w[: want.shape[0]] if want.dim() else torch.tensor(1.0)
                (want * wt).sum().backward()
                out = got.full_tensor() if got.placements[0].is_partial() else got
                if isinstance(out, DTensor):
                    out = out.redistribute(mesh, [Replicate()]).to_local()
                (out * wt).sum().backward()
                _close(dx.grad.full_tensor(), ref.grad, what + " grad")
    # torch.norm (the deprecated API): 'fro' and a number
    dx = distribute_tensor(x, mesh, [Shard(0)])
    _close(torch.norm(dx, "fro").full_tensor(), torch.norm(x, "fro"), "norm fro")
    _close(dx.norm(3, dim=0).full_tensor(), x.norm(3, dim=0), "Tensor.norm(3, dim=0)")
    # a zero norm has a zero gradient, as torch's
    z = distribute_tensor(torch.zeros(2 * world, 3), mesh, [Shard(0)]).requires_grad_()
    torch.linalg.vector_norm(z).backward()
    assert torch.equal(z.grad.full_tensor(), torch.zeros(2 * world, 3))
    return True


def _foreach_and_clip(rank: int, world: int) -> bool:
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(world * 3, 4, generator=g), torch.randn(5, generator=g),
          torch.randn(world + 1, 2, generator=g)]  # fmt: skip
    places = [[Shard(0)], [Replicate()], [Shard(0)]]
    dts = [distribute_tensor(t, mesh, p) for t, p in zip(ts, places)]
    for ord_ in ORDS:
        with CommDebugMode() as cm:
            got = torch._foreach_norm(dts, ord_)
        assert cm.get_comm_counts().get("all_gather", 0) == 0, cm.get_comm_counts()
        for a, t in zip(got, ts):
            _close(a.full_tensor(), torch.linalg.vector_norm(t, ord_), f"_foreach_norm {ord_}")
        if math.isfinite(ord_):
            with CommDebugMode() as cm:
                ps = torch._foreach_powsum(dts, ord_)
            assert cm.get_total_counts() == 0
            for a, t, p in zip(ps, ts, places):
                assert a.placements == ((Partial("sum"),) if p[0].is_shard() else (Replicate(),))
                _close(a.full_tensor(), (t.abs() ** ord_).sum(), f"_foreach_powsum {ord_}")
    # under torch.compile (aot_eager): the same shard-wise kernels, traced
    vn = torch.compile(lambda t: torch.linalg.vector_norm(t, 2.0) * 2, backend="aot_eager")
    _close(vn(dts[0]).full_tensor(), torch.linalg.vector_norm(ts[0], 2.0) * 2, "compiled norm")
    fn = torch.compile(lambda a, b: torch._foreach_norm([a, b], math.inf), backend="aot_eager")
    for a, t in zip(fn(dts[0], dts[2]), (ts[0], ts[2])):
        _close(a.full_tensor(), torch.linalg.vector_norm(t, math.inf), "compiled _foreach_norm")
    # clip_grad_norm_ over sharded gradients: the plain result, no all-gather
    for norm_type in (2.0, math.inf, 1.0):
        params = [torch.nn.Parameter(t.clone()) for t in ts]
        dparams = [torch.nn.Parameter(d.detach().clone()) for d in dts]
        for p, dp in zip(params, dparams):
            p.grad = p.detach() * 3
            dp.grad = dp.detach() * 3
        want = torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type)
        with CommDebugMode() as cm:
            got = torch.nn.utils.clip_grad_norm_(dparams, 1.0, norm_type)
        assert cm.get_comm_counts().get("all_gather", 0) == 0, (norm_type, cm.get_comm_counts())
        _close(got.full_tensor(), want, f"clip_grad_norm_ {norm_type}")
        for p, dp in zip(params, dparams):
            _close(dp.grad.full_tensor(), p.grad, f"clipped grad {norm_type}")
    return True


def _follow_input(rank: int, world: int) -> bool:
    """softmax, scans, topk / sort / kthvalue and logsumexp over a sharded dim gather it
    where it is (one all-gather, Replicate output, as PyTorch DTensor); over another dim
    they keep the shard and communicate nothing."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(2 * world, 5, 3, generator=torch.Generator().manual_seed(2))
    ops = {
        "softmax": lambda t, d: t.softmax(d),
        "cumsum": lambda t, d: t.cumsum(d),
        "cummax": lambda t, d: t.cummax(d).values,
        "logsumexp": lambda t, d: t.logsumexp(d),
        "topk": lambda t, d: t.topk(2, dim=d).values,
        "sort": lambda t, d: t.sort(d).values,
        "kthvalue": lambda t, d: t.kthvalue(2, dim=d).values,
    }
    for name, fn in ops.items():
        for d in (0, 1):
            dx = distribute_tensor(x, mesh, [Shard(0)])  # fresh: no memo of a gathered copy
            with CommDebugMode() as cm:
                y = fn(dx, d)
            _close(y.full_tensor(), fn(x, d), f"{name} dim {d}")
            if d == 0:
                assert y.placements == (Replicate(),), (name, y.placements)
                assert dict(cm.get_comm_counts()) == {"all_gather": 1}, (name, cm.get_comm_counts())
                _close(y.to_local(), fn(x, d), f"{name} to_local")
            else:
                assert y.placements == (Shard(0),), (name, y.placements)
                assert cm.get_total_counts() == 0, (name, cm.get_comm_counts())
    return True


@multiproc
def test_norms_and_following_ops_2_ranks(dist2):
    assert dist2.run(_vector_norms) == [True] * 2
    assert dist2.run(_foreach_and_clip) == [True] * 2
    assert dist2.run(_follow_input) == [True] * 2


@multiproc
def test_norms_4_ranks(dist4):
    assert dist4.run(_vector_norms) == [True] * 4
