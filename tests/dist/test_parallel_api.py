"""hyper_shard.parallel on 2 gloo ranks against the same modules in plain torch.

Every check builds a module from a seed, keeps a deep copy as the single-device
reference, parallelizes the original, and compares on the same inputs: the placements of
the parameters, the forward output, the gradients (``full_tensor()`` of every DTensor
gradient against the reference's), and the parameters after optimizer steps.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
from hyper_shard.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    distribute_module,
    parallelize_module,
)

pytestmark = pytest.mark.multiproc

TOL = {"rtol": 1e-4, "atol": 1e-5}


class MLP(nn.Module):
    def __init__(self, d: int = 8, h: int = 16, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h, bias=bias)
        self.fc2 = nn.Linear(h, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head causal self-attention whose heads live on the ranks' local tensors."""

    def __init__(self, d: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.hd = d // heads
        # no key bias: its exact gradient is zero (softmax ignores a per-query constant), and
        # Adam would amplify the rounding noise of a zero gradient into +-lr steps
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, -1, self.hd).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)) * scale, heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)); x + mlp(norm2(x))."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d)
        self.norm2, self.mlp = nn.LayerNorm(d), MLP(d, 2 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x=self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _mesh(world: int):
    torch.set_num_threads(1)
    return init_device_mesh("cpu", (world,))


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assert_grads_and_params(m: nn.Module, ref: nn.Module) -> int:
    n = 0
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(_full(p.grad), q.grad, **TOL, msg=lambda s, n=name: f"{n}: {s}")
        torch.testing.assert_close(_full(p.detach()), q.detach(), **TOL)
        n += 1
    return n


def _chunk(t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world, dim)[rank]


def _train(m, ref, make_input, loss_of, opt_cls, steps=3, **opt_kw) -> int:
    """Run ``steps`` optimizer steps on both; compare outputs, grads, params each step."""
    opt, ropt = opt_cls(m.parameters(), **opt_kw), opt_cls(ref.parameters(), **opt_kw)
    n = 0
    for i in range(steps):
        x, rx, check_out = make_input(i)
        out, rout = m(x), ref(rx)
        check_out(out, rout)
        loss_of(out).backward()
        loss_of(rout).backward()
        n += _assert_grads_and_params(m, ref)
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(_full(p.detach()), q.detach(), **TOL)
    return n


# ---------------------------------------------------------------------------- checks
def check_colwise_rowwise_mlp(rank, world):
    mesh = _mesh(world)
    n = 0
    for opt_cls, kw in (
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        (torch.optim.AdamW, {"lr": 1e-2}),
    ):
        torch.manual_seed(0)
        m = MLP()
        ref = copy.deepcopy(m)
        res = parallelize_module(m, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        assert res is m
        want = {
            "fc1.weight": (Shard(0), (8, 8)),
            "fc1.bias": (Shard(0), (8,)),
            "fc2.weight": (Shard(1), (8, 8)),
            "fc2.bias": (Replicate(), (8,)),
        }
        for name, p in m.named_parameters():
            assert isinstance(p, DTensor) and isinstance(p, nn.Parameter), name
            assert p.is_leaf and p.requires_grad
            assert p.placements == (want[name][0],), (name, p.placements)
            assert tuple(p.to_local().shape) == want[name][1]
            assert p.shape == dict(ref.named_parameters())[name].shape  # global shape
        g = torch.Generator().manual_seed(1)

        def make_input(i, g=g):
            x = torch.randn(3, 5, 8, generator=g)

            def check(out, rout):
                assert type(out) is torch.Tensor  # use_local_output: a plain replicated tensor
                torch.testing.assert_close(out, rout, **TOL)

            return x, x, check

        n += _train(m, ref, make_input, lambda y: y.pow(2).sum(), opt_cls, **kw)
    return n


def check_input_gradient_and_local_output_false(rank, world):
    mesh = _mesh(world)
    torch.manual_seed(3)
    m = MLP(bias=False)
    ref = copy.deepcopy(m)
    parallelize_module(
        m,
        mesh,
        {
            "fc1": ColwiseParallel(use_local_output=False),
            "fc2": RowwiseParallel(use_local_output=False),
        },
    )
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4), requires_grad=True)
    rx = x.detach().clone().requires_grad_()
    h = m.fc1(x)
    assert isinstance(h, DTensor) and h.placements == (Shard(1),)
    y = m.fc2(F.gelu(h))
    assert isinstance(y, DTensor) and y.placements == (Replicate(),)
    ry = ref(rx)
    torch.testing.assert_close(y.full_tensor(), ry, **TOL)
    (y * y).sum().backward()
    (ry * ry).sum().backward()
    torch.testing.assert_close(x.grad, rx.grad, **TOL)  # the plain input's gradient
    return _assert_grads_and_params(m, ref)


