"""Expert parallelism on MindSpore Cells (mccl ranks): the MindSpore job's Llama with a
mixture-of-experts MLP (examples/mindspore_llama_model.py, ``num_experts``) and
``ExpertParallel`` on ``model.layers.*.mlp.experts`` — the same style class as torch —
against the same model in one plain MindSpore process on the whole batch: the logits,
every gradient (router, attention, every expert) and the losses over two ``nn.Adam``
steps (a one-layer model: MindSpore's PyNative steps take seconds on a shared CPU);
top-2 and a router biased so expert 0 takes every first choice and the last expert none
(top-1) on 2 ranks (4 ranks run on torch: tests/dist/test_expert_parallel.py); the token
exchange runs as send/recv rounds (mccl has no all-to-all). Bad input: 3 experts over 2
ranks, a router index out of range on one rank: the same error on every rank, no hang.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
EXPERTS = "model.layers.*.mlp.experts"


def _model(top_k: int, experts: int = 4, biased: bool = False):
    sys.path.insert(0, EXAMPLES)
    from mindspore_llama_model import LlamaConfig, build_model

    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        num_experts=experts, num_experts_per_tok=top_k,
    )  # fmt: skip
    net = build_model(cfg, 0)
    if biased:
        for layer in net.model.layers:
            _bias_router(layer.mlp.gate)
    return net


def _bias_router(gate) -> None:
    from mindspore import Tensor, mint, ops

    bias = np.zeros(gate.num_experts, np.float32)
    bias[0], bias[-1] = 8.0, -1e4
    b = Tensor(bias)

    def construct(h):
        logits = mint.matmul(h, gate.weight.T) + b
        top, idx = ops.topk(mint.softmax(logits, -1), gate.top_k)
        return logits, top / top.sum(-1, keepdims=True), idx

    object.__setattr__(gate, "construct", construct)


def check_ep(rank: int, world: int, cases: list) -> list:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    import hyper_shard as hs
    from hyper_shard import DTensor
    from hyper_shard.parallel import ExpertParallel, parallelize_module
    from hyper_shard.platform import compose
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    mesh = hs.init_device_mesh("CPU", (world,), mesh_dim_names=("ep",))
    plat, group = mesh.platform, mesh._group(0)
    rs = np.random.RandomState(1)
    ids = rs.randint(0, 64, (4, 9)).astype(np.int32)
    x, y = Tensor(ids[:, :-1]), Tensor(ids[:, 1:])
    per = 4 // world
    mine = slice(rank * per, (rank + 1) * per)
    out = []
    for top_k, biased in cases:
        ref, net = _model(top_k, biased=biased), _model(top_k, biased=biased)
        parallelize_module(net, mesh, {EXPERTS: ExpertParallel()})
        ref_opt = nn.Adam(ref.trainable_params(), learning_rate=1e-2)
        opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)

        def ref_loss(a, b, ref=ref):
            return ops.cross_entropy(ref(a).reshape(-1, 64), b.reshape(-1))

        def loss_fn(a, b, net=net):
            return ops.cross_entropy(net(a).reshape(-1, 64), b.reshape(-1))

        ref_vg = ms.value_and_grad(ref_loss, None, ref_opt.parameters)
        vg = value_and_grad(loss_fn, None, opt.parameters)
        losses, grad_err, logit_err = [], 0.0, 0.0
        for step in range(2):
            rl, rg = ref_vg(x, y)
            loss, grads = vg(x[mine], y[mine])
            if step == 0:
                logit_err = float(np.abs(net(x[mine]).asnumpy() - ref(x).asnumpy()[mine]).max())
            avg = []
            for g, r in zip(grads, rg):
                if isinstance(g, DTensor):  # an expert shard: this rank's experts' rows
                    local = g.to_local().asnumpy()
                    want = r.asnumpy()[rank * local.shape[0] : (rank + 1) * local.shape[0]]
                    avg.append(g)
                else:  # replicated: the data-parallel mean over the ranks
                    g = plat.all_reduce(g, "avg", group)
                    local, want = g.asnumpy(), r.asnumpy()
                    avg.append(g)
                if step == 0:
                    grad_err = max(grad_err, float(np.abs(local - want).max()))
            opt(optimizer_grads(tuple(avg), opt.parameters))
            ref_opt(rg)
            mean = float(plat.all_reduce(loss, "avg", group).asnumpy())
            losses.append((mean, float(rl.asnumpy())))
        out.append(
            {
                "losses": losses,
                "grad_err": grad_err,
                "logit_err": logit_err,
                "n_grads": len(grads),
                "route": compose.route_for(plat, "all_to_all_v"),
            }
        )
    return out


def check_bad_input(rank: int, world: int) -> list:
    from mindspore import Tensor

    import hyper_shard as hs
    from hyper_shard.kernels.moe import RoutingError
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    mesh = hs.init_device_mesh("CPU", (world,), mesh_dim_names=("ep",))
    msgs = []
    try:
        parallelize_module(_model(2, experts=3), mesh, {EXPERTS: ExpertParallel()})
    except ValueError as e:
        msgs.append(str(e))
    net = parallelize_module(_model(2), mesh, {EXPERTS: ExpertParallel()})
    experts = net.model.layers[0].mlp.experts
    rs = np.random.RandomState(rank)
    h = Tensor(rs.randn(5, 32).astype(np.float32))
    idx = rs.randint(0, 4, (5, 2)).astype(np.int64)
    w = Tensor(np.full((5, 2), 0.5, np.float32))
    if rank == 1:
        idx[3, 0] = 9
    try:
        experts(h, Tensor(idx), w)
    except RoutingError as e:
        msgs.append(str(e))
    idx[3, 0] = 1
    msgs.append(tuple(experts(h, Tensor(idx), w).shape))  # the group is still in step
    return msgs


def _check(res: list) -> None:
    for per_rank in res:
        for case in per_rank:
            assert case["route"] == "send_recv"
            assert case["logit_err"] < 1e-5 and case["grad_err"] < 1e-5, case
            for a, b in case["losses"]:
                assert abs(a - b) <= 1e-5 * abs(b), case["losses"]


def test_expert_parallel_on_2_ranks(ms2):
    res = ms2.run(check_ep, [(2, False), (1, True)], timeout=600)
    _check(res)
    assert res[0][0]["n_grads"] == 12  # every parameter: embedding, 9 in the layer, norm, head


def test_bad_input_errors_on_every_rank(ms2):
    res = ms2.run(check_bad_input, timeout=600)
    for msgs in res:
        assert "3 experts" in msgs[0] and "divisible" in msgs[0]
        assert "coordinate 1: 1" in msgs[1] and "[0, 4)" in msgs[1]
        assert msgs[2] == (5, 32)
