"""No hang: bounded collectives, CollectiveError, the flight recorder and the consistency
mode (issue 10), on fresh spawned gloo ranks (tests/_fresh.py): these tests stall, kill and
desynchronise ranks, which would break the shared session pools.

Two small worlds of 2 ranks, started together by a module fixture (spawning is the slow
part: their imports, rendezvous and timeouts overlap; each world runs several checks in
sequence, each on its own mesh, i.e. a fresh process group, and reports as it goes).
Time bounds are generous (the machine is shared): a stalled peer must fail the others
after about the timeout, never after gloo's 30 minutes.
"""

from __future__ import annotations

import datetime
import os

import pytest

from tests._fresh import caught, report, start_fresh

pytestmark = pytest.mark.multiproc

SHORT = 4.0  # seconds: the mesh timeout of the checks that break their group
SLACK = 15.0  # seconds of scheduling noise allowed on top of a timeout


def _mesh(seconds: float):
    from hyper_shard import init_device_mesh

    return init_device_mesh(
        "cpu", (2,), mesh_dim_names=("tp",), timeout=datetime.timedelta(seconds=seconds)
    )


def _x(mesh):
    import torch

    from hyper_shard import Shard, distribute_tensor

    return distribute_tensor(torch.arange(32.0).reshape(8, 4), mesh, [Shard(0)])


@pytest.fixture(scope="module")
def worlds():
    """Both worlds, started at once; each test collects its own."""
    started = {
        "recorder": start_fresh(_recorder_and_consistency, deadline=180),
        "stall": start_fresh(_stall_diverge_die, deadline=180),
    }
    yield started
    for w in started.values():
        w.collect()  # a world whose test did not run still ends (killed at its deadline)


def _is(res: dict, cls: str) -> bool:
    return bool(res["error"]) and res["error"][0] == cls


# ---------------------------------------------------------------------- world 1
def _recorder_and_consistency(rank: int, world: int) -> None:
    """recent_ops; the consistency mode on both divergent examples and on a correct
    program; then example (b) without the mode (gloo may abort a rank: last)."""
    import torch

    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor
    from hyper_shard.debug import check_consistency, clear_recent_ops, recent_ops
    from hyper_shard.errors import CollectiveError, DivergenceError

    mesh = _mesh(30.0)
    x = _x(mesh)
    full = torch.arange(32.0).reshape(8, 4)
    report("group_timeout", str(mesh._group(0).timeout))

    # the flight recorder: what a few redistributions leave
    clear_recent_ops()
    y = x.redistribute(mesh, [Replicate()])
    z = torch.softmax(x, dim=0)  # a dispatched op whose decision moves its input
    x + x  # moves nothing: records nothing
    report("recent", [r.as_dict() for r in recent_ops()])
    report(
        "values_ok",
        bool(torch.equal(y.to_local(), full) and torch.allclose(z.full_tensor(), full.softmax(0))),
    )

    # consistency mode, (a): the ranks redistribute to different placements
    with check_consistency():
        report("a", caught(x.redistribute, mesh, [Replicate()] if rank == 0 else [Shard(1)]))
    report("after_a", bool(torch.equal(x.full_tensor(), full)))  # the group still works

    # (b): from_local(run_check=False) with local shards that are not one tensor: each
    # rank's shard fits the shape it gives, so no rank can tell without communicating
    c = 3 if rank == 0 else 5
    bad = DTensor.from_local(
        torch.ones(4, c), mesh, [Shard(0)], shape=(8, c), stride=(c, 1), run_check=False
    )
    with check_consistency():
        report("b", caught(torch.softmax, bad, 0))
    report("after_b", bool(torch.equal(x.full_tensor(), full)))

    # the mode on a correct program: no false alarm; values and gradients as plain torch
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(8, 4, generator=g), torch.randn(4, 6, generator=g)
    with check_consistency():
        da = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()
        dw = distribute_tensor(w, mesh, [Shard(1)]).requires_grad_()
        loss = torch.mm(da, dw).sum()
        clear_recent_ops()
        loss.backward()
        report("backward", [r.as_dict() for r in recent_ops()])
        got = (loss.full_tensor(), da.grad.full_tensor(), dw.grad.full_tensor())
    pa, pw = a.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.mm(pa, pw).sum()
    ref.backward()
    ok = torch.allclose(got[0], ref) and torch.allclose(got[1], pa.grad)
    report("mode_values_ok", bool(ok and torch.allclose(got[2], pw.grad)))
    report("subclass", issubclass(DivergenceError, CollectiveError))

    # (b) without the mode, on a fresh group: never a hang. gloo aborts the rank that
    # receives more than it expects; the other may get garbage silently, and its next
    # collective then raises CollectiveError (its peer is gone)
    mesh2 = _mesh(SHORT)
    bad2 = DTensor.from_local(
        torch.ones(4, c), mesh2, [Shard(0)], shape=(8, c), stride=(c, 1), run_check=False
    )

    def op_then_next() -> None:
        torch.softmax(bad2, 0)
        _x(mesh2).full_tensor()

    report("b_off", caught(op_then_next))


