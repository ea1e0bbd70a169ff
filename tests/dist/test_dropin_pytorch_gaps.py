"""The last gaps found running PyTorch 2.13's DTensor / TP test files with their imports
switched to hyper_shard (test_dtensor, parallel/test_parallelize_api, test_dtensor_ops),
each checked as in ``test_dropin_pytorch_tests``: the same code runs with
``torch.distributed.tensor`` and with ``hyper_shard`` in one process and the results (or
errors) are compared; where hyper_shard deliberately differs (docs/parallel.md, "Coming
from PyTorch DTensor") the check says so, checks hyper_shard's behaviour against plain
torch, and that every rank gets the same answer (never a hang)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import hyper_shard as hs

from .test_dropin_pytorch_ops import _both, _done
from .test_dropin_pytorch_tests import _canon, _lib

pytestmark = pytest.mark.multiproc

LIBS = ("torch", "hs")


def _parallel(L):
    if L.name == "torch":
        import torch.distributed.tensor.parallel as P

        return P
    return hs.parallel


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------- parallel/test_parallelize_api: a row-wise Linear
def check_rowwise_linear(rank, world):
    """A ``RowwiseParallel`` ``nn.Linear`` fed each rank's slice of the input, compared with
    the plain module as PyTorch's test does: forward, gradients, an SGD step. The bias (left
    ``Replicate`` by the style) has PyTorch's ``Replicate`` gradient, whole on every rank
    after backward, so rank 0 alone may read it with ``redistribute``/``full_tensor`` (no
    collective; with a ``Partial`` gradient that was a collective of rank 0 alone, and the
    ranks waited for ever); two backward passes accumulate whole gradients. A
    ``SequenceParallel`` norm's replicated weights keep ``Partial(sum)`` gradients, as in
    PyTorch."""
    out = {}
    for name in LIBS:
        L = _lib(name)
        P = _parallel(L)
        mesh = L.mesh((world,))
        torch.manual_seed(5)
        ref = torch.nn.Linear(16, 10)
        tp = P.parallelize_module(
            torch.nn.Linear(16, 10).requires_grad_(), mesh, P.RowwiseParallel()
        )
        with torch.no_grad():
            tp.weight.copy_(L.distribute_tensor(ref.weight.detach(), mesh, [L.Shard(1)]))
            tp.bias.copy_(L.distribute_tensor(ref.bias.detach(), mesh, [L.Replicate()]))
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.25)
        opt = torch.optim.SGD(tp.parameters(), lr=0.25)
        x = _r(9, 16, seed=1)
        for _ in range(2):  # two backward passes: gradients accumulate
            y_ref = ref(x)
            y = tp(x.chunk(world, dim=-1)[rank])  # a plain tensor (use_local_output)
            if isinstance(y, L.DTensor):
                y = y.redistribute(y.device_mesh, [L.Replicate()]).to_local()
            assert torch.allclose(y, y_ref, atol=1e-6), name
            y_ref.sum().backward()
            y.sum().backward()
        got = {"bias_grad_placements": tuple(type(p).__name__ for p in tp.bias.grad.placements)}
        if rank == 0:  # local reads on one rank only: never a collective
            got["bias_grad"] = tp.bias.grad.redistribute(
                tp.bias.grad.device_mesh, [L.Replicate()]
            ).to_local()
            got["bias_grad_full"] = tp.bias.grad.full_tensor()
            assert torch.allclose(got["bias_grad"], ref.bias.grad, atol=1e-5), name
            assert torch.allclose(got["bias_grad_full"], ref.bias.grad, atol=1e-5), name
        w_grad = tp.weight.grad.full_tensor()
        assert torch.allclose(w_grad, ref.weight.grad, atol=1e-5), name
        ref_opt.step()
        opt.step()
        assert torch.allclose(tp.weight.full_tensor(), ref.weight, atol=1e-6), name
        if rank == 0:
            assert torch.allclose(tp.bias.to_local(), ref.bias, atol=1e-6), name
        out[name] = got["bias_grad_placements"]
    assert out["hs"] == out["torch"] == ("Replicate",), out

    # SequenceParallel: the norm's replicated weight and bias: Partial(sum), as PyTorch
    def seq(L):
        P = _parallel(L)
        mesh = L.mesh((world,))
        norm = P.parallelize_module(torch.nn.LayerNorm(6), mesh, P.SequenceParallel())
        x = L.distribute_tensor(_r(2, 8, 6, seed=2), mesh, [L.Shard(1)])
        norm(x).sum().backward()
        g = norm.weight.grad
        return [_canon(p) for p in g.placements], g.to_local(), norm.bias.grad.to_local()

    _both(seq, "SequenceParallel norm weight gradients")
    return _done()


def test_rowwise_linear(dist4):
    assert dist4.run(check_rowwise_linear, timeout=240) == [True] * 4


# ------------------------------------------------------------- test_dtensor: from_local
def check_from_local(rank, world):
    """``from_local`` of a DTensor raises RuntimeError with PyTorch's phrase on every
    rank; ``run_check=True`` raises ValueError on every rank for a dtype or requires_grad
    that differs on one rank, and ``run_check=False`` does not look. Local shapes that
    differ outside the sharded dim are refused on every rank by hyper_shard even with
    ``run_check=False`` (PyTorch builds a DTensor whose global shape differs per rank)."""
    mesh_of = {n: _lib(n).mesh((world,)) for n in LIBS}

    def of_dtensor(L):
        d = L.DTensor.from_local(torch.ones(2, 2), mesh_of[L.name], [L.Shard(0)])
        return L.DTensor.from_local(d, mesh_of[L.name], [L.Shard(0)])

    _both(of_dtensor, "from_local of a DTensor")
    try:
        of_dtensor(_lib("hs"))
        raise AssertionError("from_local of a DTensor: no error")
    except RuntimeError as e:
        assert "the local_tensor argument only accepts torch.Tensor" in str(e), e

    def local(kind):
        t = _r(3, 3 if kind != "stride" else 4, seed=3).requires_grad_()
        if rank == 0:
            if kind == "dtype":
                t = t.to(torch.float64)
            elif kind == "requires_grad":
                t = t.detach()
            else:
                t = t.t()
        return t

    for kind in ("dtype", "requires_grad", "stride"):
        for run_check in (True, False):

            def make(L, kind=kind, run_check=run_check):
                d = L.DTensor.from_local(
                    local(kind), mesh_of[L.name], [L.Shard(0)], run_check=run_check
                )
                return [_canon(p) for p in d.placements], d.dtype

            if kind == "stride" and not run_check:
                make(_lib("torch"))  # PyTorch does not look: a DTensor on every rank
                with pytest.raises(ValueError, match="differ outside the sharded tensor dim"):
                    make(_lib("hs"))  # refused on every rank, together
            elif kind == "dtype" and not run_check:
                for L in map(_lib, LIBS):  # rank 0's dtype differs: compared per rank
                    make(L)
            else:
                _both(make, f"from_local {kind} run_check={run_check}")
    return _done()


def test_from_local(dist4):
    assert dist4.run(check_from_local) == [True] * 4


# ------------------------------------------------ test_dtensor: torch.save / torch.load
def _load_in_subprocess(path: str, preamble: str) -> subprocess.CompletedProcess:
    code = (
        f"import torch\n{preamble}\nt = torch.load({path!r}, weights_only=True)\n"
        f"print(type(t).__name__, t.to_local().tolist())"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def check_save_load(rank, world, tmp: str):
    """``torch.save`` of a DTensor loads back in the process (``weights_only`` both ways)
    with its placements and local shard, as PyTorch's; and in a new process with
    ``weights_only=True`` it loads once hyper_shard is imported, while without the import
    ``torch.load`` raises torch's UnpicklingError naming hyper_shard's rebuild function
    (PyTorch's message names ``torch.distributed.tensor``, its own module)."""
    import io

    def roundtrip(L):
        d = L.DTensor.from_local(_r(3, 3, seed=rank), L.mesh((world,)), [L.Shard(0)])
        buf = io.BytesIO()
        torch.save(d, buf)
        out = []
        for weights_only in (False, True):
            buf.seek(0)
            r = torch.load(buf, weights_only=weights_only)
            out += [r, r.to_local(), torch.equal(r.to_local(), d.to_local())]
        return out

    _both(roundtrip, "torch.save / torch.load of a DTensor")
    d = hs.DTensor.from_local(
        _r(3, 3, seed=rank), hs.init_device_mesh("cpu", (world,)), [hs.Shard(0)]
    )
    if rank == 0:  # two fresh interpreters from one rank
        path = str(Path(tmp) / "dt.pt")
        torch.save(d, path)
        ok = _load_in_subprocess(path, "import hyper_shard")
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert ok.stdout.startswith("TorchDTensor") and str(d.to_local().tolist()) in ok.stdout
        bad = _load_in_subprocess(path, "")
        assert bad.returncode != 0 and "UnpicklingError" in bad.stderr, bad.stderr[-2000:]
        assert "hyper_shard.platform.torch.dtensor._rebuild_dtensor" in bad.stderr
    return _done()


def test_save_load(dist2):
    with tempfile.TemporaryDirectory() as tmp:
        assert dist2.run(check_save_load, tmp, timeout=600) == [True] * 2


# ------------------------------- test_dtensor: an in-place op on a view of to_local()
def check_inplace_on_local_view(rank, world):
    """PyTorch's ``test_inplace_on_local_tensor_view`` (marked expectedFailure there:
    torch raises "a view ... is being modified inplace" for ``to_local()`` of a non-leaf):
    on hyper_shard the local tensor of a ``Shard`` DTensor is an autograd view of its data,
    so the in-place op lands in the DTensor and the gradients are the single-device ones."""
    mesh = hs.init_device_mesh("cpu", (world,))
    seq, vocab = 8, 16
    full = _r(seq, vocab * world, seed=4)
    ref_leaf = full.clone().requires_grad_()
    ref = ref_leaf * 2
    shift = _r(seq, seed=5)
    ref = ref - shift.unsqueeze(1)
    (ref.square().sum()).backward()

    leaf = full.chunk(world, dim=1)[rank].clone().requires_grad_()
    logits = hs.DTensor.from_local(leaf, mesh, [hs.Shard(1)]) * 2  # non-leaf
    local = logits.to_local()
    local -= shift.unsqueeze(1)  # in place on the view
    torch.testing.assert_close(logits.full_tensor(), ref.detach())  # landed in the DTensor
    logits.square().sum().backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad.chunk(world, dim=1)[rank])
    with pytest.raises(RuntimeError, match="view"):  # what PyTorch does today
        leaf2 = full.chunk(world, dim=1)[rank].clone().requires_grad_()
        tl = torch.distributed.tensor.DTensor.from_local(
            leaf2, _lib("torch").mesh((world,)), [torch.distributed.tensor.Shard(1)]
        )
        v = (tl * 2).to_local()
        v -= shift.unsqueeze(1)
    return True


