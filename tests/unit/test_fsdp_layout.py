"""The FSDP flat-buffer layout, in one process: where every element of every parameter
sits in a unit's gathered buffer (against ``torch.chunk`` computed independently), and the
platform's pack/unpack primitives (the fused torch kernels against the composed default
any platform inherits)."""

from __future__ import annotations

import pytest
import torch

from hyper_shard.fsdp._layout import FlatLayout
from hyper_shard.platform.base import Platform
from hyper_shard.platform.torch import TorchPlatform

SHAPES = [(5, 3), (2,), (7, 1, 2), (1, 4), (3,)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_layout_places_every_element_where_torch_chunk_puts_it(n: int) -> None:
    layout = FlatLayout(SHAPES, n)
    S = layout.chunk_numel
    assert S == sum(
        -(-s[0] // n) * (s[1] if len(s) > 1 else 1) * (s[2] if len(s) > 2 else 1) for s in SHAPES
    )
    gathered = torch.full((n * S,), float("nan"))
    tensors = [
        torch.arange(torch.Size(s).numel(), dtype=torch.float32).view(s) + 100 * i
        for i, s in enumerate(SHAPES)
    ]
    for i, t in enumerate(tensors):  # what each rank writes: its torch.chunk piece
        slot = layout.slots[i]
        pieces = list(t.chunk(n)) + [t[:0]] * n
        for c in range(n):
            p = pieces[c].reshape(-1)
            assert p.numel() == slot.shard_numel(c)
            assert tuple(pieces[c].shape) == slot.shard_shape(c) or p.numel() == 0
            gathered[c * S + slot.offset : c * S + slot.offset + p.numel()] = p
    for i, t in enumerate(tensors):
        flat = t.reshape(-1)
        for k in range(flat.numel()):
            assert gathered[layout.flat_index(i, k)] == flat[k]


def test_layout_rejects_0d_and_bad_n() -> None:
    with pytest.raises(ValueError, match="0-d"):
        FlatLayout([()], 2)
    with pytest.raises(ValueError, match="n must be"):
        FlatLayout([(2,)], 0)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_pack_and_unpack_primitives_agree_with_the_composed_default(n: int) -> None:
    plat = TorchPlatform()
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(*s, generator=g) for s in SHAPES]
    layout = FlatLayout(SHAPES, n)
    fused = torch.empty(layout.total_numel)
    plat.pack_chunks(tensors, n, fused)
    composed = torch.full((layout.total_numel,), 7.0)
    Platform.pack_chunks(plat, tensors, n, composed)
    torch.testing.assert_close(fused, composed, rtol=0, atol=0)
    for i, t in enumerate(tensors):  # pad rows are zero, real rows where the layout says
        slot = layout.slots[i]
        for c in range(n):
            chunk = fused[c * layout.chunk_numel + slot.offset :][: slot.slot_numel]
            rows = slot.rows[c]
            want = t[slot.row_start(c) : slot.row_start(c) + rows].reshape(-1)
            torch.testing.assert_close(chunk[: want.numel()], want, rtol=0, atol=0)
            assert torch.all(chunk[want.numel() :] == 0)
    outs_a = [torch.empty(n * s.slot_numel) for s in layout.slots]
    outs_b = [torch.empty(n * s.slot_numel) for s in layout.slots]
    plat.unpack_chunks(fused, n, outs_a)
    Platform.unpack_chunks(plat, fused, n, outs_b)
    for a, b, t in zip(outs_a, outs_b, tensors):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a[: t.numel()].view(t.shape), t, rtol=0, atol=0)
