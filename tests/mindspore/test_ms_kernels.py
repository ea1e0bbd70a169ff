"""The framework-neutral kernels on MindSpore (2 mccl ranks) against one process: the
vocab-parallel cross-entropy under ``loss_parallel`` (and gathered outside it; forward and gradients, the class dim
never gathered: the largest local tensor the loss creates is the local logits' size and no
all-gather runs), sharded attention with a causal mask on sequence shards, and dropout
equal to the single-device draw."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

N, C = 6, 9  # 9 classes over 2 ranks: 5 + 4 (uneven)


class _Recorder:
    """Wraps a Platform's methods: the largest tensor any of them returns, and the
    collectives called (the kernels compute only through the platform)."""

    def __init__(self, plat) -> None:
        self.plat, self.largest, self.calls, self._saved = plat, 0, [], {}

    def __enter__(self):
        from mindspore import Tensor

        for name in ("exp", "log", "amax", "sum", "where", "gather", "take_rows", "stack",
                     "select", "unsqueeze", "squeeze", "full", "cast", "isfinite", "reshape",
                     "all_reduce", "all_gather", "reduce_scatter", "all_to_all"):  # fmt: skip
            fn = getattr(self.plat, name)
            self._saved[name] = fn

            def wrapped(*a, _fn=fn, _name=name, **k):
                out = _fn(*a, **k)
                self.calls.append(_name)
                outs = out if isinstance(out, (list, tuple)) else [out]
                for o in outs:
                    if isinstance(o, Tensor):
                        self.largest = max(self.largest, int(np.prod(Tensor.shape.fget(o))))
                return out

            setattr(self.plat, name, wrapped)
        return self

    def __exit__(self, *exc) -> None:
        for name in self._saved:
            delattr(self.plat, name)


def check_kernels(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, ops

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.parallel import loss_parallel
    from hyper_shard.platform.mindspore import functional as hsF
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    plat = mesh.platform
    rs = np.random.RandomState(0)
    X = rs.randn(N, C).astype(np.float32) * 3
    T = rs.randint(0, C, (N,)).astype(np.int32)
    T[1] = -100  # ignored
    out: dict = {}

    # --- vocab-parallel cross-entropy: every variant, forward and gradient, no gather
    variants = {
        "ce": lambda x, t: ops.cross_entropy(x, t),
        "ce_smooth_sum": lambda x, t: ops.cross_entropy(x, t, reduction="sum", label_smoothing=0.2),
        "ce_none": lambda x, t: ops.cross_entropy(x, t, reduction="none"),
        "nll": lambda x, t: ops.nll_loss(ops.log_softmax(x, 1), t),
    }
    x = hs.distribute_tensor(Tensor(X), mesh, [Shard(1)])
    t = hs.distribute_tensor(Tensor(T), mesh, [Replicate()])
    local_logits = int(np.prod(x.to_local().shape))
    for name, fn in variants.items():

        def ref_loss(a, fn=fn):
            return fn(a, Tensor(T)).sum()

        ref = fn(Tensor(X), Tensor(T)).asnumpy()
        gref = ms.grad(ref_loss)(Tensor(X)).asnumpy()

        def dt_loss(a, fn=fn):
            with loss_parallel():
                return fn(a, t).sum()

        with _Recorder(plat) as rec, loss_parallel():
            got = fn(x, t)
            _, g = value_and_grad(dt_loss)(x)
        out[name] = {
            "fwd": float(np.abs(got.full_tensor().asnumpy() - ref).max()),
            "grad": float(np.abs(g.full_tensor().asnumpy() - gref).max()),
            "grad_pl": str(g.placements),
            "loss_pl": str(got.placements),
            "largest": rec.largest,
            "gathers": rec.calls.count("all_gather"),
            "reduces": rec.calls.count("all_reduce"),
        }
    out["local_logits"] = local_logits
    # outside loss_parallel the classes are gathered first (as PyTorch DTensor), with a hint
    import warnings

    from hyper_shard.kernels import loss_gather

    loss_gather._HINTED.clear()
    ref = ops.cross_entropy(Tensor(X), Tensor(T)).asnumpy()
    with warnings.catch_warnings(record=True) as w, _Recorder(plat) as rec:
        warnings.simplefilter("always")
        got = ops.cross_entropy(x, t)
    out["outside"] = {
        "fwd": float(np.abs(got.full_tensor().asnumpy() - ref).max()),
        "hint": any("loss_parallel()" in str(m.message) for m in w),
        "gathers": rec.calls.count("all_gather"),
    }

    # --- causal attention on a sequence-sharded query (key/value replicated)
    Q, K, V = (rs.randn(1, 2, 7, 4).astype(np.float32) for _ in range(3))

    def attn(q, k, v):
        return hsF.scaled_dot_product_attention(q, k, v, is_causal=True)

    ref = attn(Tensor(Q), Tensor(K), Tensor(V)).asnumpy()
    grefs = ms.grad(lambda q, k, v: (attn(q, k, v) ** 2).sum(), grad_position=(0, 1, 2))(
        Tensor(Q), Tensor(K), Tensor(V)
    )
    q = hs.distribute_tensor(Tensor(Q), mesh, [Shard(2)])
    k = hs.distribute_tensor(Tensor(K), mesh, [Replicate()])
    v = hs.distribute_tensor(Tensor(V), mesh, [Replicate()])
    o = attn(q, k, v)
    _, gs = value_and_grad(lambda a, b, c: (attn(a, b, c) ** 2).sum(), grad_position=(0, 1, 2))(
        q, k, v
    )
    out["attn"] = {
        "pl": str(o.placements),
        "local_rows": int(o.to_local().shape[2]),
        "fwd": float(np.abs(o.full_tensor().asnumpy() - ref).max()),
        "grads": [
            float(np.abs(a.full_tensor().asnumpy() - b.asnumpy()).max()) for a, b in zip(gs, grefs)
        ],
    }

    # --- dropout: each shard is its slice of the single-device draw
    D = rs.randn(7, 6).astype(np.float32)
    ms.set_seed(123)
    ref_d = ops.dropout(Tensor(D), 0.4).asnumpy()
    after_ref = ops.rand((3,)).asnumpy()  # the generator advances as on one device
    res = {}
    for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
        ms.set_seed(123)
        d = ops.dropout(hs.distribute_tensor(Tensor(D), mesh, pl), 0.4)
        after = ops.rand((3,)).asnumpy()
        res[str(pl)] = (
            float(np.abs(d.full_tensor().asnumpy() - ref_d).max()),
            float(np.abs(after - after_ref).max()),
            str(d.placements),
        )
    out["dropout"] = res
    out["dropped"] = float((ref_d == 0).mean())
    return out


def test_kernels_match_one_process(ms2) -> None:
    res = ms2.run(check_kernels, timeout=300)
    for rank, out in enumerate(res):
        for name in ("ce", "ce_smooth_sum", "ce_none", "nll"):
            r = out[name]
            assert r["fwd"] < 1e-5 and r["grad"] < 1e-5, (name, r)
            assert r["gathers"] == 0, (name, r)  # the classes are never gathered
            assert r["largest"] <= out["local_logits"], (name, r, out["local_logits"])
            assert r["grad_pl"] == "(Shard(dim=1),)", r
        # the fused path: one max all-reduce and one column all-reduce, a Replicate loss
        assert out["ce"]["loss_pl"] == "(Replicate(),)"
        assert out["ce_none"]["loss_pl"] == "(Replicate(),)"
        assert out["nll"]["loss_pl"] == "(Partial(sum),)"
        o = out["outside"]  # gathered outside loss_parallel, equal to the plain loss
        assert o["fwd"] < 1e-5 and o["hint"] and o["gathers"] >= 1, o
        a = out["attn"]
        assert a["pl"] == "(Shard(dim=2),)" and a["local_rows"] == (4, 3)[rank]
        assert a["fwd"] < 1e-5 and max(a["grads"]) < 1e-4, a
        for pl, (err, after, got_pl) in out["dropout"].items():
            assert err == 0.0 and after == 0.0, (pl, err, after)
            assert got_pl == pl.replace("[", "(").replace("]", ",)")
        assert 0.1 < out["dropped"] < 0.7  # a real dropout happened
