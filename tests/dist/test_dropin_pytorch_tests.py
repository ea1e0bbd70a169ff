"""Behaviours that PyTorch's own DTensor and DeviceMesh tests check (test_device_mesh,
test_dtensor, test_pointwise_ops, test_tensor_ops, test_view_ops...), each run twice in the
same process: once with ``torch.distributed.tensor`` / ``torch.distributed.device_mesh`` and
once with ``hyper_shard``, with the imports switched. Results, placements, shapes, strides,
dtypes and error types are compared between the two, never against numbers of our own.

Where hyper_shard deliberately differs (docs/parallel.md, "Coming from PyTorch DTensor"),
the check says so and compares what must still agree (the global values)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hyper_shard as hs

pytestmark = pytest.mark.multiproc


class _Lib:
    """One library's public names, as code written for PyTorch DTensor imports them."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import torch.distributed.tensor as T
            from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        else:
            T = hs
            DeviceMesh, init_device_mesh = hs.DeviceMesh, hs.init_device_mesh
        self.DeviceMesh, self.init_device_mesh = DeviceMesh, init_device_mesh
        self.DTensor, self.distribute_tensor = T.DTensor, T.distribute_tensor
        self.Shard, self.Replicate, self.Partial = T.Shard, T.Replicate, T.Partial
        for f in ("zeros", "ones", "empty", "full", "rand", "randn"):
            setattr(self, f, getattr(T, f))
        self._meshes: dict = {}

    def mesh(self, shape: tuple, names: tuple | None = None):
        """The mesh of ``shape`` over the world, built once per library (a collective)."""
        key = (shape, names)
        if key not in self._meshes:
            self._meshes[key] = self.init_device_mesh("cpu", shape, mesh_dim_names=names)
        return self._meshes[key]


_LIB_CACHE: dict[str, _Lib] = {}


def _lib(name: str) -> _Lib:
    if name not in _LIB_CACHE:
        _LIB_CACHE[name] = _Lib(name)
    return _LIB_CACHE[name]


LIBS = ("torch", "hs")


def _canon(p) -> str:
    name = type(p).__name__
    if name == "_StridedShard":
        return f"_StridedShard({p.dim}, sf={p.split_factor})"
    if name == "Shard":
        return f"S({p.dim})"
    if name == "Replicate":
        return "R"
    return f"P({p.reduce_op})"


def _same(a, b, what: str, bad: list[str]) -> None:
    """torch's result ``a`` and hyper_shard's ``b`` agree: for DTensors the placements,
    global shape, stride, dtype, requires_grad and global value; for tensors shape, dtype
    and value; other values by ``==``. Differences are appended to ``bad`` (every rank walks
    the whole structure, so the ``full_tensor`` collectives stay aligned across ranks)."""
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            bad.append(f"{what}: {a!r} / {b!r}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{i}]", bad)
        return
    if isinstance(a, torch.Tensor) and hasattr(a, "placements"):
        if not isinstance(b, hs.DTensor):
            bad.append(f"{what}: hyper_shard gave {type(b).__name__}")
            a.full_tensor()  # the collective the other ranks run
            return
        fa, fb = a.full_tensor(), b.full_tensor()
        got = (tuple(map(_canon, b.placements)), tuple(b.shape), b.stride(), b.dtype)
        want = (tuple(map(_canon, a.placements)), tuple(a.shape), a.stride(), a.dtype)
        if got != want or a.requires_grad != b.requires_grad:
            bad.append(f"{what}: torch {want, a.requires_grad} / hs {got, b.requires_grad}")
        elif not torch.allclose(fb, fa, rtol=1e-5, atol=1e-6, equal_nan=True):
            bad.append(f"{what}: values differ: torch {fa} / hyper_shard {fb}")
        return
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or isinstance(b, hs.DTensor):
            bad.append(f"{what}: torch gave a tensor, hyper_shard {type(b).__name__}")
        elif (b.shape, b.dtype) != (a.shape, a.dtype) or not (
            torch.equal(b, a) or (a.is_floating_point() and torch.allclose(b, a, 1e-5, 1e-6))
        ):
            bad.append(f"{what}: torch {a} / hyper_shard {b}")
        return
    if a != b:
        bad.append(f"{what}: torch {a!r} / hyper_shard {b!r}")


