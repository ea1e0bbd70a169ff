"""Public bug reports on tensor and sequence parallelism (``hyper_shard.parallel``, the
styles of ``test_parallel_api.py``), each replaying the report's program on 2 real gloo
ranks against the same module in plain torch: outputs and every gradient (each
``report_*`` names its report)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hyper_shard import DeviceMesh, DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from tests._helpers import assert_close_any as _eq
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def report_uneven_rowwise_and_colwise_gelu_rowwise(rank, world):
    """#118836: an uneven ``RowwiseParallel`` ``Linear(9, 3)``: a contiguous local weight
    and the right output; #144359: a Colwise -> GELU(tanh) -> Rowwise MLP equals the
    plain one, gradients too."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    lin, ref = nn.Linear(9, 3), nn.Linear(9, 3)
    ref.load_state_dict(lin.state_dict())
    parallelize_module(lin, mesh, RowwiseParallel())
    assert lin.weight.to_local().is_contiguous()
    x = torch.randn(2, 9)
    _eq(lin(x.chunk(world, -1)[rank]), ref(x))
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU("tanh"), nn.Linear(16, 8))
    rmlp = nn.Sequential(nn.Linear(8, 16), nn.GELU("tanh"), nn.Linear(16, 8))
    rmlp.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    xb = torch.randn(2, 5, 8)
    out, rout = mlp(xb), rmlp(xb)
    _eq(out, rout.detach())
    out.sum().backward()
    rout.sum().backward()
    _eq(mlp[0].weight.grad.full_tensor(), rmlp[0].weight.grad)
    _eq(mlp[2].bias.grad.full_tensor(), rmlp[2].bias.grad)


def report_sequence_parallel_norm_gradients(rank, world):
    """pytorch/torchtitan#2217: ``SequenceParallel`` LayerNorm / RMSNorm weight gradients
    are the full-sequence ones (a norm, colwise up, rowwise down to ``Shard(1)``, a
    norm)."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)

    def block():
        return nn.ModuleDict(
            {
                "norm": nn.LayerNorm(8),
                "up": nn.Linear(8, 16),
                "down": nn.Linear(16, 8),
                "rms": nn.RMSNorm(8),
            }
        )

    blk = block()
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rblk = block()
    rblk.load_state_dict(blk.state_dict())
    parallelize_module(
        blk,
        mesh,
        {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "rms": SequenceParallel(),
        },
    )

    def run(m, h):
        return m["rms"](m["down"](torch.relu(m["up"](m["norm"](h)))))

    xs = torch.randn(2, 6, 8)
    o, ro = run(blk, xs.chunk(world, 1)[rank]), run(rblk, xs)
    _eq(o, ro.detach())
    ws = torch.randn(2, 6, 8)
    (o * distribute_tensor(ws, mesh, [Shard(1)])).sum().backward()
    (ro * ws).sum().backward()
    for (n, p), (_, q) in zip(blk.named_parameters(), rblk.named_parameters()):
        _eq(p.grad.full_tensor(), q.grad, atol=1e-5, rtol=1e-4, msg=n)


def report_sequence_parallel_rms_norm_output(rank, world):
    """#139681: a ``SequenceParallel`` RMSNorm returns a DTensor (not a plain Tensor),
    with the right values."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    rms, rrms = nn.RMSNorm(8), nn.RMSNorm(8)
    with torch.no_grad():
        rms.weight.add_(torch.randn(8) * 0.1)
    rrms.load_state_dict(rms.state_dict())
    parallelize_module(rms, mesh, SequenceParallel())
    xs = torch.randn(2, 6, 8)
    o = rms(xs.chunk(world, 1)[rank])
    assert isinstance(o, DTensor)
    _eq(o, rrms(xs).detach())


class _KwOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *, x):
        return self.lin(x)