def test_inplace_on_local_view(dist2):
    assert dist2.run(check_inplace_on_local_view) == [True] * 2


# ------------------------------------------------------- test_dtensor: vmap, torch.dist
def check_vmap(rank, world):
    """``torch.vmap`` over DTensors (PyTorch's ``test_vmap_embedding``): batched inputs
    sharded on the vmapped dim run locally and give the DTensor sharded on the output
    dim, as PyTorch's; other layouts are gathered first (the values are torch's); the
    gradients of batched and unbatched inputs equal plain torch's."""
    g = torch.Generator().manual_seed(6)
    idx = torch.randint(0, 8, (8, 6), generator=g)
    emb = torch.randn(8, 8, 5, generator=g)
    mesh_of = {n: _lib(n).mesh((world,)) for n in LIBS}

    def run(L, pi, pe):
        di = L.distribute_tensor(idx, mesh_of[L.name], [pi(L)])
        de = L.distribute_tensor(emb, mesh_of[L.name], [pe(L)])
        return torch.vmap(F.embedding)(di, de)

    S0, R = (lambda L: L.Shard(0)), (lambda L: L.Replicate())
    for pi, pe, what in ((S0, S0, "S(0), S(0)"), (S0, R, "S(0), R"), (R, R, "R, R")):
        _both(lambda L, pi=pi, pe=pe: run(L, pi, pe), f"vmap(embedding) {what}")
    ref = torch.vmap(F.embedding)(idx, emb)
    for pi, pe in ((R, lambda L: L.Shard(1)), (lambda L: L.Shard(1), lambda L: L.Shard(2))):
        out = run(_lib("hs"), pi, pe)  # sharded inside a sample: gathered, then local
        torch.testing.assert_close(out.full_tensor(), ref)

    x, w = _r(8, 5, 3, seed=7), _r(3, 4, seed=8)

    def mm(L):
        dx = L.distribute_tensor(x, mesh_of[L.name], [L.Shard(0)]).requires_grad_()
        dw = L.distribute_tensor(w, mesh_of[L.name], [L.Replicate()]).requires_grad_()
        y = torch.vmap(torch.mm, in_dims=(0, None), out_dims=1)(dx, dw)
        (y * 2).sum().backward()
        return y, dx.grad.full_tensor(), dw.grad.full_tensor()

    _both(mm, "vmap(mm, in_dims=(0, None), out_dims=1) and its gradients")
    rx, rw = x.clone().requires_grad_(), w.clone().requires_grad_()
    (torch.vmap(torch.mm, in_dims=(0, None), out_dims=1)(rx, rw) * 2).sum().backward()
    _, gx, gw = mm(_lib("hs"))
    torch.testing.assert_close(gx, rx.grad)
    torch.testing.assert_close(gw, rw.grad)
    return _done()


