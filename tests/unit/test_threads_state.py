"""Ranks as threads: the state hyper_shard keeps per rank, checked rank by rank on PyTorch's
threaded process group (4 rank threads, the harness of tests/unit/test_threads.py) against
what one process per rank gives: a mesh's identity, ``CommDebugMode``'s counts, the flight
recorder, the consistency mode entered at each rank's own time, the RNG tracker's
counters, a DTensor saved and loaded by each rank; and the process-wide tables several
threads fill at once (spec ids)."""

from __future__ import annotations

import io
import threading
import time

import torch

import hyper_shard as hs
from hyper_shard import DeviceMesh, Replicate, Shard, distribute_tensor
from hyper_shard import random as hs_random
from hyper_shard.debug import CommDebugMode, check_consistency, clear_recent_ops, recent_ops
from hyper_shard.mesh import this_rank
from hyper_shard.spec import intern_spec_key
from tests.unit.test_threads import WORLD, run_threads

S0, S1, R = Shard(0), Shard(1), Replicate()


def test_a_mesh_is_per_rank_and_per_world():
    """The same mesh built by two ranks (threads of one process), or again in a new world,
    is another mesh: specs, decisions and plans keyed on it never cross ranks or worlds."""
    assert DeviceMesh.abstract((4,), rank=1) != DeviceMesh.abstract((4,), rank=2)
    assert DeviceMesh.abstract((4,), rank=1) == DeviceMesh.abstract((4,), rank=1)

    def rank(r: int) -> tuple:
        mesh = hs.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        again = hs.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert mesh == again and mesh["tp"] == again["tp"]  # one world: equal
        assert this_rank() == r == mesh.get_rank()
        return mesh._key

    first, second = run_threads(rank), run_threads(rank)
    assert len(set(first)) == WORLD  # one mesh per rank
    assert not set(first) & set(second)  # a new world: new meshes


def test_comm_debug_mode_counts_this_rank_only():
    """Each rank counts its own collectives, as in a process of its own (PyTorch's
    CommDebugMode is per thread): one all-gather for S(0) -> R, not one per rank thread."""

    def rank(r: int) -> tuple:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        d = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [S0])
        with CommDebugMode() as cm:
            time.sleep(0.01 * r)  # the ranks' blocks overlap at different times
            d.redistribute(mesh, [R])
            d.redistribute(mesh, [S1])
        return cm.get_total_counts(), dict(cm.get_comm_counts())

    counts = run_threads(rank)
    assert counts[0][0] == 2 and all(c == counts[0] for c in counts), counts


def test_the_flight_recorder_is_per_rank():
    def rank(r: int) -> list:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        clear_recent_ops()
        d = distribute_tensor(torch.ones(8, 4), mesh, [S0])
        for _ in range(3):
            d.full_tensor()
        if r == 0:
            clear_recent_ops()  # its own records only
        return [(x.collective, x.status) for x in recent_ops()]

    got = run_threads(rank)
    mine = [("broadcast", "ok")] + [("all_gather", "ok")] * 3  # distribute_tensor's, then 3
    assert got[0] == [] and got[1:] == [mine] * (WORLD - 1), got


def test_the_consistency_mode_is_per_rank():
    """Ranks enter and leave ``check_consistency`` at their own times (as processes do):
    each checks exactly the collectives inside its own block, so the fingerprint exchanges
    line up and nothing hangs; a process-wide switch would make a rank still inside the
    block exchange fingerprints with ranks already out of it."""

    def rank(r: int) -> tuple:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        x = torch.arange(32.0).reshape(8, 4)
        d = distribute_tensor(x, mesh, [S0])
        out = []
        time.sleep(0.05 * r)
        with check_consistency():
            out.append(d.redistribute(mesh, [R]).to_local())
            time.sleep(0.05 * (WORLD - r))
        out.append(d.redistribute(mesh, [S1]).full_tensor())
        return all(torch.equal(o, x) for o in out)

    assert run_threads(rank) == [True] * WORLD


def test_rng_tracker_counters_are_per_rank():
    torch.manual_seed(0)

    def rank(r: int) -> tuple:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        tracker = hs_random.get_rng_tracker()
        before = (tracker.stats.draws, tracker.stats.kept)
        torch.nn.functional.dropout(distribute_tensor(torch.ones(8, 3), mesh, [S0]), 0.5)
        return tracker.stats.draws - before[0], tracker.stats.kept - before[1]

    assert run_threads(rank) == [(1, 6)] * WORLD  # one draw each, each keeping its box


def test_save_and_load_on_each_rank_thread():
    """``torch.load`` of a DTensor in a rank thread finds that rank's live mesh."""

    def rank(r: int) -> bool:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        d = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [S0])
        buf = io.BytesIO()
        torch.save(d, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=True)
        assert back.device_mesh is mesh and back.device_mesh.get_rank() == r
        return torch.equal(back.full_tensor(), torch.arange(12.0).reshape(4, 3))

    assert run_threads(rank) == [True] * WORLD


def test_spec_ids_stay_unique_when_threads_intern_at_once():
    keys = [[("k", t, i) for i in range(3000)] for t in range(6)]
    ids: list[list[int]] = [[] for _ in keys]
    start = threading.Barrier(len(keys))

    def work(t: int) -> None:
        start.wait()
        ids[t] = [intern_spec_key(k) for k in keys[t]]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(keys))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    flat = [i for row in ids for i in row]
    assert len(flat) == 6 * 3000 and len(set(flat)) == len(flat)
    assert [intern_spec_key(k) for k in keys[0][:10]] == ids[0][:10]  # stable per key


def test_context_parallel_per_rank_thread():
    """``context_parallel`` entered and left by rank threads at different times: each rank
    attends over its own mesh, and torch's function is back once the last one left. (Each
    context used to patch ``F.scaled_dot_product_attention`` and put back what it found:
    the first rank out restored torch's function under the others, the last one left
    another rank's context patched in; the ranks deadlocked.)"""
    import torch.nn.functional as F

    from hyper_shard.experimental import context_parallel, set_context_parallel_method

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 4, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch_sdpa = F.scaled_dot_product_attention

    def rank(r: int) -> tuple:
        mesh = hs.init_device_mesh("cpu", (WORLD,))
        bufs = [q.clone(), k.clone(), v.clone(), torch.arange(16)[None].clone()]
        time.sleep(0.05 * r)  # rank 0 enters first and leaves last
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 1],
                              no_restore_buffers=set(bufs)):  # fmt: skip
            time.sleep(0.2 * (WORLD - r))
            out = F.scaled_dot_product_attention(*bufs[:3], is_causal=True)
        return out, bufs[3][0]

    set_context_parallel_method("allgather")  # the threaded group has no send/recv
    try:
        outs = run_threads(rank)
    finally:
        set_context_parallel_method("auto")
    assert F.scaled_dot_product_attention is torch_sdpa
    for out, pos in outs:  # each rank's piece of the whole sequence's attention
        torch.testing.assert_close(out, ref[:, :, pos])
