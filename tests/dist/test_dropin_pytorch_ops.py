"""More behaviours PyTorch's own DTensor tests check (test_tensor_ops, test_init,
test_redistribute, test_view_ops, test_math_ops, test_matrix_ops, test_random_ops...),
ported as in ``test_dropin_pytorch_tests``: each runs twice in the same process, once with
``torch.distributed.tensor`` and once with ``hyper_shard`` (imports switched), on the same
inputs, and the two results are compared (placements, shapes, strides, values, errors).
Where hyper_shard deliberately differs (docs/parallel.md, "Coming from PyTorch DTensor"),
the check compares what must still agree (the global values)."""

from __future__ import annotations

import pytest
import torch

from .test_dropin_pytorch_tests import _both as _both_raising
from .test_dropin_pytorch_tests import _lib

pytestmark = pytest.mark.multiproc

_FAILS: list[str] = []


def _both(fn, what: str) -> None:
    """``_both`` of test_dropin_pytorch_tests, collecting the differences so one run names
    all of them (``_done`` raises with the list)."""
    try:
        _both_raising(fn, what)
    except AssertionError as e:
        _FAILS.append(str(e)[:300])


def _done() -> bool:
    fails, _FAILS[:] = list(_FAILS), []
    assert not fails, "\n".join(fails)
    return True


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _full(x):
    """The global value of a DTensor result (what must agree even where placements differ)."""
    return x.full_tensor()


