"""scaled_dot_product_attention on real gloo ranks against plain torch on the same global
inputs, forward and the gradients of query, key and value: every placement combination on
2 ranks (batch/heads/sequence/feature shards, Partial, uneven sizes), causal masks with a
sequence-sharded query, grouped-query attention with consistent and inconsistent head
splits, DTensor masks, dropout equal to torch's for the same seed, and a fixed sample on a
(2, 2) mesh; public bug reports on attention (``report_*``).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.debug import comm_counter
from tests._helpers import all_combos, assert_dtensor_close, check_op
from tests._reports import reports

pytestmark = pytest.mark.multiproc

R = Replicate()
sdpa = F.scaled_dot_product_attention


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _sample(combos, k, world, must=()):
    """Every combination on the 1-D mesh; on (2, 2) ``must`` plus a fixed sample of ``k``."""
    if world == 2 or len(combos) <= k:
        return combos
    return list(must) + random.Random(0).sample(combos, k)


def check_sdpa_placements(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    # batch 2, heads 3, L 5, S 6, E 4: every dim uneven on 2 ranks except batch
    q, k, v = _randn(2, 3, 5, 4, seed=0), _randn(2, 3, 6, 4, seed=1), _randn(2, 3, 6, 4, seed=2)
    S0, S1, S2, S3 = Shard(0), Shard(1), Shard(2), Shard(3)
    must = [
        ((S0, S1), (S0, S1), (S0, S1)),  # data + tensor parallel
        ((S2, S1), (R, S1), (R, S1)),  # sequence-sharded query, heads sharded
        ((S2, S2), (R, R), (R, R)),  # query rows nested over both mesh dims
        ((S1, S1), (S1, S1), (S1, S1)),
        ((R, R), (R, R), (S3, Partial())),
    ]
    combos = _sample(all_combos([q, k, v], mesh.ndim), 25, world, must)
    n = check_op(lambda a, b, c: sdpa(a, b, c), [q, k, v], mesh, combos)
    n += check_op(lambda a, b, c: sdpa(a, b, c, is_causal=True), [q, k, v], mesh, combos)
    n += check_op(lambda a, b, c: sdpa(a, b, c, scale=0.3), [q, k, v], mesh, combos[::7])
    # causal with L > S and L < S (torch's mask is top-left aligned), 3-d inputs
    q2, k2, v2 = _randn(3, 7, 4, seed=3), _randn(3, 3, 4, seed=4), _randn(3, 3, 2, seed=5)
    combos2 = random.Random(2).sample(all_combos([q2, k2, v2], mesh.ndim), 30 if world == 2 else 10)
    n += check_op(lambda a, b, c: sdpa(a, b, c, is_causal=True), [q2, k2, v2], mesh, combos2)
    n += check_op(lambda a, b, c: sdpa(a, b, c, is_causal=True), [k2, q2, q2], mesh, combos2)
    return n


def check_sdpa_gqa(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    n = 0
    # Hq 4, Hkv 2: heads split consistently on 2 ranks; Hq 6, Hkv 3: ceil(6/2)=3 query heads
    # but ceil(3/2)=2 kv heads per rank, so the key/value heads must not be split like that
    for hq, hkv in ((4, 2), (6, 3), (4, 1)):
        q = _randn(2, hq, 5, 4, seed=hq)
        k, v = _randn(2, hkv, 6, 4, seed=hkv + 10), _randn(2, hkv, 6, 4, seed=hkv + 20)
        S1 = Shard(1)
        must = [((S1, S1), (S1, S1), (S1, S1)), ((Shard(0), S1), (Shard(0), S1), (R, S1))]
        combos = _sample(all_combos([q, k, v], mesh.ndim), 10, world, must)
        n += check_op(
            lambda a, b, c: sdpa(a, b, c, is_causal=True, enable_gqa=True), [q, k, v], mesh, combos
        )
    return n


def check_sdpa_masks(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    q, k, v = _randn(2, 3, 5, 4, seed=6), _randn(2, 3, 6, 4, seed=7), _randn(2, 3, 6, 4, seed=8)
    bool_mask = _randn(5, 6, seed=9) > -0.5
    bool_mask[:, 0] = True  # every row attends somewhere
    float_mask = _randn(2, 1, 5, 6, seed=10)
    n = 0
    for mask, grad in ((bool_mask, False), (float_mask, True)):
        combos = all_combos([q, k, v, mask], mesh.ndim)
        combos = random.Random(1).sample(combos, 40 if world == 2 else 12)
        fn = (
            (lambda a, b, c, m: sdpa(a, b, c, attn_mask=m))
            if grad
            else (lambda a, b, c, m: sdpa(a, b, c, attn_mask=m.detach()))
        )
        n += check_op(fn, [q, k, v, mask], mesh, combos)
    return n


def _dropout_layouts(world):
    S0, S1, S2, S3 = Shard(0), Shard(1), Shard(2), Shard(3)
    if world == 4:
        return [
            ((S0, S1), (S0, S1), (S0, S1), False),
            ((S2, S1), (R, S1), (R, S1), True),
            ((R, R), (R, R), (S3, S3), False),
        ]
    return [
        ((R,), (R,), (R,), False),
        ((S0,), (S0,), (S0,), False),
        ((S1,), (S1,), (S1,), True),  # heads (Megatron tensor parallel)
        ((S2,), (R,), (R,), True),  # sequence-sharded query, causal
        ((S2,), (R,), (R,), False),
        ((R,), (R,), (S3,), False),
        ((R,), (R,), (Partial(),), True),
    ]


def check_sdpa_dropout(rank, world):
    """dropout_p > 0: the attention weights' dropout mask is each rank's box of the
    single-device draw, so outputs and gradients equal torch's for the same seed, and the
    generator advances as on one device."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    q, k, v = _randn(2, 3, 5, 4, seed=11), _randn(2, 3, 6, 4, seed=12), _randn(2, 3, 6, 4, seed=13)
    w = _randn(2, 3, 5, 4, seed=14)
    from tests._helpers import _local_objective, assert_dtensor_close, dt_from_global

    n = 0
    for qp, kp, vp, causal in _dropout_layouts(world):
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(5)
        ref = sdpa(*refs, dropout_p=0.4, is_causal=causal)
        ref_next = torch.rand(3)
        (ref * w).sum().backward()
        ins = [
            dt_from_global(t, mesh, pl, seed=i, requires_grad=True)
            for i, (t, pl) in enumerate(zip((q, k, v), (qp, kp, vp)))
        ]
        torch.manual_seed(5)
        out = sdpa(*ins, dropout_p=0.4, is_causal=causal)
        torch.testing.assert_close(torch.rand(3), ref_next)  # generator in lockstep
        assert_dtensor_close(out, ref.detach(), rtol=1e-5, atol=1e-5)
        _local_objective(out, w).backward()
        for dt, r in zip(ins, refs):
            assert_dtensor_close(dt.grad, r.grad, rtol=1e-5, atol=1e-5)
        n += 1
    return n