def test_vmap(dist4):
    assert dist4.run(check_vmap) == [True] * 4


def check_dist(rank, world):
    """``torch.dist`` (test_dtensor_ops' ``dist``): the values are torch's for every p and
    layout; on sharded inputs PyTorch returns its internal ``_NormPartial``/``Partial``
    placement, hyper_shard a ``Replicate`` scalar (no norm-partial placement; the same one
    all-reduce)."""
    a, b = _r(8, 4, seed=9), _r(8, 4, seed=10)
    out = {}
    for name in LIBS:
        L = _lib(name)
        mesh = L.mesh((world,))
        for pl in (L.Shard(0), L.Shard(1), L.Replicate()):
            for p in (2.0, 1.0, 3.0, float("inf"), 0.0):
                r = torch.dist(
                    L.distribute_tensor(a, mesh, [pl]), L.distribute_tensor(b, mesh, [pl]), p
                )
                out[(name, str(pl), p)] = (r.full_tensor(), type(r.placements[0]).__name__)
                torch.testing.assert_close(r.full_tensor(), torch.dist(a, b, p))
    for (name, pl, p), (_, kind) in out.items():
        if name == "hs":
            assert kind == "Replicate", (pl, p, kind)
    return True


def test_dist(dist4):
    assert dist4.run(check_dist) == [True] * 4


