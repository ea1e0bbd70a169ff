"""Public bug reports on embeddings (next to ``test_embedding.py``, which others are
changing now): vocab-parallel (row-sharded) and column-parallel embedding modules with
``padding_idx`` and ``scale_grad_by_freq``, and an embedding with sharded weight and
indices on a (2, 2) mesh, each replaying the report's program on real gloo ranks against
plain torch: outputs and the weight gradient (each ``report_*`` names its report)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from tests._helpers import assert_close_any as _eq
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def report_padding_row_and_written_rows(rank, world):
    """pytorch/torchtitan#4637 / NVIDIA-NeMo/Automodel#1675: a vocab-parallel embedding
    with ``padding_idx``, and writing rows of its row-sharded weight."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    for pad in (1, 7):
        emb, remb = nn.Embedding(10, 4, padding_idx=pad), nn.Embedding(10, 4, padding_idx=pad)
        remb.load_state_dict(emb.state_dict())
        parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
        with torch.no_grad():
            emb.weight[3] = 0
            remb.weight[3] = 0
            emb.weight[-1].zero_()
            remb.weight[-1].zero_()
        ids = torch.tensor([[0, 1, 7, 8], [pad, 3, 9, 1]])
        o, ro = emb(ids), remb(ids)
        _eq(o, ro.detach())
        o.sum().backward()
        ro.sum().backward()
        _eq(emb.weight.grad.full_tensor(), remb.weight.grad)


def report_padding_idx_is_a_global_row(rank, world):
    """pytorch/torchtitan PR #4637: a vocab-parallel embedding's ``padding_idx`` is a
    global row (a token mapping to local row ``padding_idx`` lost its gradient; a
    ``padding_idx`` beyond the local rows raised); ``scale_grad_by_freq`` counts over the
    whole batch; row- and column-parallel."""
    mesh = init_device_mesh("cpu", (world,))
    ids = torch.tensor([[5, 13, 2, 13], [5, 7, 9, 13]])
    colw = distribute_tensor(torch.arange(4.0), mesh, [Replicate()])
    styles = (
        RowwiseParallel(input_layouts=Replicate(), use_local_output=False),
        ColwiseParallel(use_local_output=False),
    )
    for style in styles:
        for kw in ({"padding_idx": 5}, {"padding_idx": 13, "scale_grad_by_freq": True}):
            torch.manual_seed(3)
            e, re = nn.Embedding(16, 4, **kw), nn.Embedding(16, 4, **kw)
            re.load_state_dict(e.state_dict())
            parallelize_module(e, mesh, style)
            o, ro = e(ids), re(ids)
            _eq(o, ro.detach())
            (o * colw).sum().backward()
            (ro * torch.arange(4.0)).sum().backward()
            _eq(e.weight.grad, re.weight.grad)


@reports(report_padding_row_and_written_rows, report_padding_idx_is_a_global_row)
def test_reports(report, dist2):
    dist2.run(report)


def report_sharded_weight_and_indices_on_a_2d_mesh(rank, world):
    """#164543: embedding with a ``Shard(0)`` weight and a ``Shard(0)`` index on a (2, 2)
    mesh."""
    mesh2 = init_device_mesh("cpu", (2, 2))
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 4, generator=g)
    ids = torch.randint(0, 16, (4, 6), generator=g)
    dw = distribute_tensor(w, mesh2, [Shard(0), Replicate()])
    di = distribute_tensor(ids, mesh2, [Shard(0), Replicate()])
    _eq(F.embedding(di, dw), F.embedding(ids, w))


@reports(report_sharded_weight_and_indices_on_a_2d_mesh)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