def report_keyword_inputs_and_a_mesh_of_one(rank, world):
    """#128365: ``PrepareModuleInput`` with keyword-only inputs that are already DTensors;
    #127213: tensor parallel on a mesh of size 1 (TP "disabled") is the plain module."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    kw, rkw = _KwOnly(), _KwOnly()
    rkw.load_state_dict(kw.state_dict())
    parallelize_module(
        kw,
        mesh,
        PrepareModuleInput(
            input_kwarg_layouts={"x": Shard(0)},
            desired_input_kwarg_layouts={"x": Replicate()},
            use_local_output=True,
        ),
    )
    xk = torch.randn(4, 4, generator=g)
    _eq(kw(x=distribute_tensor(xk, mesh, [Shard(0)])), rkw(x=xk).detach())
    _eq(kw(x=xk.chunk(world)[rank]), rkw(x=xk).detach())
    one = DeviceMesh("cpu", [rank])
    lin, rlin = nn.Linear(10, 10), nn.Linear(10, 10)
    rlin.load_state_dict(lin.state_dict())
    parallelize_module(lin, one, ColwiseParallel())
    x1 = torch.randn(10, 10, generator=g)
    _eq(lin(x1), rlin(x1).detach())


def report_vocab_parallel_embedding_padding_idx(rank, world):
    """pytorch/torchtitan#4637: a vocab-parallel (``RowwiseParallel``) embedding with a
    ``padding_idx`` in the second shard (the global index given to a local shard: an error,
    or gradients suppressed on rows of other shards); NVIDIA-NeMo/Automodel#1675:
    ``weight[padding_idx] = 0`` on the row-sharded weight (Hugging Face's init) failed.
    Output, gradient and the written rows against one process."""
    mesh = init_device_mesh("cpu", (world,))
    for pad in (7, 2):
        torch.manual_seed(0)
        emb, ref = nn.Embedding(10, 4, padding_idx=pad), nn.Embedding(10, 4, padding_idx=pad)
        ref.load_state_dict(emb.state_dict())
        parallelize_module(
            emb, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        )
        with torch.no_grad():
            for m in (emb, ref):
                m.weight[pad] = 0
                m.weight[pad + 1] = 1.5
        ids = torch.tensor([[pad, 1, pad + 1, 3], [9, pad, 0, 8]])
        out, r = emb(ids), ref(ids)
        _eq(out, r.chunk(world, 1)[rank].detach())
        (out * (rank + 1)).sum().backward()
        (
            r * torch.arange(1.0, world + 1).repeat_interleave(4 // world).view(1, 4, 1)
        ).sum().backward()
        _eq(emb.weight.grad.full_tensor(), ref.weight.grad)
        _eq(emb.weight.full_tensor(), ref.weight.detach())


def report_sequence_parallel_input_is_a_piece(rank, world):
    """#129355 / PR #131346: ``SequenceParallel`` takes a plain input as this rank's
    sequence piece (the global length is ``T * world``: "tiling" in the report), and
    redistributes a DTensor input sharded otherwise (a replicated one) to ``Shard(1)``."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ln, ref = nn.LayerNorm(6), nn.LayerNorm(6)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    ref.load_state_dict(ln.state_dict())
    parallelize_module(ln, mesh, SequenceParallel())
    x = torch.randn(2, 8, 6)
    out = ln(x.chunk(world, 1)[rank])
    assert isinstance(out, DTensor) and out.shape == (2, 8, 6) and out.placements == (Shard(1),)
    _eq(out.to_local(), ref(x).chunk(world, 1)[rank].detach())
    out2 = ln(distribute_tensor(x, mesh, [Replicate()]))
    assert out2.placements == (Shard(1),)
    _eq(out2.full_tensor(), ref(x).detach())


def report_sequence_parallel_norm_frozen_parts(rank, world):
    """PR #133502: ``native_layer_norm_backward`` under ``SequenceParallel`` with some of
    the parameters frozen (its optional outputs absent) failed in sharding propagation:
    a rowwise embedding to ``Shard(1)``, a LayerNorm, a colwise head, each part's
    ``requires_grad`` switched on and off; output and every gradient (None where frozen)."""
    import copy

    mesh = init_device_mesh("cpu", (world,))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.ln, self.out = (
                nn.Linear(8, 6, bias=False),
                nn.LayerNorm(6),
                nn.Linear(6, 4),
            )

        def forward(self, x):
            return self.out(self.ln(self.emb(x)))

    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    for flags in (
        (True, True, True),
        (False, True, True),
        (True, False, True),
        (True, True, False),
        (False, False, True),
    ):
        torch.manual_seed(0)
        ref = Block()
        for mod, rg in zip((ref.emb, ref.ln, ref.out), flags):
            mod.requires_grad_(rg)
        m = parallelize_module(
            copy.deepcopy(ref),
            mesh,
            {
                "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "ln": SequenceParallel(),
                "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        y, yr = m(x), ref(x)
        _eq(y, yr.detach())
        (y**2).sum().backward()
        (yr**2).sum().backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            if q.grad is None:
                assert p.grad is None, name
            else:
                _eq(p.grad, q.grad)


@reports(
    report_uneven_rowwise_and_colwise_gelu_rowwise,
    report_sequence_parallel_norm_gradients,
    report_sequence_parallel_rms_norm_output,
    report_keyword_inputs_and_a_mesh_of_one,
    report_vocab_parallel_embedding_padding_idx,
    report_sequence_parallel_input_is_a_piece,
    report_sequence_parallel_norm_frozen_parts,
)
def test_reports(report, dist2):
    dist2.run(report)
