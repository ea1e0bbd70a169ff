"""The MindSpore hooks (``hyper_shard/platform/mindspore/hooks.py``, issue 26):

* ``install()`` reports every site it replaced, and ``uninstall()`` puts back every
  attribute of every ``mindspore*`` module, of ``tensor_operator_registry``, of the jit
  executors and the ``__defaults__`` it changed — compared by identity with a snapshot
  taken before hyper_shard was imported, in a fresh process; a second ``install()``
  works again;
* names user code imported from MindSpore before hyper_shard (``from mindspore.ops import
  dropout``) are named in a warning and the report, and ``install(rebind_captured=True)``
  rebinds them: the sharded dropout through the captured name then equals the
  single-device draw (2 fresh ranks);
* the self-check names a missing symbol, the version gate names the version and what to
  check;
* a second Python thread doing plain MindSpore work while DTensor ops run gets plain
  results, and a thread MindSpore's ``threading`` does not know about (``_thread``) using
  the same DTensors gets DTensor results.

The fresh processes here are spawned by the test itself (the pools' workers import
hyper_shard before any test code runs).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

X = np.arange(32, dtype=np.float32).reshape(8, 4) / 5.0


def _child(name: str, rank: int, world: int, port: int, q, args: tuple) -> None:
    os.environ.update({"OMP_NUM_THREADS": "1", "GLOG_v": "3"})
    try:
        q.put((rank, True, globals()[name](rank, world, port, *args)))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))
    q.close()
    q.join_thread()
    os._exit(0)


def _spawn(fn, world: int, *args, timeout: float = 300) -> list:
    """``fn(rank, world, port, *args)`` in ``world`` fresh spawned processes that import
    nothing before ``fn`` runs."""
    import importlib.util

    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("MindSpore is not installed")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        ctx.Process(target=_child, args=(fn.__name__, r, world, port, q, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out: dict = {}
    try:
        for _ in range(world):
            rank, ok, val = q.get(timeout=timeout)
            assert ok, f"rank {rank}:\n{val}"
            out[rank] = val
    except queue.Empty:
        raise AssertionError(
            f"{fn.__name__}: ranks {set(range(world)) - set(out)} timed out"
        ) from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world)]


def _snapshot() -> dict:
    """Every attribute the hooks may touch: each ``mindspore*`` module's dict, the
    registry's, the jit executors' class dicts, two functions' ``__defaults__``."""
    import sys

    import mindspore.graph.api as api
    import mindspore.mint.distributed.distributed as D
    from mindspore.common._register_for_tensor import tensor_operator_registry

    snap = {}
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.startswith("mindspore"):
            for attr, value in list(vars(mod).items()):
                snap[(name, attr)] = value
    for attr, value in vars(tensor_operator_registry).items():
        snap[("tensor_operator_registry", attr)] = value
    for cls in (api._JitExecutor, api._CellGraphExecutor):
        for attr, value in vars(cls).items():
            snap[(cls.__name__, attr)] = value
    for fn in (D.get_cache_group_rank, D.get_cache_group_size):
        snap[(fn.__name__, "__defaults__")] = fn.__defaults__
    return snap


