"""Context parallelism and expert parallelism under ``torch.compile`` (aot_eager), on 2 gloo
ranks, against eager hyper_shard and plain torch in one process:

* a tiny Hugging Face Llama (one layer) trained inside ``context_parallel``, its decoder layer
  compiled and ring attention forced: the losses of 2 AdamW steps and every gradient at
  the first step against the eager context-parallel model and the one-process model; 0
  graph breaks; the compiled graphs hold the ring (``all_to_all_single`` shifts: 2
  forward, 6 backward), no all-gather;
* a Mixtral sparse MoE block with ``ExpertParallel`` compiled whole (top-2, and top-1
  with a router biased so one expert gets every first choice and one none): output and
  every gradient against eager EP and one process, 0 graph breaks, one graph, the
  exchange an even ``all_to_all_single``; a router id out of range on one rank raises
  on every rank;
* ``Shard(0) -> Shard(1)`` of uneven sizes in a compiled region: the traced all-to-all is
  one ``all_to_all_single`` (value and gradient against one process).

Compiled tests are few and small (each graph costs seconds): one pool call each.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .test_compile import _llama
from .test_expert_parallel import _model

pytestmark = pytest.mark.multiproc


def _eq(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _recording() -> tuple[Any, dict[str, Counter]]:
    """An aot_eager-like backend that counts the collectives of the forward and backward
    graphs it is handed."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen: dict[str, Counter] = {"fw": Counter(), "bw": Counter()}

    def compiler(tag: str) -> Any:
        def run(gm: Any, _: Any) -> Any:
            for node in gm.graph.nodes:
                if node.op == "call_function" and "_c10d_functional" in str(node.target):
                    seen[tag][str(node.target).split(".")[1]] += 1
            return make_boxed_func(gm)

        return run

    return aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw")), seen


def _breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


# ---------------------------------------------------------------------- context parallelism
def _llama1() -> Any:
    """The tiny Llama of test_compile.py with one decoder layer (one graph to build)."""
    model = _llama()
    del model.model.layers[1]
    model.config.num_hidden_layers = 1
    return model


def _cp_train(model: Any, mesh: Any, batches: list, compiled: Any) -> tuple[list, dict]:
    """2 AdamW steps inside ``context_parallel``; the losses (mean over the ranks) and the
    first step's gradients (mean over the ranks: each rank's loss is its tokens' mean)."""
    from hyper_shard.experimental import context_parallel

    if compiled is not None:
        for layer in model.model.layers:
            layer.compile(backend=compiled)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], {}
    for i, (x, y) in enumerate(batches):
        x, y, pos = x.clone(), y.clone(), torch.arange(x.shape[1])[None].clone()
        with context_parallel(mesh, buffers=[x, y, pos], buffer_seq_dims=[1, 1, 1]):
            logits = model(input_ids=x, position_ids=pos, attention_mask=torch.ones_like(x))
            loss = F.cross_entropy(logits.logits.flatten(0, 1), y.flatten())
            loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= mesh.size()
        if i == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / mesh.size())
    return losses, grads


def check_cp_compiled_layers(rank: int, world: int) -> list:
    from hyper_shard import init_device_mesh
    from hyper_shard.experimental import set_context_parallel_method

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    g = torch.Generator().manual_seed(1)
    batches = [tuple(torch.randint(0, 64, (2, 16), generator=g) for _ in "xy") for _ in "12"]
    plain = _llama1()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    ref_losses, ref_grads = [], {}
    for i, (x, y) in enumerate(batches):
        loss = F.cross_entropy(plain(input_ids=x).logits.flatten(0, 1), y.flatten())
        loss.backward()
        if i == 0:
            ref_grads = {n: p.grad.clone() for n, p in plain.named_parameters()}
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())
    set_context_parallel_method("ring")
    try:
        eager_losses, eager_grads = _cp_train(_llama1(), mesh, batches, None)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        backend, seen = _recording()
        losses, grads = _cp_train(_llama1(), mesh, batches, backend)
    finally:
        set_context_parallel_method("auto")
    assert _breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
    for a, b, c in zip(losses, eager_losses, ref_losses):
        assert abs(a - b) <= 1e-6 * abs(b) and abs(a - c) <= 1e-5 * abs(c), (a, b, c)
    for name, want in ref_grads.items():
        _eq(grads[name], eager_grads[name])
        _eq(grads[name], want)
    # the ring, its shifts functional
    assert seen["fw"]["all_to_all_single"] == 2 and seen["bw"]["all_to_all_single"] == 6, seen
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not seen["fw"]["all_gather_into_tensor"] and not seen["bw"]["all_gather_into_tensor"]
    # after the contexts, attention on DTensors compiles through hyper_shard (torch's cached
    # list of overridable functions, which dynamo asks, was once built while patched)
    from hyper_shard import Shard, distribute_tensor

    torch._dynamo.reset()
    qkv = [torch.randn(1, 2, 8, 4, generator=g) for _ in range(3)]
    dq = [distribute_tensor(t, mesh, [Shard(2)]) for t in qkv]
    out = torch.compile(F.scaled_dot_product_attention, backend="aot_eager")(*dq)
    _eq(out.full_tensor(), F.scaled_dot_product_attention(*qkv))
    return losses


