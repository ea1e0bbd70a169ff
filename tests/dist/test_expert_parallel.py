"""Expert parallelism (hyper_shard.parallel.ExpertParallel / ExpertTensorParallel) on
Hugging Face MoE models as they ship (MixtralForCausalLM, Qwen3MoeForCausalLM, tiny random
configs) on real gloo ranks, against the same model in one process on the global batch:
the logits, every gradient (router, attention, embeddings, every expert) and the losses
over AdamW steps; EP on 2 and 4 ranks, top-1 and top-2, a router biased so one expert
gets most tokens and one none, the expert x tensor form on a 2 x 2 mesh, EP x FSDP on a
("dp", "ep") mesh; bad input (experts not divisible by the ranks, a router index out of
range on one rank): the same clear error on every rank, no hang; GPT-OSS's experts (transposed weights,
biases, interleaved gate/up, its own clamped gate, keyword arguments) at the module level.

Each rank builds the reference model from the same seed and runs it on the whole batch;
the EP model runs on this rank's slice. Plain (non-expert) gradients are averaged over
the data-parallel ranks as DDP would; the experts' gradients are the style's own.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

pytestmark = pytest.mark.multiproc

EXPERTS = "model.layers.*.mlp.experts"


def _model(kind: str, top_k: int, experts: int = 4, biased: bool = False) -> Any:
    import transformers
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    transformers.logging.set_verbosity_error()
    common = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=top_k,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = MixtralConfig(intermediate_size=32, num_local_experts=experts, **common)
        model = MixtralForCausalLM(cfg)
    else:
        cfg = Qwen3MoeConfig(
            intermediate_size=64, moe_intermediate_size=16, head_dim=8, num_experts=experts,
            norm_topk_prob=True, **common,
        )  # fmt: skip
        model = Qwen3MoeForCausalLM(cfg)
    if biased:
        for layer in model.model.layers:
            _bias_router(layer.mlp.gate)
    return model


def _bias_router(gate: Any) -> None:
    """The router's logits plus a bias: expert 0 gets (nearly) every token's first choice,
    the last expert none (the router's gradient still flows through the softmax)."""
    bias = torch.zeros(gate.num_experts)
    bias[0], bias[-1] = 8.0, -1e4

    def forward(h: torch.Tensor) -> tuple:
        logits = F.linear(h.reshape(-1, gate.hidden_dim), gate.weight) + bias
        probs = torch.softmax(logits.float(), -1)
        top, idx = probs.topk(gate.top_k, -1)
        return logits, top / top.sum(-1, keepdim=True), idx

    gate.forward = forward


def _batch(rows: int = 4, seq: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: ``rows`` sequences of ``seq`` tokens (inputs, next-token targets)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (rows, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _loss(model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=x).logits
    return logits, F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _avg_plain_grads(model: Any, group: Any, n: int) -> None:
    """DDP's reduction of the replicated (non-expert) parameters' gradients."""
    from hyper_shard import DTensor

    for p in model.parameters():
        if p.grad is not None and not isinstance(p, DTensor):
            dist.all_reduce(p.grad, group=group)
            p.grad /= n


def _expert_rows(p: Any, full: torch.Tensor) -> torch.Tensor:
    """The box of a full tensor a DTensor parameter's local shard holds."""
    shape, offset = p._spec.local_shape_and_offset()
    for d, (n, o) in enumerate(zip(shape, offset)):
        full = full.narrow(d, o, n)
    return full


def _check_grads(ep: Any, ref: Any, tag: str) -> int:
    from hyper_shard import DTensor

    refs = dict(ref.named_parameters())
    checked = 0
    for name, p in ep.named_parameters():
        want = refs[name].grad
        got = p.grad
        if isinstance(p, DTensor):
            got, want = got.to_local(), _expert_rows(p, want)
        assert got is not None, f"{tag}: {name} has no gradient"
        torch.testing.assert_close(
            got, want, atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"{tag} {name}: {m}"
        )
        checked += 1
    return checked


def _train_compare(
    ep: Any, ref: Any, rows: slice, group: Any, n: int, steps: int, tag: str
) -> dict:
    """``steps`` AdamW steps of both models; checks logits and every gradient at step 0
    and the losses (the mean over the data-parallel ranks) at every step."""
    x, y = _batch()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_ep = torch.optim.AdamW(ep.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        ref_logits, ref_loss = _loss(ref, x, y)
        ref_loss.backward()
        logits, loss = _loss(ep, x[rows], y[rows])
        loss.backward()
        _avg_plain_grads(ep, group, n)
        if step == 0:
            torch.testing.assert_close(logits, ref_logits[rows], atol=2e-5, rtol=1e-4)
            checked = _check_grads(ep, ref, tag)
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        losses.append((mean.item() / n, ref_loss.item()))
        for opt in (opt_ref, opt_ep):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in losses:
        assert abs(a - b) <= 1e-4 * abs(b), f"{tag}: losses {losses}"
    return {"losses": losses, "checked": checked}


# ---------------------------------------------------------------------- workers
def _ep_cases(
    rank: int, world: int, cases: list[tuple], native: list[str] | None = None
) -> list[dict]:
    """Every ``(model kind, top_k, biased router)`` case on a 1-D "ep" mesh; ``native``:
    the collectives the platform may run natively (the rest composed, as on a backend
    without them)."""
    from hyper_shard import init_device_mesh

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    plat = mesh.platform
    saved = plat.native_collectives
    if native is not None:
        plat.native_collectives = frozenset(native)
    try:
        return [_ep_case(rank, world, mesh, *case) for case in cases]
    finally:
        plat.native_collectives = saved


def _ep_case(rank: int, world: int, mesh: Any, kind: str, top_k: int, biased: bool) -> dict:
    from hyper_shard.parallel import ExpertParallel, parallelize_module
    from hyper_shard.platform import compose

    ref = _model(kind, top_k, biased=biased)
    ep = _model(kind, top_k, biased=biased)  # the same seed: the same weights
    parallelize_module(ep, mesh, {EXPERTS: ExpertParallel()})
    per = 4 // world
    rows = slice(rank * per, (rank + 1) * per)
    tag = f"{kind} top-{top_k}{' biased' if biased else ''} on {world} ranks"
    res = _train_compare(ep, ref, rows, None, world, 3, tag)
    res["route"] = compose.route_for(mesh.platform, "all_to_all_v")
    if biased:  # the imbalance really happened: the last expert saw no token
        x, _ = _batch()
        with torch.no_grad():
            h = ref.model.embed_tokens(x)
            _, _, idx = ref.model.layers[0].mlp.gate(h)
        counts = torch.bincount(idx.flatten(), minlength=4)
        assert counts[-1] == 0 and counts[0] == idx.shape[0], counts
    return res


def _example_case(rank: int, world: int) -> dict:
    """The main job's ``--moe 4 --ep 2`` path (examples/train_llama_tp.py: its flags,
    MixtralForCausalLM, examples/moe_common.py's layout, its training loop) on the pool's
    ranks, against its own single-process run; a small model, 3 steps."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import train_llama_tp as ex
    from moe_common import moe_defaults

    argv = ["--moe", "4", "--ep", "2", "--steps", "3", "--batch", "4", "--seq", "16"]
    args = ex.parse_args([*argv, "--hidden", "32", "--ffn", "64", "--layers", "1", "--nproc", "2"])
    moe_defaults(args)
    ex.validate(args, world)
    data = ex.load_data()
    got = ex.train_tp(args, data, torch.device("cpu"))["losses"]
    want = ex.train_single(args, data, torch.device("cpu"))["losses"]
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-4 * abs(b), (got, want)
    return {"losses": got, "mode": ex.mode_name(args)}


def _etp_case(rank: int, world: int) -> dict:
    from hyper_shard import init_device_mesh
    from hyper_shard.parallel import ExpertTensorParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
    ref = _model("mixtral", 2)
    ep = copy.deepcopy(ref)
    parallelize_module(ep, mesh, {EXPERTS: ExpertTensorParallel()})
    e = mesh.get_local_rank("ep")
    rows = slice(2 * e, 2 * e + 2)  # the tp ranks of an ep coordinate hold the same tokens
    return _train_compare(ep, ref, rows, mesh.get_group("ep"), 2, 3, "ETP (2, 2)")


def _ep_dp_case(rank: int, world: int) -> dict:
    """EP x FSDP on a ("dp", "ep") = (2, 2) mesh: the experts ExpertParallel on "ep" and
    fully_shard on "dp"; every decoder layer and the root fully_shard on the flattened
    ("dp", "ep") mesh (all 4 ranks: each holds its own quarter of the batch)."""
    from hyper_shard import DTensor, init_device_mesh
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    flat = mesh[("dp", "ep")]._flatten()
    ref = _model("mixtral", 2)
    ep = copy.deepcopy(ref)
    parallelize_module(ep, mesh["ep"], {EXPERTS: ExpertParallel()})
    for layer in ep.model.layers:
        fully_shard(layer.mlp.experts, mesh=mesh["dp"])
        fully_shard(layer, mesh=flat)
    fully_shard(ep, mesh=flat)
    x, y = _batch()
    me = flat.get_local_rank()
    rows = slice(me, me + 1)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_ep = torch.optim.AdamW(ep.parameters(), lr=1e-2)
    refs = dict(ref.named_parameters())
    losses = []
    for step in range(3):
        _, ref_loss = _loss(ref, x, y)
        ref_loss.backward()
        _, loss = _loss(ep, x[rows], y[rows])
        loss.backward()
        if step == 0:
            for name, p in ep.named_parameters():
                assert isinstance(p, DTensor) and isinstance(p.grad, DTensor), name
                torch.testing.assert_close(
                    p.grad.full_tensor(), refs[name].grad, atol=2e-5, rtol=1e-4,
                    msg=lambda m, name=name: f"EP x DP {name}: {m}",
                )  # fmt: skip
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append((mean.item() / 4, ref_loss.item()))
        for opt in (opt_ref, opt_ep):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in losses:
        assert abs(a - b) <= 1e-4 * abs(b), f"EP x DP losses {losses}"
    return {"losses": losses}


def _gpt_oss_experts(rank: int, world: int) -> int:
    """GPT-OSS's experts as they ship: weights stored [E, in, out] (``is_transposed``),
    biases, the gate and up columns interleaved and a clamped gate (its own
    ``_apply_gate``), called with keywords (``router_indices=``, ``routing_weights=``);
    the style on the module itself, ``gradient_divide_factor=1.0`` (a summed objective).
    Output and every gradient against the module on the global tokens."""
    import transformers
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from hyper_shard import init_device_mesh
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    transformers.logging.set_verbosity_error()
    cfg = GptOssConfig(hidden_size=32, intermediate_size=16, num_local_experts=4)
    torch.manual_seed(0)
    ref = GptOssExperts(cfg)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ep = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    parallelize_module(ep, mesh, ExpertParallel(gradient_divide_factor=1.0))
    g = torch.Generator().manual_seed(2)
    h = torch.randn(8, 32, generator=g, requires_grad=True)
    idx = torch.randint(0, 4, (8, 2), generator=g)
    w = torch.rand(8, 2, generator=g, requires_grad=True)
    dy = torch.randn(8, 32, generator=g)
    out = ref(h, router_indices=idx, routing_weights=w)
    (out * dy).sum().backward()
    per = 8 // world
    mine = slice(rank * per, (rank + 1) * per)
    hl, wl = h.detach()[mine].requires_grad_(), w.detach()[mine].requires_grad_()
    got = ep(hl, router_indices=idx[mine], routing_weights=wl)
    (got * dy[mine]).sum().backward()
    torch.testing.assert_close(got, out.detach()[mine], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hl.grad, h.grad[mine], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wl.grad, w.grad[mine], atol=1e-5, rtol=1e-5)
    refs = dict(ref.named_parameters())
    for name, p in ep.named_parameters():
        torch.testing.assert_close(
            p.grad.to_local(), _expert_rows(p, refs[name].grad), atol=1e-5, rtol=1e-5,
            msg=lambda m, name=name: f"GPT-OSS {name}: {m}",
        )  # fmt: skip
    return len(refs)


def _bad_input(rank: int, world: int) -> list[str]:
    """Both mistakes on every rank: 6 experts over 4 ranks (refused at parallelize_module,
    before any collective), and rank 1's router producing an index out of range (refused
    in the count exchange: every rank raises). The pool then runs a good step: no rank
    was left inside a collective."""
    from hyper_shard import init_device_mesh
    from hyper_shard.kernels.moe import RoutingError
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    msgs = []
    model = _model("mixtral", 2, experts=6)
    with pytest.raises(ValueError, match="6 experts") as info:
        parallelize_module(model, mesh, {EXPERTS: ExpertParallel()})
    msgs.append(str(info.value))
    model = _model("mixtral", 2)
    parallelize_module(model, mesh, {EXPERTS: ExpertParallel()})
    experts = model.model.layers[0].mlp.experts
    h = torch.randn(5, 32)
    idx = torch.randint(0, 4, (5, 2))
    w = torch.full((5, 2), 0.5)
    if rank == 1:
        idx[3, 0] = 7
    with pytest.raises(RoutingError, match=r"coordinate 1: 1 of the expert-parallel group") as e2:
        experts(h, idx, w)
    msgs.append(str(e2.value))
    with pytest.raises(TypeError, match="plain local"):
        from hyper_shard import DTensor, Replicate

        experts(DTensor.from_local(h, mesh, [Replicate()]), idx, w)
    idx[3, 0] = 2
    out = experts(h, idx, w)  # the group is still in step
    assert out.shape == (5, 32)
    return msgs


# ---------------------------------------------------------------------- tests
def test_expert_parallel_on_2_ranks(dist2):
    """Mixtral top-1 and top-2, and top-2 with the biased router (one expert gets every
    token's first choice, one none)."""
    res = dist2.run(_ep_cases, [("mixtral", 1, False), ("mixtral", 2, False), ("mixtral", 2, True)])
    assert all(r["checked"] == 12 and r["route"] == "native" for r in res[0])  # every parameter


def test_expert_parallel_composed_exchange_and_main_job_on_2_ranks(dist2):
    """The platform without the variable and the even all-to-all (as MindSpore on CPU):
    the token exchange runs as send/recv rounds, with the same results; then the main
    job's ``--moe 4 --ep 2`` path."""
    res = dist2.run(_ep_cases, [("qwen3_moe", 2, True)], ["all_gather", "all_reduce", "send_recv"])
    assert res[0][0]["checked"] == 14 and res[0][0]["route"] == "send_recv"  # + q/k norms
    job = dist2.run(_example_case)
    assert len(job[0]["losses"]) == 3 and job[0]["mode"] == "EP"
    assert dist2.run(_gpt_oss_experts) == [4, 4]  # every parameter, biases included


def test_expert_parallel_on_4_ranks(dist4):
    """Qwen3-MoE top-2, Mixtral top-1 with the biased router, then the expert x tensor
    form on a (2, 2) mesh."""
    res = dist4.run(_ep_cases, [("qwen3_moe", 2, False), ("mixtral", 1, True)])
    assert [r["checked"] for r in res[0]] == [14, 12]  # Qwen3 has q/k norms
    etp = dist4.run(_etp_case)
    assert etp[0]["checked"] == 12


def test_expert_parallel_with_fsdp_on_4_ranks(dist4):
    res = dist4.run(_ep_dp_case)
    assert len(res[0]["losses"]) == 3


def test_bad_input_errors_on_every_rank(dist4):
    res = dist4.run(_bad_input)
    for msgs in res:
        assert "divisible" in msgs[0] and "[0, 4)" in msgs[1]
