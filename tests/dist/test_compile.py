"""``torch.compile`` over hyper_shard DTensors on 2 gloo ranks, against eager and against
plain torch in one process ([Note: compiled DTensor] in platform/torch/compiled.py).

Compiled tests are few and small (each graph costs seconds to build): ``aot_eager`` for
most, one ``inductor`` case. The Hugging Face Llama with the main job's TP plan compiles
whole into one graph (the graph-break count is printed and must be 0, as PyTorch DTensor's)
and per decoder layer; its losses over AdamW steps and every parameter's gradient equal
eager TP and the single-process model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.multiproc

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


def _counters() -> dict:
    c = torch._dynamo.utils.counters
    return {"graph_breaks": sum(c["graph_break"].values()), "graphs": c["stats"]["unique_graphs"]}


# ---------------------------------------------------------------------- functions
def check_fullgraph_fn(rank: int, world: int, backend: str) -> dict:
    """matmul, softmax, redistribute, from_local/to_local/full_tensor and sum inside one
    fullgraph region: value and input gradients against plain torch."""
    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 4, generator=g), torch.randn(4, 6, generator=g)
    c = torch.randn(8, 6, generator=g)

    def f(x, y, z_local):
        z = DTensor.from_local(z_local, mesh, [Shard(0)])
        h = torch.matmul(x, y).softmax(-1) * z
        r = h.redistribute(mesh, [Replicate()])
        return (r.to_local() * 2).sum() + h.full_tensor().mean()

    def run(fn):
        x = distribute_tensor(a.clone().requires_grad_(), mesh, [Shard(0)])
        y = distribute_tensor(b.clone().requires_grad_(), mesh, [Replicate()])
        out = fn(x, y, c.chunk(world)[rank])
        out.backward()
        return out.detach(), x.grad.full_tensor(), y.grad.full_tensor()

    got = run(torch.compile(f, backend=backend, fullgraph=True))
    eager = run(f)
    pa, pb = a.clone().requires_grad_(), b.clone().requires_grad_()
    h = (pa @ pb).softmax(-1) * c
    ref = (h * 2).sum() + h.mean()
    ref.backward()
    for x, e, r in zip(got, eager, (ref.detach(), pa.grad, pb.grad)):
        torch.testing.assert_close(x, e)
        torch.testing.assert_close(x, r, rtol=1e-5, atol=1e-6)
    return _counters()


def check_recompiles(rank: int, world: int) -> list[int]:
    """Frames compiled after each call: same shapes and placements reuse the graph, a new
    placement compiles once, a new length compiles once more (then runs dynamic)."""
    from hyper_shard import Replicate, Shard, distribute_tensor, init_device_mesh

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mesh = init_device_mesh("cpu", (world,))
    w = distribute_tensor(torch.randn(6, 6), mesh, [Replicate()])
    f = torch.compile(lambda x: (x @ w).relu().sum(), backend="aot_eager")
    seen = []
    for n, pl in [(8, Shard(0)), (8, Shard(0)), (8, Replicate()), (8, Shard(0)), (12, Shard(0))]:
        x = distribute_tensor(torch.randn(n, 6), mesh, [pl])
        out = f(x)
        torch.testing.assert_close(
            out.full_tensor(), (x.full_tensor() @ w.full_tensor()).relu().sum()
        )
        seen.append(int(torch._dynamo.utils.counters["stats"]["unique_graphs"]))
    return seen


def check_bad_input(rank: int, world: int) -> list[str]:
    """Under compile a call with no sharding rule, DTensors of two meshes, or a plain
    tensor mixed in raise the eager error (its type and message), not a dynamo internal
    error; under ``fullgraph=True`` dynamo's error names it (it was "Unsupported output type
    for nonstrict_trace-ed function", the message nowhere)."""
    from hyper_shard import Shard, distribute_tensor, init_device_mesh
    from hyper_shard.errors import OpNotRegisteredError, ShardingError

    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    other = init_device_mesh("cpu", (1, world))  # the same ranks as a 2-D mesh
    x = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
    y = distribute_tensor(torch.randn(4, 4), other, [Shard(1), Shard(0)])
    seen = []
    for fn, err in (
        (lambda a, b: torch.ops.aten._fft_r2c(a, [0], 0, True), OpNotRegisteredError),
        (lambda a, b: a + b, ShardingError),
        (lambda a, b: a + torch.ones(4, 4), ShardingError),
    ):
        with pytest.raises(err) as eager:
            fn(x, y)
        with pytest.raises(err) as info:
            torch.compile(fn, backend="aot_eager")(x, y)
        assert str(info.value) == str(eager.value)
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported) as full:
            torch.compile(fn, backend="aot_eager", fullgraph=True)(x, y)
        assert f"raised exception {err.__name__}" in str(full.value), str(full.value)
        assert str(eager.value)[:60] in str(full.value), str(full.value)
        seen.append(type(info.value).__name__)
    return seen


