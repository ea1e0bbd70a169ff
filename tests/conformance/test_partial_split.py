"""The conformance suite's exact Partial(sum) split (one process, no ranks): the pieces sum
to the value bit for bit in every order, and they are not trivial."""

from __future__ import annotations

import itertools

import pytest
import torch

from ._partial import split_exact

pytestmark = pytest.mark.conformance


def _values() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, generator=g) * torch.exp(torch.randn(2000, generator=g) * 8)
    special = [0.0, -0.0, 1.0, -3.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3e38]
    return torch.cat([x, torch.tensor(special)])


@pytest.mark.parametrize("sizes", [[2], [2, 2]])
def test_pieces_sum_exactly_in_every_order(sizes):
    x = _values()
    pieces = split_exact(x, sizes, seed=3)
    assert pieces.shape == (*sizes, *x.shape)
    flat = list(pieces.reshape(-1, *x.shape))
    for perm in itertools.permutations(flat):
        acc = perm[0]
        for p in perm[1:]:
            acc = acc + p
        torch.testing.assert_close(acc, x, rtol=0, atol=0, equal_nan=True)
    if len(sizes) == 2:  # one mesh dim reduced first, then the other, either way round
        torch.testing.assert_close(pieces.sum(1).sum(0), x, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(pieces.sum(0).sum(0), x, rtol=0, atol=0, equal_nan=True)


def test_pieces_are_not_trivial():
    x = _values()[:2000]
    a, b = split_exact(x, [2], seed=5)
    assert ((a != 0) & (b != 0)).float().mean() > 0.9  # both coordinates hold a part
    assert ((a * b) < 0).float().mean() > 0.3  # signs mixed
    assert ((a != x) & (b != x)).float().mean() > 0.9  # no rank holds the whole value


def test_other_mesh_sizes_keep_the_value_on_coordinate_zero():
    x = _values()[:10]
    pieces = split_exact(x, [3], seed=1)
    torch.testing.assert_close(pieces[0], x, rtol=0, atol=0, equal_nan=True)
    assert not pieces[1:].any()
