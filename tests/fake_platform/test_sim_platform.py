"""A third platform, added as one package: DTensor ops, every redistribution between
Shard/Replicate/Partial on a 1-D and a 2-D mesh, and a tensor-parallel MLP's forward and
backward, on the thread-simulated "sim" platform (tests/fake_platform), against plain torch
on the whole tensors.

This file imports hyper_shard's public, framework-neutral API and the sim package, and
nothing from hyper_shard's torch or MindSpore platform packages; the sim package itself
changes no line outside its directory: it registers its key, resolver, binding table,
dispatcher and DTensor type through the registration call, and binds its op names to the
built-in YAML entries with its own op specs (``extend: true``).
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard
from hyper_shard.dtensor import redistribute_local
from hyper_shard.errors import OpSpecError
from hyper_shard.placement import grad_placement
from hyper_shard.registry import Registry, get_registry, load_all
from hyper_shard.spec import contiguous_stride
from tests.fake_platform import KEY, SimPlatform, installed, run_ranks, sim, sim_mesh

S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def sim_platform():
    with installed() as b:
        yield b


def _coords(mesh_shape):
    return list(itertools.product(*[range(s) for s in mesh_shape]))


def _box(full, mesh_shape, placements, coord):
    """Independent: the piece of ``full`` a coordinate holds (torch.chunk per Shard, left
    to right); Partial and Replicate keep the whole dim."""
    t = full
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            chunks = list(t.chunk(mesh_shape[m], p.dim))
            k = coord[m]
            t = chunks[k] if k < len(chunks) else t.narrow(p.dim, 0, 0)
    return t.clone(memory_format=torch.contiguous_format)  # this rank's own copy


# ---------------------------------------------------------------------- the registration
def test_the_sim_is_registered_with_its_own_names():
    reg = get_registry()
    names = reg.names(KEY)
    assert names["sim.add"].name == "add" and names["SimTensor.__matmul__"].name == "matmul"
    assert reg["add"].bindings["torch"][0] == "torch.add"  # the built-in names stay
    assert reg["sum"].op.signatures[KEY] == ("input", "dim|axis", "keepdim|keepdims")


def test_an_unknown_sim_name_names_file_entry_and_field(tmp_path):
    (tmp_path / "bad.yaml").write_text("relu: {extend: true, sim: [sim.reluu]}\n")
    reg = Registry(load_all([tmp_path]))
    from tests.fake_platform.dispatch import build_sim_table

    with pytest.raises(OpSpecError) as info:
        build_sim_table(reg)
    msg = str(info.value)
    assert "bad.yaml" in msg and "entry 'relu'" in msg and "field 'sim'" in msg
    assert "did you mean 'sim.relu'" in msg


# ---------------------------------------------------------------------- DTensor ops
def _ops_case(mesh_shape):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    w, bias = torch.randn(4, 5, generator=g), torch.randn(4, generator=g)
    m = torch.randn(5, 3, generator=g)
    want = {
        "add": a + b,
        "sub_scalar": a - 2.0,
        "mul": a * b,
        "div": a / (b * b + 1.0),
        "neg_exp": (-a).exp(),
        "tanh_relu": torch.relu(torch.tanh(a)),
        "matmul": a @ m,
        "mm": torch.mm(a, m),
        "linear": torch.nn.functional.linear(a, w, bias),
        "sum_axis": a.sum(1, keepdim=True),  # sim.sum(x, axis=1, keepdims=True)
        "sum_all": a.sum(),
        "mean": a.mean(0),
        "softmax": torch.softmax(a, 1),
        "t": a.t(),
        "transpose": a.transpose(0, 1),
        "view": a.view(3, 10),
        "reshape": a.reshape(30),
    }
    pls = {1: [(S0,), (S1,), (R,)], 2: [(S0, S1), (S1, R), (R, S0), (S0, S0)]}[len(mesh_shape)]

    def rank(r):
        mesh = sim_mesh(mesh_shape)
        coord = mesh.get_coordinate()
        out = []
        for pl in pls:
            reps = [R] * mesh.ndim

            def dist(t, placements=pl):
                return DTensor.from_local(
                    _box(t, mesh_shape, placements, coord),
                    mesh,
                    placements,
                    shape=t.shape,
                    stride=contiguous_stride(t.shape),
                )

            x, y = dist(a), dist(b)
            got = {
                "add": x + y,
                "sub_scalar": x - 2.0,
                "mul": sim.mul(x, y),
                "div": sim.div(x, y * y + 1.0),
                "neg_exp": (-x).exp(),
                "tanh_relu": sim.relu(sim.tanh(x)),
                "matmul": x @ dist(m, reps),
                "mm": sim.mm(x, dist(m, reps)),
                "linear": sim.linear(x, dist(w, reps), dist(bias, reps)),
                "sum_axis": sim.sum(x, axis=1, keepdims=True),
                "sum_all": x.sum(),
                "mean": sim.mean(x, 0),
                "softmax": sim.softmax(x, 1),
                "t": x.t(),
                "transpose": sim.transpose(x, 0, 1),
                "view": x.view(3, 10),
                "reshape": x.reshape(30),
            }
            out.append((pl, {k: v.full_tensor() for k, v in got.items()}))
        return out

    return want, run_ranks(math.prod(mesh_shape), rank)


@pytest.mark.parametrize("mesh_shape", [(3,), (2, 2)], ids=["1d", "2d"])
def test_dtensor_ops_equal_plain_torch(mesh_shape):
    want, results = _ops_case(mesh_shape)
    for r, per_pl in enumerate(results):
        for pl, got in per_pl:
            assert set(got) == set(want)
            for k, v in got.items():
                torch.testing.assert_close(v, want[k], msg=f"rank {r}, {pl}, {k}")


# ---------------------------------------------------------------------- redistribute
def _all_placements(ndim):
    return list(itertools.product([S0, S1, R, P], repeat=ndim))


class _Composing(SimPlatform):
    """A sim platform whose missing collectives must be composed, never called."""

    def reduce_scatter(self, pieces, op, group):  # noqa: ANN001, ANN201
        raise AssertionError("reduce_scatter is not native here: it must be composed")

    def all_to_all(self, pieces, group):  # noqa: ANN001, ANN201
        raise AssertionError("all_to_all is not native here: it must be composed")


@pytest.mark.parametrize(
    "mesh_shape, shape, native",
    [((3,), (7, 5), None), ((2, 2), (5, 6), None), ((2, 2), (5, 6), {"all_gather", "all_reduce"})],
    ids=["1d", "2d", "2d_composed"],
)
def test_every_redistribution_forward_and_backward(mesh_shape, shape, native):
    """For every (source, target) pair: each rank's target shard is its box of the global
    value, and the gradient reaching each source shard is its box of the global gradient
    (the gradient contract), for uneven shards too; ``native``: a platform with only those
    collectives (reduce-scatter and all-to-all composed)."""
    plat = None if native is None else _Composing(native=frozenset(native))
    pairs = list(itertools.product(_all_placements(len(mesh_shape)), repeat=2))
    g = torch.Generator().manual_seed(0)
    n_terms = math.prod(mesh_shape)
    terms = torch.randn(n_terms, *shape, generator=g)  # per-rank Partial terms
    grads = torch.randn(*shape, generator=g)

    def rank(r):
        mesh = sim_mesh(mesh_shape, platform=plat)
        coord = mesh.get_coordinate()
        checked = 0
        for src, dst in pairs:
            # the global value: the sum of one term per coordinate of the Partial mesh
            # dims (a rank holds the term of its coordinate there)
            pdims = [m for m, p in enumerate(src) if isinstance(p, Partial)]
            pcoords = list(itertools.product(*[range(mesh_shape[m]) for m in pdims]))
            value = terms[: len(pcoords)].sum(0)
            mine = terms[pcoords.index(tuple(coord[m] for m in pdims))]
            held = [R if isinstance(p, Partial) else p for p in src]
            local = _box(mine, mesh_shape, held, coord).requires_grad_()
            x = DTensor.from_local(local, mesh, src, shape=shape, stride=contiguous_stride(shape))
            if all(s == d for s, d in zip(src, dst) if isinstance(d, Partial)):
                y = x.redistribute(mesh, dst)
            else:  # to Partial: the executor (the public API refuses it, as PyTorch);
                # its gradients are local derivatives (of a Replicate value: Partial...)
                spec = x._spec.with_placements(dst)
                mine_g = [grad_placement(p) for p in src]  # the executor's gradients
                moved = redistribute_local(
                    mesh.platform, x.to_local(grad_placements=mine_g), x._spec, spec
                )
                y = DTensor.from_local(
                    moved,
                    mesh,
                    dst,
                    shape=shape,
                    stride=contiguous_stride(shape),
                    grad_placements=[grad_placement(p) for p in dst],
                )
            full = y.full_tensor()
            torch.testing.assert_close(full, value, msg=f"{src} -> {dst}")
            if not any(isinstance(p, Partial) for p in dst):
                torch.testing.assert_close(
                    y.to_local(), _box(value, mesh_shape, dst, coord), msg=f"{src} -> {dst}"
                )
            (full * grads).sum().backward()
            torch.testing.assert_close(
                local.grad, _box(grads, mesh_shape, held, coord), msg=f"grad {src} -> {dst}"
            )
            checked += 1
        return checked

    assert run_ranks(math.prod(mesh_shape), rank) == [len(pairs)] * math.prod(mesh_shape)


# ---------------------------------------------------------------------- TP MLP
def test_tensor_parallel_mlp_forward_and_backward():
    """A 2-D mesh: data parallel on dim 0 (the batch is sharded), Megatron tensor
    parallel on dim 1 (the first linear column-wise, the second row-wise, a replicated
    bias): the loss and every gradient equal plain torch's on the whole batch."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 6, generator=g)
    w1, b1 = torch.randn(10, 6, generator=g), torch.randn(10, generator=g)
    w2, b2 = torch.randn(4, 10, generator=g), torch.randn(4, generator=g)
    ref = [t.clone().requires_grad_() for t in (w1, b1, w2, b2)]
    xr = x.clone().requires_grad_()
    y = torch.nn.functional.linear(
        torch.relu(torch.nn.functional.linear(xr, ref[0], ref[1])), ref[2], ref[3]
    )
    loss_ref = (y * y).mean()
    loss_ref.backward()
    mesh_shape = (2, 2)
    layout = {"w1": (R, S0), "b1": (R, S0), "w2": (R, S1), "b2": (R, R), "x": (S0, R)}

    def rank(r):
        mesh = sim_mesh(mesh_shape, ("dp", "tp"))
        coord = mesh.get_coordinate()

        def param(t, pl):
            local = _box(t, mesh_shape, pl, coord).requires_grad_()
            return local, DTensor.from_local(
                local, mesh, pl, shape=t.shape, stride=contiguous_stride(t.shape)
            )

        leaves = {
            k: param(t, layout[k])
            for k, t in zip(("w1", "b1", "w2", "b2", "x"), (w1, b1, w2, b2, x))
        }
        d = {k: v[1] for k, v in leaves.items()}
        h = sim.relu(sim.linear(d["x"], d["w1"], d["b1"]))
        out = sim.linear(h, d["w2"], d["b2"])
        loss = sim.mean(out * out)
        loss.backward()
        grads = {k: leaves[k][0].grad for k in leaves}
        return loss.full_tensor(), out.placements, grads, coord

    for loss, out_pl, grads, coord in run_ranks(4, rank):
        torch.testing.assert_close(loss, loss_ref)
        assert out_pl == (S0, P)  # the row-wise linear's output, reduced by the loss
        for k, t in zip(("w1", "b1", "w2", "b2", "x"), (*ref, xr)):
            # from_local's default: a Shard leaf gets its shard of the gradient, a
            # Replicate one the whole gradient
            want = _box(t.grad, mesh_shape, layout[k], coord)
            torch.testing.assert_close(grads[k], want, msg=f"{k} at {coord}")


# ---------------------------------------------------------------------- the imports
def test_the_sim_loads_no_framework_platform_package():
    """In a fresh process, sim ops on DTensors import none of hyper_shard's torch or
    MindSpore platform modules (and no MindSpore at all). hyper_shard is imported before
    torch: imported after, it would load the torch platform's unpickling allowlist
    (``PlatformBindings.preload``), which the sim does not use."""
    code = (
        "import sys\n"
        "from hyper_shard import DTensor, Shard\n"  # before torch: no torch preload
        "import torch\n"
        "from tests.fake_platform import installed, run_ranks, sim, sim_mesh\n"
        "with installed():\n"
        "    def rank(r):\n"
        "        x = DTensor.from_local(torch.ones(2, 3), sim_mesh((2,)), [Shard(0)])\n"
        "        return sim.relu(x).full_tensor().sum().item()\n"
        "    assert run_ranks(2, rank) == [12.0, 12.0]\n"
        "bad = [m for m in sys.modules if m.startswith(('hyper_shard.platform.torch',"
        " 'hyper_shard.platform.mindspore', 'mindspore'))]\n"
        "print(bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