# ---------------------------------------------------------------------- the TP Llama
def _llama(seed: int = 0):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _batches(steps: int, seq: int = 16):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randint(0, 64, (2, seq), generator=g)
        out.append((x, torch.randint(0, 64, (2, seq), generator=g)))
    return out


def _full(t):
    from hyper_shard import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _train_tp(mesh, how: str, steps: int, sp: bool = False):
    from hyper_shard import DTensor, Replicate, Shard
    from hyper_shard import parallel as hp

    sys.path.insert(0, EXAMPLES)
    from llama_common import llama_tp_plan

    model = _llama()
    hp.parallelize_module(model, mesh, llama_tp_plan(sp, hp, Replicate, Shard))
    if how == "whole":
        fwd = torch.compile(model, backend="aot_eager")
    elif how == "layers":
        for layer in model.model.layers:
            layer.compile(backend="aot_eager")
        fwd = model
    else:
        fwd = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pos = torch.arange(16)[None]
    losses, grads = [], None
    for x, y in _batches(steps):
        logits = fwd(input_ids=x, position_ids=pos).logits
        target = DTensor.from_local(y.flatten(), mesh, [Replicate()])
        with hp.loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), target)
            loss.backward()
        losses.append(loss.detach().full_tensor().item())
        if grads is None:
            grads = {n: _full(p.grad).clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads


def _train_plain(steps: int):
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pos = torch.arange(16)[None]
    losses, grads = [], None
    for x, y in _batches(steps):
        logits = model(input_ids=x, position_ids=pos).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        losses.append(loss.item())
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads


def check_llama_tp(rank: int, world: int, how: str, sp: bool) -> dict:
    from hyper_shard import init_device_mesh

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    steps = 3
    got, got_g = _train_tp(mesh, how, steps, sp)
    counts = _counters()
    eager, eager_g = _train_tp(mesh, "eager", steps, sp)
    plain, plain_g = _train_plain(steps)
    for a, e, p in zip(got, eager, plain):
        assert abs(a - e) <= 1e-5 * abs(e), (got, eager)
        assert abs(a - p) <= 1e-4 * abs(p), (got, plain)
    for n, g in got_g.items():
        torch.testing.assert_close(g, eager_g[n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g, plain_g[n], rtol=1e-4, atol=1e-5)
    return counts


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_function(dist2, backend):
    counts = dist2.run(check_fullgraph_fn, backend, timeout=600)
    assert counts[0]["graph_breaks"] == 0 and counts[0]["graphs"] == 1


def test_guards_recompile_only_on_new_layouts(dist2):
    # 1 graph; the same call again: 1; Replicate input: 2; Shard(0) again: 2; a new length: 3
    assert dist2.run(check_recompiles) == [[1, 1, 2, 2, 3]] * 2


def test_bad_input_gets_the_eager_error(dist2):
    assert (
        dist2.run(check_bad_input)
        == [["OpNotRegisteredError", "ShardingError", "ShardingError"]] * 2
    )


def test_llama_tp_compiled_whole_zero_graph_breaks(dist2):
    counts = dist2.run(check_llama_tp, "whole", False, timeout=600)
    print(f"TP Llama compiled whole: {counts[0]['graph_breaks']} graph breaks, "
          f"{counts[0]['graphs']} graph(s)")  # fmt: skip
    assert counts[0] == {"graph_breaks": 0, "graphs": 1}


def test_llama_tp_compiled_per_layer(dist2):
    counts = dist2.run(check_llama_tp, "layers", False, timeout=600)
    assert counts[0]["graph_breaks"] == 0


def test_llama_sp_compiled_whole(dist2):
    counts = dist2.run(check_llama_tp, "whole", True, timeout=600)
    assert counts[0]["graph_breaks"] == 0


# ---------------------------------------------------------------------- DTensor API patterns
def check_api_patterns(rank: int, world: int) -> list[str]:
    """The DTensor API as code written for PyTorch DTensor uses it inside compiled regions
    (fullgraph): placements and meshes as inputs, attribute reads, from_local / to_local /
    redistribute with keyword arguments, DTensors in and out, dynamic shapes, forward hooks,
    gradients. Each compiled result is held to the eager one (and grads to plain torch)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from hyper_shard import DeviceMesh, DTensor, Partial, Replicate, Shard

    mesh = DeviceMesh("cpu", torch.arange(world))
    done = []

    def compiled(fn, **kw):
        torch._dynamo.reset()
        return torch.compile(fn, backend=kw.pop("backend", "aot_eager"), fullgraph=True, **kw)

    def same(a, b):
        a = a.full_tensor() if isinstance(a, DTensor) else a
        b = b.full_tensor() if isinstance(b, DTensor) else b
        torch.testing.assert_close(a, b)

    # placements and a mesh as the region's inputs: their methods are constants
    def kinds(p):
        return (p.is_shard(), p.is_shard(0), p.is_shard(dim=1), p.is_replicate(), p.is_partial())

    f = compiled(kinds)
    assert all(f(p) == kinds(p) for p in (Shard(0), Replicate(), Partial()))

    def mesh_info(m):
        return m.size(), m.size(0), m.size(mesh_dim=0), m.get_coordinate(), m.get_group()

    assert compiled(mesh_info)(mesh) == mesh_info(mesh)
    done.append("placement and mesh inputs")

    # a DTensor in, the same or a new DTensor out; attribute reads on intermediates
    x = DTensor.from_local(torch.rand(3), mesh, [Shard(0)], run_check=False)
    out = compiled(lambda t: t)(x)
    assert isinstance(out, DTensor) and out.placements == (Shard(0),) and out.shape == (3 * world,)
    same(compiled(lambda t: t * t + 2)(x), x * x + 2)

    def branch(t):
        u = t * 2
        if u.placements[0].is_shard() and u.device_mesh.device_type == "cpu":
            return u._local_tensor + 2
        return u._local_tensor + 3

    same(compiled(branch)(x), branch(x))
    done.append("DTensor in and out, attributes")

    # redistribute / to_local with keywords, a dim marked dynamic (recompiles, not an error)
    def gather_row(t):
        r = torch.mul(t, t).redistribute(device_mesh=t.device_mesh, placements=[Replicate()])
        return r.to_local()[0]

    y = DTensor.from_local(torch.rand(4, 4), mesh, [Shard(0)], run_check=False)
    torch._dynamo.mark_dynamic(y, 0)
    same(compiled(gather_row)(y), gather_row(y))
    r = DTensor.from_local(torch.ones(4), mesh, [Replicate()], run_check=False)
    out = compiled(lambda t: r.to_local(grad_placements=[Shard(0)]) + 2)(r)
    assert type(out) is torch.Tensor
    same(out, r.to_local() + 2)
    done.append("redistribute / to_local keywords, mark_dynamic")

    # from_local inside the region (plain in, plain out), keywords, grads; one frame each
    def wrap_add(t):
        return DTensor.from_local(t, device_mesh=mesh, placements=[Replicate()]).to_local() + 2

    cnt = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    t = torch.ones(2, requires_grad=True)
    out = torch.compile(wrap_add, backend=cnt, fullgraph=True)(t)
    out.sum().backward()
    same(out, t.detach() + 2)
    same(t.grad, torch.ones(2))
    assert cnt.frame_count == 1

    def sized(t):  # sizes read from a dynamic input
        d = DTensor.from_local(t, mesh, [Replicate()], shape=t.shape, stride=t.stride())
        return d.to_local() + 2

    t = torch.randn(4, 6, requires_grad=True)
    out = compiled(sized, dynamic=True)(t)
    out.sum().backward()
    same(out, t.detach() + 2)
    # a torch DeviceMesh (a slice of a 2-D one) first met inside the region
    from torch.distributed.device_mesh import init_device_mesh

    tsub = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))["tp"]

    def on_torch_mesh(t):
        d = DTensor.from_local(t, tsub, [Shard(0)], shape=(2 * world, 3), stride=(3, 1))
        return (d * 2).redistribute(placements=[Replicate()]).to_local()

    t = torch.randn(2 * world, 3, generator=torch.Generator().manual_seed(5))
    same(compiled(on_torch_mesh)(t.chunk(world)[rank]), t * 2)
    done.append("from_local inside, dynamic=True, torch mesh")

    # the same placements on a new equal mesh: no recompile; a new placement: one
    cnt = CompileCounterWithBackend("aot_eager")
    env = {}

    def build(t):
        return DTensor.from_local(t, env["mesh"], [env["pl"]]).to_local() * 1

    torch._dynamo.reset()
    g = torch.compile(build, backend=cnt)
    for pl in (Shard(1), Shard(1), Partial(), Partial()):
        env["mesh"], env["pl"] = DeviceMesh("cpu", torch.arange(world)), pl
        g(torch.ones(4, 4))
    assert cnt.frame_count == 2
    done.append("guards on equal meshes")

    # a forward hook converting the output; nn.Parameter of a DTensor
    def hook(m, inp, o):
        loc = o.to_local(grad_placements=o.placements) + 2
        return DTensor.from_local(loc, mesh, o.placements, run_check=False)

    torch.manual_seed(3)
    lin = torch.nn.Linear(4, 4)
    lin.register_forward_hook(hook)
    lin.weight = torch.nn.Parameter(DTensor.from_local(lin.weight, mesh, [Replicate()]))
    lin.bias = torch.nn.Parameter(DTensor.from_local(lin.bias, mesh, [Replicate()]))
    d = DTensor.from_local(torch.ones(4, 4), mesh, [Replicate()])
    same(compiled(lin)(d), lin(d))
    done.append("forward hook")

    # async redistribute, transposed layouts, gradients through matmul and redistribute
    def gathered(t):
        d = DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
        return d.redistribute(mesh, [Replicate()], async_op=True).to_local() + 2

    same(compiled(gathered)(torch.ones(2)), torch.ones(2 * world) + 2)

    def lin_t(a, w, b):
        h = torch._C._nn.linear(a.permute(0, 2, 1).contiguous(), w, b)
        return h.permute(0, 2, 1)

    g0 = torch.Generator().manual_seed(4)
    a0, w0, b0 = (torch.randn(*s, generator=g0) for s in ((4, 8 * world, 4), (4, 8 * world), (4,)))
    leaves = [v.clone().requires_grad_() for v in (a0, w0, b0)]
    dts = [
        DTensor.from_local(v.chunk(world, 1)[rank] if i < 2 else v, mesh, [pl])
        for i, (v, pl) in enumerate(zip(leaves, (Shard(1), Shard(1), Replicate())))
    ]
    out = compiled(lin_t)(*dts)
    out.contiguous().sum().backward()
    ref = [v.clone().requires_grad_() for v in (a0, w0, b0)]
    lin_t(*ref).sum().backward()
    same(out, lin_t(*ref).detach())
    for i, (v, rv) in enumerate(zip(leaves, ref)):  # this rank's shards' gradients
        same(*((g.chunk(world, 1)[rank] if i < 2 else g) for g in (v.grad, rv.grad)))
    done.append("async redistribute, layouts, grads")
    return done


def test_dtensor_api_patterns_in_compiled_regions(dist2):
    done = dist2.run(check_api_patterns, timeout=900)
    assert done[0] == done[1] and len(done[0]) == 7, done


# ---------------------------------------------------------------------- one decoder layer
def check_decoder_layer_fullgraph(rank: int, world: int, backend: str) -> dict:
    """One TP decoder layer of the Llama under ``fullgraph=True``: its output and every
    parameter's and the input's gradient equal the eager TP layer and the plain layer."""
    from hyper_shard import Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    sys.path.insert(0, EXAMPLES)
    from llama_common import llama_tp_plan

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    plain = _llama()
    h0 = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    pe = plain.model.rotary_emb(h0, torch.arange(16)[None])

    def run(layer, fn):
        h = h0.clone().requires_grad_()
        out = fn(h, position_embeddings=pe)
        out = out[0] if isinstance(out, tuple) else out
        out = _full(out)
        (out * out).sum().backward()
        grads = {n: _full(p.grad) for n, p in layer.named_parameters()}
        return out.detach(), h.grad, grads

    tp = _llama()
    hp.parallelize_module(tp, mesh, llama_tp_plan(False, hp, Replicate, Shard))
    tp_layer = tp.model.layers[0]
    got = run(tp_layer, torch.compile(tp_layer, backend=backend, fullgraph=True))
    counts = _counters()
    tp_layer.zero_grad()
    eager = run(tp_layer, tp_layer)
    ref = run(plain.model.layers[0], plain.model.layers[0])
    for g, e, r in zip(got[:2], eager[:2], ref[:2]):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    for n, g in got[2].items():
        torch.testing.assert_close(g, eager[2][n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, ref[2][n], rtol=1e-4, atol=1e-5)
    return counts


def test_tp_decoder_layer_fullgraph_inductor(dist2):
    counts = dist2.run(check_decoder_layer_fullgraph, "inductor", timeout=900)
    assert counts[0] == {"graph_breaks": 0, "graphs": 1}


# ---------------------------------------------------------------------- LLM ops, fullgraph
def check_llm_ops_fullgraph(rank: int, world: int) -> list[str]:
    """The functional ops of an LLM block on DTensors in one fullgraph region, value and
    every input's gradient against plain torch: causal SDPA, rms_norm, silu, gelu, the
    rotary ``torch.cat((-x2, x1))`` over a *tuple* of DTensors made in the region (dynamo
    looked for DTensors in lists only: the cat ran on the local tensors and returned a plain
    tensor), a reshape that moves data (a copied view's layout id was stale: the next op
    failed to trace) and cross-entropy with ``ignore_index``."""
    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    B, H, S, D = 2, 2 * world, 6, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
    wn = torch.randn(D, generator=g)
    tgt = torch.randint(0, D, (B * H * S,), generator=g)
    tgt[::3] = -100

    def f(q, k, v, wn, tgt):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = F.rms_norm(o, (D,), wn, eps=1e-6)
        o = F.silu(o) + F.gelu(o, approximate="tanh")
        rot = torch.cat((-o[..., D // 2 :], o[..., : D // 2]), dim=-1)
        o = o * torch.cos(o) + rot * torch.sin(o)
        return F.cross_entropy(o.reshape(-1, D), tgt, ignore_index=-100)

    leaves = [t.clone().requires_grad_() for t in (q, k, v, wn)]
    ref = f(*leaves, tgt)
    ref.backward()
    done = []
    for pl in (Shard(1), Shard(0)):
        torch._dynamo.reset()
        ins = [
            distribute_tensor(t.clone(), mesh, [pl if t.ndim == 4 else Replicate()])
            for t in (q, k, v, wn)
        ]
        for t in ins:
            t.requires_grad_()
        dt = distribute_tensor(tgt, mesh, [Replicate()])
        loss = torch.compile(f, backend="aot_eager", fullgraph=True)(*ins, dt)
        assert isinstance(loss, DTensor), type(loss)
        loss.backward()
        torch.testing.assert_close(loss.full_tensor(), ref.detach(), rtol=1e-5, atol=1e-6)
        for t, r in zip(ins, leaves):
            torch.testing.assert_close(t.grad.full_tensor(), r.grad, rtol=1e-4, atol=1e-6)
        done.append(str(pl))
    return done


def test_llm_ops_fullgraph(dist2):
    assert dist2.run(check_llm_ops_fullgraph, timeout=900) == [["S(1)", "S(0)"]] * 2
