"""Behaviours PyTorch 2.13's own DTensor / tensor-parallel test files check that a run of
those files with their imports switched to hyper_shard found different (docs/parallel.md,
"Coming from PyTorch DTensor"), ported as in ``test_dropin_pytorch_tests``: each runs
twice in the same process, once with ``torch.distributed.tensor`` and once with
``hyper_shard``, on the same inputs, and the two results are compared (placements, values,
communication counts, errors). One pool call per world size."""

from __future__ import annotations

import itertools
from copy import deepcopy

import pytest
import torch

import hyper_shard as hs

from .test_dropin_pytorch_more import _counts, _m, _r
from .test_dropin_pytorch_ops import _FAILS, _both, _done
from .test_dropin_pytorch_tests import _lib

pytestmark = pytest.mark.multiproc


def check_parity2(rank, world):
    """test_redistribute's ``test_one_chunk_mesh``: redistributions over a size-1 mesh dim
    (Shard/Replicate/Partial to Shard/Replicate) communicate nothing. test_dtensor_compile's
    ``test_tp_compile_fullgraph(use_ca=True)``: a compiled TP MLP's backward under compiled
    autograd gives eager's gradients. test_view_ops' ``test_storage_offset_*``: shards own
    their memory, so slices report torch's storage offsets; ``test_squeeze_``: aten's in-place
    view overloads (``aten.squeeze_.dim``...) work on DTensors; test_math_ops' powsum and
    ``_foreach_max`` tests: torch 2.13's new reductions shard; test_parallelize_api's
    ``src_data_rank`` test: the parameters' broadcast is counted; test_dtensor_ops'
    ``conv_transpose3d`` sample: unbatched convolutions with an empty channel shard, and its
    ``linalg.cond`` sample; test_dtensor_compile's dynamic-shape tests run after others in
    one process (a ``mark_dynamic`` DTensor whose layout a region saw before); test_device_mesh's
    error sentences."""

    def one_chunk(L):
        mesh = L.mesh((world, 1))
        out = []
        for src, dst in itertools.product(
            (L.Shard(1), L.Replicate(), L.Partial()), (L.Shard(0), L.Shard(1), L.Replicate())
        ):
            x = torch.arange(128.0).reshape(16, 8) + rank
            dt = L.DTensor.from_local(x, mesh, [L.Shard(0), src])
            with _m(L).debug.CommDebugMode() as cm:
                r = dt.redistribute(mesh, [L.Shard(0), dst])
            out += [_counts(cm), r, r.to_local()]
        return out

    _both(one_chunk, "redistribute over a size-1 mesh dim")

    def compiled_autograd_tp(L):
        # test_dtensor_compile's test_tp_compile_fullgraph(use_ca=True): a TP MLP compiled
        # (aot_eager), its backward run by compiled autograd; the gradients are eager's
        import torch._dynamo.compiled_autograd as ca

        P = _m(L).parallel
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        model = P.parallelize_module(
            model, L.mesh((world,)), {"0": P.ColwiseParallel(), "2": P.RowwiseParallel()}
        )
        inp = torch.rand(4, 8, generator=torch.Generator().manual_seed(1))
        torch._dynamo.reset()
        out = torch.compile(model, backend="aot_eager", fullgraph=True)(inp)
        with ca._enable(torch.compile(backend="aot_eager")):
            out.sum().backward()
        return [out, *(p.grad.full_tensor() for p in model.parameters())]

    def storage_offsets(L):
        # test_view_ops' test_storage_offset_*: a shard made by distribute_tensor / rand owns
        # its memory (not a view of the whole tensor), so a slice's storage offset is torch's
        mesh = L.mesh((world,))
        out = []
        for shape, pl, idx in (
            ((12, 8), L.Shard(0), (slice(None), slice(2, None))),
            ((10, 12), L.Shard(1), (slice(2, None), slice(None))),
        ):
            d = L.distribute_tensor(_r(*shape), mesh, [pl])
            s = d[idx]
            out += [
                s,
                s.storage_offset(),
                s.to_local().storage_offset(),
                d.to_local().untyped_storage().nbytes(),
            ]
        return out

    _both(storage_offsets, "storage offsets of slices of distributed shards")
    # torch 2.13's rand on a CPU mesh raises AssertionError; hyper_shard's shard of the draw
    # owns its memory as distribute_tensor's does
    r = hs.rand(12, 8, device_mesh=_lib("hs").mesh((world,)), placements=[hs.Shard(0)])
    if r.to_local().untyped_storage().nbytes() != r.to_local().numel() * 4:
        _FAILS.append(
            f"hs.rand's Shard(0) local tensor holds {r.to_local().untyped_storage().nbytes()} bytes"
        )

    def aten_inplace_views(L):
        # test_view_ops' test_squeeze_: aten's in-place view overloads on DTensors
        mesh2 = L.mesh((2, world // 2), ("a", "b"))
        d = L.DTensor.from_local(_r(1, 4, seed=rank), mesh2, [L.Partial(), L.Shard(1)])
        r = torch.ops.aten.squeeze_.dim(d, 0)
        return [r is d, d, d.stride()]

    _both(aten_inplace_views, "aten in-place view overloads")
    # torch 2.13 has no strategy for the other aten in-place views; hyper_shard's equal
    # plain torch's on the global tensor
    z = hs.distribute_tensor(_r(2, 4, 6), _lib("hs").mesh((world,)), [hs.Shard(0)])
    torch.ops.aten.transpose_.default(z, 0, 2)
    torch.ops.aten.unsqueeze_.default(z, 1)
    if not torch.equal(z.full_tensor(), _r(2, 4, 6).transpose(0, 2).unsqueeze(1)):
        _FAILS.append("aten.transpose_/unsqueeze_ of a DTensor differ from torch's")

    def powsum_foreach_max(L):
        # test_math_ops' test_powsum_sharded, test_foreach_powsum_sharded,
        # test_foreach_compose: torch 2.13's new reductions on shards (the foreach results
        # compared as global values: hyper_shard's are Replicate, torch's Partial(sum))
        mesh = L.mesh((world,))
        g0, g1 = _r(12, 8, seed=1), _r(8, 8, seed=2)
        d0, d1 = (L.distribute_tensor(g, mesh, [L.Shard(0)]) for g in (g0, g1))
        out = []
        for o in (1, 2, 3):
            out.append(torch.ops.aten.linalg__powsum(d0, o))
            out += [x.full_tensor() for x in torch.ops.aten._foreach_powsum([d0, d1], o)]
        out.append(torch.linalg._powsum(d0, 2, dim=1))
        out += [x.full_tensor() for x in torch._foreach_max(torch._foreach_abs((d0, d1)))]
        return out

    _both(powsum_foreach_max, "linalg._powsum / _foreach_powsum / _foreach_max")

    def src_data_rank(L):
        # test_parallelize_api's test_parallelize_module_src_data_rank: parameters taken from
        # src_data_rank=1 communicate (counted), src_data_rank=None does not
        P = _m(L).parallel
        torch.manual_seed(rank)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        plan = {"0": P.ColwiseParallel(), "2": P.RowwiseParallel()}
        with _m(L).debug.CommDebugMode() as cm:
            tp = P.parallelize_module(deepcopy(model), L.mesh((world,)), plan, src_data_rank=1)
        with _m(L).debug.CommDebugMode() as cm_none:
            P.parallelize_module(deepcopy(model), L.mesh((world,)), plan, src_data_rank=None)
        return [
            cm.get_total_counts() > 0,
            cm_none.get_total_counts(),
            *(p.full_tensor() for p in tp.parameters()),
        ]

    _both(src_data_rank, "parallelize_module(src_data_rank=)")

    # test_dtensor_ops' conv_transpose3d sample: an unbatched input whose channel dim (3) is
    # smaller than the mesh, sharded on it (rank 3's shard is empty) or on a spatial dim;
    # values and gradients are plain torch's (rank 3 used to add the bias on the wrong dim
    # and raise, hanging the others)
    F = torch.nn.functional
    mesh = _lib("hs").mesh((world,))
    for conv, wshape in ((F.conv_transpose3d, (3, 3, 3, 3, 3)), (F.conv3d, (3, 3, 3, 3, 3))):
        x, w, b = _r(3, 4, 4, 4, seed=5), _r(*wshape, seed=6), _r(3, seed=7)
        for pl in (hs.Shard(0), hs.Shard(1)):
            dx = hs.distribute_tensor(x.clone().requires_grad_(), mesh, [pl])
            dw = hs.distribute_tensor(w.clone().requires_grad_(), mesh, [hs.Replicate()])
            y = conv(dx, dw, hs.distribute_tensor(b, mesh, [hs.Replicate()]))
            y.sum().backward()
            xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
            yr = conv(xr, wr, b)
            yr.sum().backward()
            got = (y.full_tensor(), dx.grad.full_tensor(), dw.grad.full_tensor())
            if not all(
                torch.allclose(g, e, atol=1e-4) for g, e in zip(got, (yr, xr.grad, wr.grad))
            ):
                _FAILS.append(f"unbatched {conv.__name__} on {pl}: values or gradients differ")

    # test_dtensor_ops' linalg.cond sample: one number per matrix (torch 2.13 raises on
    # batched inputs for most p: compared with plain torch)
    A = _r(4, 6, 6, seed=8).double()
    for pl in (hs.Shard(0), hs.Shard(1), hs.Replicate()):
        for p in (None, "fro", 1):
            got = torch.linalg.cond(hs.distribute_tensor(A, _lib("hs").mesh((world,)), [pl]), p)
            if not torch.allclose(got.full_tensor(), torch.linalg.cond(A, p)):
                _FAILS.append(f"linalg.cond(p={p}) on {pl} differs from torch's")

    def dynamic_after_static(L):
        # test_dtensor_compile's test_dtensor_basic then test_dtensor_dynamic_recompiles in
        # one process: a region over a layout, then a new region over a mark_dynamic DTensor
        # of that layout (its decision from the layout cache) gives eager's local result
        mesh = L.mesh((world,))
        torch._dynamo.reset()

        @torch.compile(backend="aot_eager", fullgraph=True)
        def g(x):
            return x * x + 2

        @torch.compile(backend="aot_eager", fullgraph=True)
        def f(x):
            return (x * x).to_local()

        out = []
        for shape in ((4, 4), (6, 8)):
            p = _r(*shape, seed=rank).requires_grad_()
            x = L.DTensor.from_local(p, mesh, [L.Shard(0)], run_check=False)
            out.append(g(x).to_local())
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)
            r = f(x)
            r.sum().backward()
            out += [r, p.grad]
        return out

    _both(dynamic_after_static, "mark_dynamic DTensor in a region after a static one")

    def mesh_error_phrases(L):
        # test_device_mesh: the errors carry PyTorch's sentences (its tests match them)
        out = []
        for call, phrase in (
            (
                lambda: L.mesh((2, world // 2), ("dp", "tp")).get_local_rank(),
                "Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1.",
            ),
            (
                lambda: L.init_device_mesh("cpu", (2, world // 2), mesh_dim_names=["dp", "dp"]),
                "Each mesh_dim_name must be unique.",
            ),
            (
                lambda: L.init_device_mesh("cpu", (world,), mesh_dim_names=["dp", "tp"]),
                "mesh_shape and mesh_dim_names should have same length!",
            ),
        ):
            try:
                call()
                out.append("no error")
            except RuntimeError as e:
                out.append(phrase in str(e))
        return out

    _both(mesh_error_phrases, "DeviceMesh error messages")

    def safe_softmax(L):
        # test_dtensor_ops' aten._safe_softmax sample (a fully masked row gives zeros); the
        # global values compared (over a sharded dim the placements are the cost model's)
        x = _r(4, 8, 6, seed=9)
        x[1, 2, :] = float("-inf")
        return [
            torch.ops.aten._safe_softmax.default(
                L.distribute_tensor(x, L.mesh((world,)), [pl]), d
            ).full_tensor()
            for pl in (L.Shard(0), L.Shard(2), L.Replicate())
            for d in (-1, 1)
        ]

    _both(safe_softmax, "aten._safe_softmax")

    def grid_sampler(L):
        # test_dtensor_ops' grid_sampler_2d sample: the op behind F.grid_sample, integer modes
        x, grid = _r(4, 3, 5, 20, seed=10), torch.tanh(_r(4, 13, 10, 2, seed=11))
        mesh = L.mesh((world,))
        return [
            torch.grid_sampler_2d(
                L.distribute_tensor(x, mesh, [pl]),
                L.distribute_tensor(grid, mesh, [L.Replicate()]),
                m,
                1,
                False,
            ).full_tensor()
            for pl in (L.Shard(0), L.Shard(1), L.Replicate())
            for m in (0, 1)
        ]

    _both(grid_sampler, "torch.grid_sampler_2d")

    # test_dtensor_ops' max_unpool3d sample: F.max_unpool1d/2d/3d on batch, channel and
    # spatial shards equal plain torch's; 2 channels over 4 ranks (torch's kernel rejects an
    # empty channel shard: one rank raised and the others hung, now gathered)
    for pool, unpool, shape in (
        (F.max_pool1d, F.max_unpool1d, (4, 4, 8)),
        (F.max_pool2d, F.max_unpool2d, (4, 8, 8)),
        (F.max_pool3d, F.max_unpool3d, (4, 4, 4, 4, 4)),
        (F.max_pool2d, F.max_unpool2d, (1, 2, 4, 6)),
    ):
        v, i = pool(_r(*shape, seed=12), 2, return_indices=True)
        for pl in (hs.Shard(0), hs.Shard(1), hs.Shard(len(shape) - 1)):
            dv, di = (hs.distribute_tensor(t, mesh, [pl]) for t in (v, i))
            if not torch.equal(unpool(dv, di, 2).full_tensor(), unpool(v, i, 2)):
                _FAILS.append(f"{unpool.__name__} on {pl} differs from torch's")

    # test_dtensor_ops' lu_unpack sample: batched factors, batch-sharded or Replicate
    LU, piv = torch.linalg.lu_factor(_r(4, 5, 3, seed=13).double())
    for pl in (hs.Shard(0), hs.Replicate()):
        got = torch.lu_unpack(
            hs.distribute_tensor(LU, mesh, [pl]), hs.distribute_tensor(piv, mesh, [pl])
        )
        if not all(torch.equal(a.full_tensor(), b) for a, b in zip(got, torch.lu_unpack(LU, piv))):
            _FAILS.append(f"lu_unpack on {pl} differs from torch's")

    _both(compiled_autograd_tp, "TP MLP backward under compiled autograd")
    return _done()


def test_parity2(dist4):
    assert dist4.run(check_parity2) == [True] * 4
