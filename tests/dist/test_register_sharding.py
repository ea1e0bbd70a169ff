"""``hyper_shard.experimental.register_sharding`` against PyTorch DTensor's
``torch.distributed.tensor.experimental.register_sharding`` and plain torch, on real gloo
ranks (a mesh of 2): the same strategy function registered with both, the same calls.

Covered as in PyTorch's own test (test/distributed/tensor/experimental/
test_register_sharding.py): a custom op (``torch.library.custom_op`` with a fake
implementation) with a non-tensor first argument, an aten op called directly
(``aten.argmax``, ``aten._softmax``) whose strategy keeps a shard, the strategy forcing a
redistribution, and a wrong strategy function's error.
"""

from __future__ import annotations

import pytest
import torch

import hyper_shard as hs
from hyper_shard import ShardingError
from hyper_shard.experimental import register_sharding
from tests._reports import reports

pytestmark = pytest.mark.multiproc

aten = torch.ops.aten


def _custom_ops():
    """Two custom ops in the namespace ``hs_test`` (defined once per process)."""
    if hasattr(torch.ops, "hs_test") and hasattr(torch.ops.hs_test, "mycos"):
        return

    @torch.library.custom_op("hs_test::rowscale", mutates_args=())
    def rowscale(name: str, x: torch.Tensor, k: float) -> torch.Tensor:
        """x * k: elementwise, so any Shard of x works."""
        return x * k

    @rowscale.register_fake
    def _(name, x, k):
        return torch.empty_like(x)

    @torch.library.custom_op("hs_test::mycos", mutates_args=())
    def mycos(x: torch.Tensor) -> torch.Tensor:
        """cos(x), with its own autograd formula (it saves the input)."""
        return x.cos()

    @mycos.register_fake
    def _(x):
        return torch.empty_like(x)

    def _save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def _bwd(ctx, g):
        return -g * ctx.saved_tensors[0].sin()

    mycos.register_autograd(_bwd, setup_context=_save)

    @torch.library.custom_op("hs_test::rownorm", mutates_args=())
    def rownorm(x: torch.Tensor) -> torch.Tensor:
        """x / x.sum(-1): needs whole rows (the last dim unsharded)."""
        return x / x.sum(-1, keepdim=True)

    @rownorm.register_fake
    def _(x):
        return torch.empty_like(x)


def _rowscale_strategy(Shard, Replicate):
    def strategy(name, x, k):
        return [([Replicate()], [None, Replicate(), None])] + [
            ([Shard(d)], [None, Shard(d), None]) for d in range(x.ndim)
        ]

    return strategy


def _rownorm_strategy(Shard, Replicate):
    def strategy(x):
        return [([Replicate()], [Replicate()])] + [
            ([Shard(d)], [Shard(d)]) for d in range(x.ndim - 1)
        ]

    return strategy


def _argmax_strategy(Shard, Replicate):
    def strategy(x, dim=None, keepdim=False):
        out = [([Replicate()], [Replicate(), None, None])]
        if keepdim and dim is not None:
            out += [([Shard(d)], [Shard(d), None, None]) for d in range(x.ndim) if d != dim]
        return out

    return strategy


def check_register_sharding(rank, world):
    import torch.distributed.tensor as T
    from torch.distributed.tensor.experimental import register_sharding as t_register

    _custom_ops()
    prop = T.DTensor._op_dispatcher.sharding_propagator
    saved = (
        prop.op_strategy_funcs.get(aten.argmax.default),
        prop.op_to_schema_info.get(aten.argmax.default),
    )
    try:
        return _check(rank, world, T, t_register)
    finally:  # the pool's processes run other tests after this one: restore both libraries
        from hyper_shard._register_sharding import unregister
        from hyper_shard.platform.select import get_platform

        for op in (
            aten.argmax.default,
            torch.ops.hs_test.rowscale.default,
            torch.ops.hs_test.mycos.default,
        ):
            unregister(get_platform("torch"), op)
        unregister(get_platform("torch"), torch.ops.hs_test.rownorm.default)
        for table, value in zip((prop.op_strategy_funcs, prop.op_to_schema_info), saved):
            if value is None:
                table.pop(aten.argmax.default, None)
            else:
                table[aten.argmax.default] = value
        prop.propagate_op_sharding.cache_clear()