def test_context_parallel_compiled_decoder_layers(dist2):
    a, b = dist2.run(check_cp_compiled_layers, timeout=600)
    assert a == b


# ---------------------------------------------------------------------- expert parallelism
def _block(top_k: int, biased: bool) -> Any:
    return _model("mixtral", top_k, biased=biased).model.layers[0].mlp


def _run_block(block: Any, x: torch.Tensor) -> torch.Tensor:
    out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    (out * out).sum().backward()
    return out.detach()


def _grads(block: Any, world: int) -> dict:
    """Every parameter's gradient as one process would see the mean of the ranks' losses
    times ``world`` (the experts' is the style's mean; the router's is summed here)."""
    from hyper_shard import DTensor

    out = {}
    for name, p in block.named_parameters():
        if isinstance(p, DTensor):
            out[name] = p.grad.full_tensor() * world
        else:
            g = p.grad.clone()
            dist.all_reduce(g)
            out[name] = g
    return out


def check_ep_compiled_block(rank: int, world: int) -> list:
    from hyper_shard import init_device_mesh
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
    g = torch.Generator().manual_seed(2)
    counts = []
    for top_k, biased in ((2, False), (1, True)):
        ref, eager, block = _block(top_k, biased), _block(top_k, biased), _block(top_k, biased)
        parallelize_module(eager, mesh, {"experts": ExpertParallel()})
        parallelize_module(block, mesh, {"experts": ExpertParallel()})
        x = torch.randn(2 * world, 4, 32, generator=g)
        mine = x.chunk(world)[rank]
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        backend, seen = _recording()
        xc, xe, xr = mine.clone().requires_grad_(), mine.clone().requires_grad_(), x.clone()
        out = _run_block(torch.compile(block, backend=backend), xc)
        want_eager = _run_block(eager, xe)
        want = _run_block(ref, xr.requires_grad_()).chunk(world)[rank]
        assert _breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
        _eq(out, want_eager)
        _eq(out, want)
        _eq(xc.grad, xe.grad)
        _eq(xc.grad, xr.grad.chunk(world)[rank])
        got, ge = _grads(block, world), _grads(eager, world)
        for name, p in ref.named_parameters():
            _eq(got[name], ge[name])
            _eq(got[name], p.grad)
        stats = torch._dynamo.utils.counters["stats"]
        counts.append((stats["unique_graphs"], seen["fw"]["all_to_all_single"]))
        assert not seen["fw"]["all_gather_into_tensor"], seen
    # a router id out of range on rank 0 only: every rank raises (an in-graph assert on
    # the all-reduced count of bad ids), nobody hangs
    block = _block(2, False)
    parallelize_module(block, mesh, {"experts": ExpertParallel()})
    experts = block.experts
    torch._dynamo.reset()

    def bad(h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return h + experts(h, idx + (7 if rank == 0 else 0), w)

    h = torch.randn(4, 32)
    idx = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]])
    with pytest.raises(RuntimeError, match="outside"):
        torch.compile(bad, backend="aot_eager")(h, idx, torch.full((4, 2), 0.5))
    dist.barrier()
    return counts


def test_expert_parallel_compiled_block(dist2):
    # one graph per block; the exchange: ids, rows, rows back (all_to_all_single)
    assert dist2.run(check_ep_compiled_block, timeout=600) == [[(1, 3), (1, 3)]] * 2


# ---------------------------------------------------------------------- the traced all-to-all
def check_shard_to_shard_compiled(rank: int, world: int) -> dict:
    """``Shard(0) -> Shard(1)`` in a compiled region (the traced all-to-all is one
    ``all_to_all_single``), uneven sizes, value and gradient against one process."""
    from hyper_shard import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))
    x = distribute_tensor(a.clone(), mesh, [Shard(0)]).requires_grad_()
    torch._dynamo.reset()
    backend, seen = _recording()
    y = torch.compile(lambda t: (t * 2).redistribute(mesh, [Shard(1)]) * 3, backend=backend)(x)
    assert y.placements == (Shard(1),)
    _eq(y.full_tensor(), a * 6)
    (y * y).sum().backward()
    _eq(x.grad.full_tensor(), 72 * a)
    return dict(seen["fw"])


def test_shard_to_shard_compiled(dist2):
    fw = dist2.run(check_shard_to_shard_compiled)[0]
    assert fw.get("all_to_all_single") == 1 and not fw.get("all_gather_into_tensor"), fw