# ---------------------------------------------------------------- test_tensor_ops.py
def check_tensor_ops(rank, world):
    """test_tensor_ops: aten.contiguous, clone/detach identity, copy_ (broadcasting,
    redistributing, keeping Partial of every reduce op), contiguous/stride of transposes,
    in-place ops returning self and keeping their placements, out=, the *_like factories
    (also of Partial inputs), zero_, new_full/new_empty_strided placements, stack of
    Partial/Shard inputs, equal/is_same_size, where's type promotion, dtype conversion."""
    x = _r(12, 8)

    def m(L):
        return L.mesh((world,))

    _both(
        lambda L: torch.ops.aten.contiguous(L.distribute_tensor(_r(16, 32), m(L), [L.Shard(0)])),
        "aten.contiguous",
    )

    def ident(L):
        d = L.distribute_tensor(x.clone().requires_grad_(), m(L), [L.Shard(0)])
        c = d.clone()
        return d.detach() is d, c is d, c, c.to_local()

    _both(ident, "detach/clone")

    def copy(L):
        out = []
        mesh = m(L)
        cases = [
            ((12, 12), (12, 12), [L.Replicate()], [L.Replicate()]),
            ((12, 12), (12, 12), [L.Shard(0)], [L.Shard(0)]),
            ((128,), (128, 128), [L.Replicate()], [L.Replicate()]),
            ((128,), (128, 128), [L.Shard(0)], [L.Shard(1)]),
        ] + [
            ((64, 1), (16, 32, 64, 128), [L.Shard(1)], d)
            for d in ([L.Replicate()], [L.Shard(0)], [L.Shard(1)], [L.Shard(2)])
        ]
        for i, (ss, ds, sp, dp) in enumerate(cases):
            src = L.distribute_tensor(_r(*ss, seed=i), mesh, sp)
            dst = L.distribute_tensor(torch.zeros(ds), mesh, dp)
            dst.copy_(src)
            out.append(dst)
        for red in ("sum", "max", "min"):
            src = L.DTensor.from_local(_r(64, 1, seed=rank), mesh, [L.Partial(red)])
            dst = L.DTensor.from_local(torch.zeros(16, 32, 64, 128), mesh, [L.Partial(red)])
            r = dst.copy_(src)
            out += [r is dst, dst.placements == (L.Partial(red),), dst.to_local()]
        return out

    _both(copy, "copy_")

    def contiguous(L):
        t = torch.rand(3, 5, 6, generator=torch.Generator().manual_seed(rank)).requires_grad_()
        d = L.DTensor.from_local(t, m(L), [L.Shard(0)])
        n = d.transpose(0, 2)
        c = n.contiguous()
        res = [
            d.is_contiguous(),
            d.stride(),
            n.is_contiguous(),
            n.to_local().is_contiguous(),
            n.stride(),
            c.is_contiguous(),
            c.to_local().is_contiguous(),
            c.stride(),
        ]
        c.to_local().sum().backward()
        return res + [t.grad]

    _both(contiguous, "contiguous/stride")

    def inplace(L):
        mesh = m(L)
        a = L.distribute_tensor(x.clone(), mesh, [L.Shard(0)])
        b = a.clone()
        ea, eb = a.clone() + 3, b.clone() * 3
        ra, rb = a.add_(3), b.mul_(3)
        c = L.distribute_tensor(x.clone(), mesh, [L.Shard(0)])
        p = L.DTensor.from_local(_r(12, 8, seed=rank), mesh, [L.Partial()])
        rc = c.add_(p)
        return (
            ra is a,
            rb is b,
            ra.to_local(),
            ea.to_local(),
            rb.to_local(),
            eb.to_local(),
            rc is c,
            rc,
        )

    _both(inplace, "in-place ops")

    def out_variant(L):
        mesh = m(L)
        s = L.distribute_tensor(x.clone(), mesh, [L.Shard(0)])
        o = s.clone()
        r1 = torch.add(s, 3, out=o)
        ro = L.distribute_tensor(x.clone(), mesh, [L.Replicate()])
        r2 = torch.add(s, 3, out=ro)
        return r1 is o, o, r2 is ro, ro, ro.to_local()

    _both(out_variant, "out=")

    def likes(L):
        mesh = m(L)
        t = _r(4, 8, seed=rank).requires_grad_()
        d = L.DTensor.from_local(t, mesh, [L.Shard(0)])
        p = L.DTensor.from_local(_r(4, 8, seed=rank), mesh, [L.Partial()])
        z = torch.zeros_like(d, dtype=torch.bfloat16)
        return (
            torch.empty_like(d).to_local().shape,
            torch.full_like(d, 42.0).to_local(),
            torch.ones_like(d).to_local(),
            torch.ones_like(d),
            _full(torch.ones_like(p)),
            _full(torch.zeros_like(p)),
            z.to_local(),
            z.dtype,
            d.dtype,
        )

    _both(likes, "*_like")

    def zero_fill(L):
        d = L.DTensor.from_local(_r(4, 8, seed=rank), m(L), [L.Shard(0)])
        z = torch.zero_(d)
        e = L.DTensor.from_local(_r(4, 8, seed=rank), m(L), [L.Shard(0)])
        f = torch.fill_(e, 42.0)
        return z is d, d.to_local(), f is e, e.to_local()

    _both(zero_fill, "zero_/fill_")

    def new_full(L):
        mesh = m(L)
        out = []
        for pl in ([L.Shard(0)], [L.Replicate()]):
            d = L.distribute_tensor(x.clone(), mesh, pl)
            a, b = d.new_full((4, 8), 42.0), d.new_full((12, 8), 42.0)
            out += [a, a.to_local(), b, b.to_local()]
        return out

    _both(new_full, "new_full")

    def new_empty_strided(L):
        mesh = m(L)
        out = []
        for shape, new, stride in (
            ((12, 8), (12, 8), (8, 1)),
            ((12, 7), (12, 7), (7, 1)),
            ((12, 8), (12, 4), (4, 1)),
        ):
            d = L.distribute_tensor(_r(*shape), mesh, [L.Shard(1)])
            e = d.new_empty_strided(new, stride)
            out += [
                e.placements == d.placements,
                tuple(e.shape),
                e.to_local().shape,
                e.to_local().stride(),
                e.contiguous() is e,
            ]
        return out

    _both(new_empty_strided, "new_empty_strided")

    def stack(L):
        m2 = L.DeviceMesh("cpu", torch.arange(world).reshape(2, 2))
        pr = L.DTensor.from_local(_r(4, 8, seed=rank // 2), m2, [L.Partial(), L.Replicate()])
        pp = L.DTensor.from_local(_r(4, 8, seed=rank + 5), m2, [L.Partial(), L.Partial()])
        st = torch.stack([pr, pp])
        s1 = L.distribute_tensor(_r(8, 8), m(L), [L.Shard(1)])
        return (
            _full(st),
            tuple(st.shape),
            torch.stack([s1, s1.clone()]),
            torch.stack([s1, s1.clone()], dim=1),
        )

    _both(stack, "stack")

    def equal(L):
        mesh = m(L)
        d1 = L.DTensor.from_local(torch.ones(4, 4), mesh, [L.Shard(0)])
        d2 = L.DTensor.from_local(torch.ones(4, 4), mesh, [L.Shard(0)])
        t2 = torch.ones(4, 4) if rank == 0 else _r(4, 4, seed=rank)
        d3 = L.DTensor.from_local(t2, mesh, [L.Shard(0)])
        d4 = L.DTensor.from_local(torch.ones(4 * world, 4), mesh, [L.Replicate()], run_check=False)
        return (
            d1.equal(d2),
            d1.equal(d3),
            d1.is_same_size(d3),
            d1.equal(d4),
            d1.is_same_size(d4),
            d3.equal(d4),
            t2.is_same_size(d4),
        )

    _both(equal, "equal/is_same_size")

    def where(L):
        out = []
        for pl in ([L.Shard(0)], [L.Replicate()]):
            d = L.distribute_tensor(x.clone(), m(L), pl)
            out.append(torch.where(d > 0, 1, 0))
        return out

    _both(where, "where type promotion")

    def dtypes(L):
        d = L.DTensor.from_local(_r(2, 8, seed=rank, dtype=torch.bfloat16), m(L), [L.Shard(0)])
        f = d.float()
        b = f.type_as(d)
        return d.dtype, d.to_local().dtype, f, f.to_local().dtype, b, b.to_local().dtype

    _both(dtypes, "dtype conversion")
    return _done()


def test_tensor_ops(dist4):
    assert dist4.run(check_tensor_ops) == [True] * 4


def check_tensor_ops_indexing(rank, world):
    """test_tensor_ops: scatter/gather on replicated and sharded inputs, x[idx] and
    index_select on every sharding of their inputs, slicing of a sharded dim (values and the
    gradient), full-size slices, split of Partial values, unbind, argmax/argmin on a 2-D
    mesh, index_put with Partial inputs and duplicated indices."""

    def m(L):
        return L.mesh((world,))

    def scatter(L):
        mesh = m(L)
        out = []
        idxs = [torch.tensor([[0, 1, 2, 0]]), torch.tensor([[0, 1, 2], [0, 1, 4]])]
        for dim in (0, 1):
            for src in (torch.arange(1, 11).reshape(2, 5), 4):
                inp = L.distribute_tensor(
                    torch.zeros(3, 5, dtype=torch.int64), mesh, [L.Replicate()]
                )
                idx = L.distribute_tensor(idxs[dim], mesh, [L.Replicate()])
                s = (
                    L.distribute_tensor(src, mesh, [L.Replicate()])
                    if isinstance(src, torch.Tensor)
                    else src
                )
                o = torch.scatter(inp, dim, idx, s)
                out += [o, o.to_local()]
        return out

    _both(scatter, "scatter")

    def gather(L):
        mesh = m(L)
        g = _r(12, 8, 16)
        i1 = torch.randint(8, (4, 4, 8), generator=torch.Generator().manual_seed(1))
        i2 = torch.randint(8, (4, 1, 8), generator=torch.Generator().manual_seed(2))
        out = []
        for dim in (0, 1, 2):
            o = torch.gather(
                L.distribute_tensor(g, mesh, [L.Replicate()]),
                dim,
                L.distribute_tensor(i1, mesh, [L.Replicate()]),
            )
            out.append(o)
            o = torch.gather(
                L.distribute_tensor(g, mesh, [L.Replicate()]),
                dim,
                L.distribute_tensor(i1, mesh, [L.Shard(dim)]),
            )
            out.append(o)
        o = torch.gather(
            L.distribute_tensor(g, mesh, [L.Shard(1)]),
            1,
            L.distribute_tensor(i2, mesh, [L.Replicate()]),
        )
        out.append(_full(o))  # torch: _MaskPartial (internal placement)
        return out

    _both(gather, "gather")

    ri = lambda hi, shape, s: torch.randint(hi, shape, generator=torch.Generator().manual_seed(s))  # noqa: E731
    cases = [
        (lambda x, y: x[y], _r(16, 32, 16), ri(5, (4, 8), 1)),
        (lambda x, y: x.index_select(1, y), _r(16, 32, 16), ri(5, (4,), 2)),
        (lambda x, y: x.index_select(0, y), _r(16, 32, 16), ri(5, (4,), 3)),
        (lambda x, y: x[:, y], _r(16, 32, 16), ri(5, (4, 8), 4)),
        (lambda x, y: x[..., y], _r(16, 32, 16), ri(5, (4, 8, 16), 5)),
        (lambda x, y, z: x[z, y], _r(16, 32, 16), ri(5, (12, 8, 12), 6), ri(2, (12, 8, 12), 7)),
        (
            lambda x, y, z: x[:, z, :, y],
            _r(16, 32, 16, 12),
            ri(5, (12, 8, 12), 8),
            ri(2, (12, 1, 12), 9),
        ),
        (
            lambda x, y, z: x[z, :, :, y],
            _r(16, 32, 16, 12),
            ri(2, (8, 1), 10),
            ri(5, (12, 8, 12), 11),
        ),
    ]
    for k, (fn, *args) in enumerate(cases):
        for dims in ((0,) * len(args), (1,) * len(args), tuple(range(len(args)))):

            def run(L, fn=fn, args=args, dims=dims):
                mesh = m(L)
                ds = [
                    L.distribute_tensor(a, mesh, [L.Shard(min(d, a.ndim - 1))])
                    for a, d in zip(args, dims)
                ]
                return _full(fn(*ds))

            _both(run, f"index case {k} sharded {dims}")

    def slices(L):
        mesh = m(L)
        g = _r(8, 16).requires_grad_()
        d = L.distribute_tensor(g, mesh, [L.Shard(1)])
        o = d[:, 8:]
        o.backward(L.ones(o.shape, device_mesh=mesh, placements=[L.Shard(1)]))
        g2 = _r(2, 4)
        e = L.distribute_tensor(g2, mesh, [L.Shard(1)])
        return (
            _full(o),
            _full(d.grad),
            [
                _full(e[s])
                for s in (
                    (slice(None), slice(None, 2)),
                    (slice(None), slice(2, None)),
                    (slice(None), slice(None, 4)),
                    (slice(None), slice(None, 8)),
                    (slice(None, 2),),
                )
            ],
        )

    _both(slices, "slice (test_slice, test_slice_full_size_on_sharded_dim)")

    for red in ("sum", "avg", "product", "min", "max"):

        def split(L, red=red):
            d = L.DTensor.from_local(_r(8, 8, seed=rank), m(L), [L.Partial(red)])
            return [
                [_full(p) for p in torch.split(d, s, dim=dim)] for s in (2, 3) for dim in (0, 1)
            ]

        _both(split, f"split of Partial({red})")

    def unbind(L):
        out = []
        t = _r(4, 8)
        for sd in (0, 1):
            for ud in (0, 1):
                if sd == ud:
                    continue  # deliberate difference (docs/parallel.md): hyper_shard gathers
                out.append(list(L.distribute_tensor(t, m(L), [L.Shard(sd)]).unbind(dim=ud)))
        return out

    _both(unbind, "unbind")

    sample = torch.tensor(
        [
            [0, 2, 1, 11, 5, 9, -2, -23],
            [3, 5, 7, 9, 0, -1, 4, 2],
            [8, 4, 6, -5, -10, 12, 7, 1],
            [13, 6, 9, -5, 0, 4, 2, 8],
            [4, 9, 2, 1, -6, -3, 5, 7],
            [0, -4, -2, 8, 6, 3, 12, -7],
            [20, 6, -3, 1, -8, 4, 2, 0],
            [5, 9, 11, -1, -4, 2, 3, 8],
        ]
    )

    def argmax(L):
        mesh = L.init_device_mesh("cpu", (2, 2))
        P, S, R = L.Partial, L.Shard, L.Replicate
        out = []
        for pl in ([P(), S(1)], [P(), S(0)], [S(0), S(1)], [R(), S(0)], [R(), S(1)]):
            d = L.distribute_tensor(sample, mesh, pl)
            out += [_full(torch.argmax(d, dim=1)), _full(torch.argmin(d, dim=1))]
        return out

    _both(argmax, "argmax/argmin")

    def index_put(L):
        mesh = m(L)
        g = _r(4, 8)
        v = _r(8, seed=3)
        out = []
        for acc in (True, False):
            i = L.DTensor.from_local(g / world, mesh, [L.Partial()], run_check=False)
            vv = L.DTensor.from_local(v / world, mesh, [L.Partial()], run_check=False)
            o = torch.index_put(i, [torch.tensor(1)], vv, acc)
            out.append(o)
        idx = torch.tensor([1, 1, 2])
        i = L.distribute_tensor(torch.zeros(4, 8), mesh, [L.Shard(1)])
        vd = L.distribute_tensor(torch.ones(3, 8), mesh, [L.Shard(1)])
        ix = L.distribute_tensor(idx, mesh, [L.Replicate()])
        out += [_full(torch.index_put(i, [ix], vd, accumulate=a)) for a in (False, True)]
        r = L.distribute_tensor(g, mesh, [L.Replicate()])
        out.append(
            _full(
                torch.index_put(
                    r,
                    [L.distribute_tensor(torch.tensor([0, 1]), mesh, [L.Shard(0)])],
                    L.distribute_tensor(torch.zeros(8), mesh, [L.Replicate()]),
                )
            )
        )
        return out

    _both(index_put, "index_put")
    return _done()


def test_tensor_ops_indexing(dist4):
    assert dist4.run(check_tensor_ops_indexing) == [True] * 4


# ---------------------------------------------------------------------- test_init.py
def check_init(rank, world):
    """test_init: nn.init.constant_ on a DTensor; the ones/empty/full/zeros factories with
    requires_grad on every 1-D placement (even, uneven and 0-d shapes), on 2-D meshes and
    on sub-meshes (ranks outside hold empty shards)."""

    def m(L):
        return L.mesh((world,))

    def constant(L):
        d = L.DTensor.from_local(_r(8, 4, seed=rank), m(L), [L.Shard(0)])
        r = torch.nn.init.constant_(d, 2.4)
        return r is d, d.to_local()

    _both(constant, "nn.init.constant_")

    for name, args in (("ones", ()), ("zeros", ()), ("full", (123.4,)), ("empty", ())):

        def fac(L, name=name, args=args):
            f = getattr(L, name)
            mesh = m(L)
            out = []
            for size in ([4, 8, 12], [5, 10, 15]):
                for pl in ([L.Shard(0)], [L.Shard(1)], [L.Shard(2)], [L.Replicate()]):
                    d = f(size, *args, requires_grad=True, device_mesh=mesh, placements=pl)
                    loc = d.to_local()
                    out += [
                        tuple(d.shape),
                        d.placements == tuple(pl),
                        d.requires_grad,
                        loc.shape,
                        loc.requires_grad,
                    ]
                    if name != "empty":
                        out.append(loc)
            e = f(
                [], *args, requires_grad=True, device_mesh=mesh, placements=[L.Replicate()]
            ).to_local()
            out += [e.shape] + ([e] if name != "empty" else [])
            return out

        _both(fac, f"factory {name}")

    def zeros2d(L):
        out = []
        mesh = m(L)
        for size in ([32, 3], [31, 3]):
            out.append(L.zeros(size, device_mesh=mesh, placements=[L.Shard(0)]).to_local())
        m2 = L.DeviceMesh("cpu", torch.arange(world).reshape(2, 2))
        for pl, size in (
            ([L.Shard(0), L.Replicate()], [32, 4]),
            ([L.Shard(0), L.Shard(1)], [32, 4]),
            ([L.Shard(0), L.Shard(1)], [31, 3]),
        ):
            d = L.zeros(size, device_mesh=m2, placements=pl)
            out += [tuple(d.size()), d.to_local(), d.device.type]
        return out

    _both(zeros2d, "zeros on 1-D/2-D meshes")

    def submesh(L):
        out = []
        for ranks in ([0, 3], [0, 1, 3], [[0], [3]]):
            mesh = L.DeviceMesh("cpu", ranks)
            pl = [L.Shard(0)] if isinstance(ranks[0], int) else [L.Shard(0), L.Shard(1)]
            d = L.zeros([32, 3], device_mesh=mesh, placements=pl)
            out += [tuple(d.size()), d.to_local()]
        return out

    _both(submesh, "zeros on sub-meshes")
    return _done()


def test_init(dist4):
    assert dist4.run(check_init) == [True] * 4


# ------------------------------------------- aten calls and init functions (scoring gaps)
def check_aten_slice_and_init(rank, world):
    """``torch.ops.aten.slice.Tensor`` called directly on DTensors (test_view_ops and the
    decompositions call it), ``diag_embed``, ``torch.eye(out=)`` and the deterministic
    in-place ``nn.init`` functions (``eye_``, ``dirac_``, ``zeros_``, ``ones_``,
    ``constant_``) on sharded and replicated parameters."""
    aten = torch.ops.aten
    x = _r(8, 12)

    def m(L):
        return L.mesh((world,))

    for pl in ("S0", "S1", "R"):

        def sl(L, pl=pl):
            p = {"S0": L.Shard(0), "S1": L.Shard(1), "R": L.Replicate()}[pl]
            d = L.distribute_tensor(x.clone(), m(L), [p])
            out = []
            for dim, *a in ((0, 2, 6), (1, 1, 11, 2), (1,), (-1, None, 4), (0, 0, 100)):
                r = aten.slice.Tensor(d, dim, *a)
                # slicing the sharded dim: the placements are the cheapest plan's
                # (docs/parallel.md), the values torch's
                touched = pl != "R" and dim % 2 == int(pl[1]) and a[:2] not in ((), (0, 100))
                out.append(_full(r) if touched else r)
            return out

        _both(sl, f"aten.slice.Tensor on {pl}")

        def diag(L, pl=pl):
            p = {"S0": L.Shard(0), "S1": L.Shard(1), "R": L.Replicate()}[pl]
            d = L.distribute_tensor(x.clone(), m(L), [p])
            return _full(torch.diag_embed(d)), _full(torch.diag_embed(d, offset=1, dim1=0, dim2=2))

        _both(diag, f"diag_embed on {pl}")

        def inits(L, pl=pl):
            p = {"S0": L.Shard(0), "S1": L.Shard(1), "R": L.Replicate()}[pl]
            out = []
            for init in (
                torch.nn.init.zeros_,
                torch.nn.init.ones_,
                lambda w: torch.nn.init.constant_(w, 0.25),
            ):
                d = L.distribute_tensor(x.clone(), m(L), [p])
                r = init(d)
                out += [r is d, d, d.to_local()]
            return out

        _both(inits, f"nn.init on {pl}")

        # torch 2.13's DTensor raises in eye_ / eye(out=) ("narrow unexpectedly changed
        # concrete size") and zeroes a sharded dirac_: hyper_shard against plain torch
        lib = _lib("hs")
        p = {"S0": lib.Shard(0), "S1": lib.Shard(1), "R": lib.Replicate()}[pl]
        for name, init, t in (
            ("eye_", torch.nn.init.eye_, x),
            ("eye(out=)", lambda t: torch.eye(8, 12, out=t), x),
            ("dirac_", torch.nn.init.dirac_, _r(4, 4, 3)),
        ):
            d = lib.distribute_tensor(t.clone(), m(lib), [p])
            r = init(d)
            want = init(t.clone())
            if not (r is d and d.placements == (p,) and torch.equal(d.full_tensor(), want)):
                _FAILS.append(f"{name} on {pl}: {d.placements} {d.full_tensor()} / {want}")

    return _done()


def test_aten_slice_and_init(dist4):
    assert dist4.run(check_aten_slice_and_init) == [True] * 4


# ----------------------------------------------------- _StridedShard (FSDP2 x TP layouts)
def check_strided_shard(rank, world):
    """PyTorch's ``_StridedShard`` placements (test_redistribute, test_view_ops and FSDP2 x
    TP construct them from ``torch.distributed.tensor.placement_types``) given to
    ``distribute_tensor``, ``from_local`` and ``redistribute``: the local shards, global
    values and redistributed results agree with torch's. hyper_shard reports the layout as
    ``Shard`` placements plus a split order (docs/parallel.md), so placements are compared
    after redistributing to plain ones."""
    from torch.distributed.tensor.placement_types import _StridedShard

    x = torch.arange(96.0).reshape(8, 12)

    def run(L):
        mesh = L.mesh((2, world // 2), ("dp", "tp"))
        S, R = L.Shard, L.Replicate
        out = []
        for pl in (
            [_StridedShard(0, split_factor=2), S(0)],
            [_StridedShard(1, split_factor=2), S(1)],
            [_StridedShard(0, split_factor=2), S(0)],
        ):
            d = L.distribute_tensor(x.clone(), mesh, pl)
            out += [d.to_local(), _full(d), tuple(d.shape), d.stride()]
            out += [d.redistribute(mesh, [R(), R()]), d.redistribute(mesh, [S(0), R()])]
            f = L.DTensor.from_local(d.to_local(), mesh, pl)
            out += [_full(f), tuple(f.shape)]
            e = L.distribute_tensor(x.clone(), mesh, [S(pl[1].dim), S(pl[1].dim)])
            g = e.redistribute(mesh, pl)
            out += [g.to_local(), _full(g)]
        m1 = L.mesh((world,))
        one = L.distribute_tensor(x.clone(), m1, [_StridedShard(0, split_factor=1)])
        return out + [one.to_local()]

    _both(run, "_StridedShard")
    # a split factor no split order expresses (on a 1-D mesh, rank k holding rows k and
    # k + world of 2 * world): refused, naming the placement and the fix
    import hyper_shard as hs

    try:
        hs.distribute_tensor(x, _lib("hs").mesh((world,)), [_StridedShard(0, split_factor=2)])
        _FAILS.append("_StridedShard(0, split_factor=2) on a 1-D mesh: no error")
    except NotImplementedError as e:
        if "_StridedShard" not in str(e) or "shard_order" not in str(e):
            _FAILS.append(f"_StridedShard refusal does not name the fix: {e}")
    return _done()


def test_strided_shard(dist4):
    assert dist4.run(check_strided_shard) == [True] * 4


# --------------------------------------------------------------------- test_dtensor.py
def check_dtensor_api(rank, world):
    """test_dtensor: meta DTensors materialised by empty_like + nn.init, global strides of
    from_local (transposed locals too), from_local sizes for each placement, gradients
    through non-leaf locals and through to_local, uneven from_local with shape and stride
    (and the error for one of them alone), negative shard dims, grad_placements hints of
    to_local/full_tensor, new_empty_strided with requires_grad, placements copied at
    construction, the default mesh of ``with mesh:``, 2-D from_local sizes, sub-meshes,
    and a parallelized meta-device model trained against one built on CPU."""

    def m(L):
        return L.DeviceMesh("cpu", list(range(world)))

    def meta(L):
        out = []
        for pl in ([L.Shard(0)], [L.Replicate()]):
            mt = torch.randn(64, 32, device="meta")
            d = L.distribute_tensor(mt, m(L), pl)
            e = torch.empty_like(d, device="cpu")
            torch.nn.init.constant_(e, 1.2)
            f = torch.empty_like(L.DTensor.from_local(mt, m(L), pl), device="cpu")
            torch.nn.init.constant_(f, 1.5)
            out += [d.is_meta, e.is_meta, e.device.type, e.to_local(), f, f.to_local()]
        return out

    _both(meta, "meta DTensors")

    def strides(L):
        a = L.DTensor.from_local(_r(4, 8, seed=rank), m(L), [L.Shard(0)])
        b = L.DTensor.from_local(_r(8, 4, seed=rank), m(L), [L.Shard(1)])
        c = L.DTensor.from_local(_r(8, 4, 8, seed=rank).permute(1, 2, 0), m(L), [L.Shard(1)])
        return a.stride(), b.stride(), c.stride()

    _both(strides, "from_local strides")

    def sizes(L):
        t = _r(3, 3, seed=rank)
        return [
            tuple(L.DTensor.from_local(t, m(L), [p]).size())
            for p in (L.Shard(0), L.Replicate(), L.Partial(), L.Shard(-1))
        ] + [L.DTensor.from_local(t, m(L), [L.Shard(-1)]).placements[0].dim]

    _both(sizes, "from_local sizes")

    def grads(L):
        w = _r(3, 3, seed=rank).requires_grad_()
        d = L.DTensor.from_local(w * 3, m(L), [L.Shard(0)])
        out = d * 3
        out.backward(L.DTensor.from_local(torch.ones(3, 3), m(L), [L.Shard(0)]))
        v = _r(3, 3, seed=rank).requires_grad_()
        e = L.DTensor.from_local(v + 8, m(L), [L.Shard(0)])
        n = _r(3, 3, seed=9).requires_grad_()
        ((e * 6).to_local() + n).sum().backward()
        s = L.distribute_tensor(_r(12, 3).requires_grad_(), m(L), [L.Shard(0)])
        ((s * 3).to_local() + n).sum().backward()
        return d.is_leaf, out, w.grad, e.is_leaf, v.grad, s.grad, s.grad.to_local()

    _both(grads, "gradients through from_local/to_local")

    def uneven(L):
        g = _r(world + 1, 2)
        ch = list(torch.chunk(g, world))  # torch.chunk's layout: trailing ranks may be empty
        loc = ch[rank] if rank < len(ch) else g[:0]
        d = L.DTensor.from_local(loc, m(L), [L.Shard(0)], shape=g.size(), stride=g.stride())
        return tuple(d.size()), d.stride(), _full(d)

    _both(uneven, "uneven from_local")
    for kw in ("shape", "stride"):

        def half(L, kw=kw):
            g = _r(world + 1, 2)
            ch = list(torch.chunk(g, world))
            loc = ch[rank] if rank < len(ch) else g[:0]
            arg = {"shape": g.size()} if kw == "shape" else {"stride": g.stride()}
            return L.DTensor.from_local(loc, m(L), [L.Shard(0)], **arg)

        _both(half, f"from_local with {kw} only")

    def hints(L):
        g = torch.ones(8, 3, requires_grad=True)
        s = L.distribute_tensor(g, m(L), [L.Shard(0)])
        lo = s.redistribute(placements=[L.Replicate()]).to_local(grad_placements=[L.Partial()])
        lo.backward(torch.ones_like(lo))
        g2 = torch.ones(8, 3, requires_grad=True)
        s2 = L.distribute_tensor(g2, m(L), [L.Shard(0)])
        s2.full_tensor(grad_placements=[L.Partial()]).sum().backward()
        return s.grad, s2.grad, s.full_tensor()

    _both(hints, "grad_placements hints")

    def new_empty_strided(L):
        lt = _r(8, 8).requires_grad_()
        d = L.distribute_tensor(lt, m(L), [L.Shard(0)])
        n = d.new_empty_strided((8, 8), (8, 1), requires_grad=True)
        n.sum().backward()
        d.to_local().sum().backward()
        # n.grad: torch keeps the placement backward produced (Replicate), hyper_shard the
        # leaf's (Shard(0), the gradient contract); the values agree
        rep = d.grad.redistribute(placements=[L.Replicate()]).to_local()
        return (
            tuple(n.shape),
            n.placements == d.placements,
            n.to_local().shape,
            _full(n.grad),
            d.grad,
            rep,
        )

    _both(new_empty_strided, "new_empty_strided backward")

    def read_only(L):
        pl = [L.Shard(0)]
        d = L.DTensor.from_local(_r(3, 3, seed=rank), m(L), pl)
        pl[0] = L.Replicate()
        return d.placements is not pl, d.placements != tuple(pl), d.device.type

    _both(read_only, "placements copied")

    def default_mesh(L):
        with m(L) as mesh:
            a = L.DTensor.from_local(_r(3, 3, seed=rank), device_mesh=mesh, placements=[L.Shard(0)])
        with m(L):
            b = L.DTensor.from_local(_r(3, 3, seed=rank), placements=[L.Shard(0)])
            r = b.redistribute(placements=[L.Replicate()])
        m2 = L.DeviceMesh("cpu", torch.arange(world).reshape(2, 2))
        with m(L):
            g = _r(3 * world, 3)
            c = L.distribute_tensor(g, placements=[L.Shard(0)])
            with m2:
                t2 = L.distribute_tensor(g, placements=[L.Shard(0), L.Replicate()])
            after = L.distribute_tensor(g, placements=[L.Shard(0)])
        return a, r, c.to_local(), t2.to_local(), after.to_local()

    _both(default_mesh, "with mesh:")

    def two_d(L):
        m2 = L.DeviceMesh("cpu", torch.arange(world).reshape(2, 2))
        a = L.DTensor.from_local(_r(3, 3, seed=rank), m2, [L.Shard(0), L.Shard(1)])
        b = L.DTensor.from_local(_r(3, 3, seed=rank), m2, [L.Shard(0), L.Shard(0)])
        sub = L.DeviceMesh("cpu", [0, 2])
        c = L.DTensor.from_local(torch.ones(3, 4), sub, [L.Shard(0)])
        return (
            tuple(a.size()),
            tuple(b.size()),
            a,
            b,
            tuple(c.size()),
            c.to_local(),
            (c + c).to_local(),
        )

    _both(two_d, "2-D and sub-mesh from_local")

    def meta_model(L):
        from torch import nn

        if L.name == "torch":
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )
        else:
            from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        class MLP(nn.Module):
            def __init__(self, device):
                super().__init__()
                self.net1 = nn.Linear(5, 64, device=device)
                self.net2 = nn.Linear(64, 4, device=device)

            def forward(self, x):
                return self.net2(torch.relu(self.net1(x)))

            def reset_parameters(self):
                with torch.no_grad():
                    self.net1.weight.fill_(0.5)
                    self.net2.weight.fill_(1)
                    self.net1.bias.fill_(1.5)
                    self.net2.bias.fill_(1.2)

        plan = {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
        a = parallelize_module(MLP("meta"), m(L), plan)
        a.to_empty(device="cpu")
        a.reset_parameters()
        b = parallelize_module(MLP("cpu"), m(L), plan)
        b.reset_parameters()
        oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
        inp = _r(20, 5)
        ya, yb = a(inp), b(inp)
        ya.sum().backward()
        yb.sum().backward()
        oa.step()
        ob.step()
        inp2 = _r(20, 5, seed=1)
        return ya, yb, a(inp2), b(inp2)

    _both(meta_model, "meta-device parallelized model")
    return _done()


def test_dtensor_api(dist4):
    assert dist4.run(check_dtensor_api) == [True] * 4


# ------------------------------------------------------------------- test_math_ops.py
def check_math_ops(rank, world):
    """test_math_ops: the linear reductions (all/sum/prod/max/min/any/amax/amin) over every
    dim with and without keepdim and over everything, softmax over each dim of each
    sharding (the placements where softmax does not cross the sharded dim; the values
    everywhere: over the sharded dim hyper_shard keeps the cheapest plan's placements,
    docs/parallel.md), elementwise ops of doubly sharded tensors on a 2-D mesh, LayerNorm
    through distribute_module with replicated parameters, nll_loss / cross_entropy of
    sharded inputs (values and gradients)."""

    def m(L):
        return L.mesh((world,))

    for op_str in ("all", "sum", "prod", "max", "min", "any", "amax", "amin"):

        def red(L, op_str=op_str):
            t = _r(12, 8, 8)
            if op_str in ("any", "all"):
                t = t < 0
            d = L.distribute_tensor(t, m(L), [L.Shard(0)])
            op = getattr(d, op_str)
            out = []
            for dim in range(3):
                for kd in (True, False, None):
                    args = (dim, kd) if kd is not None else (dim,)
                    r = op(*args)
                    out.append(_full(r[0] if op_str in ("max", "min") else r))
            return out + [_full(op())]

        _both(red, f"reduction {op_str}")

    def softmax(L):
        x = torch.rand(8, 12, 16, generator=torch.Generator().manual_seed(0))
        out = []
        for sm in (-1, 0, 1, 2):
            for sd in (-1, 0, 1, 2):
                d = L.distribute_tensor(x, m(L), [L.Shard(sd)])
                y = torch.nn.functional.softmax(d, dim=sm, dtype=torch.float32)
                out.append(y if sm % 3 != sd % 3 else _full(y))
        return out

    _both(softmax, "softmax")

    def two_d(L):
        mesh = L.DeviceMesh("cpu", torch.arange(world).reshape(2, world // 2))
        g = torch.ones(4, 4)
        a = L.distribute_tensor(g, mesh, [L.Shard(0), L.Shard(0)])
        b = L.distribute_tensor(g, mesh, [L.Shard(0), L.Shard(1)])
        return [(op(a, 2), op(b, 2)) for op in (torch.add, torch.sub, torch.mul, torch.div)]

    _both(two_d, "elementwise on a 2-D mesh")

    def layer_norm(L):
        import copy

        if L.name == "torch":
            from torch.distributed.tensor import distribute_module
        else:
            from hyper_shard.parallel import distribute_module
        x = torch.rand(20, 5, 10, generator=torch.Generator().manual_seed(0))
        out = []
        for sd in (-1, 0, 1, 2):
            for ni in (0, 1, 2):
                for aff in (False, True):
                    torch.manual_seed(0)
                    ln = torch.nn.LayerNorm(x.shape[ni:], elementwise_affine=aff)
                    if aff:
                        with torch.no_grad():
                            ln.weight.copy_(_r(*x.shape[ni:], seed=1))
                            ln.bias.copy_(_r(*x.shape[ni:], seed=2))

                    def rep(name, module, mesh):
                        for n, p in module.named_parameters():
                            dp = torch.nn.Parameter(L.distribute_tensor(p, mesh, [L.Replicate()]))
                            module.register_parameter(n, dp)

                    dist_ln = distribute_module(copy.deepcopy(ln), m(L), rep)
                    y = dist_ln(L.distribute_tensor(x, m(L), [L.Shard(sd)]))
                    out += [tuple(y.shape), _full(y)]
        return out

    _both(layer_norm, "LayerNorm via distribute_module")

    def losses(L):
        out = []
        for size, tsize in (((8, 16), (8,)), ((8, 16, 12), (8, 12))):
            x = torch.rand(*size, generator=torch.Generator().manual_seed(3))
            tgt = torch.randint(16, tsize, generator=torch.Generator().manual_seed(4))
            dt = L.distribute_tensor(tgt, m(L), [L.Replicate()])
            for sd in range(len(size)):
                for reduction in ("none", "mean", "sum"):
                    for fn in (torch.nn.functional.nll_loss, torch.nn.functional.cross_entropy):
                        dx = L.distribute_tensor(x.clone().requires_grad_(), m(L), [L.Shard(sd)])
                        y = fn(dx, dt, reduction=reduction)
                        (y.sum() if reduction == "none" else y).backward()
                        out += [_full(y), _full(dx.grad)]
        return out

    _both(losses, "nll_loss / cross_entropy")
    return _done()


def test_math_ops(dist4):
    assert dist4.run(check_math_ops) == [True] * 4


# ----------------------------------------------------------------- test_matrix_ops.py
def check_matrix_ops(rank, world):
    """test_matrix_ops: addmm for each single-dim strategy (1-D, 2-D, 0-d, (1, N) and (M, 1)
    biases; output placements and values), addmm of an empty operand, addmm of
    contraction-sharded inputs (a Partial result, gradients), mm of every pair of
    placements (values and gradients)."""

    def m(L):
        return L.mesh((world,))

    M, K, N = 12, 8, 4
    m1, m2 = _r(M, K, seed=1), _r(K, N, seed=2)
    biases = {
        "1d": _r(N, seed=3),
        "2d": _r(M, N, seed=4),
        "0d": _r(1, seed=5)[0],
        "1n": _r(1, N, seed=6),
        "m1": _r(M, 1, seed=7),
    }

    def addmm(L):
        S, R, P = L.Shard, L.Replicate, L.Partial
        d = lambda t, p: L.distribute_tensor(t.clone(), m(L), [p])  # noqa: E731
        cases = [
            ("1d", R(), S(0), R()),
            ("2d", S(0), S(0), R()),
            ("1d", S(0), R(), S(1)),
            ("2d", S(1), R(), S(1)),
            ("1d", P(), S(1), S(0)),
            ("2d", P(), S(1), S(0)),
            ("1d", R(), R(), R()),
            ("2d", R(), R(), R()),
            ("0d", R(), S(0), R()),
            ("0d", R(), R(), S(1)),
            ("1n", R(), S(0), R()),
            ("1n", S(1), R(), S(1)),
            ("m1", S(0), S(0), R()),
            ("m1", R(), R(), S(1)),
        ]
        return [torch.addmm(d(biases[b], pb), d(m1, p1), d(m2, p2)) for b, pb, p1, p2 in cases]

    _both(addmm, "addmm strategies")

    def empty(L):
        a = L.distribute_tensor(_r(12, 0), m(L), [L.Shard(0)])
        b = L.distribute_tensor(_r(0, 4), m(L), [L.Replicate()])
        i = L.distribute_tensor(_r(4), m(L), [L.Replicate()])
        return _full(torch.addmm(i, a, b))

    _both(empty, "addmm of an empty operand")

    def auto(L):
        t1, t2 = m1.clone().requires_grad_(), m2.clone().requires_grad_()
        a = L.distribute_tensor(t1, m(L), [L.Shard(1)])
        b = L.distribute_tensor(t2, m(L), [L.Shard(0)])
        i = L.distribute_tensor(_r(N, seed=3).requires_grad_(), m(L), [L.Replicate()])
        r = torch.addmm(i, a, b)
        f = r.full_tensor()
        f.sum().backward()
        return r, f, b.grad, a.grad

    _both(auto, "addmm auto redistribute")

    def mm(L):
        S, R = L.Shard, L.Replicate
        out = []
        for p1 in (S(0), S(1), R()):
            for p2 in (S(0), S(1), R()):
                t1, t2 = _r(12, 8, seed=8).requires_grad_(), _r(8, 16, seed=9).requires_grad_()
                a = L.distribute_tensor(t1, m(L), [p1])
                b = L.distribute_tensor(t2, m(L), [p2])
                r = torch.mm(a, b).redistribute(m(L), [R()])
                r.backward(torch.ones_like(r))
                out += [r.to_local(), _full(a.grad), _full(b.grad)]
        return out

    _both(mm, "mm of every placement pair")
    return _done()


def test_matrix_ops(dist4):
    assert dist4.run(check_matrix_ops) == [True] * 4


# -------------------------------------------------------------------- test_view_ops.py
def check_view_ops(rank, world):
    """test_view_ops: view-like ops (view/reshape/flatten/unflatten/squeeze/unsqueeze/
    permute/transpose/movedim/expand/t/swapaxes/view_as_real) of every 1-D sharding: the
    placements, shapes, strides and values torch gives; on a 2-D mesh the values."""
    views = {
        "view": lambda x: x.view(6, 16, 2),
        "reshape": lambda x: x.reshape(-1, 4),
        "flatten": lambda x: x.flatten(1),
        "flatten0": lambda x: x.flatten(0, 1),
        "unflatten": lambda x: x.unflatten(1, (4, 2)),
        "unsqueeze": lambda x: x.unsqueeze(1),
        "squeeze": lambda x: x.unsqueeze(0).squeeze(0),
        "permute": lambda x: x.permute(2, 0, 1),
        "transpose": lambda x: x.transpose(0, 2),
        "movedim": lambda x: torch.movedim(x, 0, -1),
        "expand": lambda x: x[:, :1].expand(12, 5, 4),
        "swapaxes": lambda x: x.swapaxes(1, 2),
        "view_as_complex": lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(12, 8, 2))),
    }
    g = _r(12, 8, 4)
    for name, fn in views.items():

        def run(L, fn=fn, name=name):
            mesh = L.mesh((world,))
            out = []
            for p in (L.Shard(0), L.Shard(1), L.Shard(2), L.Replicate()):
                r = fn(L.distribute_tensor(g.clone(), mesh, [p]))
                # merging a sharded inner dim: torch's placement is a _StridedShard,
                # hyper_shard's a Shard after an all-to-all (docs/parallel.md); slicing a
                # sharded dim before expand: the cheapest plan's placement
                merged = name in ("reshape", "flatten", "flatten0", "expand") and p.is_shard()
                out.append((tuple(r.shape), r.stride(), _full(r)) if merged else r)
            return out

        _both(run, f"view op {name}")

        def run2(L, fn=fn):
            mesh = L.mesh((2, world // 2), ("a", "b"))
            S = L.Shard
            return [
                _full(fn(L.distribute_tensor(g.clone(), mesh, p)))
                for p in ([S(0), S(1)], [S(1), S(0)], [S(0), S(0)], [S(2), L.Replicate()])
            ]

        _both(run2, f"view op {name} on a 2-D mesh")
    return _done()


def test_view_ops(dist4):
    assert dist4.run(check_view_ops) == [True] * 4


# --------------------------------------------------------------- test_embedding_ops.py
def check_embedding_ops(rank, world):
    """test_embedding_ops: F.embedding with a column-sharded weight (Shard(1): the output
    sharded on its last dim) and a row-sharded one (torch: the internal _MaskPartial;
    compared by value), with max_norm unset and set, and the weight gradients."""

    def m(L):
        return L.mesh((world,))

    w0 = _r(16, 8)
    idx = torch.randint(16, (6, 5), generator=torch.Generator().manual_seed(1))

    def run(L):
        out = []
        for p in (L.Shard(1), L.Shard(0), L.Replicate()):
            w = L.distribute_tensor(w0.clone().requires_grad_(), m(L), [p])
            i = L.distribute_tensor(idx, m(L), [L.Replicate()])
            y = torch.nn.functional.embedding(i, w)
            out.append(y if p.is_shard(1) else _full(y))
            y.sum().backward()
            out.append(_full(w.grad))
            j = L.distribute_tensor(idx, m(L), [L.Shard(0)])
            out.append(_full(torch.nn.functional.embedding(j, w)))
        return out

    _both(run, "embedding")
    return _done()


def test_embedding_ops(dist4):
    assert dist4.run(check_embedding_ops) == [True] * 4
