"""Issue 28: a DTensor given to compiled MindSpore code (``mindspore.jit`` in its three
capture modes, ``@jit`` on a Cell's ``construct``, ``ms.jit(cell)``, a Cell in
``GRAPH_MODE``, a jit-compiled Cell holding a DTensor parameter, an optimizer whose update
is not per element) raises a clear error on every rank, naming PyNative and the function,
instead of running on the local shards (before: 56.0 on rank 0 and 184.0 on rank 1 for
``ops.sum(a * 2.0)`` of a ``Shard(0)`` ``arange(16).reshape(4, 4)``). Afterwards PyNative
gives plain MindSpore's value on the global tensor, jit on plain tensors still compiles,
and ``nn.SGD`` still steps DTensor parameters compiled on their local shards."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

X = np.arange(16, dtype=np.float32).reshape(4, 4)


def _err(fn) -> tuple[str, str]:
    try:
        out = fn()
    except Exception as e:  # the test asserts on the type and the message
        return type(e).__name__, str(e)
    return "no error", repr(out)


def check_jit_refused(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    import hyper_shard as hs

    mesh = hs.init_device_mesh("CPU", (world,))
    x = Tensor(X)
    d = hs.distribute_tensor(x, mesh, [hs.Shard(0)])

    def _sum2(a):
        return ops.sum(a * 2.0)

    class Decorated(nn.Cell):
        @ms.jit
        def construct(self, a):
            return ops.sum(a * 2.0)

    class Plain(nn.Cell):
        def construct(self, a):
            return ops.sum(a * 2.0)

    class Weighted(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(hs.distribute_tensor(Tensor(X), mesh, [hs.Shard(0)]), name="w")

        def construct(self, a):
            return ops.sum(a * self.w)

    out: dict = {}
    out["ast"] = _err(lambda: ms.jit(_sum2)(d))
    out["ast_kwarg"] = _err(lambda: ms.jit(_sum2)(a=d))
    out["ast_in_tuple"] = _err(lambda: ms.jit(lambda t: ops.sum(t[0]))((d, x)))
    out["construct"] = _err(lambda: Decorated()(d))
    out["jit_cell"] = _err(lambda: ms.jit(Plain())(d))
    out["cell_dtensor_param"] = _err(lambda: ms.jit(Weighted())(x))
    out["bytecode"] = _err(lambda: ms.jit(_sum2, capture_mode="bytecode")(d))
    out["bytecode_cell"] = _err(lambda: ms.jit(Plain(), capture_mode="bytecode")(d))
    out["trace"] = _err(lambda: ms.jit(_sum2, capture_mode="trace")(d))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        out["graph_mode"] = _err(lambda: Plain()(d))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    # MindSpore's per-element optimizers step DTensor parameters compiled, on local shards
    w = ms.Parameter(hs.distribute_tensor(Tensor(X), mesh, [hs.Shard(0)]), name="w_sgd")
    sgd = nn.SGD([w], learning_rate=0.5)
    ones = np.ones_like(X)
    sgd((hs.distribute_tensor(Tensor(ones), mesh, [hs.Shard(0)]),))  # a DTensor gradient
    sgd((Tensor(ones[2 * rank : 2 * rank + 2]),))  # a plain local one (optimizer_grads)
    out["sgd"] = w.full_tensor().asnumpy()
    bad = hs.distribute_tensor(Tensor(ones), mesh, [hs.Replicate()])
    out["sgd_bad_grad"] = _err(lambda: sgd((bad,)))
    w2 = ms.Parameter(hs.distribute_tensor(Tensor(X), mesh, [hs.Shard(0)]), name="w_lamb")
    out["lamb"] = _err(lambda: nn.Lamb([w2], learning_rate=0.5)((Tensor(ones[:2]),)))
    # PyNative afterwards: the global value, as plain MindSpore on the full tensor
    r = _sum2(d)
    out["pynative"] = (type(r).__name__, float(r.full_tensor().asnumpy()))
    out["plain"] = float(_sum2(x).asnumpy())
    out["plain_jit"] = float(ms.jit(_sum2)(x).asnumpy())
    out["plain_jit_bytecode"] = float(ms.jit(_sum2, capture_mode="bytecode")(x).asnumpy())
    out["plain_cell_jit"] = float(ms.jit(Plain())(x).asnumpy())
    return out


def test_jit_on_dtensors_raises_on_every_rank_and_pynative_stays_right(ms2):
    res = ms2.run(check_jit_refused)
    want_entry = {
        "ast": ("mindspore.jit", "_sum2"),
        "ast_kwarg": ("mindspore.jit", "_sum2"),
        "ast_in_tuple": ("mindspore.jit", "<lambda>"),
        "construct": ("mindspore.jit", "Decorated.construct"),
        "jit_cell": ("mindspore.jit", "Plain.construct"),
        "cell_dtensor_param": ("mindspore.jit", "Weighted.construct"),
        "bytecode": ("capture_mode='bytecode'", "_sum2"),
        "bytecode_cell": ("capture_mode='bytecode'", "Plain.construct"),
        "trace": ("capture_mode='trace'", "_sum2"),
        "graph_mode": ("GRAPH_MODE", "Plain.construct"),
    }
    for rank, out in enumerate(res):
        for case, (entry, fn_name) in want_entry.items():
            kind, msg = out[case]
            assert kind == "CompiledDTensorError", (rank, case, kind, msg)
            assert entry in msg and fn_name in msg and "PyNative" in msg, (rank, case, msg)
            assert "local shard" in msg, msg
        assert "parameter 'w'" in out["cell_dtensor_param"][1]
        assert "argument 0" in out["ast_kwarg"][1]  # jit binds keywords to positions
        assert "argument 0[0]" in out["ast_in_tuple"][1]
        assert "placements (S(0))" in out["ast"][1]
        np.testing.assert_array_equal(out["sgd"], X - 1.0)  # two steps of 0.5 * 1
        kind, msg = out["sgd_bad_grad"]
        assert kind == "CompiledDTensorError" and "optimizer_grads" in msg, msg
        assert "placements (R)" in msg and "w_sgd" in msg, msg
        kind, msg = out["lamb"]
        assert kind == "CompiledDTensorError" and "Lamb.construct" in msg, msg
        assert "per-element optimizers" in msg and "SGD" in msg, msg
        want = float((X.astype(np.float64) * 2.0).sum())  # 240.0
        assert out["pynative"] == ("MindSporeDTensor", want), (rank, out["pynative"])
        assert out["plain"] == want
        assert out["plain_jit"] == want
        assert out["plain_jit_bytecode"] == want
        assert out["plain_cell_jit"] == want