def _check(rank, world, T, t_register):
    torch.manual_seed(0)
    x = torch.rand(6, 5) + 0.5  # 5 columns: uneven on 2 ranks
    libs = [
        ("torch", T.init_device_mesh("cpu", (world,)), T, t_register),
        ("hyper_shard", hs.init_device_mesh("cpu", (world,)), hs, register_sharding),
    ]
    for name, mesh, L, reg in libs:
        reg(torch.ops.hs_test.rowscale.default)(_rowscale_strategy(L.Shard, L.Replicate))
        reg(torch.ops.hs_test.rownorm.default)(_rownorm_strategy(L.Shard, L.Replicate))
        reg(aten.argmax.default)(_argmax_strategy(L.Shard, L.Replicate))
        for d in (0, 1):
            dx = L.distribute_tensor(x, mesh, [L.Shard(d)])
            # a custom op whose first argument is a string; packet and overload calls
            for call in (torch.ops.hs_test.rowscale, torch.ops.hs_test.rowscale.default):
                y = call("tag", dx, 3.0)
                assert isinstance(y, L.DTensor), name
                assert tuple(y.placements) == (L.Shard(d),), (name, y.placements)
                torch.testing.assert_close(y.full_tensor(), x * 3.0)
            # a strategy that needs the last dim whole: Shard(1) is redistributed
            # (Shard(1) input: the strategy allows Replicate or Shard(0); each library picks
            # by its own cost model)
            z = torch.ops.hs_test.rownorm(dx)
            allowed = [(L.Shard(0),)] if d == 0 else [(L.Replicate(),), (L.Shard(0),)]
            assert tuple(z.placements) in allowed, (name, d, z.placements)
            torch.testing.assert_close(z.full_tensor(), x / x.sum(-1, keepdim=True))
            # an aten op called directly, keepdim over the other dim keeps the shard
            a = aten.argmax.default(dx, 1 - d, True)
            assert tuple(a.placements) == (L.Shard(d),), (name, a.placements)
            torch.testing.assert_close(a.full_tensor(), x.argmax(1 - d, keepdim=True))
            # a reduction over the sharded dim: the strategy allows Replicate or the other
            # dim's shard, never the reduced dim's
            r = aten.argmax.default(dx, d, True)
            allowed = [(L.Replicate(),), (L.Shard(1 - d),)]
            assert tuple(r.placements) in allowed, (name, r.placements)
            torch.testing.assert_close(r.full_tensor(), x.argmax(d, keepdim=True))
    # a custom op with its own autograd formula trains on DTensors: the formula runs on
    # the local tensors (PyTorch DTensor runs it on DTensors; same gradient)
    register_sharding(torch.ops.hs_test.mycos.default)(lambda x: [([hs.Shard(0)], [hs.Shard(0)])])
    xc = hs.distribute_tensor(x, hs.init_device_mesh("cpu", (world,)), [hs.Shard(0)])
    xc.requires_grad_()
    yc = torch.ops.hs_test.mycos(xc)
    assert tuple(yc.placements) == (hs.Shard(0),)
    yc.sum().backward()
    torch.testing.assert_close(yc.full_tensor(), x.cos())
    torch.testing.assert_close(xc.grad.full_tensor(), -x.sin())
    # a registration replaces an earlier one (here: the custom op refuses Shard(0) too)
    hmesh = hs.init_device_mesh("cpu", (world,))
    dx = hs.distribute_tensor(x, hmesh, [hs.Shard(0)])

    @register_sharding(torch.ops.hs_test.rowscale.default)
    def replicate_only(name, x, k):
        return [([hs.Replicate()], [None, hs.Replicate(), None])]

    y = torch.ops.hs_test.rowscale("tag", dx, 2.0)
    assert tuple(y.placements) == (hs.Replicate(),)
    torch.testing.assert_close(y.full_tensor(), x * 2.0)

    # a strategy with the wrong number of entries names the op and the fix
    @register_sharding(torch.ops.hs_test.rowscale.default)
    def wrong(name, x, k):
        return [([hs.Replicate()], [hs.Replicate()])]

    with pytest.raises(ShardingError, match=r"hs_test\.rowscale.*one entry per argument"):
        torch.ops.hs_test.rowscale("tag", dx, 2.0)
    with pytest.raises(TypeError, match="torch.ops"):
        register_sharding(torch.add)(wrong)
    # unregistered again, the op is hyper_shard's own once more
    from hyper_shard._register_sharding import unregister
    from hyper_shard.platform.select import get_platform

    unregister(get_platform("torch"), torch.ops.hs_test.rowscale.default)
    with pytest.raises(hs.OpNotRegisteredError):
        torch.ops.hs_test.rowscale("tag", dx, 2.0)
    return 1


def test_register_sharding(dist2):
    assert dist2.run(check_register_sharding) == [1, 1]


