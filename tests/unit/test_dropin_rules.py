"""One-process checks of the pure pieces behind issue 12 against torch itself: the global
stride DTensor.stride() reports, the output shapes of the conv / interpolate / dim-map
rules, readable names of aten ops, and the mesh helpers (default mesh, detached meshes)."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import DeviceMesh
from hyper_shard.mesh import _rebuild_mesh, as_mesh, current_mesh
from hyper_shard.platform.torch.names import resolve_torch_op, torch_op_name
from hyper_shard.rules.conv import conv_output_shape
from hyper_shard.rules.resample import interpolate_output_shape
from hyper_shard.rules.simple_views import dim_map
from hyper_shard.spec import global_stride


@pytest.mark.parametrize("shape", [(3, 5, 6), (4, 1, 4), (2, 3, 1, 4)])
def test_global_stride_follows_the_local_layout(shape) -> None:
    """For every dim order, a local shard laid out like a permuted tensor gives the global
    stride torch gives the permuted global tensor (what PyTorch DTensor reports)."""
    glob = torch.empty(shape)
    for perm in itertools.permutations(range(len(shape))):
        g = glob.permute(perm)
        local = torch.empty((*shape[:-1], max(1, shape[-1] // 2))).permute(perm)
        gshape = tuple(g.shape)
        assert global_stride(gshape, tuple(local.shape), local.stride()) == g.stride(), perm
        c = g.contiguous()
        assert global_stride(gshape, tuple(local.shape), local.contiguous().stride()) == c.stride()


def test_global_stride_keeps_broadcast_dims() -> None:
    local = torch.empty(3, 1).expand(3, 4)
    assert global_stride((6, 4), (3, 4), local.stride()) == (1, 0)


@pytest.mark.parametrize(
    "n, transposed, kw",
    [
        (1, False, dict(stride=2, padding=1, dilation=1)),
        (2, False, dict(stride=(2, 1), padding="same", dilation=1)),
        (2, False, dict(stride=1, padding="valid", dilation=2)),
        (3, False, dict(stride=1, padding=(0, 1, 2), dilation=1)),
        (2, True, dict(stride=2, padding=1, dilation=1, output_padding=1)),
        (1, True, dict(stride=3, padding=0, dilation=2, output_padding=0)),
    ],
)
def test_conv_output_shape_matches_torch(n, transposed, kw) -> None:
    x = torch.empty(2, 4, *([9] * n), device="meta")
    w = torch.empty(*((4, 3) if transposed else (3, 4)), *([3] * n), device="meta")
    fn = getattr(F, f"conv_transpose{n}d" if transposed else f"conv{n}d")
    args = {k: v for k, v in kw.items() if transposed or k != "output_padding"}
    if "same" == kw.get("padding"):
        args["stride"] = 1
    ref = fn(x, w, **args).shape
    got = conv_output_shape(
        x.shape, w.shape, n, transposed, args.get("stride", 1), args.get("padding", 0),
        args.get("dilation", 1), args.get("output_padding", 0),
    )  # fmt: skip
    assert got == tuple(ref)


@pytest.mark.parametrize(
    "size, scale", [((5, 7), None), (None, 2), (None, (1.5, 2.3)), (4, None), (None, 0.5)]
)
def test_interpolate_output_shape_matches_torch(size, scale) -> None:
    x = torch.empty(2, 3, 5, 6)
    ref = F.interpolate(x, size=size, scale_factor=scale, mode="nearest").shape
    assert interpolate_output_shape(tuple(x.shape), size, scale) == tuple(ref)


@pytest.mark.parametrize("kind", ["atleast_1d", "atleast_2d", "atleast_3d", "view_as_real"])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4)])
def test_dim_map_shapes_match_torch(kind, shape) -> None:
    x = torch.empty(shape, dtype=torch.cfloat if kind == "view_as_real" else torch.float32)
    out, _ = dim_map(kind, shape)
    assert out == tuple(getattr(torch, kind)(x).shape)
    if shape and shape[-1] == 2:
        assert dim_map("view_as_complex", shape)[0] == tuple(torch.view_as_complex(x).shape)


def test_aten_ops_are_named_and_bound_publicly() -> None:
    packet = torch.ops.aten.linalg_vector_norm
    assert torch_op_name(packet) == "torch.ops.aten.linalg_vector_norm"
    assert torch_op_name(packet.default) == "torch.ops.aten.linalg_vector_norm.default"
    assert (
        resolve_torch_op("torch.ops.aten._foreach_norm.Scalar")
        is torch.ops.aten._foreach_norm.Scalar
    )
    assert torch_op_name(torch._C._VariableFunctions.atleast_2d) == "torch.atleast_2d"
    assert "pybind11" not in torch_op_name(torch.ops.aten.renorm)


def test_default_mesh_and_as_mesh() -> None:
    a, b = DeviceMesh.abstract((2,)), DeviceMesh.abstract((2, 2))
    assert current_mesh() is None
    with pytest.raises(ValueError, match="needs device_mesh"):
        as_mesh(None, "f")
    with a:
        assert as_mesh(None) is a
        with b as inner:
            assert inner is b and current_mesh() is b
        assert current_mesh() is a
    assert current_mesh() is None
    with pytest.raises(TypeError, match="expected a hyper_shard DeviceMesh"):
        as_mesh([0, 1])


def test_a_mesh_unpickled_without_a_live_one_is_detached() -> None:
    """As PyTorch lets a checkpoint be opened in a process that never built the mesh: the
    description and the saving coordinate come back, collectives raise naming the fix."""
    m = _rebuild_mesh("cpu", [[0, 1], [2, 3]], ("dp", "tp"), False, (1, 0))
    assert m.shape == (2, 2) and m.get_coordinate() == (1, 0) and m.get_rank() == 2
    assert not m.is_abstract
    with pytest.raises(RuntimeError, match="loaded .* had not built it"):
        m._group(0)
    again = pickle.loads(pickle.dumps(m))
    assert again.shape == m.shape and again.mesh_dim_names == ("dp", "tp")


def test_pytorch_public_names_exist() -> None:
    """Every public name of PyTorch's DTensor modules exists under hyper_shard's, so
    switching imports finds it (the behaviour of each is tested elsewhere: local_map,
    register_sharding, context_parallel, CommDebugMode in tests/dist)."""
    import torch.distributed.tensor as T
    import torch.distributed.tensor.debug as TD
    import torch.distributed.tensor.experimental as TE
    import torch.distributed.tensor.parallel as TP

    import hyper_shard as hs
    import hyper_shard.debug as hd
    import hyper_shard.experimental as he
    import hyper_shard.parallel as hp

    pairs = [(T, hs), (TP, hp), (TD, hd), (TE, he)]
    missing = {(t.__name__, n) for t, h in pairs for n in t.__all__ if not hasattr(h, n)}
    assert not missing, sorted(missing)