def _both(fn, what: str) -> None:
    """``fn(lib)`` for torch then hyper_shard; the results (or the error types) agree: where
    torch raises, hyper_shard raises an instance of torch's error class too."""
    out = []
    for name in LIBS:
        try:
            out.append((True, fn(_lib(name))))
        except Exception as e:  # noqa: BLE001 - compared below
            out.append((False, e))
    (ok_a, a), (ok_b, b) = out
    if not ok_a:
        assert not ok_b, f"{what}: torch raised {type(a).__name__}: {a}; hyper_shard returned {b!r}"
        assert isinstance(b, type(a)), f"{what}: torch raised {type(a).__name__}, hyper_shard {b!r}"
        return
    assert ok_b, f"{what}: hyper_shard raised {type(b).__name__}: {b}"
    bad: list[str] = []
    _same(a, b, what, bad)
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------- test_device_mesh.py
def check_device_mesh_api(rank, world):
    """DeviceMesh queries as test_device_mesh checks them: ``mesh.mesh`` is an int tensor,
    sub-meshes carry their slice of it, ``get_local_rank``/``get_group`` without a dim on a
    2-D mesh and repeated or miscounted dim names raise RuntimeError, ``_flatten`` makes a
    1-D mesh (found again by name) whose DTensors shard as torch's, ``from_group`` builds
    meshes over existing groups."""

    def mesh2(L):
        return L.mesh((2, world // 2), ("dp", "tp"))

    _both(lambda L: mesh2(L).mesh, "mesh.mesh")
    _both(lambda L: mesh2(L).mesh.tolist(), "mesh.mesh.tolist()")
    _both(lambda L: mesh2(L)["tp"].mesh, "mesh['tp'].mesh")
    _both(lambda L: mesh2(L)["dp"].mesh, "mesh['dp'].mesh")
    _both(lambda L: L.DeviceMesh("cpu", torch.arange(world).reshape(2, -1)).mesh, "tensor mesh")
    _both(lambda L: (mesh2(L)["tp"].get_local_rank(), mesh2(L).get_local_rank("dp")), "local")
    _both(lambda L: mesh2(L).get_local_rank(), "get_local_rank() on 2-D")
    _both(lambda L: mesh2(L).get_group(), "get_group() on 2-D")
    _both(lambda L: dist.get_process_group_ranks(mesh2(L).get_group("dp")), "get_group('dp')")
    _both(lambda L: L.init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "a")), "dup names")
    _both(lambda L: L.init_device_mesh("cpu", (4,), mesh_dim_names=("a", "b")), "name count")
    _both(lambda L: mesh2(L)["pp"], "unknown dim name")
    x = torch.arange(48.0).reshape(8, 6)

    def flat(L):
        m = mesh2(L)
        f = m._flatten("dp_tp")
        d = L.distribute_tensor(x, f, [L.Shard(0)])
        again = m["dp_tp"]
        return f.mesh, f.mesh_dim_names, f.get_local_rank(), d, d.to_local(), again.mesh

    _both(flat, "_flatten")
    _both(lambda L: mesh2(L)["dp", "tp"]._flatten().mesh_dim_names, "_flatten default name")

    def from_group(L):
        m = mesh2(L)
        one = L.DeviceMesh.from_group(m.get_group("tp"), "cpu")
        two = L.DeviceMesh.from_group(
            [m.get_group("dp"), m.get_group("tp")], "cpu", mesh=m.mesh, mesh_dim_names=("a", "b")
        )
        d = L.distribute_tensor(x, two, [L.Shard(0), L.Shard(1)])
        return one.mesh, one.get_local_rank(), two.get_coordinate(), d, d.to_local()

    _both(from_group, "from_group")
    return True


def test_device_mesh_api(dist4):
    assert dist4.run(check_device_mesh_api) == [True] * 4


# ----------------------------------------------------- aten calls (test_pointwise_ops...)
def check_aten_calls(rank, world):
    """``torch.ops.aten.<op>.<overload>`` called on DTensors shards as the public function
    (test_pointwise_ops calls ``aten.mul.Scalar`` / ``aten.div.Scalar`` on Partial values)."""
    aten = torch.ops.aten
    x = torch.arange(32.0).reshape(8, 4)
    calls = {
        "add.Tensor": lambda a, b: aten.add.Tensor(a, a, alpha=2),
        "add packet": lambda a, b: aten.add(a, 1),
        "mul.Scalar": lambda a, b: aten.mul.Scalar(a, 3),
        "mm": lambda a, b: aten.mm.default(a, b),
        "sum.dim_IntList": lambda a, b: aten.sum.dim_IntList(a, [1]),
        "clone": lambda a, b: aten.clone.default(a),
        "view": lambda a, b: aten.view.default(a, [4, 8]),
        "t": lambda a, b: aten.t.default(a),
        "_to_copy": lambda a, b: aten._to_copy.default(a, dtype=torch.float64),
        "relu": lambda a, b: aten.relu.default(a - 10),
        "cat": lambda a, b: aten.cat.default([a, a], 1),
        "add_.Tensor": lambda a, b: aten.add_.Tensor(a.clone(), a),
        "detach": lambda a, b: aten.detach.default(a),
        "is_same_size": lambda a, b: aten.is_same_size.default(a, a),
        "equal": lambda a, b: aten.equal.default(a, a),
        "stride": lambda a, b: aten.stride.default(a.t()),
    }
    for name, call in calls.items():

        def run(L, call=call):
            mesh = L.mesh((world,))
            a = L.distribute_tensor(x, mesh, [L.Shard(0)])
            b = L.distribute_tensor(x[:4], mesh, [L.Replicate()])
            return call(a, b)

        _both(run, f"aten.{name}")

    def partial_scalar(L):  # test_pointwise_ops.test_mul_div_scalar_partial
        mesh = L.mesh((world,))
        d = L.DTensor.from_local(torch.tensor([float(rank)]), mesh, [L.Partial("sum")])
        m, q = aten.mul.Scalar(d, 2), aten.div.Scalar(d, 2)
        return m, m.to_local(), q, q.to_local()

    _both(partial_scalar, "aten.mul/div.Scalar on Partial")
    return True


