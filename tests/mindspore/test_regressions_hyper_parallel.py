"""Bug reports against MindSpore hyper-parallel (mindspore-ai/hyper-parallel), replayed on
hyper_shard with 2 mccl ranks. Each scenario computes the same thing on one device (plain
MindSpore / numpy on the global values) and compares: forward values, gradients, and the
metadata (global shape, placements, local shapes) hyper-parallel got wrong.

The reports are batched into a few worker calls (one pool round trip each); every
scenario is wrapped so that one failure names itself instead of hiding the others."""

from __future__ import annotations

import numpy as np
import pytest

from tests._scenarios import guard as _guard
from tests._scenarios import ok as _ok

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

# --------------------------------------------------------------------------- DTensor core


def check_dtensor_reports(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, mint, ops

    import hyper_shard as hs
    from hyper_shard import DTensor, Partial, Replicate, Shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad
    from tests.mindspore._ms_helpers import dt_from_numpy

    mesh = hs.init_device_mesh("CPU", (world,))
    rs = np.random.RandomState(11)
    out: dict = {}

    # #764 (1): redistribute must not touch its source (is_partial not called: the source
    # layout's partial state was reset / reduced even when nothing was Partial).
    def source_untouched():
        x = rs.randn(6, 4).astype(np.float32)
        s = dt_from_numpy(x, mesh, [Shard(0)])
        s2 = DTensor.from_local(s.to_local(), mesh, [Shard(0)], shape=x.shape)  # same spec
        local0 = s.to_local().asnumpy().copy()
        r = s.redistribute(mesh, [Replicate()])
        p = dt_from_numpy(x, mesh, [Partial()], seed=3)
        plocal0 = p.to_local().asnumpy().copy()
        pr = p.redistribute(mesh, [Replicate()])
        ps = p.redistribute(mesh, [Shard(1)])
        return {
            "s": (str(s.placements), np.abs(s.to_local().asnumpy() - local0).max()),
            "s2": str(s2.placements),
            "r": (str(r.placements), r.to_local().asnumpy(), x),
            "p": (str(p.placements), np.abs(p.to_local().asnumpy() - plocal0).max()),
            "p_full": (p.full_tensor().asnumpy(), x),
            "pr": (pr.to_local().asnumpy(), x),
            "ps": (str(ps.placements), ps.full_tensor().asnumpy(), x),
        }

    _guard(out, "764_source", source_untouched)

    # #764 (2): Partial -> Shard (the reduce-scatter path) crashed; forward and backward.
    def partial_to_shard():
        res = {}
        x = rs.randn(5, 6).astype(np.float32)  # 5 rows: uneven over 2 ranks
        w = rs.randn(5, 6).astype(np.float32)
        for d in (0, 1):
            p = dt_from_numpy(x, mesh, [Partial()], seed=d)
            s = p.redistribute(mesh, [Shard(d)])
            wd = hs.distribute_tensor(Tensor(w), mesh, [Shard(d)])

            def f(a, _wd=wd, _d=d):
                return (a.redistribute(mesh, [Shard(_d)]) * _wd).sum()

            _, g = value_and_grad(f, 0)(p)
            res[d] = (
                str(s.placements),
                tuple(s.to_local().shape),
                s.full_tensor().asnumpy(),
                g.full_tensor().asnumpy(),
            )
        res["x"], res["w"] = x, w
        # the other reduce ops: max and avg partials reduced onto shards
        pm = DTensor.from_local(Tensor(x - rank), mesh, [Partial("max")], shape=x.shape)
        pa = DTensor.from_local(Tensor(x * (rank + 1)), mesh, [Partial("avg")], shape=x.shape)
        res["max"] = (pm.redistribute(mesh, [Shard(0)]).full_tensor().asnumpy(), x)
        res["avg"] = (
            pa.redistribute(mesh, [Shard(1)]).full_tensor().asnumpy(),
            x * sum(range(1, world + 1)) / world,
        )
        return res

    _guard(out, "764_partial_shard", partial_to_shard)

    # #711: dim_map sized by the mesh ndim, not the tensor ndim (index out of range at
    # parameter init): a 3-D parameter sharded on its last dim over a 1-D mesh, and a 1-D
    # bias on a 2-D mesh.
    def dim_map():
        from mindspore import Parameter

        res = {}
        w = rs.randn(2, 3, 4).astype(np.float32)
        dw = hs.distribute_tensor(Tensor(w), mesh, [Shard(2)])
        pw = Parameter(dw, name="w3")
        res["w3"] = (
            tuple(pw.shape),
            str(pw.placements),
            tuple(pw.to_local().shape),
            pw.full_tensor().asnumpy(),
            w,
        )
        mesh2 = hs.init_device_mesh("CPU", (world, 1), mesh_dim_names=("a", "b"))
        b = rs.randn(6).astype(np.float32)
        db = hs.distribute_tensor(Tensor(b), mesh2, [Shard(0), Replicate()])
        pb = Parameter(db, name="b1")
        res["b1"] = (
            tuple(pb.shape),
            str(pb.placements),
            tuple(pb.to_local().shape),
            pb.full_tensor().asnumpy(),
            b,
        )
        z = hs.zeros(5, device_mesh=mesh2, placements=[Replicate(), Shard(0)])
        res["z"] = (tuple(z.shape), tuple(z.to_local().shape))
        return res

    _guard(out, "711_dim_map", dim_map)

    # #685: chained matmul (x @ A^T) @ B^T with x Shard(-1), A Shard(1), B Replicate: the
    # first product is Partial and the second must keep it (hyper-parallel dropped the
    # Partial: wrong forward, B's gradient 1/N of the true one).
    def chained_matmul():
        x = rs.randn(4, 6).astype(np.float32)
        a = rs.randn(3, 6).astype(np.float32)
        bm = rs.randn(5, 3).astype(np.float32)
        wt = rs.randn(4, 5).astype(np.float32)

        def ref_f(x_, a_, b_):
            return (mint.matmul(mint.matmul(x_, a_.T), b_.T) * Tensor(wt)).sum()

        ref_grads = ms.grad(ref_f, (0, 1, 2))(Tensor(x), Tensor(a), Tensor(bm))
        dx = hs.distribute_tensor(Tensor(x), mesh, [Shard(-1)])
        da = hs.distribute_tensor(Tensor(a), mesh, [Shard(1)])
        db = hs.distribute_tensor(Tensor(bm), mesh, [Replicate()])
        dwt = hs.distribute_tensor(Tensor(wt), mesh, [Replicate()])
        tmp = mint.matmul(dx, da.T)
        o = mint.matmul(tmp, db.T)

        def f(x_, a_, b_):
            return (mint.matmul(mint.matmul(x_, a_.T), b_.T) * dwt).sum()

        _, grads = value_and_grad(f, (0, 1, 2))(dx, da, db)
        return {
            "tmp": str(tmp.placements),
            "o": (str(o.placements), o.full_tensor().asnumpy(), x @ a.T @ bm.T),
            "grads": [g.full_tensor().asnumpy() for g in grads],
            "ref": [g.asnumpy() for g in ref_grads],
        }

    _guard(out, "685_chained_matmul", chained_matmul)

    # #665 / #370: the outputs of a multi-output op each carry a spec of their own rank
    # (hyper-parallel copied the input's 4-D tensor_map onto 3-D outputs). The CPU build
    # has no flash_attention_score: the TND-shaped (tokens, heads, dim) attention through
    # hyper_shard's SDPA, and multi-output reductions whose outputs drop a dim.
    def output_ranks():
        from hyper_shard.platform.mindspore import functional as hsF

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

    _guard(out, "665_output_ranks", output_ranks)

    # #763 (1.1): redistribution around a reshape of a sharded tensor.
    def reshape_redistribute():
        res = {}
        x = rs.randn(4, 6).astype(np.float32)
        d = hs.distribute_tensor(Tensor(x), mesh, [Shard(0)])
        a = d.reshape(4, 2, 3)
        res["split"] = (str(a.placements), tuple(a.shape), a.full_tensor().asnumpy(),
                        x.reshape(4, 2, 3))  # fmt: skip
        b = d.reshape(24).redistribute(mesh, [Replicate()])
        res["flat"] = (tuple(b.shape), b.to_local().asnumpy(), x.reshape(24))
        d1 = hs.distribute_tensor(Tensor(x), mesh, [Shard(1)])
        c = d1.reshape(2, 12)
        res["merge"] = (tuple(c.shape), c.full_tensor().asnumpy(), x.reshape(2, 12))
        e = a.redistribute(mesh, [Shard(2)])
        res["rs"] = (str(e.placements), tuple(e.to_local().shape), e.full_tensor().asnumpy(),
                     x.reshape(4, 2, 3))  # fmt: skip
        return res

    _guard(out, "763_reshape", reshape_redistribute)

    # PR #140 / #671: vocab-parallel cross-entropy with class weights and ignore_index
    # (hyper-parallel indexed weight[ignore_index] out of range and broadcast the weight
    # to [B, B, V]).
    def ce_weight_ignore():
        from hyper_shard.parallel import loss_parallel

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

    _guard(out, "140_ce", ce_weight_ignore)
    return out


def test_dtensor_reports(ms2):
    """Replays, on DTensors (2 ranks vs. one device):

    * mindspore-ai/hyper-parallel#764 "CC分析fully_shard/DTensor相关编码问题", item 1:
      ``from_layout.is_partial`` (a method, not called) made every redistribution reset
      the source layout's partial state and run the partial reduction even when nothing
      was Partial, corrupting DTensors that share the layout. Single-device answer: the
      source DTensor keeps its placements and local data; the result is the global value.
    * #764 item 2: ``self.platform`` undefined in the reduce-scatter path, so every
      ``Partial -> Shard(d)`` redistribution crashed. Answer: the global sum, sharded on
      ``d`` (uneven rows included), gradient = the upstream gradient, replicated;
      ``Partial("max")`` / ``Partial("avg")`` reduce with their own op.
    * #711 "[bug] mf联调发现，参数初始化时，dim_map[shard_dim] index越界": the dim map was
      sized by the mesh ndim instead of the tensor ndim, so a parameter whose ndim differs
      from the mesh's raised IndexError at init. Answer: a 3-D Shard(2) parameter on a 1-D
      mesh and a 1-D bias on a 2-D mesh keep their global shapes and values.
    * #685 "[Bug] 分布式 MatMul 的 layout 推断不传播输入的 Partial 状态...": in
      ``(x @ A^T) @ B^T`` (x Shard(-1), A Shard(1), B Replicate) the second matmul dropped
      the first's Partial: wrong forward, B's gradient 1/N of the true one. Answer: the
      intermediate is Partial(sum), the output and all three gradients equal one device.
    * #665 "[Bug]: TND FlashAttention softmax output DTensor layout rank mismatch" and
      #370 "npu_mhc_pre_sinkhorn ... output Layout tensor_map rank mismatch causes
      full_tensor() failure": an op's outputs got the input's 4-D tensor_map while the
      kernel returned 3-D tensors. The CPU build has no flash_attention_score: the same
      (tokens, heads, dim) attention through hyper_shard's SDPA, and multi-output ops
      whose outputs differ from the input rank (``mint.max(dim)``, ``ops.topk``). Answer:
      each output's spec has its own rank; ``full_tensor()`` equals one device.
    * #763 "GLM4.7分析fully_shard&DTensor相关编码问题", item 1.1 "Reshape 支持不完整":
      redistribution around a reshape of a sharded tensor could give wrong shards.
      Answer: reshapes that split/merge a sharded dim, then redistribute, equal numpy.
    * PR #140 (vocab-parallel CE ignore_index indexing / weight broadcast) and #671
      "[基础能力4] loss_parallel / 分布式 CE": class weights sharded with the classes plus
      ``ignore_index``, every reduction. Answer: loss and logits gradient equal
      ``ops.cross_entropy`` on one device.
    """
    res = ms2.run(check_dtensor_reports)
    for rank, out in enumerate(res):
        s = _ok(out, "764_source")
        assert s["s"] == ("(Shard(dim=0),)", 0.0) and s["s2"] == "(Shard(dim=0),)"
        assert s["r"][0] == "(Replicate(),)"
        np.testing.assert_allclose(s["r"][1], s["r"][2], rtol=1e-6)
        assert s["p"] == ("(Partial(sum),)", 0.0)
        for a, b in (s["p_full"], s["pr"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert s["ps"][0] == "(Shard(dim=1),)"
        np.testing.assert_allclose(s["ps"][1], s["ps"][2], rtol=1e-5, atol=1e-5)

        ps = _ok(out, "764_partial_shard")
        for d in (0, 1):
            pl, _, full, grad = ps[d]
            assert pl == f"(Shard(dim={d}),)"
            np.testing.assert_allclose(full, ps["x"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(grad, ps["w"], rtol=1e-6)
        assert ps[0][1] == ((3, 6), (2, 6))[rank] and ps[1][1] == (5, 3)
        for got, want in (ps["max"], ps["avg"]):
            np.testing.assert_allclose(got, want, rtol=1e-6)

        dm = _ok(out, "711_dim_map")
        assert dm["w3"][:2] == ((2, 3, 4), "(Shard(dim=2),)") and dm["w3"][2] == (2, 3, 2)
        np.testing.assert_array_equal(dm["w3"][3], dm["w3"][4])
        assert dm["b1"][:3] == ((6,), "(Shard(dim=0), Replicate())", (3,))
        np.testing.assert_array_equal(dm["b1"][3], dm["b1"][4])
        assert dm["z"] == ((5,), (5,))  # Shard(0) over the size-1 mesh dim: all of it

        cm = _ok(out, "685_chained_matmul")
        assert cm["tmp"] == "(Partial(sum),)"
        np.testing.assert_allclose(cm["o"][1], cm["o"][2], rtol=1e-5, atol=1e-5)
        for g, r in zip(cm["grads"], cm["ref"]):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)

        orr = _ok(out, "665_output_ranks")
        nd, lnd, shape, full, ref = orr["sdpa"]
        assert (nd, lnd, shape) == (3, 3, (4, 6, 3))
        np.testing.assert_allclose(full, ref, rtol=1e-5, atol=1e-6)
        for nd, lnd, shape, pl, full, ref in orr["max"]:
            assert (nd, lnd, shape, pl) == (2, 2, (4, 6), "(Shard(dim=0),)")
            np.testing.assert_allclose(full, ref, rtol=1e-6)
        for shape, lshape, full, ref in orr["topk"]:
            assert shape == (4, 6, 2) and lshape == (2, 6, 2)
            np.testing.assert_allclose(full, ref, rtol=1e-6)

        rr = _ok(out, "763_reshape")
        for key in ("split", "rs"):
            np.testing.assert_allclose(rr[key][2], rr[key][3], rtol=1e-6)
        assert rr["split"][:2] == ("(Shard(dim=0),)", (4, 2, 3))
        assert rr["rs"][:2] == ("(Shard(dim=2),)", ((4, 2, 2), (4, 2, 1))[rank])
        assert rr["flat"][0] == (24,)
        np.testing.assert_allclose(rr["flat"][1], rr["flat"][2], rtol=1e-6)
        assert rr["merge"][0] == (2, 12)
        np.testing.assert_allclose(rr["merge"][1], rr["merge"][2], rtol=1e-6)

        ce = _ok(out, "140_ce")
        for red in ("mean", "sum", "none"):
            loss, ref, g, rg = ce[red]
            np.testing.assert_allclose(loss, ref, rtol=1e-5)
            np.testing.assert_allclose(g, rg, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- Cells


def _two_layer(seed: int, bias: bool = True):
    from mindspore import Parameter, Tensor, mint, nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.up = mint.nn.Linear(8, 6, bias=bias)
            self.head = mint.nn.Linear(6, 5, bias=bias)

        def construct(self, x):
            h = mint.nn.functional.relu(self.up(x))
            # the head on two chunks of the rows (a chunked loss: #324)
            a, b = mint.chunk(h, 2, 0)
            return mint.cat([self.head(a), self.head(b)], 0)

    net = Net()
    rs = np.random.RandomState(seed)
    for cell in (net.up, net.head):
        o, i = cell.weight.shape
        cell.weight = Parameter(
            Tensor(rs.randn(o, i).astype(np.float32) / np.sqrt(i)), name=cell.weight.name
        )
        if bias:
            cell.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.3), name=cell.bias.name)
    return net


def check_cell_reports(rank: int, world: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    import hyper_shard as hs
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad
    from tests.mindspore._ms_helpers import max_param_err

    out: dict = {}
    mesh = hs.init_device_mesh("CPU", (world,))
    x = np.random.RandomState(5).randn(4, 8).astype(np.float32)
    t = np.random.RandomState(6).randn(4, 5).astype(np.float32)
    half = 4 // world

    def ref_run(steps: int = 1):
        ref = _two_layer(0)
        opt = nn.SGD(ref.trainable_params(), learning_rate=0.1)
        vg = ms.value_and_grad(lambda a, b: ((ref(a) - b) ** 2).mean(), None, opt.parameters)
        losses, grads = [], None
        for _ in range(steps):
            loss, grads = vg(Tensor(x), Tensor(t))
            losses.append(float(loss.asnumpy()))
            opt(grads)
        return ref, losses, [g.asnumpy() for g in grads]

    # #756: RowwiseParallel ignored the bias (and ColwiseParallel the embedding).
    def rowwise_bias():
        ref, losses, ref_grads = ref_run(2)
        net = parallelize_module(
            _two_layer(0), mesh, {"up": ColwiseParallel(), "head": RowwiseParallel()}
        )
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        vg = value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, opt.parameters)
        got, grads = [], None
        for _ in range(2):
            loss, grads = vg(Tensor(x), Tensor(t))
            got.append(float(loss.asnumpy()))
            opt(optimizer_grads(grads, opt.parameters))
        return {
            "losses": (got, losses),
            "grads": [g.full_tensor().asnumpy() for g in grads],
            "ref_grads": ref_grads,
            "werr": max_param_err(net, ref),
            "bias": str(net.head.bias.placements),
        }

    _guard(out, "756_rowwise_bias", rowwise_bias)

    # #324 / #412 / #735 on Cells: a unit (the head) called on two chunks in one forward,
    # a few steps (the loss must track one process, not drift lower), and the grad norm
    # of FSDP and HSDP (2, 1) (replicated) parameters.
    def fsdp_cells():
        ref, losses, ref_grads = ref_run(3)
        ref_norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in ref_grads)))
        res = {"ref_losses": losses, "ref_norm": ref_norm}
        mesh2 = hs.init_device_mesh("CPU", (world, 1), mesh_dim_names=("replicate", "shard"))
        for name, m in (("fsdp", mesh), ("hsdp", mesh2)):
            net = _two_layer(0)
            fully_shard(net.head, mesh=m)
            fully_shard(net, mesh=m)
            opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
            vg = value_and_grad(lambda a, b, _n=net: ((_n(a) - b) ** 2).mean(), None,
                                opt.parameters)  # fmt: skip
            got, norm = [], None
            for step in range(3):
                sl = slice(rank * half, (rank + 1) * half)
                loss, grads = vg(Tensor(x[sl]), Tensor(t[sl]))
                got.append(float(loss.asnumpy()))
                if step == 2:
                    sq = 0.0
                    for g in grads:
                        sq += float(((g * g).sum()).full_tensor().asnumpy())
                    norm = float(np.sqrt(sq))
                    res[name + "_grads"] = [g.full_tensor().asnumpy() for g in grads]
                opt(optimizer_grads(grads, opt.parameters))
            res[name] = (got, norm, max_param_err(net, ref))
        res["ref_grads"] = ref_grads
        return res

    _guard(out, "fsdp_cells", fsdp_cells)
    return out


