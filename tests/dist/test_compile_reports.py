"""Public bug reports on ``torch.compile`` over DTensors (docs/compiling.md), each replaying
the report's program on 2 real gloo ranks, compiled with ``aot_eager``, against plain torch
on the same values in one process (and eager hyper_shard where the report compared the
two): outputs and every gradient (each ``report_*`` names its report)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _eq(got, ref):
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def _compile(fn, **kw):
    return torch.compile(fn, backend="aot_eager", **kw)


def report_matmul_of_new_shapes(rank, world):
    """#154111: one compiled ``x @ y`` of replicated DTensors called again with other
    shapes ((2, 1) @ (1, 1) then (64, 1), (2, 3) @ (3, 4)...) failed on CPU."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    f = _compile(lambda x, y: x @ y)
    g = torch.Generator().manual_seed(0)
    for xs, ys in [((2, 1), (1, 1)), ((64, 1), (1, 1)), ((2, 3), (3, 4))]:
        a, b = torch.randn(xs, generator=g), torch.randn(ys, generator=g)
        out = f(
            distribute_tensor(a, mesh, [Replicate()]), distribute_tensor(b, mesh, [Replicate()])
        )
        _eq(out.full_tensor(), a @ b)


def report_compiled_colwise_output_shard0(rank, world):
    """#141830: a compiled ``ColwiseParallel(output_layouts=Shard(0))`` under a
    ``PrepareModuleInput(Shard(0) -> Replicate())`` parent failed with a stride mismatch
    (eager ran); output and weight gradient against one process."""
    from hyper_shard.parallel import ColwiseParallel, PrepareModuleInput, parallelize_module

    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 8, bias=False)

        def forward(self, x):
            return self.l(x)

    torch.manual_seed(0)
    m, ref = M(), M()
    ref.load_state_dict(m.state_dict())
    parallelize_module(m.l, mesh, ColwiseParallel(output_layouts=Shard(0)))
    parallelize_module(
        m, mesh, PrepareModuleInput(input_layouts=[Shard(0)], desired_input_layouts=[Replicate()])
    )
    x = torch.randn(4, 8)
    out = _compile(m)(x.chunk(world)[rank])
    out.sum().backward()
    r = ref(x)
    r.sum().backward()
    _eq(out, r.chunk(world)[rank].detach())
    _eq(m.l.weight.grad.full_tensor(), ref.l.weight.grad)


def report_aliased_and_detached_outputs(rank, world):
    """#184002: a compiled function returning outputs that alias each other (``y``,
    ``y[:, :1]``, ``y.transpose(0, 1)``) failed ("as_strided not supported with DTensor");
    #172549: two aliasing outputs, one detached, one differentiable, failed in
    AOTAutograd's partitioner."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    a = torch.randn(4, 6)

    def fn(x):
        y = x + 1
        return y, y[:, :1], y.transpose(0, 1)

    x = distribute_tensor(a.clone(), mesh, [Shard(0)]).requires_grad_()
    y, aux, t = _compile(fn)(x)
    (y.sum() + 2 * aux.sum() + 3 * t.sum()).backward()
    pa = a.clone().requires_grad_()
    ry, raux, rt = fn(pa)
    (ry.sum() + 2 * raux.sum() + 3 * rt.sum()).backward()
    for got, ref in zip((y, aux, t), (ry, raux, rt)):
        _eq(got.full_tensor(), ref.detach())
    _eq(x.grad.full_tensor(), pa.grad)

    def f2(x):
        out = DTensor.from_local(x.to_local().sin(), mesh, [Shard(0)])
        return out.detach(), out

    x2 = distribute_tensor(a.clone(), mesh, [Shard(0)]).detach().requires_grad_()
    o1, o2 = _compile(f2)(x2)
    o2.sum().backward()
    _eq(o1.full_tensor(), a.sin())
    _eq(o2.full_tensor(), a.sin())
    _eq(x2.grad.full_tensor(), a.cos())


def report_dynamic_add_of_inputs_requiring_grad(rank, world):
    """#159709: ``torch.compile(torch.add, dynamic=True, fullgraph=True)`` on rank-3
    replicated DTensors made by ``from_local`` of tensors requiring grad failed with an
    untracked symbolic proxy; two shapes, one graph."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    f = _compile(torch.add, dynamic=True, fullgraph=True)
    for shape in [(5, 10, 5), (3, 4, 6)]:
        a, b = torch.ones(shape, requires_grad=True), torch.ones(shape, requires_grad=True)
        x = DTensor.from_local(a, mesh, [Replicate()], run_check=False)
        y = DTensor.from_local(b, mesh, [Replicate()], run_check=False)
        out = f(x, y)
        out.sum().backward()
        _eq(out.full_tensor(), torch.full(shape, 2.0))
        _eq(a.grad, torch.ones(shape))