def test_aten_calls(dist4):
    assert dist4.run(check_aten_calls) == [True] * 4


# ------------------------------------------------------ global metadata (test_dtensor.py)
def check_global_metadata(rank, world):
    """``is_contiguous()`` describes the global tensor, as PyTorch DTensor's wrapper does (a
    one-row or empty local shard is contiguous either way), ``contiguous()`` makes the
    global stride row-major, ``stride()`` of transposes and of views of unsharded dims is
    the global tensor's (``x[:, 1:3]`` of an 8 x 4: ``(4, 1)``), and ``as_strided`` with a
    view's own size and stride is the identity."""

    def run(L):
        mesh = L.mesh((world,))
        d = L.distribute_tensor(torch.arange(20.0).reshape(5, 4), mesh, [L.Shard(0)])
        e = L.distribute_tensor(torch.arange(32.0).reshape(4, 8), mesh, [L.Shard(1)])
        return (
            d.is_contiguous(),
            d.t().is_contiguous(),
            d.t().contiguous().is_contiguous(),
            e.is_contiguous(),
            e.t().is_contiguous(),
            d.t().contiguous().stride(),
            d.t().stride(),
            e.transpose(0, 1).stride(),
            d[:, 1:3].stride(),  # views of an unsharded dim: the view's global strides
            d.narrow(1, 1, 2).stride(),
            d[:, 0].stride(),
            [p.stride() for p in d.split(2, dim=1)],
            e[1:3].stride(),
            e[::2].stride(),
            torch.as_strided(d[:, 1:3], d[:, 1:3].size(), d[:, 1:3].stride()),
        )

    _both(run, "is_contiguous / contiguous / stride")
    return True


def test_global_metadata(dist4):
    assert dist4.run(check_global_metadata) == [True] * 4


# --------------------------------------------------------------- test_pointwise_ops.py
def check_pointwise_partials(rank, world):
    """Partial values through elementwise ops as test_pointwise_ops checks them:
    ``maximum``/``minimum`` keep ``Partial("max")``/``Partial("min")`` (of two partial
    inputs, or one next to a Replicate one) with no communication; ``Partial`` times a
    scalar, a 0-d tensor or a Replicate tensor stays ``Partial`` for sum and avg;
    ``Partial + Partial`` stays ``Partial``."""
    a = torch.rand(4, 4, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
    b = torch.rand(4, 4, generator=torch.Generator().manual_seed(rank + 9)) * (world - rank)
    for op, red in ((torch.maximum, "max"), (torch.minimum, "min")):

        def run(L, op=op, red=red):
            mesh = L.mesh((world,))
            da = L.DTensor.from_local(a, mesh, [L.Partial(red)])
            db = L.DTensor.from_local(b, mesh, [L.Partial(red)])
            r = L.distribute_tensor(torch.full((4, 4), 0.5), mesh, [L.Replicate()])
            return op(da, db), op(da, r), op(r, da)

        _both(run, f"{op.__name__} of Partial({red})")

    def scalars(L):
        mesh = L.mesh((world,))
        out = []
        for red in ("sum", "avg"):
            d = L.DTensor.from_local(torch.ones(4, 4), mesh, [L.Partial(red)])
            r = L.distribute_tensor(torch.full((4, 4), 2.0), mesh, [L.Replicate()])
            out += [d * 2.0, d * torch.tensor(2.0), d * r, d + d]
        return out

    _both(scalars, "Partial * scalar / 0-d / Replicate")
    return True


def test_pointwise_partials(dist4):
    assert dist4.run(check_pointwise_partials) == [True] * 4


# ----------------------------------------- torch meshes, as DTensorTestBase builds them
def check_torch_meshes(rank, world):
    """PyTorch's tests build ``torch.distributed.device_mesh`` meshes (their import is not
    switched) and hand them to the DTensor API: sub-meshes, flattened meshes and 2-D meshes
    shard as in PyTorch, and ``dt.device_mesh == mesh`` holds for the torch mesh."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    m2 = torch_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    flat = m2._flatten("dp_tp")
    x = torch.arange(64.0).reshape(8, 8)

    def run(L):
        S, R = L.Shard, L.Replicate
        d = L.distribute_tensor(x, m2, [S(0), R()])
        return (
            d.device_mesh == m2,
            d.device_mesh["tp"].mesh,
            L.distribute_tensor(x, m2["tp"], [S(0)]).to_local(),
            L.distribute_tensor(x, flat, [S(1)]),
            L.distribute_tensor(x, m2["dp_tp"], [S(0)]).to_local(),
            d.redistribute(m2, [R(), S(1)]),
        )

    _both(run, "torch meshes")
    return True


def test_torch_meshes(dist4):
    assert dist4.run(check_torch_meshes) == [True] * 4
