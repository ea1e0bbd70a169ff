"""Context-parallel attention on real gloo ranks against plain torch on the same global
tensors: ``scaled_dot_product_attention`` on query, key and value all sharded along the
sequence, run by ring attention, all-to-all (Ulysses) attention and the all-gather form
(``set_context_parallel_method``), causal and not, even and uneven pieces, grouped-query
heads, the plain and the head-tail (load-balanced) layout, 2 and 4 ranks and a (2, 2)
mesh with the heads sharded too: the output and the query/key/value gradients. Memory:
the key/value bytes ring attention holds are at most 1/N of what the all-gather form
keeps plus one piece in flight (measured: the kernel's record of what it holds, torch's
saved-tensor hooks for the all-gather form). The main job's ``--cp`` on a 3-D
``("dp", "cp", "tp")`` mesh (CP x TP, FSDP x CP) gives the single-process losses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.dispatch.dispatcher import _CACHE
from hyper_shard.experimental import set_context_parallel_method
from hyper_shard.kernels.attention_layout import HEAD_TAIL, PLAIN, using_layout
from hyper_shard.kernels.ring_attention import record_memory

pytestmark = pytest.mark.multiproc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KERNELS = {"ring": "RingAttention", "ulysses": "AllToAllAttention", "allgather": "ShardedSDPA"}


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _kernels() -> set[str]:
    return {type(d.impl).__name__ for d in _CACHE.values() if d.impl is not None}


def _check(mesh, placements, method, layout, q, k, v, causal):
    """Attention on the sequence laid out by ``layout`` (the DTensors hold the laid-out
    order), sharded; compared with torch on the natural order, permuted the same way."""
    n = mesh.size(len(placements) - 1)
    order = torch.tensor(layout.order(q.shape[-2], n))
    gqa = q.shape[-3] != k.shape[-3]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=causal, enable_gqa=gqa)
    g = _randn(*ref.shape, seed=7)
    ref.backward(g)
    ds = [
        distribute_tensor(t.index_select(-2, order), mesh, placements).requires_grad_()
        for t in (q, k, v)
    ]
    with using_layout(layout):
        out = F.scaled_dot_product_attention(*ds, is_causal=causal, enable_gqa=gqa)
        out.backward(distribute_tensor(g.index_select(-2, order), mesh, out.placements))
    case = f"{method} causal={causal} {layout.kind} q{list(q.shape)} k{list(k.shape)}"
    assert KERNELS[method] in _kernels(), (case, _kernels())
    close = dict(rtol=1e-5, atol=1e-5, msg=lambda m: f"{case}: {m}")
    torch.testing.assert_close(out.full_tensor(), ref.detach().index_select(-2, order), **close)
    for d, r in zip(ds, refs):
        torch.testing.assert_close(d.grad.full_tensor(), r.grad.index_select(-2, order), **close)


def check_methods(rank, world):
    torch.set_num_threads(1)
    meshes = [(init_device_mesh("cpu", (world,)), [Shard(2)])]
    if world == 4:  # heads on mesh dim 0, the sequence on mesh dim 1
        meshes.append((init_device_mesh("cpu", (2, 2)), [Shard(1), Shard(2)]))
    n_cases = 0
    try:
        for mesh, placements in meshes:
            n = mesh.size(mesh.ndim - 1)
            for method in ("ring", "ulysses", "allgather"):
                set_context_parallel_method(method)
                for causal in (False, True):
                    for length, hq, hkv, layout in (
                        (4 * n, 4, 4, PLAIN),  # even pieces
                        (4 * n + 1, 4, 2, PLAIN),  # uneven pieces, grouped-query heads
                        (4 * n, 4, 4, HEAD_TAIL),  # load-balanced
                        (2 * n, 4, 2, HEAD_TAIL),
                    ):
                        q = _randn(2, hq, length, 8, seed=length)
                        k = _randn(2, hkv, length, 8, seed=length + 1)
                        v = _randn(2, hkv, length, 8, seed=length + 2)
                        _check(mesh, placements, method, layout, q, k, v, causal)
                        n_cases += 1
    finally:
        set_context_parallel_method("auto")
    return n_cases


def check_memory(rank, world):
    """Key/value bytes: ring attention's held pieces vs the all-gather form's saved ones."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    length, e = 64 * world, 16
    q, k, v = (_randn(1, 2, length, e, seed=s) for s in range(3))
    piece = 2 * (k.numel() // world) * k.element_size()  # one rank's key + value
    held: dict[str, list[int]] = {}
    try:
        # the all-gather form: the gathered key and value that attention keeps for backward
        set_context_parallel_method("allgather")
        ds = [distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in (q, k, v)]
        saved: list[torch.Tensor] = []

        def pack(t):
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(*ds, is_causal=True)
        # plain tensors of the whole sequence: the gathered key and value (a DTensor
        # reports its global shape: the query's local piece is one)
        whole = [t for t in saved if type(t) is torch.Tensor and t.dim() == 4]
        whole = [t for t in whole if t.shape[-2] == length]
        ag_kv = sum({t.data_ptr(): t.numel() * t.element_size() for t in whole}.values())
        out.sum().backward()
        assert ag_kv == world * piece  # all n pieces of key and value
        # ring attention, same call
        set_context_parallel_method("ring")
        ds = [distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in (q, k, v)]
        with record_memory() as rec:
            out = F.scaled_dot_product_attention(*ds, is_causal=True)
            out.sum().backward()
        assert "RingAttention" in _kernels()
        for phase in ("forward", "backward", "saved"):
            held[phase] = [b for p, _, b in rec if p == phase]
    finally:
        set_context_parallel_method("auto")
    assert len(held["forward"]) == world and len(held["backward"]) == world
    assert max(held["saved"]) <= ag_kv // world  # only its own piece is kept for backward
    assert max(held["forward"]) <= ag_kv // world + piece  # + the piece in flight
    # backward: key/value and their gradients, one piece each computed on and in flight;
    # the all-gather form holds both whole (n pieces each)
    assert max(held["backward"]) <= 2 * (ag_kv // world) + 2 * piece
    return [max(held["forward"]), max(held["backward"]), max(held["saved"]), ag_kv]


def check_llama_cp(rank, world, extra, steps):
    """The main job's ``--cp`` (examples/train_llama_tp.py), in the test's rank pool: the
    context-parallel losses against the single-device model on the same batches."""
    sys.path.insert(0, str(EXAMPLES))
    import train_llama_tp as ex

    args = ex.parse_args([*extra, "--steps", str(steps), "--seq", "32", "--batch", "4"])
    data = ex.load_data()
    cp = ex.train_tp(args, data, torch.device("cpu"))["losses"]
    single = ex.train_single(args, data, torch.device("cpu"))["losses"]
    assert len(cp) == len(single) == steps
    for a, b in zip(cp, single):
        assert abs(a - b) <= 1e-4 * abs(b), (cp, single)
    assert "RingAttention" in _kernels() or "AllToAllAttention" in _kernels()
    return cp


def test_methods_on_2_ranks(dist2):
    assert dist2.run(check_methods, timeout=600) == [24, 24]


def test_methods_on_4_ranks(dist4):
    assert dist4.run(check_methods, timeout=900) == [48] * 4


def test_ring_memory(dist4):
    res = dist4.run(check_memory)
    fwd, bwd, saved, ag = res[0]
    assert saved * 4 == ag and fwd == 2 * saved and bwd == 4 * saved  # measured, all ranks
    assert all(r == res[0] for r in res)


def test_llama_cp_on_2_ranks(dist2):
    a, b = dist2.run(check_llama_cp, ["--cp", "2"], 3, timeout=300)
    assert a == b


@pytest.mark.parametrize("extra", [["--cp", "2", "--tp", "2"], ["--dp", "2", "--cp", "2"]])
def test_llama_cp_3d_mesh(dist4, extra):
    losses = dist4.run(check_llama_cp, extra, 3, timeout=600)
    assert all(x == losses[0] for x in losses)  # every rank reports the same mean


def test_replicate_key_value_keeps_the_query_sharded(dist2):
    assert dist2.run(check_replicated_kv) == [1, 1]


def check_replicated_kv(rank, world):
    """A sequence-sharded query with Replicate key/value (sequence parallelism) is not
    context parallelism: nothing is moved, the shifted-mask kernel runs."""
    mesh = init_device_mesh("cpu", (world,))
    q, k = _randn(1, 2, 8, 4, seed=0), _randn(1, 2, 8, 4, seed=1)
    ref = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    dq = distribute_tensor(q, mesh, [Shard(2)])
    dk = distribute_tensor(k, mesh, [Replicate()])
    out = F.scaled_dot_product_attention(dq, dk, dk, is_causal=True)
    torch.testing.assert_close(out.full_tensor(), ref)
    assert out.placements == (Shard(2),)
    return 1
