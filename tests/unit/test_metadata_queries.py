"""Metadata queries on a DTensor are answered without layout inference (no rule, no
communication) and give what plain torch gives for the global tensor."""

from __future__ import annotations

import pytest
import torch

from hyper_shard import DeviceMesh, DTensor, Shard

QUERIES = {
    "torch.numel": torch.numel,
    "Tensor.numel": lambda t: t.numel(),
    "torch.is_floating_point": torch.is_floating_point,
    "torch.is_complex": torch.is_complex,
    "torch.is_inference": torch.is_inference,
    "Tensor.is_inference": lambda t: t.is_inference(),
    "torch.is_conj": torch.is_conj,
    "torch.is_neg": torch.is_neg,
    "torch.is_signed": torch.is_signed,
    "Tensor.type()": lambda t: t.type(),
    "Tensor.is_same_size": lambda t: t.is_same_size(t),
    "torch.is_same_size": lambda t: torch.is_same_size(t, t),
    "len": len,
    "Tensor.dim": lambda t: t.dim(),
    "Tensor.nbytes": lambda t: t.nbytes,
    "_has_compatible_shallow_copy_type": lambda t: torch._has_compatible_shallow_copy_type(t, t),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_query_matches_plain_torch(name: str) -> None:
    full = torch.randn(5, 3)
    mesh = DeviceMesh.abstract((2,), rank=1)  # an abstract mesh: no collective can run
    dt = DTensor.from_local(full[3:].clone(), mesh, [Shard(0)], shape=(5, 3), stride=(3, 1))
    q = QUERIES[name]
    assert q(dt) == q(full)


def test_type_conversion_is_a_cast() -> None:
    mesh = DeviceMesh.abstract((2,), rank=0)
    dt = DTensor.from_local(torch.ones(3, 3), mesh, [Shard(0)], shape=(5, 3), stride=(3, 1))
    for arg in (torch.float64, "torch.DoubleTensor", torch.DoubleTensor):
        out = dt.type(arg)
        assert out.dtype == torch.float64 and out.placements == (Shard(0),)
        assert out._spec.dtype == torch.float64 and tuple(out.shape) == (5, 3)
    assert not torch._has_compatible_shallow_copy_type(dt, torch.ones(3, 3))  # keeps layout