def check_sequence_parallel_block(rank, world):
    """LayerNorms on sequence shards, attention and MLP tensor-parallel, reduce-scattered
    outputs; PrepareModuleInput with a keyword input; Adam steps."""
    mesh = _mesh(world)
    torch.manual_seed(5)
    m = Block()
    ref = copy.deepcopy(m)
    plan = {
        "norm1": SequenceParallel(),
        "norm2": SequenceParallel(),
        "attn": PrepareModuleInput(
            input_kwarg_layouts={"x": Shard(1)},
            desired_input_kwarg_layouts={"x": Replicate()},
            use_local_output=True,
        ),
        "attn.[qkv]": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(m, mesh, plan)
    for name in ("norm1.weight", "norm1.bias", "norm2.weight"):
        assert dict(m.named_parameters())[name].placements == (Replicate(),)
    assert m.attn.q.weight.placements == (Shard(0),) and m.attn.o.weight.placements == (Shard(1),)
    g = torch.Generator().manual_seed(6)

    def make_input(i):
        x = torch.randn(2, 8, 16, generator=g)

        def check(out, rout):
            assert type(out) is torch.Tensor and out.shape == (2, 8 // world, 16)
            torch.testing.assert_close(out, _chunk(rout, 1, rank, world), **TOL)

        return _chunk(x, 1, rank, world), x, check

    # the objective is the sum over the sequence: each rank sums its own positions, the
    # reference sums all of them (local autograd differentiates the global sum)
    n = _train(m, ref, make_input, lambda y: (y * y).sum(), torch.optim.Adam, lr=1e-2)
    # the input's gradient: each rank gets its sequence shard of the reference's
    x = torch.randn(2, 8, 16, generator=g)
    rx = x.clone().requires_grad_()
    xl = _chunk(x, 1, rank, world).clone().requires_grad_()
    (m(xl) ** 2).sum().backward()
    (ref(rx) ** 2).sum().backward()
    torch.testing.assert_close(xl.grad, _chunk(rx.grad, 1, rank, world), **TOL)
    return n + 1


def check_attention_tensor_parallel(rank, world):
    mesh = _mesh(world)
    torch.manual_seed(7)
    m = Attention()
    ref = copy.deepcopy(m)
    parallelize_module(
        m,
        mesh,
        {
            "q": ColwiseParallel(),
            "k": ColwiseParallel(),
            "v": ColwiseParallel(),
            "o": RowwiseParallel(),
        },
    )
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(8), requires_grad=True)
    rx = x.detach().clone().requires_grad_()
    plat = mesh.platform
    calls = []
    real = plat.all_reduce
    plat.all_reduce = lambda t, op, group: calls.append(op) or real(t, op, group)
    try:
        out, rout = m(x, scale=0.5), ref(rx, scale=0.5)
        n_fwd = len(calls)
        torch.testing.assert_close(out, rout, **TOL)
        out.sum().backward()
        n_bwd = len(calls) - n_fwd
    finally:
        del plat.all_reduce
    rout.sum().backward()
    torch.testing.assert_close(x.grad, rx.grad, **TOL)
    # forward: o's partial sums; backward: ONE all-reduce of x's gradient for q, k and v
    # together (they share the wrapped input), none for o's output (a replicated gradient),
    # and o's bias (left Replicate by RowwiseParallel) summed whole, as PyTorch's
    assert (n_fwd, n_bwd) == (1, 2), calls
    return _assert_grads_and_params(m, ref)


def check_same_input_across_forwards(rank, world):
    """One input tensor fed to the model in several forward/backward passes (the wrap of the
    input is shared between consumers, never between passes' gradients)."""
    mesh = _mesh(world)
    torch.manual_seed(19)
    m = MLP()
    ref = copy.deepcopy(m)
    parallelize_module(m, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(20), requires_grad=True)
    rx = x.detach().clone().requires_grad_()
    for _ in range(3):  # gradients accumulate over the passes in both
        m(x).pow(2).sum().backward()
        ref(rx).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, rx.grad, **TOL)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(rx), **TOL)
    x.data.mul_(2)  # an in-place change is seen (the input is wrapped anew)
    rx.data.mul_(2)
    torch.testing.assert_close(m(x), ref(rx), **TOL)
    return _assert_grads_and_params(m, ref)


