"""Embedding parallelism on MindSpore (2 mccl ranks): the ``Gather`` Primitive that
``mindspore.nn.Embedding`` runs, decided by the shared embedding rule (vocab-parallel
``Shard(0)`` -> ``Partial(sum)`` with out-of-range ids masked, column-parallel
``Shard(1)``, sharded ids), and ``parallelize_module`` of a Cell with an ``nn.Embedding``
and a ``mint.nn.Linear`` with the torch plan classes: forward, gradients, SGD losses and
updated weights equal the single-process plain MindSpore run on the same init."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

V, E, H = 11, 8, 6  # vocab (uneven over 2 ranks), embedding dim, output features


def _model(seed: int):
    from mindspore import Parameter, Tensor, mint, nn

    class EmbNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(V, E)
            self.proj = mint.nn.Linear(E, H)

        def construct(self, ids):
            return self.proj(mint.nn.functional.relu(self.emb(ids)))

    net = EmbNet()
    rs = np.random.RandomState(seed)
    net.emb.embedding_table = Parameter(
        Tensor(rs.randn(V, E).astype(np.float32)), name=net.emb.embedding_table.name
    )
    net.proj.weight = Parameter(
        Tensor(rs.randn(H, E).astype(np.float32) / np.sqrt(E)), name=net.proj.weight.name
    )
    net.proj.bias = Parameter(Tensor(rs.randn(H).astype(np.float32) * 0.1), name=net.proj.bias.name)
    return net


def _plans(name: str) -> dict:
    from hyper_shard import Replicate, Shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel

    return {
        # embedding dim sharded; its Shard(-1) output feeds a row-parallel Linear
        "colwise": {"emb": ColwiseParallel(), "proj": RowwiseParallel()},
        # vocab sharded: Partial(sum) lookups all-reduced to the Replicate output
        "rowwise": {
            "emb": RowwiseParallel(input_layouts=Replicate()),
            "proj": ColwiseParallel(output_layouts=Replicate()),
        },
        # vocab sharded, reduce-scattered over the sequence (Shard(1)), gathered by proj
        "rowwise_seq": {
            "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "proj": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    }[name]


def check_embedding_tp(rank: int, world: int, plan: str, steps: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.parallel import parallelize_module
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(5)
    ids = rs.randint(0, V, (steps, 3, 4)).astype(np.int32)
    ids[0, 0] = [0, V - 1, 5, 6]  # both ends of the vocab, both sides of the shard boundary
    target = rs.randn(steps, 3, 4, H).astype(np.float32)

    ref = _model(0)
    ref_opt = nn.SGD(ref.trainable_params(), learning_rate=0.2)
    ref_vg = ms.value_and_grad(lambda x, t: ((ref(x) - t) ** 2).mean(), None, ref_opt.parameters)
    net = parallelize_module(_model(0), mesh, _plans(plan))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.2)
    vg = value_and_grad(lambda x, t: ((net(x) - t) ** 2).mean(), None, opt.parameters)

    fwd_err = float(np.abs(net(Tensor(ids[0])).asnumpy() - ref(Tensor(ids[0])).asnumpy()).max())
    losses, ref_losses, grad_err = [], [], 0.0
    for i in range(steps):
        x, t = Tensor(ids[i]), Tensor(target[i])
        loss, grads = vg(x, t)
        rl, rg = ref_vg(x, t)
        losses.append(float(loss.asnumpy()))
        ref_losses.append(float(rl.asnumpy()))
        for g, r in zip(grads, rg):
            full = g.full_tensor().asnumpy() if isinstance(g, hs.DTensor) else g.asnumpy()
            grad_err = max(grad_err, float(np.abs(full - r.asnumpy()).max()))
        opt(optimizer_grads(grads, opt.parameters))
        ref_opt(rg)
    params = {
        p.name.split(".")[-2] + "." + p.name.split(".")[-1]: str(p.placements)
        for p in net.trainable_params()
    }
    werr = max(
        float(np.abs(p.full_tensor().asnumpy() - r.asnumpy()).max())
        for p, r in zip(net.trainable_params(), ref.trainable_params())
    )
    return {
        "fwd_err": fwd_err,
        "losses": losses,
        "ref": ref_losses,
        "grad_err": grad_err,
        "werr": werr,
        "params": params,
    }


@pytest.mark.parametrize(
    "plan, table",
    [
        ("colwise", "(Shard(dim=1),)"),
        ("rowwise", "(Shard(dim=0),)"),
        ("rowwise_seq", "(Shard(dim=0),)"),
    ],
)
def test_embedding_tp_training(ms2, plan, table):
    res = ms2.run(check_embedding_tp, plan, 3)
    for out in res:
        assert out["fwd_err"] < 1e-5
        np.testing.assert_allclose(out["losses"], out["ref"], rtol=1e-5)
        assert out["grad_err"] < 1e-5 and out["werr"] < 1e-5
        assert out["params"]["emb.embedding_table"] == table
    assert res[0]["losses"] == res[1]["losses"]


def check_gather_layouts(rank: int, world: int) -> dict:
    """The decided placements of ``ops.gather`` (no gather of a sharded table), values, and
    the errors for what is refused."""
    from mindspore import Tensor, mint, ops

    import hyper_shard as hs
    from hyper_shard import Partial, Replicate, Shard

    mesh = hs.init_device_mesh("CPU", (world,))
    W = np.arange(V * E, dtype=np.float32).reshape(V, E) / 10
    ids = np.array([[0, 10, 5], [6, 2, 10]], np.int32)
    want = W[ids]
    out: dict = {}
    for wp, ip in [
        (Shard(0), Replicate()),
        (Shard(1), Replicate()),
        (Replicate(), Shard(1)),
        (Partial(), Replicate()),
    ]:
        w = hs.distribute_tensor(Tensor(W), mesh, [wp])
        if isinstance(wp, Partial):
            w = hs.DTensor.from_local(Tensor(W / world), mesh, [wp], shape=W.shape)
        i = hs.distribute_tensor(Tensor(ids), mesh, [ip])
        y = ops.gather(w, i, 0)
        out[f"{wp}/{ip}"] = (
            str(y.placements),
            float(np.abs(y.full_tensor().asnumpy() - want).max()),
        )
    # an index DTensor of MindSpore's int32 in x[idx] (the getitem rule reads its dtype)
    w = hs.distribute_tensor(Tensor(W), mesh, [Shard(1)])
    i = hs.distribute_tensor(Tensor(ids), mesh, [Shard(0)])
    y = w[i]
    out["getitem"] = (str(y.placements), float(np.abs(y.full_tensor().asnumpy() - want).max()))

    def err(fn) -> str:
        try:
            fn()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    x = hs.distribute_tensor(Tensor(W), mesh, [Shard(0)])
    out["ellipsis"] = err(lambda: ops.strided_slice(x, (0, 1), (0, 3), (1, 1), ellipsis_mask=1))
    out["neg_masked"] = err(lambda: ops.strided_slice(x, (0, 0), (0, 4), (-1, 1), begin_mask=1))
    out["batch_dims"] = err(
        lambda: ops.Gather(batch_dims=1)(
            x, hs.distribute_tensor(Tensor(ids[:, :2].T.copy()), mesh, [Replicate()]), 1
        )
    )
    # mint.nn.Embedding's Embedding Primitive is bound (the embedding entry) but has no CPU
    # kernel in MindSpore 2.10: a clear error on every rank, naming the alternative
    out["mint_embedding"] = err(lambda: mint.nn.functional.embedding(i, w))
    return out


def test_gather_layouts(ms2):
    for out in ms2.run(check_gather_layouts):
        assert out["S(0)/R"] == ("(Partial(sum),)", 0.0)  # vocab-parallel, ids masked
        assert out["S(1)/R"] == ("(Shard(dim=2),)", 0.0)
        assert out["R/S(1)"] == ("(Shard(dim=1),)", 0.0)
        assert out["P/R"][0] == "(Partial(sum),)" and out["P/R"][1] < 1e-5
        assert out["getitem"][1] == 0.0, out["getitem"]
        for k in ("ellipsis", "neg_masked"):
            assert out[k].startswith("ShardingError") and "x[...]" in out[k], out[k]
        assert out["batch_dims"].startswith("ShardingError") and "batch_dims" in out["batch_dims"]
        me = out["mint_embedding"]
        assert me.startswith("HyperShardError") and "no kernel" in me and "nn.Embedding" in me, me


def _np_renorm(w: np.ndarray, ids: np.ndarray, max_norm: float, p: float) -> np.ndarray:
    """``embedding_renorm_`` (the semantics ``ops.embedding`` documents) in numpy."""
    w = w.copy()
    for i in np.unique(ids):
        norm = np.linalg.norm(w[i].astype(np.float64), ord=p)
        if norm > max_norm:
            w[i] *= max_norm / (norm + 1e-7)
    return w


def _gather_loss(w, ids, g):
    from mindspore import ops

    return (ops.gather(w, ids, 0) * g).sum()


def check_max_norm(rank: int, world: int) -> dict:
    """embedding with max_norm on MindSpore, on every table layout.

    MindSpore 2.10 has no CPU kernel for the ``Embedding`` Primitive that ``ops.embedding``
    and ``mint.nn.functional.embedding`` run (plain MindSpore raises too), so on CPU:
    (1) the public call raises the clear error on every rank and leaves the table as it was
    (a column-sharded table renormalised before the lookup is restored); (2) the
    framework-neutral renormalisation kernel, given MindSpore's ``Gather`` as its lookup,
    renormalises a column-sharded table over its shards (one mccl all-reduce) exactly as
    numpy's reference does, and the lookup's values and gradient equal plain Gather's on
    the renormalised table."""
    import mindspore as ms
    from mindspore import Tensor, mint, ops

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.dispatch.op import Binder
    from hyper_shard.kernels import groups_of
    from hyper_shard.kernels.embedding_renorm import ShardedEmbeddingRenorm
    from hyper_shard.rules.embedding import EmbeddingOp

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(7)
    W = (rs.randn(V, 5) * 2).astype(np.float32)  # 5 columns: uneven over 2 ranks
    ids = np.array([[0, 3, 10, 3], [7, 0, 4, 9]], np.int32)
    out: dict = {}
    try:
        ops.embedding(Tensor(ids), Tensor(W), max_norm=1.0)
        out["plain"] = "no error"
    except RuntimeError as e:
        out["plain"] = str(e).splitlines()[0]
    assert mint.nn.functional.embedding is ops.embedding  # one function in 2.10
    for pl in (Replicate(), Shard(0), Shard(1)):
        dw = hs.distribute_tensor(Tensor(W), mesh, [pl])
        di = hs.distribute_tensor(Tensor(ids), mesh, [Replicate()])
        try:
            ops.embedding(di, dw, max_norm=1.0)
            err = "no error"
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        unchanged = bool(np.array_equal(dw.full_tensor().asnumpy(), W))
        out[f"api {pl}"] = (err, unchanged)

    binder = Binder(EmbeddingOp.signature)
    lookup = lambda i, w, *a, **k: ops.gather(w, i, 0)  # noqa: E731
    for p in (2.0, 1.0, float("inf")):
        dw = hs.distribute_tensor(Tensor(W), mesh, [Shard(1)])
        local = dw.to_local().copy()
        lo, n = dw._spec.global_offset()[1], dw._spec.local_shape()[1]
        kernel = ShardedEmbeddingRenorm(
            lookup, binder, mesh.platform, (0, V, V), groups_of(mesh, [0])
        )
        y = kernel(Tensor(ids), local, None, 1.5, p)
        want_w = _np_renorm(W, ids, 1.5, p)
        g = rs.randn(*ids.shape, n).astype(np.float32)
        grad = ms.grad(_gather_loss)(local, Tensor(ids), Tensor(g))
        out[f"kernel p={p}"] = (
            float(np.abs(local.asnumpy() - want_w[:, lo : lo + n]).max()),
            float(np.abs(y.asnumpy() - want_w[ids][..., lo : lo + n]).max()),
            float(np.abs(W[:, lo : lo + n] - want_w[:, lo : lo + n]).max()),  # rows changed
        )
        ref_grad = np.zeros((V, n), np.float32)
        np.add.at(ref_grad, ids, g)
        out[f"grad p={p}"] = float(np.abs(grad.asnumpy() - ref_grad).max())
    return out


def test_max_norm(ms2):
    res = ms2.run(check_max_norm)
    for out in res:
        assert "Embedding" in out["plain"], out["plain"]
        for k, v in out.items():
            if k.startswith("api"):
                err, unchanged = v
                assert err.startswith("HyperShardError") and "no kernel" in err, (k, err)
                assert unchanged, k
            elif k.startswith("kernel"):
                table_err, out_err, changed = v
                assert table_err < 1e-5 and out_err < 1e-5 and changed > 0.1, (k, v)
            elif k.startswith("grad"):
                assert v < 1e-6, (k, v)
    assert res[0]["plain"] == res[1]["plain"]