def test_recent_ops_consistency_mode_and_divergence(worlds):
    res = worlds["recorder"].collect()
    assert all(o.status != "hung" for o in res), res
    assert any(o.status == "ok" for o in res), res
    for rank, o in enumerate(res):
        assert o.status in ("ok", "died"), o.error  # died: gloo's abort in (b) without mode
        v = o.reports
        assert v.get("values_ok") and v.get("after_a") and v.get("after_b"), v
        assert v["mode_values_ok"] and v["subclass"] and v["group_timeout"] == "0:00:30", v
        # recent_ops: redistribute's all-gather, then softmax's move; nothing for x + x
        rec = v["recent"]
        assert len(rec) == 2, rec
        r0, r1 = rec
        assert r0["collective"] == "all_gather" and r0["ranks"] == [0, 1]
        assert r0["shape"] == [4, 4] and r0["dtype"] == "float32"
        assert r0["status"] == "ok" and r0["seconds"] >= 0
        assert r0["step"] == "all_gather on mesh dim 'tp' (size 2) of DTensor[8, 4][S(0)] -> [R]"
        assert r0["redistribution"] == "redistribute DTensor[8, 4][S(0)] -> [R]"
        assert r0["op"] is None
        assert r1["op"] == "torch.softmax(DTensor[8, 4][S(0)])", r1
        assert r1["step"].startswith(f"{r1['collective']} on mesh dim 'tp' (size 2) of "), r1
        # the backward's collectives name the op whose input move they transpose
        back = [r for r in v["backward"] if r["step"] is not None]
        assert back, v["backward"]
        for r in back:
            assert r["context"][-1].startswith("backward of torch.mm(DTensor[8, 4][S(0)], "), r
        # (a): every rank raised DivergenceError naming what each rank was doing
        a = v["a"]
        assert a["error"][:2] == ["DivergenceError", "CollectiveError"], a
        assert f"rank {rank} (this rank)" in a["message"] and "rank 1" in a["message"]
        assert "redistribute DTensor[8, 4][S(0)] -> [R]" in a["doing"][0]
        assert "redistribute DTensor[8, 4][S(0)] -> [S(1)]" in a["doing"][1]
        assert a["seconds"] < 20
        # (b): every rank raised, naming the op and each rank's global shape
        b = v["b"]
        assert _is(b, "DivergenceError"), b
        assert "softmax" in b["doing"][0] and "DTensor[8, 3][S(0)]" in b["doing"][0]
        assert "DTensor[8, 5][S(0)]" in b["doing"][1]
        assert "from_local" in b["message"] and b["seconds"] < 20
        # (b) without the mode: the survivor raised CollectiveError, in the op or the next
        if o.status == "ok":
            off = v["b_off"]
            assert _is(off, "CollectiveError"), off
            assert off["seconds"] <= 2 * SHORT + SLACK
        else:
            assert o.exitcode not in (0, None), o