def check_embeddings(rank, world):
    """Vocab-parallel (Rowwise) and column-parallel (Colwise) nn.Embedding."""
    mesh = _mesh(world)
    ids = torch.randint(0, 10, (3, 4), generator=torch.Generator().manual_seed(9))
    n = 0
    cases = [
        (RowwiseParallel(input_layouts=Replicate()), Shard(0), lambda o, r: (o, r)),
        (
            RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            Shard(0),
            lambda o, r: (o, _chunk(r, 1, rank, world)),
        ),
        (ColwiseParallel(), Shard(1), lambda o, r: (o, _chunk(r, -1, rank, world))),
    ]
    for style, wpl, view in cases:
        torch.manual_seed(10)
        m = nn.Embedding(10, 6)
        ref = copy.deepcopy(m)
        parallelize_module(m, mesh, style)
        assert m.weight.placements == (wpl,)
        out, rout = m(ids), ref(ids)
        assert type(out) is torch.Tensor
        a, b = view(out, rout)
        torch.testing.assert_close(a, b, **TOL)
        # objective: sum(out * c) over the global output; every rank holds a piece (or all)
        c = torch.arange(rout.numel(), dtype=torch.float32).reshape(rout.shape) / 10
        _, cl = view(out, c)
        (out * cl).sum().backward()
        (rout * c).sum().backward()
        n += _assert_grads_and_params(m, ref)
    return n


def check_tied_embedding_and_head(rank, world):
    """An embedding tied to the LM head stays tied (PyTorch's parallelize_module unties it
    silently): training equals the single-device tied model; a plan covering one side
    only is an error naming both sites."""

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 6)  # 11: uneven vocab shards
            self.mid = nn.Linear(6, 6)
            self.head = nn.Linear(6, 11, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.mid(self.emb(ids))))

    mesh = _mesh(world)
    torch.manual_seed(12)
    m = LM()
    ref = copy.deepcopy(m)
    assert ref.head.weight is ref.emb.weight
    plan = {
        "emb": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(m, mesh, plan)
    assert m.head.weight is m.emb.weight and m.emb.weight.placements == (Shard(0),)
    assert len(list(m.parameters())) == len(list(ref.parameters()))
    g = torch.Generator().manual_seed(13)

    def make_input(i):
        ids = torch.randint(0, 11, (3, 5), generator=g)
        return ids, ids, lambda o, r: torch.testing.assert_close(o, r, **TOL)

    n = _train(m, ref, make_input, lambda o: (o * o).mean(), torch.optim.AdamW, lr=0.05)
    # a tie the plan cannot keep: only the head is parallelized
    torch.manual_seed(12)
    bad = LM()
    with pytest.raises(ValueError, match=r"tied parameter.*emb\.weight: a plain parameter"):
        parallelize_module(bad, mesh, {"head": ColwiseParallel()})
    return n


def check_uneven_hidden(rank, world):
    """Colwise -> Rowwise with a hidden size the mesh does not divide (15 on 2 ranks: 8 + 7)
    and local outputs: the Rowwise input's global width comes from in_features, where
    PyTorch reads local width x mesh size (16 and 14) and fails."""
    mesh = _mesh(world)
    torch.manual_seed(15)
    m = nn.Sequential(nn.Linear(6, 15), nn.ReLU(), nn.Linear(15, 6))
    ref = copy.deepcopy(m)
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    g = torch.Generator().manual_seed(16)

    def make_input(i):
        x = torch.randn(4, 6, generator=g)
        return x, x, lambda o, r: torch.testing.assert_close(o, r, **TOL)

    n = _train(m, ref, make_input, lambda o: (o * o).sum(), torch.optim.AdamW, lr=0.05)
    # an input layout whose dim the input lacks: the error names the style and the module
    bad = nn.Sequential(nn.Linear(6, 4))
    parallelize_module(bad, mesh, {"0": ColwiseParallel(input_layouts=Shard(5))})
    with pytest.raises(IndexError, match=r"ColwiseParallel input of Linear \(shape \(4, 6\)\)"):
        bad(torch.randn(4, 6))
    return n


def check_inference_mode(rank, world):
    """torch.inference_mode() / no_grad forward of a parallelized model equals plain torch
    (inference tensors have no version counter: the input-wrap cache must not ask)."""
    mesh = _mesh(world)
    torch.manual_seed(14)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    ref = copy.deepcopy(m)
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(3, 8)
    n = 0
    for ctx in (torch.inference_mode, torch.no_grad):
        with ctx():
            y, r = m(x), ref(x)
            y2 = m(y)  # an inference tensor as the next input
            r2 = ref(r)
        torch.testing.assert_close(y, r, **TOL)
        torch.testing.assert_close(y2, r2, **TOL)
        n += 1
    return n


def check_prepare_module_output_and_input_output(rank, world):
    mesh = _mesh(world)

    class TwoOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x), x.sum()

    torch.manual_seed(11)
    m = TwoOut()
    ref = copy.deepcopy(m)
    # data parallel over the batch: each rank runs its rows; outputs gathered to Replicate
    parallelize_module(
        m,
        mesh,
        PrepareModuleOutput(
            output_layouts=(Shard(0), None), desired_output_layouts=(Replicate(), None)
        ),
    )
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(12))
    (y, s), (ry, _) = m(_chunk(x, 0, rank, world)), ref(x)
    assert type(y) is torch.Tensor and y.shape == (6, 3)
    torch.testing.assert_close(y, ry, **TOL)
    torch.testing.assert_close(s, _chunk(x, 0, rank, world).sum())  # None: left alone

    torch.manual_seed(13)
    lin = nn.Linear(4, 4)
    rlin = copy.deepcopy(lin)
    parallelize_module(
        lin,
        mesh,
        PrepareModuleInputOutput(
            input_layouts=Shard(0),
            desired_input_layouts=Replicate(),
            use_local_input=True,
            output_layouts=Replicate(),
            desired_output_layouts=Shard(0),
        ),
    )
    out = lin(_chunk(x, 0, rank, world))
    torch.testing.assert_close(out, _chunk(rlin(x), 0, rank, world), **TOL)
    return 3


