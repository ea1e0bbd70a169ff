"""Behaviours PyTorch 2.13's own DTensor / tensor-parallel test files check that a run of
those files with their imports switched to hyper_shard found different (docs/parallel.md,
"Coming from PyTorch DTensor"), ported as in ``test_dropin_pytorch_tests``: each runs
twice in the same process, once with ``torch.distributed.tensor`` and once with
``hyper_shard``, on the same inputs, and the two results are compared (placements, values,
communication counts, errors). One pool call per world size."""

from __future__ import annotations

import itertools

import pytest
import torch

from .test_dropin_pytorch_more import _counts, _m
from .test_dropin_pytorch_ops import _both, _done

pytestmark = pytest.mark.multiproc


def check_parity2(rank, world):
    """test_redistribute's ``test_one_chunk_mesh``: redistributions over a size-1 mesh dim
    (Shard/Replicate/Partial to Shard/Replicate) communicate nothing. test_dtensor_compile's
    ``test_tp_compile_fullgraph(use_ca=True)``: a compiled TP MLP's backward under compiled
    autograd gives eager's gradients."""

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

    _both(compiled_autograd_tp, "TP MLP backward under compiled autograd")
    return _done()


def test_parity2(dist4):
    assert dist4.run(check_parity2) == [True] * 4
