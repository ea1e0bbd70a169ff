"""Context parallelism on MindSpore (2 mccl ranks) against one process: hyper_shard's
``scaled_dot_product_attention`` on query, key and value sharded along the sequence, by
ring attention (the math blocks with an explicit log-sum-exp, one multi-input custom
autograd node), all-to-all (Ulysses) attention and the all-gather form, causal and not,
the plain and the head-tail layout, grouped-query heads, an uneven sequence: output and
the query/key/value gradients; ``context_parallel`` with buffers on a small causal
model (the loss and the summed parameter gradients equal one process's, the buffers
restored), the forced load-balanced layout's error on every rank; and the MindSpore
Llama job's ``--cp`` (CP, and CP x TP on 4 ranks), whose losses follow the single
process's over the steps."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KERNELS = {"ring": "RingAttention", "ulysses": "AllToAllAttention", "allgather": "ShardedSDPA"}


def _attention_case(mesh, method, layout, shape_q, shape_kv, causal, seed):
    import mindspore as ms
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard import Shard
    from hyper_shard.dispatch.dispatcher import _CACHE
    from hyper_shard.kernels.attention_layout import using_layout
    from hyper_shard.platform.mindspore import functional as hsF
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    n = mesh.size()
    rs = np.random.RandomState(seed)
    Q = rs.randn(*shape_q).astype(np.float32)
    K = rs.randn(*shape_kv).astype(np.float32)
    V = rs.randn(*shape_kv).astype(np.float32)
    G = rs.randn(*shape_q).astype(np.float32)  # the upstream gradient
    gqa = shape_q[1] != shape_kv[1]
    order = np.array(layout.order(shape_q[2], n))

    def attn(q, k, v):
        return hsF.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def ref_loss(q, k, v):
        return (attn(q, k, v) * Tensor(G)).sum()

    ref = attn(Tensor(Q), Tensor(K), Tensor(V)).asnumpy()
    grefs = ms.grad(ref_loss, grad_position=(0, 1, 2))(Tensor(Q), Tensor(K), Tensor(V))
    lay = [hs.distribute_tensor(Tensor(x[:, :, order]), mesh, [Shard(2)]) for x in (Q, K, V)]
    g = hs.distribute_tensor(Tensor(G[:, :, order]), mesh, [Shard(2)])

    def loss(q, k, v):
        return (attn(q, k, v) * g).sum()

    with using_layout(layout):
        out = attn(*lay)
        _, grads = value_and_grad(loss, grad_position=(0, 1, 2))(*lay)
    kinds = {type(d.impl).__name__ for d in _CACHE.values() if d.impl is not None}
    assert KERNELS[method] in kinds, (method, kinds)
    errs = [float(np.abs(out.full_tensor().asnumpy() - ref[:, :, order]).max())]
    for a, b in zip(grads, grefs):
        errs.append(float(np.abs(a.full_tensor().asnumpy() - b.asnumpy()[:, :, order]).max()))
    return errs


def check_attention(rank, world):
    import hyper_shard as hs
    from hyper_shard.experimental import set_context_parallel_method
    from hyper_shard.kernels.attention_layout import HEAD_TAIL, PLAIN

    mesh = hs.init_device_mesh("CPU", (world,))
    out = {}
    try:
        for method in ("ring", "ulysses", "allgather"):
            set_context_parallel_method(method)
            for causal in (False, True):
                cases = [
                    (PLAIN, (1, 2, 7, 4), (1, 2, 7, 4)),  # uneven pieces
                    (HEAD_TAIL, (2, 4, 8, 4), (2, 2, 8, 4)),  # grouped-query heads
                ]
                for layout, sq, skv in cases:
                    key = f"{method} causal={causal} {layout.kind}"
                    out[key] = _attention_case(mesh, method, layout, sq, skv, causal, len(out))
    finally:
        set_context_parallel_method("auto")
    return out


def check_context_parallel_model(rank, world):
    """A small causal model (embedding, q/k/v projection, attention through hyper_shard's
    function, output projection) inside ``context_parallel``: loss and summed gradients
    against one process; bad input."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, mint, nn, ops

    import hyper_shard as hs
    from hyper_shard.experimental import (
        context_parallel,
        context_parallel_unshard,
        set_context_parallel_method,
        set_load_balance,
    )
    from hyper_shard.platform.mindspore import functional as hsF

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            rs = np.random.RandomState(0)
            self.tok = Parameter(Tensor(rs.randn(11, 8).astype(np.float32)), name="tok")
            self.pos = Parameter(Tensor(rs.randn(16, 8).astype(np.float32)), name="pos")
            self.qkv = Parameter(Tensor(rs.randn(8, 24).astype(np.float32) * 0.3), name="qkv")
            self.out = Parameter(Tensor(rs.randn(8, 11).astype(np.float32) * 0.3), name="out")

        def construct(self, tokens, positions):
            b, s = tokens.shape
            h = ops.gather(self.tok, tokens, 0) + ops.gather(self.pos, positions, 0)
            qkv = mint.matmul(h, self.qkv).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
            a = hsF.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return mint.matmul(a.transpose(1, 2).reshape(b, s, 8) + h, self.out)

    net = Net()
    params = net.trainable_params()
    seq = 8
    rs = np.random.RandomState(1)
    T = rs.randint(0, 11, (2, seq)).astype(np.int32)
    L = rs.randint(0, 11, (2, seq)).astype(np.int32)
    P = np.tile(np.arange(seq, dtype=np.int32), (2, 1))

    def loss_fn(t, y, p):
        logits = net(t, p)
        return ops.cross_entropy(logits.reshape(-1, 11), y.reshape(-1), reduction="sum")

    ref_loss, ref_grads = ms.value_and_grad(loss_fn, None, params)(Tensor(T), Tensor(L), Tensor(P))
    mesh = hs.init_device_mesh("CPU", (world,))
    plat = mesh.platform
    group = mesh._group(0)
    res = {}
    try:
        for method in ("auto", "ring", "ulysses", "allgather"):
            set_context_parallel_method(method)
            t, y, p = Tensor(T.copy()), Tensor(L.copy()), Tensor(P.copy())
            with context_parallel(mesh, buffers=[t, y, p], buffer_seq_dims=[1, 1, 1]):
                local_pos = p.asnumpy()[0].tolist()
                loss, grads = ms.value_and_grad(loss_fn, None, params)(t, y, p)
                whole = context_parallel_unshard(mesh, [net(t, p)], [1])[0]
            total = plat.all_reduce(loss, "sum", group)
            gerr = 0.0
            for g, r in zip(grads, ref_grads):
                gsum = plat.all_reduce(g, "sum", group)
                gerr = max(gerr, float(np.abs(gsum.asnumpy() - r.asnumpy()).max()))
            res[method] = {
                "loss": abs(float(total.asnumpy()) - float(ref_loss.asnumpy())),
                "grad": gerr,
                "positions": local_pos,
                "restored": bool((t.asnumpy() == T).all() and (p.asnumpy() == P).all()),
                "unshard": float(
                    np.abs(whole.asnumpy() - net(Tensor(T), Tensor(P)).asnumpy()).max()
                ),
            }
        set_load_balance(True)
        odd = Tensor(np.arange(7, dtype=np.int32).reshape(1, 7))
        try:
            with context_parallel(mesh, buffers=[odd], buffer_seq_dims=[1]):
                pass
            res["error"] = None
        except ValueError as e:
            res["error"] = str(e)
        res["odd_untouched"] = odd.asnumpy().tolist()
    finally:
        set_context_parallel_method("auto")
        set_load_balance(None)
    res["still_works"] = float(
        plat.all_reduce(Tensor(np.ones(1, np.float32)), "sum", group).asnumpy()
    )
    return res


