"""The public-API behaviours of PyTorch DTensor that code written for it relies on (issue 12):
default meshes, torch meshes, sub-meshes, from_local/stride metadata, meta-device paths,
plain one-element tensors, PyTorch's errors, out=, plan-key warnings, PrepareModuleInput,
save/load and vmap — each against plain torch or against the error PyTorch raises; public
bug reports on device meshes (``report_*``)."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh as torch_mesh

import hyper_shard as hs
from hyper_shard import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from hyper_shard.parallel import (
    ColwiseParallel,
    LayoutLengthError,
    PlanKeyWarning,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _g(seed):
    return torch.Generator().manual_seed(seed)


def check_meshes(rank, world):
    """``with mesh:`` defaults; a torch DeviceMesh is accepted everywhere (converted once,
    its process groups reused); parallelize_module(model, torch_mesh, RowwiseParallel())
    trains as one device; a failing call raises on every rank and leaves the groups usable."""
    glob = torch.randn(6, 4, generator=_g(0))
    with hs.init_device_mesh("cpu", (world,)) as mesh:
        d = distribute_tensor(glob, placements=[Shard(0)])
        assert d.device_mesh is mesh and d.to_local().shape == (3, 4)
        f = DTensor.from_local(torch.ones(2, 3), placements=[Shard(1)])
        assert f.shape == (2, 6) and f.redistribute(placements=[Replicate()]).shape == (2, 6)
        z = hs.zeros(4, 4, placements=[Shard(0)])
        assert z.device_mesh is mesh and z.to_local().shape == (2, 4)
        m2 = DeviceMesh("cpu", [[0, 1]])
        with m2:
            assert distribute_tensor(glob, placements=[Replicate(), Shard(0)]).device_mesh is m2
        assert distribute_tensor(glob, placements=[Shard(0)]).device_mesh is mesh
    with pytest.raises(ValueError, match="needs device_mesh"):
        distribute_tensor(glob, placements=[Shard(0)])
    # a torch mesh, as PyTorch's own test base builds them
    tm = torch_mesh("cpu", (world,))
    d = distribute_tensor(glob, tm, [Shard(1)])
    assert isinstance(d, hs.DTensor) and d.device_mesh == hs.init_device_mesh("cpu", (world,))
    torch.testing.assert_close(d.full_tensor(), glob)
    assert distribute_tensor(glob, tm, [Shard(0)]).device_mesh is d.device_mesh  # cached
    torch.testing.assert_close(d.redistribute(tm, [Shard(0)]).full_tensor(), glob)
    torch.manual_seed(5)
    ref = nn.Linear(8, 6)
    tp = parallelize_module(copy.deepcopy(ref), tm, RowwiseParallel())
    x = torch.randn(3, 8, generator=_g(1))
    out = tp(x.chunk(world, -1)[rank])
    torch.testing.assert_close(out, ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(tp.weight.grad.full_tensor(), ref.weight.grad)
    # a plan error raises on every rank before any collective; the groups still work
    with pytest.raises(TypeError, match="ParallelStyle"):
        parallelize_module(nn.Linear(4, 4), tm, {"": "colwise"})
    torch.testing.assert_close(d.full_tensor(), glob)
    return True


def test_meshes(dist2):
    assert dist2.run(check_meshes) == [True, True]


def check_sub_mesh(rank, world):
    """A mesh over ranks 0 and 2 of 4, as PyTorch: ranks outside hold empty local shards,
    get empty / zero / True results and take part in no collective (ranks 1 and 3 never
    call a collective the others wait for)."""
    mesh = DeviceMesh("cpu", [0, 2])
    inside = rank in (0, 2)
    d = DTensor.from_local(torch.ones(3, 4), mesh, [Shard(0)])
    assert d.shape == (6, 4)
    empty = torch.tensor([])
    torch.testing.assert_close(d.to_local(), torch.ones(3, 4) if inside else empty)
    torch.testing.assert_close((d + 2).to_local(), torch.full((3, 4), 3.0) if inside else empty)
    s = d.sum()
    torch.testing.assert_close(s.to_local(), torch.tensor(12.0) if inside else torch.tensor(0.0))
    if inside:
        torch.testing.assert_close(s.full_tensor(), torch.tensor(24.0))
    parts = d.split([2, 2], dim=1)
    for p in parts:
        torch.testing.assert_close(p.to_local(), torch.ones(3, 2) if inside else empty)
    assert d.equal(DTensor.from_local(torch.ones(3, 4), mesh, [Shard(0)])) is True
    r = d.redistribute(mesh, [Replicate()])
    torch.testing.assert_close(r.to_local(), torch.ones(6, 4) if inside else empty)
    torch.testing.assert_close(r.full_tensor(), torch.ones(6, 4) if inside else empty)
    z = hs.zeros(8, 3, device_mesh=mesh, placements=[Shard(0)])
    assert tuple(z.to_local().shape) == ((4, 3) if inside else (0,))
    g = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    torch.testing.assert_close(
        g.to_local(), torch.arange(8.0)[4 * (rank // 2) : 4 * (rank // 2) + 4] if inside else empty
    )
    # the world's ranks still agree afterwards
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    assert t.item() == world
    return True


def test_sub_mesh(dist4):
    assert dist4.run(check_sub_mesh) == [True] * 4


def check_metadata(rank, world):
    """stride() is PyTorch's global stride (from_local, transpose/permute, contiguous);
    from_local validates as PyTorch; run_check compares dtype, requires_grad and layout on
    every rank; new_empty_strided; as_strided (identity, or any on Replicate)."""
    mesh = hs.init_device_mesh("cpu", (world,))
    assert DTensor.from_local(torch.randn(4, 8), mesh, [Shard(0)]).stride() == (8, 1)
    assert DTensor.from_local(torch.randn(8, 4), mesh, [Shard(1)]).stride() == (4 * world, 1)
    lt = torch.randn(8, 4, 8).permute(1, 2, 0)  # stride (8, 1, 32)
    assert DTensor.from_local(lt, mesh, [Shard(1)]).stride() == (8 * world, 1, 32 * world)
    t = torch.rand(3, 5, 6, requires_grad=True)
    d = DTensor.from_local(t, mesh, [Shard(0)])
    tr = d.transpose(0, 2)
    glob_t = torch.empty(3 * world, 5, 6).transpose(0, 2)
    assert tr.stride() == glob_t.stride() and not tr.is_contiguous()
    c = tr.contiguous()
    assert c.stride() == glob_t.contiguous().stride() and c.contiguous() is c
    pm = d.permute(2, 0, 1)
    assert pm.stride() == torch.empty(3 * world, 5, 6).permute(2, 0, 1).stride()
    # uneven shards read right: the global stride of the global tensor
    u = DTensor.from_local(torch.randn(3 if rank == 0 else 2, 4), mesh, [Shard(0)])
    assert u.shape == (5, 4) and u.stride() == (4, 1)
    # shape and stride go together, as PyTorch requires
    with pytest.raises(RuntimeError, match="Please pass both shape and stride at the same time"):
        DTensor.from_local(torch.randn(3, 2), mesh, [Shard(0)], shape=(5, 2))
    with pytest.raises(RuntimeError, match="Please pass both shape and stride at the same time"):
        DTensor.from_local(torch.randn(3, 2), mesh, [Shard(0)], stride=(2, 1))
    ok = DTensor.from_local(
        torch.randn(3 if rank == 0 else 2, 2), mesh, [Shard(0)], shape=(5, 2), stride=(2, 1)
    )
    assert ok.size() == (5, 2) and ok.stride() == (2, 1)
    # run_check: every rank raises together on a metadata disagreement
    for bad in (
        torch.randn(3, 3, dtype=torch.float64 if rank == 0 else torch.float32),
        torch.randn(3, 3, requires_grad=rank == 0),
        torch.randn(4, 3).t() if rank == 0 else torch.randn(3, 4),
    ):
        with pytest.raises(ValueError, match="Inconsistent tensor metadata"):
            DTensor.from_local(bad, mesh, [Replicate()], run_check=True)
        DTensor.from_local(bad, mesh, [Replicate()])  # no check, no error (as PyTorch)
    # run_check broadcasts Replicate values from coordinate 0 (as PyTorch)
    r = DTensor.from_local(torch.full((2,), float(rank)), mesh, [Replicate()], run_check=True)
    torch.testing.assert_close(r.to_local(), torch.zeros(2))
    # new_empty_strided: global size/stride, sharded like the input when the shape matches
    x = distribute_tensor(torch.randn(4, 8, generator=_g(2)), mesh, [Shard(1)])
    n = x.new_empty_strided((4, 8), (8, 1))
    assert n.placements == (Shard(1),) and n.to_local().shape == (4, 8 // world)
    assert n.to_local().stride() == (8 // world, 1) and n.contiguous() is n
    n = x.new_empty_strided((4, 8), (1, 4))  # column-major
    assert n.stride() == torch.empty_strided((4, 8), (1, 4)).stride()
    n = x.new_empty_strided((4, 2), (2, 1))
    assert n.placements == (Replicate(),) and n.to_local().shape == (4, 2)
    g = x.new_empty_strided((4, 8), (8, 1), requires_grad=True)
    assert g.is_leaf and g.requires_grad
    (g.sum() * 0).backward()
    assert isinstance(g.grad, DTensor) and g.grad.shape == (4, 8)
    # as_strided: the identity keeps the shards; any form on Replicate; else PyTorch's error
    glob = torch.arange(24.0).view(4, 6)
    s = distribute_tensor(glob, mesh, [Shard(1)])
    a = s.as_strided(s.size(), s.stride())
    assert a.placements == (Shard(1),) and a.stride() == glob.stride()
    torch.testing.assert_close(a.full_tensor(), glob)
    rep = distribute_tensor(glob, mesh, [Replicate()])
    torch.testing.assert_close(
        rep.as_strided((3, 3), (1, 6), 2).full_tensor(), glob.as_strided((3, 3), (1, 6), 2)
    )
    # another form on a sharded DTensor reads the gathered global tensor (PyTorch raises),
    # laid out as the global tensor is, a transposed one included
    torch.testing.assert_close(
        s.as_strided((3, 3), (1, 6)).full_tensor(), glob.as_strided((3, 3), (1, 6))
    )
    tt = distribute_tensor(glob, mesh, [Shard(0)]).t()  # (6, 4), stride (1, 6)
    torch.testing.assert_close(
        tt.as_strided((2, 5), (6, 1), 1).full_tensor(), glob.t().as_strided((2, 5), (6, 1), 1)
    )
    return True


def test_metadata(dist2):
    assert dist2.run(check_metadata) == [True, True]


class _MLP(nn.Module):
    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        self.net1 = nn.Linear(5, 8, device=device)
        self.net2 = nn.Linear(8, 4, device=device)

    def forward(self, x):
        return self.net2(torch.relu(self.net1(x)))

    def reset(self) -> None:
        """Seeded values, written into plain or DTensor parameters alike (copy_ takes a
        DTensor source to the parameter's placements)."""
        with torch.no_grad():
            for i, m in enumerate((self.net1, self.net2)):
                w = torch.randn(m.weight.shape, generator=_g(10 + i))
                if isinstance(m.weight, DTensor):
                    w = distribute_tensor(w, m.weight.device_mesh, [Replicate()])
                m.weight.copy_(w)
                m.bias.fill_(0.1 * (i + 1))


def check_meta_and_factories(rank, world):
    """Modules built on meta, parallelized, then materialised (to_empty) train like plain
    ones; distribute_tensor/from_local of meta tensors; empty_like/new_empty keep Partial
    (uninitialised), ones/zeros_like make Replicate; module.to(dtype) on DTensor params."""
    mesh = hs.init_device_mesh("cpu", (world,))
    plan = {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
    tp = parallelize_module(_MLP("meta"), mesh, plan)
    assert tp.net1.weight.is_meta and isinstance(tp.net1.weight, DTensor)
    tp.to_empty(device="cpu")
    assert not tp.net1.weight.is_meta and tp.net1.weight.placements == (Shard(0),)
    tp.reset()
    ref = _MLP()
    ref.reset()
    opt, ropt = torch.optim.SGD(tp.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(2):
        x = torch.randn(6, 5, generator=_g(20 + s))
        out, rout = tp(x), ref(x)
        torch.testing.assert_close(out, rout)
        out.sum().backward()
        rout.sum().backward()
        opt.step()
        ropt.step()
    meta = torch.randn(8, 4, device="meta")
    for spec in ([Shard(0)], [Replicate()]):
        for d in (distribute_tensor(meta, mesh, spec), DTensor.from_local(meta, mesh, spec)):
            assert d.is_meta
            e = torch.empty_like(d, device="cpu")
            torch.nn.init.constant_(e, 1.5)
            assert e.device.type == "cpu" and e.placements == d.placements
            torch.testing.assert_close(e.to_local(), torch.full(e.to_local().shape, 1.5))
    p = DTensor.from_local(torch.randn(4, 2, generator=_g(rank)), mesh, [Partial()])
    assert torch.empty_like(p).placements == (Partial(),)
    assert p.new_empty((4, 2)).placements == (Partial(),)
    for fn, val in ((torch.ones_like, 1.0), (torch.zeros_like, 0.0)):
        o = fn(p)
        assert o.placements == (Replicate(),)
        torch.testing.assert_close(o.full_tensor(), torch.full((4, 2), val))
    torch.fill_(p, 8)  # the GLOBAL value becomes 8 (PyTorch's gives 8 * world here)
    torch.testing.assert_close(p.full_tensor(), torch.full((4, 2), 8.0))

    class Buf(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.tensor(0.0))

    with torch.device("meta"):
        m = Buf()
        m._buffers["b"] = DTensor.from_local(m.b, mesh, [Partial()])
    m.to_empty(device="cpu")
    assert m.b.placements == (Partial(),) and not m.b.is_meta
    bf = parallelize_module(_MLP(), mesh, plan).to(torch.bfloat16)
    w = bf.net1.weight
    assert w.dtype == torch.bfloat16 and w.to_local().dtype == torch.bfloat16
    assert bf(torch.randn(2, 5, dtype=torch.bfloat16)).dtype == torch.bfloat16
    return True


def test_meta_and_factories(dist2):
    assert dist2.run(check_meta_and_factories) == [True, True]


def check_plain_scalars_and_errors(rank, world):
    """One-element plain tensors next to DTensors are Replicate (PyTorch's warning for the
    1-D one); PyTorch's errors and key phrases: redistribute to Partial, distribute_tensor's
    argument errors, in-place placement changes; out= redistributes into out."""
    mesh = hs.init_device_mesh("cpu", (world,))
    lt = torch.arange(8.0).view(4, 2)
    s = distribute_tensor(lt, mesh, [Shard(0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close((torch.tensor(2.0) + s).full_tensor(), lt + 2)
    with pytest.warns(UserWarning, match="non-scalar tensor with numel=1"):
        torch.testing.assert_close((torch.tensor([3.0]) * s).full_tensor(), lt * 3)
    out = s + torch.ones(1, 1, 1)  # adds a leading dim, as plain torch broadcasting
    assert out.shape == (1, 4, 2)
    torch.testing.assert_close(out.full_tensor(), lt + torch.ones(1, 1, 1))
    with pytest.raises(ValueError, match="mixed with DTensor"):
        s + torch.ones(2)
    # redistribute to Partial: only keeping a Partial it already has, as PyTorch
    with pytest.raises(RuntimeError, match="Can not redistribute from S\\(0\\) to P"):
        s.redistribute(mesh, [Partial()])
    p = DTensor.from_local(torch.ones(2), mesh, [Partial()])
    assert p.redistribute(mesh, [Partial()]) is p
    with pytest.raises(RuntimeError, match="Can not redistribute"):
        p.redistribute(mesh, [Partial("max")])
    with pytest.raises(RuntimeError, match="placements is needed for redistribute"):
        s.redistribute(mesh)
    # distribute_tensor's argument checks, PyTorch's phrases
    m2 = DeviceMesh("cpu", [[0, 1]])
    with pytest.raises(ValueError, match="must have the same length"):
        distribute_tensor(lt, m2, [Shard(0)])
    with pytest.raises(RuntimeError, match="distribute leaf tensor"):
        distribute_tensor(torch.ones(2, requires_grad=True) * 2, mesh, [Shard(0)])
    with pytest.raises(ValueError, match="to a different device mesh"):
        distribute_tensor(s, m2, [Replicate(), Shard(0)])
    with pytest.raises(ValueError, match="to a different placements"):
        distribute_tensor(s, mesh, [Replicate()])
    assert distribute_tensor(s, mesh, [Shard(0)]) is s
    # an in-place op that would change the target's placements
    r = distribute_tensor(torch.randn(3, 4, generator=_g(4)), mesh, [Replicate()])
    with pytest.raises(RuntimeError, match="in-place operations that require placement changes"):
        DTensor.from_local(torch.ones(2), mesh, [Partial()]).exp_()
    assert r.add_(p.sum()).placements == (Replicate(),)
    # out= in out's own placements (the result is redistributed into it)
    rep = distribute_tensor(torch.zeros(4, 2), mesh, [Replicate()])
    assert torch.add(s, 3, out=rep) is rep and rep.placements == (Replicate(),)
    torch.testing.assert_close(rep.to_local(), lt + 3)
    return True


def test_plain_scalars_and_errors(dist2):
    assert dist2.run(check_plain_scalars_and_errors) == [True, True]


class _TwoIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.linear(x) + y


def check_parallel_api(rank, world):
    """A plan key matching nothing warns (PyTorch's words + the closest names) and the rest
    of the plan applies; PrepareModuleInput: None entries leave an input alone; the layout
    length errors carry PyTorch's messages and types."""
    mesh = hs.init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    m = _MLP()
    with pytest.warns(PlanKeyWarning) as rec:
        parallelize_module(m, mesh, {"net1": ColwiseParallel(), "nett2": RowwiseParallel()})
    msg = str(rec[0].message)
    assert "'nett2' could not be resolved" in msg and "closest module names: 'net2'" in msg
    assert isinstance(m.net1.weight, DTensor) and not isinstance(m.net2.weight, DTensor)
    with pytest.raises(
        AssertionError, match="input_layouts and desired_input_layouts should have same"
    ):
        PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=(Replicate(), None))
    with pytest.raises(LayoutLengthError):  # a ValueError too
        PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=Replicate())
    t = _TwoIn()
    ref = copy.deepcopy(t)
    parallelize_module(t.linear, mesh, ColwiseParallel())
    parallelize_module(
        t, mesh, PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate())
    )
    with pytest.raises(ValueError, match="module inputs and input_layouts should have same length"):
        t(torch.randn(2, 4), torch.ones(2 * world, 4 // world))
    t = copy.deepcopy(ref)
    parallelize_module(t.linear, mesh, ColwiseParallel())
    parallelize_module(
        t,
        mesh,
        PrepareModuleInput(
            input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None)
        ),
    )
    x = torch.randn(2 * world, 4, generator=_g(3))
    y = torch.randn(2 * world, 4 // world, generator=_g(4))  # left alone: a plain local tensor
    out = t(x.chunk(world)[rank], y)
    full = ref.linear(x)
    torch.testing.assert_close(out, full.chunk(world, -1)[rank] + y)
    return True


def test_parallel_api(dist2):
    assert dist2.run(check_parallel_api) == [True, True]


def check_save_load_and_vmap(rank, world, tmp):
    """torch.load(weights_only=True) of a saved DTensor in a fresh process that only imported
    hyper_shard (as PyTorch's test loads torch.distributed.tensor's); vmap over DTensors:
    each rank maps its own whole samples (the values are torch's)."""
    mesh = hs.init_device_mesh("cpu", (world,))
    st = DTensor.from_local(torch.randn(3, 3, generator=_g(rank)), mesh, [Shard(0)])
    buf = io.BytesIO()
    torch.save(st, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert back.placements == st.placements
    torch.testing.assert_close(back.full_tensor(), st.full_tensor())
    path = os.path.join(tmp, f"dt{rank}.pt")
    torch.save({"w": st}, path)
    code = (
        f"import torch, hyper_shard; sd = torch.load(r'{path}', weights_only=True); w = sd['w']; "
        "print(type(w).__name__, tuple(w.shape), w.placements, tuple(w.to_local().shape))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[0] == "TorchDTensor" and "(6, 3)" in res.stdout, res.stdout
    g = torch.randn(4, 3, generator=_g(9))
    want = torch.func.vmap(lambda t: t * 2 + t.sum())(g)
    for pl in (Replicate(), Shard(0), Shard(1)):  # a Replicate result, or the batch's shards
        out = torch.func.vmap(lambda t: t * 2 + t.sum())(distribute_tensor(g, mesh, [pl]))
        assert out.placements == ((Shard(0),) if pl == Shard(0) else (Replicate(),))
        torch.testing.assert_close(out.full_tensor(), want)
    return True


def test_save_load_and_vmap(dist2, tmp_path):
    assert dist2.run(check_save_load_and_vmap, str(tmp_path)) == [True, True]


# ---------------------------------------------------------------------- bug reports
def report_sub_mesh_groups_and_slicing(rank, world):
    """PR #118614 (fixed here): ``get_group()`` on a rank outside a sub-mesh
    (``DeviceMesh("cpu", [0, 2])`` on ranks 1 and 3) raised an AttributeError; it is
    ``None`` there, a working group inside; #143194 / #126530: a sub-mesh of a sub-mesh
    and n-d slicing; fixed here: a mesh dim by index (``mesh[-1]``, #143194's program)
    raised "'int' object is not iterable"."""
    from hyper_shard import init_device_mesh
    from tests._helpers import assert_close_any as _eq

    sm = DeviceMesh("cpu", [0, 2])
    grp = sm.get_group()
    if rank in (1, 3):
        assert grp is None and sm.get_coordinate() is None
    else:
        ones = torch.ones(2)
        torch.distributed.all_reduce(ones, group=grp)
        _eq(ones, torch.full((2,), 2.0))
    root = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("a", "b", "c"))
    sub = root["a", "c"]
    assert tuple(sub.shape) == (2, 2)
    a4 = torch.arange(8.0).reshape(4, 2)
    _eq(distribute_tensor(a4, sub, [Shard(0), Shard(1)]), a4)
    for last in (sub["c"], sub[-1], root[2]):
        assert last.mesh_dim_names == ("c",) and last.size() == 2
        _eq(distribute_tensor(torch.arange(4.0), last, [Shard(0)]), torch.arange(4.0))


@reports(report_sub_mesh_groups_and_slicing)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