def check_wildcard_plan_over_layers(rank, world):
    mesh = _mesh(world)
    torch.manual_seed(14)
    m = nn.Sequential(*(MLP() for _ in range(3)))
    ref = copy.deepcopy(m)
    parallelize_module(m, mesh, {"*.fc1": ColwiseParallel(), "*.fc2": RowwiseParallel()})
    for i in range(3):
        assert m[i].fc1.weight.placements == (Shard(0),)
        assert m[i].fc2.weight.placements == (Shard(1),)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(15))
    out, rout = m(x), ref(x)
    torch.testing.assert_close(out, rout, **TOL)
    out.sum().backward()
    rout.sum().backward()
    return _assert_grads_and_params(m, ref)


def check_distribute_module(rank, world):
    mesh = _mesh(world)
    torch.manual_seed(16)
    lin = nn.Linear(4, 3)
    lin.register_buffer("scale", torch.full((3,), 2.0))
    ref = copy.deepcopy(lin)

    def in_fn(mod, inputs, mesh_):
        return DTensor.from_local(inputs[0], mesh_, [Replicate()])

    def out_fn(mod, out, mesh_):
        return (out * mod.scale).to_local()

    distribute_module(lin, mesh, input_fn=in_fn, output_fn=out_fn)  # default: replicate all
    assert lin.weight.placements == (Replicate(),) and lin.bias.placements == (Replicate(),)
    assert isinstance(lin.scale, DTensor) and lin.scale.placements == (Replicate(),)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(17))
    out, rout = lin(x), ref(x) * ref.scale
    torch.testing.assert_close(out, rout, **TOL)
    out.pow(2).sum().backward()
    rout.pow(2).sum().backward()
    n = _assert_grads_and_params(lin, ref)
    with pytest.raises(RuntimeError, match="only be called once"):
        distribute_module(lin, mesh)

    # a partition_fn sharding the weight; the deprecated 2-argument hooks warn
    torch.manual_seed(18)
    lin2 = nn.Linear(4, 6)
    ref2 = copy.deepcopy(lin2)

    def part(name, mod, mesh_):
        if name == "":
            from hyper_shard import distribute_tensor

            w = distribute_tensor(mod.weight.detach(), mesh_, [Shard(0)])
            mod.register_parameter("weight", nn.Parameter(w))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distribute_module(
            lin2,
            mesh,
            part,
            lambda inputs, mesh_: DTensor.from_local(inputs[0], mesh_, [Replicate()]),
            lambda out, mesh_: out.full_tensor(),
        )
    assert sum(issubclass(w.category, FutureWarning) for w in caught) == 2
    assert lin2.weight.placements == (Shard(0),) and lin2.bias.placements == (Replicate(),)
    torch.testing.assert_close(lin2(x), ref2(x), **TOL)
    return n + 1


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    "check",
    [
        check_colwise_rowwise_mlp,
        check_input_gradient_and_local_output_false,
        check_sequence_parallel_block,
        check_attention_tensor_parallel,
        check_embeddings,
        check_tied_embedding_and_head,
        check_inference_mode,
        check_uneven_hidden,
        check_prepare_module_output_and_input_output,
        check_wildcard_plan_over_layers,
        check_same_input_across_forwards,
        check_distribute_module,
    ],
    ids=lambda f: f.__name__.removeprefix("check_"),
)
def test_parallel_api(check, dist2):
    counts = dist2.run(check)
    assert counts[0] > 0 and len(set(counts)) == 1