def check_llama_cp(rank, world, extra, steps):
    """The MindSpore Llama job's ``--cp`` in the test's rank pool, against the single
    process on the same batches."""
    sys.path.insert(0, str(EXAMPLES))
    import mindspore_llama_tp as ex

    args = ex.parse_args([*extra, "--steps", str(steps), "--seq", "32", "--batch", "4"])
    data = ex.load_data()
    got = ex.train(rank, world, args, data, True)["losses"]
    single = ex.train(rank, 1, args, data, False)["losses"]
    return got, single


def test_attention_methods(ms2) -> None:
    for out in ms2.run(check_attention, timeout=600):
        for case, errs in out.items():
            assert max(errs) < 1e-4, (case, errs)
        assert len(out) == 12


def test_context_parallel_model(ms2) -> None:
    from hyper_shard.kernels.attention_layout import HEAD_TAIL

    for rank, out in enumerate(ms2.run(check_context_parallel_model, timeout=600)):
        for method in ("auto", "ring", "ulysses", "allgather"):
            r = out[method]
            assert r["loss"] < 1e-4 and r["grad"] < 1e-4 and r["unshard"] < 1e-4, (method, r)
            assert r["positions"] == HEAD_TAIL.order(8, 2)[4 * rank : 4 * rank + 4]
            assert r["restored"]
        assert out["error"] is not None and "2 x 2 = 4 equal chunks" in out["error"]
        assert out["odd_untouched"] == [list(range(7))]
        assert out["still_works"] == 2.0


def _check_losses(results) -> None:
    for got, single in results:
        assert len(got) == len(single) == 3
        for a, b in zip(got, single):
            assert abs(a - b) <= 1e-4 * abs(b), (got, single)


def test_llama_cp(ms2) -> None:
    _check_losses(ms2.run(check_llama_cp, ["--cp", "2"], 3, timeout=900))


def test_llama_cp_x_tp(ms4) -> None:
    _check_losses(ms4.run(check_llama_cp, ["--cp", "2", "--tp", "2"], 3, timeout=900))