def check_install_uninstall(rank: int, world: int, port: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, mint, ops

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    before = _snapshot()

    import hyper_shard as hs
    from hyper_shard.platform.mindspore import hooks

    res: dict = {"at_import": dict(hooks.report().sites)}
    mesh = hs.init_device_mesh("CPU", (1,), platform="mindspore")  # binds the functions
    hooks.set_world_group_defaults("mccl_world_group")
    rep = hooks.report()
    res["sites"] = dict(rep.sites)
    res["str"] = str(rep)
    during = _snapshot()
    res["changed"] = sorted(f"{k[0]}.{k[1]}" for k in before if during.get(k) is not before[k])
    d = hs.distribute_tensor(Tensor(X), mesh, [hs.Shard(0)])
    res["hooked"] = (type(ops.stack((d, d))).__name__, type(mint.add(d, d)).__name__)
    res["uninstalled"] = hooks.uninstall()
    after = _snapshot()
    res["restored"] = sorted(f"{k[0]}.{k[1]}" for k in before if after.get(k) is not before[k])
    # nothing of hyper_shard's left in a mindspore module imported later either
    res["left"] = sorted(
        f"{k[0]}.{k[1]}"
        for k, v in after.items()
        if hasattr(v, "__hyper_shard_original__") or getattr(v, "__name__", "") == "_run_op_hooked"
    )
    res["installed_after"] = hooks.installed()
    # PyNative DTensors still work (through __fallback__), and install() works again
    res["uninstalled_value"] = (d + d).full_tensor().asnumpy()
    rep2 = hooks.install()
    res["reinstalled"] = dict(rep2.sites)
    res["reinstalled_ops"] = (
        type(ops.stack((d, d))).__name__,
        mint.add.__hyper_shard_original__ is not mint.add,
        ops.stack((d, d)).full_tensor().asnumpy(),
    )
    return res


def test_uninstall_restores_every_patched_object():
    (res,) = _spawn(check_install_uninstall, 1)
    sites = res["sites"]
    # importing hyper_shard's MindSpore platform installs run_op and the four jit entries
    assert res["at_import"] == {"run_op": res["at_import"]["run_op"], "jit": 4}
    assert res["at_import"]["run_op"] >= 1
    assert sites["jit"] == 4 and sites["world_group"] == 2 and sites["run_op"] >= 1
    functions = {k: v for k, v in sites.items() if k.startswith("function:")}
    assert all(n >= 1 for n in functions.values())
    assert "function:mindspore.ops.dropout" in functions
    assert "function:mindspore.mint.add" in functions
    # every changed attribute is a reported site (the sites outside mindspore modules are
    # hyper_shard's own functions: not in the snapshot)
    own = sum(v for k, v in functions.items() if k.startswith("function:hyper_shard."))
    assert len(res["changed"]) == sum(sites.values()) - own, res["changed"]
    assert "mindspore.ops.primitive._run_op" in res["changed"]
    assert "_JitExecutor.__call__" in res["changed"]
    assert "get_cache_group_rank.__defaults__" in res["changed"]
    assert "run_op: " in res["str"] and "jit: 4 sites" in res["str"]
    assert res["hooked"] == ("MindSporeDTensor", "MindSporeDTensor")
    assert res["uninstalled"] == sum(sites.values())
    assert res["restored"] == []  # every attribute is its original object again
    assert res["left"] == []
    assert res["installed_after"] is False
    np.testing.assert_array_equal(res["uninstalled_value"], 2 * X)
    assert res["reinstalled"]["jit"] == 4 and res["reinstalled"]["run_op"] == sites["run_op"]
    assert res["reinstalled"]["function:mindspore.mint.add"] == sites["function:mindspore.mint.add"]
    kind, wrapped, stacked = res["reinstalled_ops"]
    assert kind == "MindSporeDTensor" and wrapped
    np.testing.assert_array_equal(stacked, np.stack([X, X]))


def check_captured_early(rank: int, world: int, port: int) -> dict:
    import sys
    import types
    import warnings

    # user code imports names before hyper_shard is imported
    user = types.ModuleType("user_model")
    sys.modules["user_model"] = user
    exec(
        "import mindspore as ms\n"
        "from mindspore import ops\n"
        "from mindspore.ops import dropout, isposinf, stack\n"
        "from mindspore.mint import add\n"
        "@ms.jit\n"
        "def compiled(a):\n"
        "    return ops.sum(a * 2.0)\n",
        user.__dict__,
    )
    import mindspore as ms
    from mindspore import Tensor, ops

    from hyper_shard.platform.mindspore.launch import init_process

    init_process(rank, world, port, timeout=90, seed=0)
    import hyper_shard as hs
    from hyper_shard.platform.mindspore import hooks
    from hyper_shard.platform.mindspore.jit_guard import CompiledDTensorError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mesh = hs.init_device_mesh("CPU", (world,))
    res: dict = {
        "warnings": [str(w.message) for w in caught if w.category is hooks.CapturedEarlyWarning],
        "captured": hooks.report().captured_early,
    }
    x = np.arange(64, dtype=np.float32).reshape(8, 8) - 20.0
    d = hs.distribute_tensor(Tensor(x), mesh, [hs.Shard(0)])
    # a function made of one Primitive works whatever the capture (mint.add: AddExt);
    # ops.stack's legacy Stack Primitive has no entry of its own: a clear error, no value
    res["add_early"] = user.add(d, d).full_tensor().asnumpy()
    try:
        user.stack((d, d))
        res["stack_early"] = "no error"
    except hs.OpNotRegisteredError as e:
        res["stack_early"] = str(e)
    try:
        user.compiled(d)  # decorated before hyper_shard was imported: still refused
        res["jit_early"] = "no error"
    except CompiledDTensorError as e:
        res["jit_early"] = str(e)
    res["rebind"] = dict(hooks.install(rebind_captured=True).sites)
    res["is_wrapper"] = [
        getattr(getattr(user, n), "__hyper_shard_original__", None) is not None
        for n in ("dropout", "isposinf", "stack", "add")
    ]
    ms.set_seed(3)
    res["dropout"] = user.dropout(d, p=0.5).full_tensor().asnumpy()
    ms.set_seed(3)
    res["dropout_single"] = ops.dropout(Tensor(x), p=0.5).asnumpy()
    res["isposinf"] = user.isposinf(d).full_tensor().asnumpy()
    return res


def test_names_captured_before_install_are_named_then_rebound():
    res = _spawn(check_captured_early, 2)
    x = np.arange(64, dtype=np.float32).reshape(8, 8) - 20.0
    for out in res:
        names = ("user_model.dropout", "user_model.isposinf", "user_model.stack", "user_model.add")
        for n in names:
            assert any(c.startswith(n + " (") for c in out["captured"]), (n, out["captured"])
        (msg,) = out["warnings"]
        assert "user_model.dropout (mindspore.ops.dropout)" in msg
        assert "rebind_captured=True" in msg and "Import hyper_shard before" in msg
        assert out["stack_early"].startswith("op 'Stack' has no sharding rule"), out["stack_early"]
        np.testing.assert_array_equal(out["add_early"], 2 * x)
        assert "PyNative" in out["jit_early"] and "compiled" in out["jit_early"]
        assert out["rebind"]["function:mindspore.ops.dropout"] >= 1
        assert out["is_wrapper"] == [True, True, True, True]
        # through the rebound name: the single-device draw, on every rank
        np.testing.assert_array_equal(out["dropout"], out["dropout_single"])
        np.testing.assert_array_equal(out["isposinf"], np.isposinf(x))
    np.testing.assert_array_equal(res[0]["dropout"], res[1]["dropout"])


def check_self_check_and_version(rank: int, world: int) -> dict:
    import warnings

    import mindspore as ms
    import mindspore.graph._utils.pijit_context as pijit

    from hyper_shard.platform.mindspore import hooks

    res: dict = {}
    hooks.uninstall()
    saved = pijit.PreJit
    del pijit.PreJit
    try:
        hooks.install()
        res["missing"] = "no error"
    except hooks.MindSporeHookError as e:
        res["missing"] = str(e)
    finally:
        pijit.PreJit = saved
    res["installed_without_symbol"] = hooks.installed()
    version = ms.__version__
    hooks.uninstall()
    ms.__version__ = "2.11.0"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rep = hooks.install()
    finally:
        ms.__version__ = version
    res["version_warning"] = [
        str(w.message) for w in caught if w.category is hooks.MindSporeVersionWarning
    ]
    res["known_good"] = (rep.known_good, hooks.report().known_good)
    res["installed"] = hooks.installed()
    return res


def test_self_check_names_missing_symbols_and_version_gate_warns(ms1):
    (res,) = ms1.run(check_self_check_and_version)
    assert "PreJit" in res["missing"] and "capture_mode='bytecode'" in res["missing"]
    assert "2.10.x" in res["missing"] and "hooks.py" in res["missing"]
    assert res["installed_without_symbol"] is False
    (msg,) = res["version_warning"]
    assert "2.11.0" in msg and "2.10.x" in msg and "test_ms_hooks.py" in msg
    assert "NoFallbackGuard" in msg and "func.name" in msg
    assert res["known_good"] == (False, True)
    assert res["installed"] is True


def check_threads(rank: int, world: int) -> dict:
    import _thread
    import threading

    from mindspore import Tensor, mint

    import hyper_shard as hs
    from hyper_shard.platform.mindspore.dtensor import MindSporeDTensor

    mesh = hs.init_device_mesh("CPU", (1,), platform="mindspore")
    rs = np.random.RandomState(3)
    an, bn = rs.randn(16, 16).astype(np.float32), rs.randn(16, 16).astype(np.float32)
    dx = hs.distribute_tensor(Tensor(an), mesh, [hs.Shard(0)])
    dy = hs.distribute_tensor(Tensor(bn), mesh, [hs.Shard(0)])
    stop = threading.Event()
    done = threading.Event()
    errors: list[str] = []
    counts = {"plain": 0, "shared": 0, "main": 0}

    def check(what: str, got, want, cls) -> None:
        if type(got) is not cls:
            errors.append(f"{what}: {type(got).__name__}, not {cls.__name__}")
            return
        val = got.full_tensor().asnumpy() if cls is MindSporeDTensor else got.asnumpy()
        if not np.allclose(val, want, rtol=1e-5, atol=1e-5):
            errors.append(f"{what}: wrong value")

    # MindSpore 2.10's own CPU kernels are not all safe in two threads at once (plain
    # MatMulExt crashes, Reshape aborts): the ops here are ones plain MindSpore runs
    # concurrently (a bound mint function, the hot Tensor methods, a reduction)
    def plain_work() -> None:  # plain MindSpore while DTensor ops run in the other threads
        a, b = Tensor(an), Tensor(bn)
        while not stop.is_set():
            check("plain mint.add", mint.add(a, b), an + bn, Tensor)
            check("plain a + b", a + b, an + bn, Tensor)
            check("plain a * b", a * b, an * bn, Tensor)
            check("plain mint.sum", mint.sum(a, 1), an.sum(1), Tensor)
            counts["plain"] += 1

    def shared_work() -> None:  # the same DTensors, from a thread threading does not list
        try:
            while not stop.is_set():
                check("shared mint.add", mint.add(dx, dy), an + bn, MindSporeDTensor)
                check("shared dx * dy", dx * dy, an * bn, MindSporeDTensor)
                check("shared mint.sum", mint.sum(dx, 1), an.sum(1), MindSporeDTensor)
                counts["shared"] += 1
        finally:
            done.set()

    def main_work(n: int) -> None:
        for _ in range(n):
            check("main mint.add", mint.add(dx, dy), an + bn, MindSporeDTensor)
            check("main dx + dy", dx + dy, an + bn, MindSporeDTensor)
            check("main dx * dy", dx * dy, an * bn, MindSporeDTensor)
            check("main mint.sum", mint.sum(dy, 1), bn.sum(1), MindSporeDTensor)
            check("main types", dx, an, MindSporeDTensor)
            counts["main"] += 1

    # 1. the DTensors shared with a thread started by _thread alone (so threading lists
    # one thread: what the removed class-swap fast path relied on)
    _thread.start_new_thread(shared_work, ())
    try:
        main_work(300)
    finally:
        stop.set()
        done.wait(60)
    # 2. a threading.Thread doing plain work next to it
    stop.clear()
    t = threading.Thread(target=plain_work)
    t.start()
    try:
        main_work(300)
    finally:
        stop.set()
        t.join()
    return {"errors": sorted(set(errors)), "counts": counts}


def test_plain_thread_gets_plain_results_while_dtensor_ops_run(ms1):
    (res,) = ms1.run(check_threads)
    assert res["errors"] == []
    assert res["counts"]["main"] == 600
    assert res["counts"]["plain"] > 0 and res["counts"]["shared"] > 0, res["counts"]