def check_sdpa_no_comm_for_heads(rank, world):
    """Megatron layout: heads-sharded q/k/v run with no redistribution and the output
    stays heads-sharded (a decision, not a gather)."""
    mesh = init_device_mesh("cpu", (world,))
    q, k, v = _randn(2, 4, 5, 4, seed=15), _randn(2, 4, 6, 4, seed=16), _randn(2, 4, 6, 4, seed=17)
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v))
    dq2 = distribute_tensor(q, mesh, [Shard(2)])
    dk2, dv2 = distribute_tensor(k, mesh, [R]), distribute_tensor(v, mesh, [R])
    with comm_counter() as c:
        out = sdpa(dq, dk, dv, is_causal=True)
        out2 = sdpa(dq2, dk2, dv2, is_causal=True)  # sequence-sharded query, whole K/V
    assert c.collectives == 0 and not c, dict(c)  # no redistribution step at all
    assert out.placements == (Shard(1),)
    torch.testing.assert_close(out.to_local(), sdpa(q, k, v, is_causal=True).chunk(2, 1)[rank])
    assert out2.placements == (Shard(2),)
    torch.testing.assert_close(out2.to_local(), sdpa(q, k, v, is_causal=True).chunk(2, 2)[rank])
    return 1


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(
    "fn", [check_sdpa_placements, check_sdpa_gqa, check_sdpa_masks, check_sdpa_dropout]
)
def test_sdpa(fn, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(fn)
    assert counts[0] > 0 and len(set(counts)) == 1


def test_sdpa_layouts(dist2):
    assert dist2.run(check_sdpa_no_comm_for_heads) == [1, 1]


# ---------------------------------------------------------------------- bug reports
def report_sdpa_decided_without_then_with_grad(rank, world):
    """#134050: sdpa decided once without grad, then with grad (PyTorch's cache reused the
    no-logsumexp decision: wrong gradients); mixed ``requires_grad``."""
    mesh = init_device_mesh("cpu", (world,))
    q, k, v = (_randn(2, 4, 6, 8, seed=3 + i) for i in range(3))
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v))
    ref = sdpa(q, k, v, is_causal=True)
    assert_dtensor_close(sdpa(dq, dk, dv, is_causal=True), ref, atol=1e-5, rtol=1e-4)
    ins = [distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    o = sdpa(*ins, is_causal=True)
    ro = sdpa(*refs, is_causal=True)
    assert_dtensor_close(o, ro.detach(), atol=1e-5, rtol=1e-4)
    (o * o).sum().backward()
    (ro * ro).sum().backward()
    for a, b in zip(ins, refs):
        assert_dtensor_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    dq2, rq2 = distribute_tensor(q, mesh, [Shard(1)]).requires_grad_(), q.clone().requires_grad_()
    sdpa(dq2, dk, dv).sum().backward()
    sdpa(rq2, k, v).sum().backward()
    assert_dtensor_close(dq2.grad, rq2.grad, atol=1e-5, rtol=1e-4)


@reports(report_sdpa_decided_without_then_with_grad)
def test_reports(report, dist2):
    dist2.run(report)