def report_partial_graph_output(rank, world):
    """#118664 / #119485: a compiled region whose output is a ``Partial`` DTensor (``x + x``
    of a Partial input) failed ("Unexpected fake buffer"), and such outputs fed to later
    ops trained to wrong values; the sum, the matmul after and the gradients."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 4, generator=g) for _ in range(world)]
    yv = torch.randn(4, 4, generator=g)
    x, y = xs[rank].clone().requires_grad_(), yv.clone().requires_grad_()
    x_dt = DTensor.from_local(x, mesh, [Partial()], run_check=False)
    y_dt = DTensor.from_local(y, mesh, [Replicate()], run_check=False)
    tmp = _compile(lambda t: t + t, fullgraph=True)(x_dt)
    assert tmp.placements[0].is_partial()
    out = torch.matmul(tmp, y_dt)
    out.sum().backward()
    px, py = torch.stack(xs).sum(0).requires_grad_(), yv.clone().requires_grad_()
    r = (px + px) @ py
    r.sum().backward()
    _eq(out.full_tensor(), r.detach())
    _eq(x.grad, px.grad)  # a Partial input's gradient: the whole one on every rank
    _eq(y.grad, py.grad)


def report_non_contiguous_output(rank, world):
    """#118219 / #118596: a compiled ``linear`` between two permutes returns a
    non-contiguous DTensor; tracing its backward failed in a view."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)

    def fn(x, y, z):
        tmp = x.permute(0, 2, 1).contiguous()
        return torch._C._nn.linear(tmp, y, z).permute(0, 2, 1)

    xs = [torch.randn(4, 16, 4, generator=g) for _ in range(world)]
    ys = [torch.randn(4, 16, generator=g) for _ in range(world)]
    z = torch.randn(4, generator=g)
    xl, yl, zl = xs[rank].clone().requires_grad_(), ys[rank].clone(), z.clone()
    x = DTensor.from_local(xl, mesh, [Shard(1)], run_check=False)
    y = DTensor.from_local(yl, mesh, [Shard(1)], run_check=False)
    zz = DTensor.from_local(zl, mesh, [Replicate()], run_check=False)
    res = _compile(fn, fullgraph=True)(x, y, zz)
    res.contiguous().sum().backward()
    px = torch.cat(xs, 1).requires_grad_()
    ref = fn(px, torch.cat(ys, 1), z)
    ref.contiguous().sum().backward()
    _eq(res.full_tensor(), ref.detach())
    _eq(xl.grad, px.grad.chunk(world, 1)[rank])