# ------------------------- test_dtensor: a torch DeviceMesh entered with `with mesh:`
def check_torch_mesh_context(rank, world):
    """PyTorch's tests enter their (torch) meshes with ``with mesh:`` and call the DTensor
    API without a mesh (``test_dtensor_api_device_mesh_context_manager``): hyper_shard takes
    the innermost entered torch mesh as the default mesh, as PyTorch does (a hyper_shard
    mesh entered inside it wins)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    m1 = torch_mesh("cpu", (world,))
    m2 = torch_mesh("cpu", (2, world // 2))
    x = _r(4 * world, 3, seed=11)

    def run(L):
        with m1:
            d = L.DTensor.from_local(_r(3, 3, seed=rank), placements=[L.Shard(0)])
            r = d.redistribute(placements=[L.Replicate()])
            s = L.distribute_tensor(x, placements=[L.Shard(0)])
            with m2:
                t = L.distribute_tensor(x, placements=[L.Shard(0), L.Replicate()])
            after = L.distribute_tensor(x, placements=[L.Shard(0)])
        return r, s.to_local(), t, t.to_local().shape, after.to_local()

    _both(run, "with torch_mesh: the default mesh")
    hs_mesh = hs.init_device_mesh("cpu", (2, world // 2))
    with m1, hs_mesh:  # the hyper_shard mesh entered inside wins
        assert hs.distribute_tensor(x, placements=[hs.Shard(0), hs.Shard(1)]).device_mesh is hs_mesh
    return _done()


def test_torch_mesh_context(dist4):
    assert dist4.run(check_torch_mesh_context) == [True] * 4