def _schema_ops():
    """Ops of the reports below (namespace ``hs_rep``): a keyword-only tensor, a tensor
    list, a ``Tensor[]`` result, an op that only writes its second argument."""
    if hasattr(torch.ops, "hs_rep") and hasattr(torch.ops.hs_rep, "kwscale"):
        return
    lib = torch.library.Library("hs_rep", "DEF")  # noqa: TOR901 (kwarg-only tensors)
    lib.define("kwscale(Tensor x, *, Tensor w) -> Tensor")
    lib.impl("kwscale", lambda x, *, w: x * w, "CPU")
    lib.impl("kwscale", lambda x, *, w: torch.empty_like(x), "Meta")
    _schema_ops.lib = lib  # keep the library (and its kernels) alive

    @torch.library.custom_op("hs_rep::addlist", mutates_args=())
    def addlist(xs: list[torch.Tensor]) -> torch.Tensor:
        return sum(xs[1:], xs[0].clone())

    @addlist.register_fake
    def _(xs):
        return torch.empty_like(xs[0])

    @torch.library.custom_op("hs_rep::splitn", mutates_args=())
    def splitn(x: torch.Tensor, n: int) -> list[torch.Tensor]:
        return [c.clone() for c in x.chunk(n, dim=-1)]

    @splitn.register_fake
    def _(x, n):
        return [torch.empty_like(c) for c in x.chunk(n, dim=-1)]

    @torch.library.custom_op("hs_rep::acc", mutates_args=("y",))
    def acc(x: torch.Tensor, y: torch.Tensor) -> None:
        y.add_(x)

    @acc.register_fake
    def _(x, y):
        return None


def report_op_schemas(rank, world):
    """#167977: a keyword-only tensor argument (``expand_to_full_mesh_op_strategy``'s
    assertion in PyTorch); #167435: a tensor-list argument ("Cannot find device mesh");
    PR #191488: an op returning ``Tensor[]`` (here before: counted as one output, fixed);
    #167219: an op returning nothing that writes its second argument (here before: counted
    as one output, and a strategy moving the written argument wrote into a temporary copy
    silently: now kept in place, or a clear error)."""
    from hyper_shard._register_sharding import unregister
    from hyper_shard.platform.select import get_platform

    _schema_ops()
    ops = torch.ops.hs_rep
    mesh = hs.init_device_mesh("cpu", (world,))
    S, R = hs.Shard, hs.Replicate
    x, w = torch.arange(8.0).reshape(4, 2), torch.tensor([2.0, 3.0])
    try:
        register_sharding(ops.kwscale.default)(
            lambda x, *, w: [([S(0)], [S(0), R()]), ([R()], [R(), R()])]
        )
        dx = hs.distribute_tensor(x, mesh, [S(0)])
        out = ops.kwscale(dx, w=hs.distribute_tensor(w, mesh, [R()]))
        assert out.placements == (S(0),)
        torch.testing.assert_close(out.full_tensor(), ops.kwscale(x, w=w))

        register_sharding(ops.addlist.default)(
            lambda xs: [([S(0)], [[S(0)] * len(xs)]), ([R()], [[R()] * len(xs)])]
        )
        out = ops.addlist([hs.distribute_tensor(x * k, mesh, [S(0)]) for k in (1, 2, 3)])
        assert out.placements == (S(0),)
        torch.testing.assert_close(out.full_tensor(), ops.addlist([x, 2 * x, 3 * x]))

        register_sharding(ops.splitn.default)(
            lambda x, n: [([S(0)] * n, [S(0), None]), ([R()] * n, [R(), None])]
        )
        for n in (2, 1):
            outs = ops.splitn(dx, n)
            assert [o.placements for o in outs] == [(S(0),)] * n
            for o, ref in zip(outs, ops.splitn(x, n)):
                torch.testing.assert_close(o.full_tensor(), ref)

        register_sharding(ops.acc.default)(lambda x, y: [([], [S(0), S(0)]), ([], [R(), R()])])
        dy = hs.distribute_tensor(x * 10, mesh, [S(0)])
        assert ops.acc(dx, dy) is None
        assert dy.placements == (S(0),)
        torch.testing.assert_close(dy.full_tensor(), x * 11)
        # a strategy that would move the written argument: refused, naming it
        register_sharding(ops.acc.default)(lambda x, y: [([], [R(), R()])])
        with pytest.raises(ShardingError, match=r"hs_rep\.acc.*writes in place \(y"):
            ops.acc(hs.distribute_tensor(x, mesh, [R()]), dy)
        torch.testing.assert_close(dy.full_tensor(), x * 11)
    finally:
        for op in (ops.kwscale, ops.addlist, ops.splitn, ops.acc):
            unregister(get_platform("torch"), op.default)


@reports(report_op_schemas)
def test_reports(report, dist2):
    dist2.run(report)
