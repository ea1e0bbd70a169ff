"""Single-process checks of the reduction, softmax and norm rules: the dim/shape logic
against torch's own output shapes, the identity values against torch's dtype info, and the
strategies/decisions the rules give on abstract meshes (no process group)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import DeviceMesh, Partial, Replicate, Shard, ShardingError
from hyper_shard.dispatch.op import OpCall
from hyper_shard.kernels.extremum import ExactExtremum
from hyper_shard.platform.torch.names import resolve_torch_op
from hyper_shard.registry import get_registry
from hyper_shard.rules.norm import normalized_ndim
from hyper_shard.rules.reduction import (
    _ExtremumPadded,
    _MeanAsSum,
    identity_value,
    kept_dim_map,
    reduced_dims,
    reduced_shape,
)
from hyper_shard.rules.softmax import softmax_dim
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride

R = Replicate()


def _spec(mesh, pl, shape, dtype=torch.float32):
    itemsize = torch.empty((), dtype=dtype).element_size()
    return DTensorSpec(
        mesh, pl, TensorMeta(tuple(shape), contiguous_stride(shape), dtype, itemsize)
    )


def _call(name, pname, specs, roles, static, args=(), kwargs=None):
    from hyper_shard.platform.select import get_platform

    return OpCall(
        name,
        pname,
        list(specs),
        roles,
        static,
        {},
        False,
        False,
        args,
        kwargs or {},
        platform=get_platform("torch"),
    )


def _op(name):
    return get_registry().entries[name].op


# ---------------------------------------------------------------------- shape logic
SHAPES = [(), (4,), (2, 3), (2, 3, 4)]


def _dims_options(ndim):
    opts: list = [None, ()]
    n = max(ndim, 1)
    opts += list(range(-n, n))
    if ndim >= 2:
        opts += [(0, -1), [1, 0], (-2,)]
    if ndim >= 3:
        opts += [(0, 1, 2), (2, 0)]
    return opts


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "fn,empty", [(torch.sum, "all"), (torch.amax, "all"), (torch.mean, "all"), (torch.all, "none")]
)
def test_reduced_shape_matches_torch(shape, fn, empty):
    x = torch.zeros(shape, dtype=torch.bool if fn is torch.all else torch.float32)
    n = 0
    for dims, keepdim in itertools.product(_dims_options(len(shape)), (False, True)):
        if dims is None and fn is torch.amax:
            continue  # amax takes dim=() for "every dim"
        try:
            ref = fn(x, dims, keepdim) if dims is not None else fn(x, dim=None, keepdim=keepdim)
        except (TypeError, RuntimeError):
            continue  # a form torch itself refuses
        got = reduced_shape(shape, reduced_dims(dims, len(shape), empty), keepdim)
        assert got == tuple(ref.shape), (fn.__name__, shape, dims, keepdim)
        n += 1
    assert n > 0


@pytest.mark.parametrize("keepdim", [False, True])
def test_kept_dim_map_follows_torch(keepdim):
    shape = (2, 3, 4, 5)  # distinct sizes identify every dim
    for k in range(1, 4):
        for dims in itertools.combinations(range(4), k):
            out = torch.zeros(shape).sum(dims, keepdim=keepdim).shape
            m = kept_dim_map(4, dims, keepdim)
            assert sorted(m) == [d for d in range(4) if d not in dims]
            for d, o in m.items():
                assert out[o] == shape[d]
            assert list(m.values()) == sorted(m.values())


def test_reduced_dims_errors():
    with pytest.raises(IndexError, match=r"dim 3 is out of range .* \[-3, 2\]"):
        reduced_dims(3, 3)
    with pytest.raises(ShardingError, match="appears multiple times"):
        reduced_dims((0, -3), 3)
    with pytest.raises(TypeError):
        reduced_dims("a", 3)
    assert reduced_dims(True, 2) == (0, 1)  # std(x, unbiased) puts a bool there
    assert reduced_dims(-1, 0) == ()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
     torch.int32, torch.int64, torch.uint8],
)  # fmt: skip
def test_identity_values(dtype):
    size = torch.empty((), dtype=dtype).element_size()
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    lo, hi = identity_value("max", dtype, size), identity_value("min", dtype, size)
    if dtype.is_floating_point:
        assert lo == -float("inf") and hi == float("inf")
    else:
        assert (lo, hi) == (info.min, info.max)
    # the identity fills a tensor of that dtype exactly
    assert torch.full((1,), lo, dtype=dtype).item() == lo


def test_softmax_dim_matches_torch():
    for ndim in range(5):
        assert softmax_dim(None, ndim) == F._get_softmax_dim("softmax", ndim, 3)
        for d in range(-max(ndim, 1), max(ndim, 1)):
            assert softmax_dim(d, ndim) == d % max(ndim, 1)
    with pytest.raises(IndexError):
        softmax_dim(2, 2)


def test_normalized_ndim():
    assert normalized_ndim(4) == (4,)
    assert normalized_ndim(torch.Size([3, 4])) == (3, 4)
    with pytest.raises(TypeError):
        normalized_ndim(None)


def test_every_torch_name_resolves():
    reg = get_registry()
    for f in ("reduction.yaml", "softmax.yaml", "norm.yaml"):
        entries = [e for e in reg.entries.values() if str(e.file).endswith(f)]
        assert entries, f
        for e in entries:
            for n in e.torch:
                assert callable(resolve_torch_op(n)), n


# ---------------------------------------------------------------------- strategies
MESH = DeviceMesh.abstract((2,))


def _table(op, call):
    return {ins: outs for outs, ins in op.single_dim_strategies(call)}


def test_sum_mean_amax_strategies():
    x = _spec(MESH, [R], (5, 3))
    for name, pname, out in (
        ("sum", "torch.sum", Partial("sum")),
        ("mean", "torch.mean", Partial("sum")),
        ("amax", "torch.amax", Partial("max")),
        ("amin", "Tensor.amin", Partial("min")),
        ("max", "torch.max", Partial("max")),
    ):
        op = _op(name)
        c = _call(name, pname, [x], ["input"], {"dim": 0 if name != "max" else None})
        t = _table(op, c)
        if name == "max":  # max(x): every dim reduced
            assert t[(Shard(0),)] == (out,) and t[(Shard(1),)] == (out,)
        else:
            assert t[(Shard(0),)] == (out,), name
            assert t[(Shard(1),)] == (Shard(0),), name  # the kept dim shifts left
    # Partial inputs kept: linear ones for sum/mean, max for amax, none for the norm
    sum_t = _table(_op("sum"), _call("sum", "torch.sum", [x], ["input"], {"dim": 1}))
    assert sum_t[(Partial("sum"),)] == (Partial("sum"),)
    assert sum_t[(Partial("avg"),)] == (Partial("avg"),)
    amax_t = _table(_op("amax"), _call("amax", "torch.amax", [x], ["input"], {"dim": 1}))
    assert (Partial("sum"),) not in amax_t and amax_t[(Partial("max"),)] == (Partial("max"),)
    norm_t = _table(
        _op("vector_norm"),
        _call("vector_norm", "torch.linalg.vector_norm", [x], ["input"], {"dim": 1}),
    )
    assert set(norm_t) == {(Shard(0),)}  # only the kept dim: never Partial


def test_arg_reductions_never_partial():
    x = _spec(MESH, [R], (4, 4))
    for name, pname, static in (
        ("argmax", "torch.argmax", {"dim": None}),
        ("argmin", "torch.argmin", {"dim": 1}),
        ("max", "torch.max", {"dim": 1}),
        ("min", "Tensor.min", {"dim": 0, "keepdim": True}),
    ):
        op = _op(name)
        t = _table(op, _call(name, pname, [x], ["input"], static))
        for ins, outs in t.items():
            assert not any(isinstance(p, Partial) for p in ins + outs), (name, ins, outs)
        red = static["dim"]
        if red is not None:
            assert (Shard(red),) not in t, name
        else:
            assert t == {}
    # max(x, dim) gives (values, indices): both sharded alike on the kept dim
    t = _table(_op("max"), _call("max", "torch.max", [x], ["input"], {"dim": 1}))
    assert t[(Shard(0),)] == (Shard(0), Shard(0))


def test_mean_needs_exact_kernel():
    xi = _spec(MESH, [R], (5, 3), torch.int64)
    c = _call("mean", "torch.mean", [xi], ["input"], {"dim": 0})
    assert (Shard(0),) not in _table(_op("mean"), c)  # torch raises for an int mean anyway
    c = _call("mean", "torch.mean", [xi], ["input"], {"dim": 0}, kwargs={"dtype": torch.float32})
    assert _table(_op("mean"), c)[(Shard(0),)] == (Partial("sum"),)
    xf = _spec(MESH, [R], (5, 3))
    c = _call("mean", "MeanExt", [xf], ["input"], {"dim": 0})  # the kernel is framework-neutral
    assert _table(_op("mean"), c)[(Shard(0),)] == (Partial("sum"),)


def test_decisions_install_exact_kernels():
    # mean over the sharded dim: local sum / global count
    x = _spec(MESH, [Shard(0)], (5, 3))
    lay = _op("mean").infer_layout(_call("mean", "torch.mean", [x], ["input"], {"dim": None}))
    assert list(lay.outputs[0]) == [Partial("sum")] and isinstance(lay.impl, _MeanAsSum)
    assert lay.impl.count == 15
    local = torch.randn(0, 3)  # an empty shard contributes 0, not NaN
    assert lay.impl(local).item() == 0.0
    # amax of an integer tensor: the rank holding the empty shard of a size-1 dim pads
    # with the identity
    y = _spec(DeviceMesh.abstract((2,), rank=1), [Shard(1)], (3, 1), torch.int64)
    lay = _op("amax").infer_layout(_call("amax", "torch.amax", [y], ["input"], {"dim": 1}))
    assert list(lay.outputs[0]) == [Partial("max")] and isinstance(lay.impl, _ExtremumPadded)
    y0 = _spec(DeviceMesh.abstract((2,), rank=0), [Shard(1)], (3, 1), torch.int64)
    lay0 = _op("amax").infer_layout(_call("amax", "torch.amax", [y0], ["input"], {"dim": 1}))
    assert lay0.impl is None
    # a floating one gets the kernel with torch's gradient for ties across ranks (padding
    # the empty shard too); an abstract mesh has no process groups
    f1 = _spec(DeviceMesh.abstract((2,), rank=1), [Shard(1)], (3, 1))
    lay = _op("amax").infer_layout(_call("amax", "torch.amax", [f1], ["input"], {"dim": 1}))
    assert list(lay.outputs[0]) == [Partial("max")] and isinstance(lay.impl, ExactExtremum)
    assert lay.impl.pad_dims == (1,) and lay.impl.groups == ()
    # sum: no kernel needed; a kept shard moves with keepdim=False
    z = _spec(MESH, [Shard(1)], (5, 3))
    lay = _op("sum").infer_layout(_call("sum", "torch.sum", [z], ["input"], {"dim": 0}))
    assert lay.impl is None and list(lay.outputs[0]) == [Shard(0)] and lay.shapes == [(3,)]


def test_reduction_errors_name_the_op():
    x = _spec(MESH, [Shard(0)], (5, 3))
    with pytest.raises(IndexError, match=r"torch\.sum\(input=DTensor\[5, 3\]\[S\(0\)\]\).*dim 2"):
        _op("sum").infer_layout(_call("sum", "torch.sum", [x], ["input"], {"dim": 2}))
    with pytest.raises(TypeError, match="torch.mean"):
        _op("mean").infer_layout(_call("mean", "torch.mean", [x], ["input"], {"dim": True}))


def test_softmax_strategies():
    x = _spec(MESH, [R], (2, 3, 4))
    op = _op("softmax")
    t = _table(op, _call("softmax", "torch.softmax", [x], ["input"], {"dim": -1}))
    assert t == {(Shard(0),): (Shard(0),), (Shard(1),): (Shard(1),)}
    t = _table(op, _call("softmax", "torch.nn.functional.softmax", [x], ["input"], {"dim": None}))
    assert (Shard(0),) not in t  # the implicit dim of a 3-d input is 0


def test_norm_strategies_and_errors():
    x, w = _spec(MESH, [R], (5, 3, 4)), _spec(MESH, [R], (3, 4))
    op = _op("layer_norm")
    c = _call("layer_norm", "torch.nn.functional.layer_norm", [x, w, w], ["input", "weight", "bias"],
              {"normalized_shape": (3, 4)})  # fmt: skip
    assert _table(op, c) == {(Shard(0), R, R): (Shard(0),)}
    bad = _call("layer_norm", "torch.nn.functional.layer_norm", [x, w], ["input", "weight"],
                {"normalized_shape": (4,)})  # fmt: skip
    with pytest.raises(ShardingError, match=r"weight of shape \[3, 4\].*normalized_shape=\[4\]"):
        op.single_dim_strategies(bad)
    no_input = _call("layer_norm", "torch.nn.functional.layer_norm", [w], ["weight"],
                     {"normalized_shape": (3, 4)})  # fmt: skip
    with pytest.raises(ShardingError, match="needs its input as a DTensor"):
        op.single_dim_strategies(no_input)
