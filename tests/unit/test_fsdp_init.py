"""The steps of ``fully_shard`` and the value-form unit collectives, each alone, in one
process (no process group): the argument checks, which parameters a call manages (ignored,
tied, already managed by a submodule's unit, the two errors for a parameter another unit
manages), ``shard_placement_fn``'s answers, and the differentiable pack / gather /
unpack of an on-tape unit and the reduce-scatter composed from an all-reduce, on ``n``
simulated ranks against ``torch.chunk`` and the plain sum."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hyper_shard import Replicate, Shard
from hyper_shard.fsdp import MixedPrecisionPolicy
from hyper_shard.fsdp._collectives import (
    pack_shards,
    reduce_scatter_value,
    unpack_params,
)
from hyper_shard.fsdp._init import (
    SHARDED,
    get_managed_params,
    shard_dim_of,
    validate_module,
    validate_options,
)
from hyper_shard.fsdp._layout import FlatLayout
from hyper_shard.platform.torch import TorchPlatform
from hyper_shard.platform.torch.fsdp import ADAPTER


def test_validate_module_lists_and_duplicates() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    assert validate_module(a) == (a,)
    assert validate_module([a, b]) == (a, b)
    with pytest.raises(ValueError, match="non-empty list"):
        validate_module([])
    with pytest.raises(ValueError, match="listed twice"):
        validate_module([a, a])


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"reshard_after_forward": 2}, NotImplementedError, "smaller mesh"),
        ({"reshard_after_forward": "yes"}, ValueError, "bool or None"),
        ({"offload_policy": object()}, TypeError, "OffloadPolicy"),
        ({"mp_policy": None}, TypeError, "MixedPrecisionPolicy"),
        (
            {"mp_policy": MixedPrecisionPolicy(param_dtype="bf16")},
            TypeError,
            r"param_dtype='bf16'\): pass a dtype object",
        ),
        ({"dp_mesh_dims": object()}, NotImplementedError, "data-parallel sub-mesh"),
    ],
)
def test_validate_options_refuses(kwargs: dict, exc: type, words: str) -> None:
    args = {
        "reshard_after_forward": None,
        "mp_policy": MixedPrecisionPolicy(),
        "offload_policy": None,
        "dp_mesh_dims": None,
        **kwargs,
    }
    with pytest.raises(exc, match=words):
        validate_options(**args)


def test_validate_options_returns_the_reshard_choice() -> None:
    for raf in (True, False, None):
        assert validate_options(raf, MixedPrecisionPolicy(), None, None) is raf


def test_shard_dim_of() -> None:
    p = torch.zeros(3, 4)
    assert shard_dim_of(None, p, "w") == 0
    assert shard_dim_of(lambda t: None, p, "w") == 0
    assert shard_dim_of(lambda t: Shard(1), p, "w") == 1
    with pytest.raises(TypeError, match="Shard\\(d\\) or None"):
        shard_dim_of(lambda t: Replicate(), p, "w")
    per_mesh = SimpleNamespace(placement=Shard(0), mesh_info=None)
    with pytest.raises(NotImplementedError, match="per-parameter meshes"):
        shard_dim_of(lambda t: per_mesh, p, "w")


class _Net(nn.Module):
    def __init__(self, tie: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.body = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        self.head = nn.Linear(3, 5, bias=False)
        if tie:
            self.head.weight = self.emb.weight


def test_managed_params_ignored_tied_and_submodule_units() -> None:
    net = _Net(tie=True)
    managed = get_managed_params((net,), ADAPTER, {net.body[1].bias})
    names = [fqn for (fqn, _), _ in managed]
    assert names == ["emb.weight", "body.0.weight", "body.0.bias", "body.1.weight"]
    sites = dict(((fqn, tuple(n for _, n in s)) for (fqn, _), s in managed))
    assert sites["emb.weight"] == ("weight", "weight")  # the tied head shares the entry
    # a parameter a submodule's unit already manages is left to it
    net.body[0].weight.__dict__[SHARDED] = SimpleNamespace(unit_modules=(net.body,))
    names = [fqn for (fqn, _), _ in get_managed_params((net,), ADAPTER, None)]
    assert "body.0.weight" not in names and "body.0.bias" in names
    # a list unit of two modules holding one weight lists it once with both sites
    net = _Net(tie=True)
    managed = get_managed_params((net.emb, net.head), ADAPTER, None)
    assert len(managed) == 1 and len(managed[0][1]) == 2


def test_managed_params_enclosing_vs_shared_unit() -> None:
    top = _Net()
    # applied top-down: the root's unit already holds the block's parameter
    top.body[0].weight.__dict__[SHARDED] = SimpleNamespace(unit_modules=(top,))
    with pytest.raises(ValueError, match="bottom-up"):
        get_managed_params((top.body,), ADAPTER, None)
    # one Linear in two siblings' trees, the first sibling's unit holds it
    shared = nn.Linear(3, 3)
    a, b = nn.Sequential(nn.Linear(3, 3), shared), nn.Sequential(shared)
    shared.weight.__dict__[SHARDED] = SimpleNamespace(unit_modules=(a,))
    with pytest.raises(ValueError) as info:
        get_managed_params((b,), ADAPTER, None)
    msg = str(info.value)
    assert "submodule '0' (Linear)" in msg and "'0.weight'" in msg and "one unit" in msg
    assert "bottom-up" not in msg


@pytest.mark.parametrize("n", [1, 2, 3])
def test_value_form_pack_gather_unpack(n: int) -> None:
    """Every simulated rank packs its torch.chunk shards; their chunks concatenated (what
    the all-gather returns) unpack to every full parameter, and gradients flow back to
    each rank's shards."""
    plat = TorchPlatform()
    shapes = [(5, 3), (2,), (7, 1, 2)]
    full = [torch.randn(s) for s in shapes]
    layout = FlatLayout(shapes, n)
    shards = []
    for c in range(n):
        mine = [t.chunk(n)[c] if c < len(t.chunk(n)) else t[:0] for t in full]
        shards.append([s.clone().requires_grad_() for s in mine])
    chunks = [pack_shards(plat, layout, c, shards[c]) for c in range(n)]
    assert all(ch.shape == (layout.chunk_numel,) for ch in chunks)
    values = unpack_params(plat, layout, torch.cat(chunks))
    for v, t in zip(values, full):
        assert torch.equal(v, t)
    sum(v.sum() for v in values).backward()
    for c in range(n):
        for s in shards[c]:
            assert s.grad is not None and torch.equal(s.grad, torch.ones_like(s))