# ---------------------------------------------------------------------- world 2
def _stall_diverge_die(rank: int, world: int) -> None:
    """A stalled rank; divergence (a) without the mode; a dead rank — each on its own
    mesh (a fresh process group with a short timeout)."""
    import time

    import torch

    from hyper_shard import Replicate, Shard

    mesh = _mesh(SHORT)
    x = _x(mesh)
    x.redistribute(mesh, [Replicate()])  # a healthy collective first (in recent_ops)
    if rank == 1:
        time.sleep(SHORT + 2)  # a long stall: user code, I/O, a deadlock...
    report("stall", caught(torch.softmax, x, 0))

    mesh2 = _mesh(SHORT)  # (a) without the mode: one rank all-gathers, one all-to-alls
    x2 = _x(mesh2)
    report("a_off", caught(x2.redistribute, mesh2, [Replicate()] if rank == 0 else [Shard(1)]))

    mesh3 = _mesh(SHORT)
    x3 = _x(mesh3)
    x3.redistribute(mesh3, [Replicate()])
    if rank == 1:
        os._exit(3)  # a crash: no exception, no goodbye
    report("dead", caught(torch.softmax, x3, 0))


def test_stalled_dead_and_divergent_ranks_fail_the_others_within_the_timeout(worlds):
    res = worlds["stall"].collect()
    assert res[0].status == "ok", res[0].error
    assert res[1].status == "died" and res[1].exitcode == 3, res[1]
    waiting, stalled = res[0].reports["stall"], res[1].reports["stall"]
    # the rank that waited: CollectiveError after about the timeout, naming the op and step
    assert waiting["error"][:2] == ["CollectiveError", "HyperShardError"], waiting
    assert waiting["reason"] == "timeout" and waiting["cause"] == "RuntimeError", waiting
    assert SHORT * 0.8 <= waiting["seconds"] <= SHORT + SLACK, waiting["seconds"]
    msg = waiting["message"]
    assert msg.startswith("all_gather timed out on rank 0 (torch:"), msg
    assert "op: torch.softmax(DTensor[8, 4][S(0)])" in msg
    # softmax over the sharded dim gathers it where it is (as PyTorch DTensor)
    assert "step: all_gather on mesh dim 'tp' (size 2) of DTensor[8, 4][S(0)] -> [R]" in msg
    assert "over ranks [0, 1]" in msg and "group timeout 0:00:04" in msg
    assert "HYPER_SHARD_CHECK_CONSISTENCY=1" in msg and "HYPER_SHARD_TIMEOUT" in msg
    # the last collectives: the healthy all-gather, then this one, failed
    assert "for redistribute DTensor[8, 4][S(0)] -> [R]" in msg
    assert "FAILED" in msg.rstrip().splitlines()[-1], msg
    # the stalled rank also ends with CollectiveError (its peer gave up)
    assert _is(stalled, "CollectiveError"), stalled
    # (a) without the mode: gloo times one rank out; the other times out too, or sees
    # its peer close the connection first; CollectiveError names each rank's step
    reasons = []
    for rank, o in enumerate(res):
        a = o.reports["a_off"]
        assert _is(a, "CollectiveError") and a["reason"] in ("timeout", "peer lost"), a
        reasons.append(a["reason"])
        assert a["seconds"] <= SHORT + SLACK
        want = "[R]" if rank == 0 else "[S(1)]"
        assert f"for: redistribute DTensor[8, 4][S(0)] -> {want}" in a["message"], a
    assert "timeout" in reasons, reasons
    # the dead rank: the survivor's CollectiveError names the op; lost peer (or timeout)
    dead = res[0].reports["dead"]
    assert _is(dead, "CollectiveError") and dead["reason"] in ("peer lost", "timeout"), dead
    assert dead["cause"] == "RuntimeError" and dead["seconds"] <= SHORT + SLACK
    assert "op: torch.softmax(DTensor[8, 4][S(0)])" in dead["message"]
