"""Public bug reports on context parallelism (``hyper_shard.experimental.context_parallel``,
docs/context_parallel.md), each replaying the report's program on 2 real gloo ranks
against the same attention in one process: the unsharded output and every gradient (each
``report_*`` names its report)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import init_device_mesh
from hyper_shard.experimental import (
    context_parallel,
    context_parallel_unshard,
    set_context_parallel_method,
    set_load_balance,
)
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _eq(got, ref):
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def _cp_mesh(world):
    return init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))


def report_math_backend_and_grad_buffers(rank, world):
    """#147793: ``context_parallel`` under ``sdpa_kernel(SDPBackend.MATH)`` with
    ``is_causal=True`` crashed ("aten.add.Tensor: got mixed torch.Tensor and DTensor");
    PyTorch's own test pattern (q, k, v buffers whose ``requires_grad`` is turned on in the
    block, their gradients unsharded there) failed on exit here ("cannot resize variables
    that require grad"); a buffer that requires grad on entry is a clear error on every
    rank, the group still usable."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mesh = _cp_mesh(world)
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 2, 8, 4, generator=g, requires_grad=True) for _ in range(3)]
    ref = F.scaled_dot_product_attention(*qkv, is_causal=True)
    ref.sum().backward()
    cp = [t.detach().clone() for t in qkv]
    with sdpa_kernel(SDPBackend.MATH), context_parallel(mesh, buffers=cp, buffer_seq_dims=[2] * 3):
        for t in cp:
            t.requires_grad_()
        out = F.scaled_dot_product_attention(*cp, is_causal=True)
        out.sum().backward()
        full = context_parallel_unshard(mesh, [out] + [t.grad for t in cp], [2] * 4)
    _eq(full[0], ref.detach())
    for got, t, c in zip(full[1:], qkv, cp):
        _eq(got, t.grad)
        _eq(c.detach(), t.detach())  # restored, requires_grad and all
    with pytest.raises(ValueError, match="requires grad"):
        with context_parallel(mesh, buffers=[qkv[0]], buffer_seq_dims=[2]):
            pass
    assert qkv[0].shape == (2, 2, 8, 4)
    dist.barrier()


def report_tutorial_small_head(rank, world):
    """#159706: PyTorch's context-parallel tutorial with one head, length 4 and head size
    4 (1 x 1 x 4 x 4 q/k/v, buffers a tuple) gave wrong shapes; causal and not."""
    mesh = _cp_mesh(world)
    torch.manual_seed(0)
    for causal in (True, False):
        qkv = [torch.rand(1, 1, 4, 4) for _ in range(3)]
        ref = F.scaled_dot_product_attention(*qkv, is_causal=causal)
        cp = [t.clone() for t in qkv]
        with context_parallel(mesh, buffers=tuple(cp), buffer_seq_dims=(2, 2, 2)):
            out = F.scaled_dot_product_attention(*cp, is_causal=causal)
            (full,) = context_parallel_unshard(mesh, [out], [2])
        assert full.shape == ref.shape, (full.shape, ref.shape)
        _eq(full, ref)


def report_non_causal_load_balanced(rank, world):
    """#141429: with load balancing on (PyTorch's default), ``is_causal=False`` crashed;
    a linear, attention and MSE loss, each layout and mask: the summed weight gradient."""
    mesh = _cp_mesh(world)
    try:
        for balance in (True, False):
            for causal in (True, False):
                set_load_balance(balance)
                torch.manual_seed(0)
                x, y = torch.randn(1, 1, 8, 4), torch.randn(1, 1, 8, 4)
                lin, ref = nn.Linear(4, 12, bias=False), nn.Linear(4, 12, bias=False)
                ref.load_state_dict(lin.state_dict())
                q, k, v = ref(x).chunk(3, dim=-1)
                F.mse_loss(
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal), y, reduction="sum"
                ).backward()
                with context_parallel(mesh, buffers=[x, y], buffer_seq_dims=[2, 2]):
                    q, k, v = lin(x).chunk(3, dim=-1)
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    F.mse_loss(o, y, reduction="sum").backward()
                grad = lin.weight.grad.clone()
                dist.all_reduce(grad)
                _eq(grad, ref.weight.grad)
    finally:
        set_load_balance(None)


def report_no_buffers(rank, world):
    """#159634: ``context_parallel`` with no buffers (the data loader already split the
    sequence) failed on ``buffers[0]``; contiguous pieces, causal."""
    mesh = _cp_mesh(world)
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, 2, 8, 4, generator=g) for _ in range(3)]
    ref = F.scaled_dot_product_attention(*qkv, is_causal=True)
    set_load_balance(False)
    try:
        with context_parallel(mesh):
            out = F.scaled_dot_product_attention(
                *(t.chunk(world, 2)[rank] for t in qkv), is_causal=True
            )
    finally:
        set_load_balance(None)
    _eq(out, ref.chunk(world, 2)[rank])