def report_gradient_of_other_placements(rank, world):
    """#118600: the compiled region's output (a layer norm between permutes of a
    ``Shard(1)`` input) gets a gradient of other placements from the matmul after it;
    the inductor-compiled backward failed on the tangent's size."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)

    def fn(x, y, z):
        ln = F.layer_norm(x.permute(0, 2, 1).contiguous(), (4,), y, z, 1e-5)
        return ln.permute(0, 2, 1)

    xv = torch.randn(4, 2 * world, 4, generator=g)
    yv, zv = torch.randn(4, generator=g), torch.randn(4, generator=g)
    xl = xv.chunk(world, 1)[rank].clone().requires_grad_()
    yl, zl = yv.clone().requires_grad_(), zv.clone().requires_grad_()
    x = DTensor.from_local(xl, mesh, [Shard(1)], run_check=False)
    y = DTensor.from_local(yl, mesh, [Replicate()], run_check=False)
    z = DTensor.from_local(zl, mesh, [Replicate()], run_check=False)
    out = torch.matmul(_compile(fn, fullgraph=True)(x, y, z), x).permute(0, 2, 1)
    out.sum().backward()
    px, py, pz = (t.clone().requires_grad_() for t in (xv, yv, zv))
    r = torch.matmul(fn(px, py, pz), px).permute(0, 2, 1)
    r.sum().backward()
    _eq(out.full_tensor(), r.detach())
    _eq(xl.grad, px.grad.chunk(world, 1)[rank])
    _eq(yl.grad, py.grad)  # from_local(Replicate)'s backward: the whole gradient
    _eq(zl.grad, pz.grad)


def report_dynamic_sequence_gathered(rank, world):
    """#175690: under ``torch.compile(dynamic=True)``, a ``Shard(1) -> Replicate`` of a
    dynamically sized sequence (a ``SequenceParallel`` norm, a colwise projection viewed
    to heads and transposed, a rowwise output back to ``Shard(1)``) gave the gathered dim
    the size ``n * ceil(s / n)``; sequence lengths 6 and 10 against one process."""
    from hyper_shard.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.q, self.o = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = self.norm(x)
            b, t, _ = h.shape
            a = self.q(h).view(b, t, -1, 2).transpose(1, 2).softmax(-1)
            return self.o(a.transpose(1, 2).reshape(b, t, -1))

    torch.manual_seed(0)
    m = Block()
    ref = copy.deepcopy(m)
    parallelize_module(
        m,
        mesh,
        {
            "norm": SequenceParallel(),
            "q": ColwiseParallel(),
            "o": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
    m.norm.register_forward_hook(
        lambda mod, i, o: o.redistribute(placements=[Replicate()]).to_local()
    )
    mc = _compile(m, dynamic=True)
    for t in (6, 10):
        x = torch.randn(2, t, 8)
        _eq(mc(x.chunk(world, 1)[rank]), ref(x).chunk(world, 1)[rank].detach())


def report_context_parallel_attention_compiled(rank, world):
    """PR #131351 (context parallelism with ``torch.compile``, PyTorch's test compiling
    ``F.scaled_dot_product_attention`` on sequence-sharded q/k/v that require grad; causal
    and compiled did not work together there): here a forced ``"ring"`` hung the ranks
    (its point-to-point loop ran inside the trace), the causal all-gather form failed on a
    causal mask kept from another trace, and every backward failed (the region's inputs,
    saved for backward, dispatched again: no rule for the attention's backward). The
    ring, all-gather and chosen forms, causal or not, a new and a warm layout cache:
    output and q/k/v gradients."""
    from hyper_shard.experimental import set_context_parallel_method

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    try:
        for method, causal, warm in (
            ("ring", True, False),
            ("allgather", True, True),
            ("auto", False, False),
        ):
            set_context_parallel_method(method)
            torch._dynamo.reset()

            def fn(a, b, c, causal=causal):
                return F.scaled_dot_product_attention(a, b, c, is_causal=causal)

            dq = [distribute_tensor(t.clone(), mesh, [Shard(2)]) for t in (q, k, v)]
            if warm:
                fn(*dq)  # the eager decision first
            for t in dq:
                t.requires_grad_()
            out = _compile(fn)(*dq)
            (out * out).sum().backward()
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            r = fn(*ref)
            (r * r).sum().backward()
            _eq(out.full_tensor(), r.detach())
            for a, b in zip(dq, ref):
                _eq(a.grad.full_tensor(), b.grad)
    finally:
        set_context_parallel_method("auto")


def report_backward_reading_region_inputs(rank, world):
    """#173123: an op of several DTensor outputs, some unused downstream (``chunk``,
    ``max``), in a compiled region: the unused outputs' gradients and the compiled
    backward; and the backward of ``(a * a) @ b`` / ``a.sin() @ b``, which reads the
    region's DTensor inputs themselves (a ``ShardingError`` on mixed tensors here)."""
    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)

    def split_fn(x):
        y = x * 2
        p, q = y.chunk(2, dim=1)
        return p.sin(), q.cos(), y.max(dim=1).values

    x = distribute_tensor(a0.clone(), mesh, [Shard(0)]).requires_grad_()
    p, _, _ = _compile(split_fn)(x)
    (p.sum() * 3).backward()
    rx = a0.clone().requires_grad_()
    (split_fn(rx)[0].sum() * 3).backward()
    _eq(x.grad.full_tensor(), rx.grad)
    for fn in (lambda a, b: (a * a) @ b, lambda a, b: a.sin() @ b):
        torch._dynamo.reset()
        a = distribute_tensor(a0.clone(), mesh, [Shard(0)]).requires_grad_()
        b = distribute_tensor(b0.clone(), mesh, [Replicate()]).requires_grad_()
        out = _compile(fn)(a, b)
        (out * out).sum().backward()
        ra, rb = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        r = fn(ra, rb)
        (r * r).sum().backward()
        _eq(out.full_tensor(), r.detach())
        _eq(a.grad.full_tensor(), ra.grad)
        _eq(b.grad.full_tensor(), rb.grad)