def test_reduce_scatter_value_composed() -> None:
    """Without a native reduce-scatter (MindSpore's mccl on CPU), each simulated rank keeps
    its chunk of the sum (or mean) over the ranks, composed by platform/compose.py."""
    n, k = 3, 4
    inputs = [torch.randn(n * k) for _ in range(n)]

    class SumPlat(TorchPlatform):
        def all_reduce(self, t, op, group):  # noqa: ANN001, ANN201
            out = sum(inputs)
            return out / n if op == "avg" else out

    plat = SumPlat()
    plat.native_collectives = frozenset({"all_gather", "all_reduce"})
    layout = FlatLayout([(n * k,)], n)  # one parameter of n * k elements
    assert layout.chunk_numel == k
    for op in ("sum", "avg"):
        want = sum(inputs) / (n if op == "avg" else 1)
        for c in range(n):
            got = reduce_scatter_value(plat, None, layout, c, inputs[c], op)
            torch.testing.assert_close(got, want[c * k : (c + 1) * k])


def test_original_parameter_uid_is_never_reused() -> None:
    """A freed original's id() may be taken by another unit's parameter (a tensor-parallel
    DTensor replaced by its FSDP shard): the uid that tells tied weights apart is the same
    for one object and never given to another."""
    from hyper_shard.fsdp._param import _uid_of

    a = nn.Parameter(torch.ones(2))
    ua = _uid_of(a)
    assert _uid_of(a) == ua
    addrs = {id(a)}
    del a
    seen, reused = {ua}, 0
    for _ in range(50):  # new objects, at freed addresses (CPython reuses them at once)
        p = nn.Parameter(torch.ones(2))
        reused += id(p) in addrs
        addrs.add(id(p))
        u = _uid_of(p)
        assert u not in seen and _uid_of(p) == u
        seen.add(u)
        del p
    assert reused  # id() alone would have named two objects alike