def test_cell_reports(ms2):
    """Replays, on Cells (2 ranks vs. one process):

    * mindspore-ai/hyper-parallel#756 "ColwiseParallel、RowwiseParallel 实现问题":
      RowwiseParallel did not handle the bias parameter. Answer: a row-parallel
      ``mint.nn.Linear`` with a bias (replicated, added once) trains as one process.
    * #324 / #443 "[fully_shard]处理chunk_loss时，报错unsharded_param.grad is none" on
      MindSpore: the head unit called on two chunks in one forward. Answer: losses,
      gradients and SGD steps equal one process.
    * #412 "fully_shard ms后端精度问题，1000 step fully_shard loss偏低": the MindSpore
      fully_shard loss drifted below the baseline. Answer: every step's loss (mean over
      the ranks) equals one process, and so do the parameters after the steps.
    * #735 "[Bug]在fully_shard接口传入replicate_params时，第一个step grad_norm异常比baseline大":
      Answer: the grad norm from FSDP and from HSDP (2, 1) (every parameter replicated
      over the ranks) equals one process's.
    """
    res = ms2.run(check_cell_reports)
    n = len(res)
    for out in res:
        rb = _ok(out, "756_rowwise_bias")
        np.testing.assert_allclose(*rb["losses"], rtol=1e-5)
        for g, r in zip(rb["grads"], rb["ref_grads"]):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
        assert rb["werr"] < 1e-5 and rb["bias"] == "(Replicate(),)"
    fc = [_ok(out, "fsdp_cells") for out in res]
    for name in ("fsdp", "hsdp"):
        for k in range(3):
            mean = sum(f[name][0][k] for f in fc) / n
            assert mean == pytest.approx(fc[0]["ref_losses"][k], rel=1e-5)
        for f in fc:
            assert f[name][1] == pytest.approx(f["ref_norm"], rel=1e-5)
            assert f[name][2] < 1e-5
            for g, r in zip(f[name + "_grads"], f["ref_grads"]):
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