def report_loss_parallel_plus_auxiliary_loss(rank, world):
    """#143134: a compiled model's vocab-sharded logits, a ``loss_parallel`` cross-entropy
    (a DTensor loss) plus ``DTensor.from_local(aux_loss)`` (an MoE auxiliary loss from the
    same region): the backward failed on the tangents' subclass. Loss and gradient."""
    from hyper_shard.parallel import ColwiseParallel, loss_parallel, parallelize_module

    torch._dynamo.reset()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    head, ref = nn.Linear(6, 8, bias=False), nn.Linear(6, 8, bias=False)
    ref.load_state_dict(head.state_dict())
    parallelize_module(head, mesh, ColwiseParallel(use_local_output=False))
    x, tgt = torch.randn(5, 6), torch.randint(0, 8, (5,))

    def step(m, x):
        logits = m(x)
        return logits, logits.to_local().pow(2).mean()

    logits, aux = _compile(step)(head, x)
    with loss_parallel():
        loss = F.cross_entropy(logits, distribute_tensor(tgt, mesh, [Replicate()]))
        # each rank's mean over its vocab columns: their sum / world is the whole mean
        total = loss + DTensor.from_local(aux * (0.1 / world), mesh, [Partial()])
        total.backward()
    rl = ref(x)
    rtotal = F.cross_entropy(rl, tgt) + 0.1 * rl.pow(2).mean()
    rtotal.backward()
    _eq(total.full_tensor(), rtotal.detach())
    _eq(head.weight.grad.full_tensor(), ref.weight.grad)


def report_view_ops_compiled(rank, world):
    """#167074: compiled ``broadcast_to`` / ``expand``, ``reshape``, ``x[..., 1]`` and
    ``tensor_split`` of a DTensor on a (2, 1) mesh each failed with "aten.as_strided.default
    does not have a sharding strategy"; replicated and sharded on the first mesh dim."""
    mesh = init_device_mesh("cpu", (world, 1))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    fns = (
        lambda t: torch.broadcast_to(t, (2, 8, 3)),
        lambda t: t.expand(2, 8, 3),
        lambda t: t.reshape(4, 6),
        lambda t: t[..., 1],
        lambda t: torch.tensor_split(t, 3, dim=0)[1],
    )
    for pl in ([Replicate(), Replicate()], [Shard(0), Replicate()]):
        for f in fns:
            torch._dynamo.reset()
            out = _compile(f)(distribute_tensor(x, mesh, pl))
            _eq(out.full_tensor(), f(x))


def report_rope_slice_and_to_local_kwargs(rank, world):
    """#187443 (torchtitan): compiled ``q * rope_cache[..., :head_dim].to(device=
    q.device)`` with a replicated cache failed; values and the query's gradient for every
    placement of the query; #119023: ``to_local(grad_placements=...)`` graph-broke
    (``fullgraph=True`` raised)."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    cache, qv = torch.randn(16, 8, generator=g), torch.randn(2, 16, 4, generator=g)

    def f(q, rope_cache):
        return q * rope_cache[..., : q.shape[-1]].to(device=q.device)

    for pl in (Shard(0), Shard(1), Replicate()):
        torch._dynamo.reset()
        dq, rq = distribute_tensor(qv, mesh, [pl]).requires_grad_(), qv.clone().requires_grad_()
        out = _compile(f)(dq, distribute_tensor(cache, mesh, [Replicate()]))
        ref = f(rq, cache)
        _eq(out.full_tensor(), ref.detach())
        out.sum().backward()
        ref.sum().backward()
        _eq(dq.grad.full_tensor(), rq.grad)
    torch._dynamo.reset()
    fn = _compile(lambda d: d.to_local(grad_placements=[Shard(0)]) + 2, fullgraph=True)
    _eq(fn(DTensor.from_local(torch.ones(4), mesh, [Replicate()])), torch.full((4,), 3.0))


@reports(
    report_matmul_of_new_shapes,
    report_compiled_colwise_output_shard0,
    report_aliased_and_detached_outputs,
    report_dynamic_add_of_inputs_requiring_grad,
    report_partial_graph_output,
    report_non_contiguous_output,
    report_gradient_of_other_placements,
    report_dynamic_sequence_gathered,
    report_context_parallel_attention_compiled,
    report_backward_reading_region_inputs,
    report_loss_parallel_plus_auxiliary_loss,
    report_view_ops_compiled,
    report_rope_slice_and_to_local_kwargs,
)
def test_reports(report, dist2):
    dist2.run(report)