def report_rotary_buffers_on_another_dim(rank, world):
    """#152261: the unsharded output of a model with rotary cos/sin buffers (sequence dim
    0) next to inputs and labels (dim 1, ``no_restore_buffers``) differed from the output
    without context parallelism; the rotary buffers are restored."""
    mesh = _cp_mesh(world)
    torch.manual_seed(0)
    b, s, h, e = 2, 8, 2, 4
    x, y = torch.randn(b, s, h * e), torch.randn(b, s, h * e)
    cos, sin = torch.randn(s, e), torch.randn(s, e)
    qkv = nn.Linear(h * e, 3 * h * e)

    def model(x, cos, sin):
        q, k, v = qkv(x).view(b, -1, 3, h, e).permute(2, 0, 3, 1, 4)
        q = q * cos + q.flip(-1) * sin
        k = k * cos + k.flip(-1) * sin
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)

    ref = model(x, cos, sin).detach()
    cos0, sin0 = cos.clone(), sin.clone()
    with context_parallel(
        mesh, buffers=[x, y, cos, sin], buffer_seq_dims=[1, 1, 0, 0], no_restore_buffers={x, y}
    ):
        preds = model(x, cos, sin)
    preds, _ = context_parallel_unshard(mesh, [preds, y], [2, 1])
    _eq(preds, ref)
    _eq(cos, cos0)
    _eq(sin, sin0)


def report_ring_backward_every_block(rank, world):
    """huggingface/diffusers#14265 (and NVIDIA/Megatron-LM#1464): ring attention's
    backward computed every ring step against the first step's key/value (the forward
    right, dq/dk/dv silently wrong); every method, causal or not, grouped-query heads:
    the output and q/k/v gradients for an arbitrary output gradient."""
    mesh = _cp_mesh(world)
    g = torch.Generator().manual_seed(0)
    try:
        for method in ("ring", "ulysses", "allgather"):
            set_context_parallel_method(method)
            for causal, kv_heads in ((True, 2), (False, 2), (True, 1)):
                gqa = kv_heads != 2
                q = torch.randn(1, 2, 8, 4, generator=g)
                k, v = (torch.randn(1, kv_heads, 8, 4, generator=g) for _ in range(2))
                dout = torch.randn(1, 2, 8, 4, generator=g)
                ref = [t.clone().requires_grad_() for t in (q, k, v)]
                ro = F.scaled_dot_product_attention(*ref, is_causal=causal, enable_gqa=gqa)
                ro.backward(dout)
                bufs = [q.clone(), k.clone(), v.clone(), dout.clone()]
                with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4):
                    for t in bufs[:3]:
                        t.requires_grad_()
                    o = F.scaled_dot_product_attention(*bufs[:3], is_causal=causal, enable_gqa=gqa)
                    o.backward(bufs[3])
                    full = context_parallel_unshard(
                        mesh, [o.detach()] + [t.grad for t in bufs[:3]], [2] * 4
                    )
                _eq(full[0], ro.detach())
                for got, r in zip(full[1:], ref):
                    _eq(got, r.grad)
    finally:
        set_context_parallel_method("auto")


def report_odd_sequence_length(rank, world):
    """NVIDIA/TransformerEngine#1930: with 2 context-parallel ranks a sequence of 7 tokens
    was taken as 6 (the last token ignored); uneven pieces 4 / 3, causal and not."""
    mesh = _cp_mesh(world)
    for causal in (True, False):
        q = torch.cat([torch.full((1, 1, 4, 8), 1.0), torch.full((1, 1, 3, 8), 2.0)], 2)
        q = q + 0.1 * torch.arange(7.0).view(1, 1, 7, 1)
        k, v = q * 0.5, q + 1
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            assert q.shape[2] == (4, 3)[rank], q.shape
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            (full,) = context_parallel_unshard(mesh, [o], [2])
        _eq(full, ref)


def report_key_value_longer_than_query(rank, world):
    """huggingface/diffusers#13545 (PR: ring attention for key/value lengths other than
    the query's): a query of 4 tokens on keys and values of 8 inside ``context_parallel``
    returned, here, the whole replicated output as the rank's piece (the all-gather form
    leaves it replicated; unsharded it was twice as long). Non-causal in both layouts and
    causal in the contiguous one equal one process; causal in the load-balanced layout is
    right on the all-to-all form and a clear error on every rank on the gathered one (its
    mask would not follow the layout)."""
    mesh = _cp_mesh(world)
    g = torch.Generator().manual_seed(0)
    cases = [(None, False, "auto"), (False, False, "auto"), (False, True, "auto")]
    cases += [(None, True, "ulysses"), (None, True, "allgather")]
    try:
        for balance, causal, method in cases:
            set_load_balance(balance)
            set_context_parallel_method(method)
            q = torch.randn(1, 2, 4, 4, generator=g)
            k, v = torch.randn(1, 2, 8, 4, generator=g), torch.randn(1, 2, 8, 4, generator=g)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                if balance is None and causal and method == "allgather":
                    with pytest.raises(NotImplementedError, match="set_load_balance"):
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    continue
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                assert o.shape[-2] == q.shape[-2], (o.shape, q.shape)
                (full,) = context_parallel_unshard(mesh, [o], [2])
            _eq(full, ref)
    finally:
        set_load_balance(None)
        set_context_parallel_method("auto")
    dist.barrier()


@reports(
    report_key_value_longer_than_query,
    report_math_backend_and_grad_buffers,
    report_tutorial_small_head,
    report_non_causal_load_balanced,
    report_no_buffers,
    report_rotary_buffers_on_another_dim,
    report_ring_backward_every_block,
    report_odd_sequence_length,
)
def test_reports(report, dist2):
    dist2.run(report)
