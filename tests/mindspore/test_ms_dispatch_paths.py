"""One dispatch path: the same calls through torch's hook (``__torch_function__``),
MindSpore's hook (``__fallback__``) and the generic ``Dispatcher`` entry get the same
decision (input targets, output placements and shapes) and the same local results, and the
one rule behind each op decides alike for both frameworks. Runs in one MindSpore process
(both frameworks imported) on an abstract mesh: the chosen calls move nothing or only
chunk locally, so no collective runs."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def _cases() -> list[tuple[str, object, object, list[tuple[tuple[int, ...], str]]]]:
    import torch
    from mindspore import mint

    return [
        ("add", lambda a, b: torch.add(a, b), lambda a, b: mint.add(a, b), [((4, 6), "S0"), ((4, 6), "S0")]),
        ("add R->S chunk", lambda a, b: a + b, lambda a, b: a + b, [((4, 6), "S0"), ((4, 6), "R")]),
        ("matmul", lambda a, b: torch.matmul(a, b), lambda a, b: mint.matmul(a, b), [((4, 6), "S0"), ((6, 8), "R")]),
        ("matmul contracted", lambda a, b: torch.matmul(a, b), lambda a, b: mint.matmul(a, b), [((4, 6), "S1"), ((6, 8), "S0")]),
        ("sum dim 1", lambda a: torch.sum(a, 1), lambda a: mint.sum(a, 1), [((4, 6), "S0")]),
        ("sum dim 0 partial", lambda a: torch.sum(a, 0), lambda a: mint.sum(a, 0), [((4, 6), "S0")]),
        ("transpose", lambda a: torch.transpose(a, 0, 1), lambda a: mint.transpose(a, 0, 1), [((4, 6), "S0")]),
        ("reshape", lambda a: torch.reshape(a, (2, 2, 6)), lambda a: mint.reshape(a, (2, 2, 6)), [((4, 6), "S0")]),
        ("relu", lambda a: torch.relu(a), lambda a: mint.nn.functional.relu(a), [((5, 3), "S0")]),
    ]  # fmt: skip


def check_paths(rank: int, world: int) -> dict:
    import mindspore as ms
    import torch
    from mindspore._c_expression import NoFallbackGuard
    from torch._C import DisableTorchFunctionSubclass

    import hyper_shard.platform.mindspore.dispatch as msd
    import hyper_shard.platform.torch.dispatch as td
    from hyper_shard import DeviceMesh, DTensor, Replicate, Shard
    from hyper_shard.dispatch.dispatcher import cache_info, clear_cache

    mesh = DeviceMesh.abstract((2,), rank=1)
    pl = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}

    def local_of_torch(x):
        with DisableTorchFunctionSubclass():
            return x.as_subclass(torch.Tensor).numpy().copy()

    def local_of_ms(x):
        with NoFallbackGuard():
            return ms.Tensor._make_subclass(ms.Tensor, x).asnumpy().copy()

    def layout(dec):
        return (
            tuple(None if t is None else t.placements for t in dec.targets),
            tuple(dec.outputs),
            tuple(tuple(s) for s in dec.shapes),
        )

    def run(make, to_fw, local_of, hooks_mod, attr, dispatcher, call, specs, seed):
        g = np.random.default_rng(seed)
        dts = []
        for shape, name in specs:
            full = g.standard_normal(shape).astype(np.float32)
            spec_pl = [pl[name]]
            from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride

            sp = DTensorSpec(mesh, spec_pl, TensorMeta(shape, contiguous_stride(shape), None))
            off, ls = sp.global_offset(), sp.local_shape()
            local = full[tuple(slice(o, o + n) for o, n in zip(off, ls))]
            dts.append(
                DTensor.from_local(
                    to_fw(np.ascontiguousarray(local)),
                    mesh,
                    spec_pl,
                    shape=shape,
                    stride=contiguous_stride(shape),
                )
            )
        seen = []
        real = getattr(hooks_mod, attr)
        # MindSpore's own Python entry points (hot Tensor methods, bound functions) enter
        # the same path with their bound op already looked up (Dispatcher.dispatch_bound)
        real_bound = getattr(hooks_mod, attr + "_bound", None)

        def recorder(func, args, kwargs):
            if not seen:
                seen.append((func, args, kwargs))
            return real(func, args, kwargs)

        def recorder_bound(bound, func, args, kwargs):
            if not seen:
                seen.append((func, args, kwargs))
            return real_bound(bound, func, args, kwargs)

        clear_cache()
        setattr(hooks_mod, attr, recorder)
        if real_bound is not None:
            setattr(hooks_mod, attr + "_bound", recorder_bound)
        try:
            out_hook = call(*dts)
        finally:
            setattr(hooks_mod, attr, real)
            if real_bound is not None:
                setattr(hooks_mod, attr + "_bound", real_bound)
        func, args, kwargs = seen[0]
        before = cache_info()
        dec_hook = dispatcher.decide(func, args, kwargs)
        after = cache_info()
        # the hook's call left its decision in the cache: looking it up makes none
        hit = after["misses"] == before["misses"] and after["size"] == before["size"] == 1
        clear_cache()
        out_gen = dispatcher(func, args, kwargs)
        dec_gen = dispatcher.decide(func, args, kwargs)
        return {
            "hook_was_cached": hit,
            "layout_hook": layout(dec_hook),
            "layout_generic": layout(dec_gen),
            "out_hook": local_of(out_hook),
            "out_generic": local_of(out_gen),
            "placements": tuple(out_hook.placements),
        }

    res = {}
    for i, (name, tcall, mcall, specs) in enumerate(_cases()):
        t = run(
            None,
            torch.from_numpy,
            local_of_torch,
            td,
            "torch_dispatch",
            td.DISPATCHER,
            tcall,
            specs,
            i,
        )
        m = run(None, ms.Tensor, local_of_ms, msd, "_dispatch", msd.DISPATCHER, mcall, specs, i)
        res[name] = {"torch": t, "mindspore": m}
    return res


def test_hooks_and_generic_path_decide_alike(ms1):
    (res,) = ms1.run(check_paths)
    assert len(res) == 9
    for name, both in res.items():
        for fw, r in both.items():
            assert r["hook_was_cached"], (name, fw)
            assert r["layout_hook"] == r["layout_generic"], (name, fw)
            np.testing.assert_allclose(r["out_hook"], r["out_generic"], rtol=1e-6, atol=1e-6)
        # one rule for both frameworks: the same decision from the same input layouts
        assert both["torch"]["layout_hook"] == both["mindspore"]["layout_hook"], name
        assert both["torch"]["placements"] == both["mindspore"]["placements"], name
        np.testing.assert_allclose(
            both["torch"]["out_hook"], both["mindspore"]["out_hook"], rtol=1e-5, atol=1e-5
        )
