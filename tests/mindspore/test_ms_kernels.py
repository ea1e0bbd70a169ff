"""The framework-neutral kernels on MindSpore (2 mccl ranks) against one process: the
vocab-parallel cross-entropy under ``loss_parallel`` (and gathered outside it; forward and gradients, the class dim
never gathered: the largest local tensor the loss creates is the local logits' size and no
all-gather runs), sharded attention with a causal mask on sequence shards, and dropout
equal to the single-device draw. Public bug reports on the kernels and multi-output ops
(``report_*`` run on the ranks, each test's docstring naming its report)."""

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


# ---------------------------------------------------------------------- bug reports
def report_output_ranks(rank: int, world: int) -> dict:
    from mindspore import Tensor, mint, ops

    import hyper_shard as hs
    from hyper_shard import Shard
    from hyper_shard.platform.mindspore import functional as hsF

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    res = {}
    q, k, v = (rs.randn(4, 6, 3).astype(np.float32) for _ in range(3))  # (N, T, D)
    ref = hsF.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), is_causal=True)
    dq, dk, dv = (hs.distribute_tensor(Tensor(t), mesh, [Shard(0)]) for t in (q, k, v))
    o = hsF.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    res["sdpa"] = (
        o.ndim,
        len(o.to_local().shape),
        tuple(o.shape),
        o.full_tensor().asnumpy(),
        ref.asnumpy(),
    )
    x = rs.randn(4, 6, 5).astype(np.float32)
    dx = hs.distribute_tensor(Tensor(x), mesh, [Shard(0)])
    vals, idx = mint.max(dx, dim=2)
    rv, ri = mint.max(Tensor(x), dim=2)
    res["max"] = [
        (t.ndim, len(t.to_local().shape), tuple(t.shape), str(t.placements),
         t.full_tensor().asnumpy(), r.asnumpy())
        for t, r in ((vals, rv), (idx, ri))
    ]  # fmt: skip
    tv, ti = ops.topk(dx, 2)
    rtv, rti = ops.topk(Tensor(x), 2)
    res["topk"] = [
        (tuple(t.shape), tuple(t.to_local().shape), t.full_tensor().asnumpy(), r.asnumpy())
        for t, r in ((tv, rtv), (ti, rti))
    ]
    return res


def test_report_output_ranks(ms2):
    """mindspore-ai/hyper-parallel#665 "[Bug]: TND FlashAttention softmax output DTensor
    layout rank mismatch" and #370 "npu_mhc_pre_sinkhorn ... output Layout tensor_map rank
    mismatch causes full_tensor() failure": an op's outputs got the input's 4-D tensor_map
    while the kernel returned 3-D tensors. The CPU build has no flash_attention_score: the
    same (tokens, heads, dim) attention through hyper_shard's SDPA, and multi-output ops
    whose outputs differ from the input rank (``mint.max(dim)``, ``ops.topk``). Answer:
    each output's spec has its own rank; ``full_tensor()`` equals one device."""
    for orr in ms2.run(report_output_ranks):
        nd, lnd, shape, full, ref = orr["sdpa"]
        assert (nd, lnd, shape) == (3, 3, (4, 6, 3))
        np.testing.assert_allclose(full, ref, rtol=1e-5, atol=1e-6)
        for nd, lnd, shape, pl, full, ref in orr["max"]:
            assert (nd, lnd, shape, pl) == (2, 2, (4, 6), "(Shard(dim=0),)")
            np.testing.assert_allclose(full, ref, rtol=1e-6)
        for shape, lshape, full, ref in orr["topk"]:
            assert shape == (4, 6, 2) and lshape == (2, 6, 2)
            np.testing.assert_allclose(full, ref, rtol=1e-6)


def report_ce_weight_ignore(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, ops

    import hyper_shard as hs
    from hyper_shard import DTensor, Replicate, Shard
    from hyper_shard.parallel import loss_parallel
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    res = {}
    logits = rs.randn(6, 8).astype(np.float32)
    tgt = np.array([1, 7, -100, 3, 0, -100], np.int32)
    wts = (rs.rand(8) + 0.5).astype(np.float32)
    for red in ("mean", "sum", "none"):

        def ref_f(lg, _red=red):
            return ops.cross_entropy(
                lg, Tensor(tgt), weight=Tensor(wts), ignore_index=-100, reduction=_red
            ).sum()

        rl, rg = ms.value_and_grad(ref_f)(Tensor(logits))
        dl = hs.distribute_tensor(Tensor(logits), mesh, [Shard(1)])
        dt = hs.distribute_tensor(Tensor(tgt), mesh, [Replicate()])
        dw = hs.distribute_tensor(Tensor(wts), mesh, [Shard(0)])

        def f(lg, _red=red, _dt=dt, _dw=dw):
            with loss_parallel():
                loss = ops.cross_entropy(lg, _dt, weight=_dw, ignore_index=-100,
                                         reduction=_red)  # fmt: skip
            return loss.sum()

        loss, g = value_and_grad(f, 0)(dl)
        lv = loss.full_tensor() if isinstance(loss, DTensor) else loss
        res[red] = (float(lv.asnumpy()), float(rl.asnumpy()), g.full_tensor().asnumpy(),
                    rg.asnumpy())  # fmt: skip
    return res


def test_report_ce_weight_ignore(ms2):
    """mindspore-ai/hyper-parallel PR #140 (vocab-parallel CE ``ignore_index`` indexing /
    weight broadcast) and #671 "[基础能力4] loss_parallel / 分布式 CE": class weights sharded
    with the classes plus ``ignore_index``, every reduction. Answer: loss and logits
    gradient equal ``ops.cross_entropy`` on one device."""
    for ce in ms2.run(report_ce_weight_ignore):
        for red in ("mean", "sum", "none"):
            loss, ref, g, rg = ce[red]
            np.testing.assert_allclose(loss, ref, rtol=1e-5)
            np.testing.assert_allclose(g, rg, rtol=1e-5, atol=1e-6)
