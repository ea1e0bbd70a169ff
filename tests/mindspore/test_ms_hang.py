"""No hang on MindSpore (mccl on CPU): CollectiveError from a stalled rank within the
collective timeout, the flight recorder and the consistency mode, on fresh spawned ranks
(tests/_fresh.py; the session pools must stay healthy).

MindSpore's collective timeout is process-wide and fixed when communication starts
(``MS_CPU_COMM_OP_TIMEOUT``, which hyper_shard sets from ``HYPER_SHARD_TIMEOUT``): the
world below starts with ``HYPER_SHARD_TIMEOUT=4``. The pytest process never imports
MindSpore.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests._fresh import caught, report, run_fresh

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

SHORT = 4.0
SLACK = 15.0


def _ms_world(rank: int, world: int) -> None:
    """recent_ops; the consistency mode on both divergent examples; then a stalled rank
    (last: it leaves the group broken)."""
    import os
    import time
    import warnings
    from datetime import timedelta

    import numpy as np
    from mindspore import Tensor, mint

    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
    from hyper_shard.debug import check_consistency, clear_recent_ops, recent_ops

    mesh = init_device_mesh("CPU", (2,), mesh_dim_names=("tp",), platform="mindspore")
    report("group_timeout", str(mesh._group(0).timeout))
    report("env", os.environ.get("MS_CPU_COMM_OP_TIMEOUT"))
    with warnings.catch_warnings(record=True) as seen:  # process-wide: fixed at the start
        warnings.simplefilter("always")
        init_device_mesh("CPU", (2,), platform="mindspore", timeout=timedelta(seconds=4))
        init_device_mesh("CPU", (2,), platform="mindspore", timeout=timedelta(seconds=9))
    report("late_timeout", [str(w.message) for w in seen])
    full = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    x = distribute_tensor(Tensor(full), mesh, [Shard(0)])

    clear_recent_ops()
    y = x.redistribute(mesh, [Replicate()])
    z = mint.softmax(x, 0)  # a dispatched op whose decision moves its input
    report("recent", [r.as_dict() for r in recent_ops()])
    e = np.exp(full - full.max(0))
    ok = np.array_equal(y.to_local().asnumpy(), full)
    report("values_ok", bool(ok and np.allclose(z.full_tensor().asnumpy(), e / e.sum(0))))

    with check_consistency():  # (a)
        report("a", caught(x.redistribute, mesh, [Replicate()] if rank == 0 else [Shard(1)]))
    c = 3 if rank == 0 else 5  # each rank's shard fits its own shape: not one tensor
    bad = DTensor.from_local(
        Tensor(np.ones((4, c), np.float32)), mesh, [Shard(0)], shape=(8, c), run_check=False
    )

    with check_consistency():  # (b)
        report("b", caught(mint.softmax, bad, 0))
    report("after", bool(np.array_equal(x.full_tensor().asnumpy(), full)))

    if rank == 1:
        time.sleep(SHORT + 2)
    report("stall", caught(mint.softmax, x, 0))


def test_ms_stall_recent_ops_and_consistency_mode():
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("MindSpore is not installed")
    res = run_fresh(
        _ms_world, framework="mindspore", deadline=180, env={"HYPER_SHARD_TIMEOUT": str(SHORT)}
    )
    for o in res:
        assert o.status == "ok", (o.status, o.error, o.reports)
        v = o.reports
        assert v["env"] == "4" and v["group_timeout"] == "0:00:04", v
        assert v["values_ok"] and v["after"], v
        (late,) = v["late_timeout"]  # the equal timeout is silent, the other one warns
        assert "process-wide" in late and "0:00:04" in late and "0:00:09" in late, late
        assert "MS_CPU_COMM_OP_TIMEOUT=9" in late, late
        rec = v["recent"]
        assert len(rec) == 2 and rec[0]["collective"] == "all_gather", rec
        assert (
            rec[0]["step"] == "all_gather on mesh dim 'tp' (size 2) of DTensor[8, 4][S(0)] -> [R]"
        )
        assert rec[0]["redistribution"] == "redistribute DTensor[8, 4][S(0)] -> [R]"
        assert rec[1]["op"] == "mindspore.mint.softmax(DTensor[8, 4][S(0)])", rec[1]
        a, b = v["a"], v["b"]
        assert a["error"] and a["error"][0] == "DivergenceError", a
        assert "-> [R]" in a["doing"][0] and "-> [S(1)]" in a["doing"][1]
        assert b["error"] and b["error"][0] == "DivergenceError", b
        assert "DTensor[8, 3][S(0)]" in b["doing"][0] and "DTensor[8, 5][S(0)]" in b["doing"][1]
        assert a["seconds"] < 20 and b["seconds"] < 20
    waiting = res[0].reports["stall"]
    assert waiting["error"] and waiting["error"][0] == "CollectiveError", waiting
    assert waiting["reason"] == "timeout" and waiting["cause"] == "RuntimeError", waiting
    assert SHORT * 0.8 <= waiting["seconds"] <= SHORT + SLACK, waiting
    assert "op: mindspore.mint.softmax(DTensor[8, 4][S(0)])" in waiting["message"]
    assert "(mindspore: " in waiting["message"] and "over ranks [0, 1]" in waiting["message"]
    stalled = res[1].reports["stall"]
    assert stalled["error"] and stalled["error"][0] == "CollectiveError", stalled
