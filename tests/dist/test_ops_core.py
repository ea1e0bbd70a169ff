"""Pointwise and einsum ops on real gloo ranks against plain torch (forward and backward)."""

from __future__ import annotations

import random

import pytest
import torch

from hyper_shard import init_device_mesh
from tests._helpers import all_combos, check_op

pytestmark = pytest.mark.multiproc


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world):
    """Every combination on the 1-D mesh; a fixed random sample of ``k`` on (2, 2)."""
    return combos if world == 2 or len(combos) <= k else random.Random(0).sample(combos, k)


def check_binary_pointwise(rank, world):
    """Every placement pair on the 1-D mesh; on (2, 2) every pair for ``add`` and a fixed
    random sample of the pairs for the other functions (the same pointwise rule; add's
    full sweep covers every nested pair once)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g) + 3
    b = torch.randn(4, generator=g)
    combos = all_combos([x, y], mesh.ndim)
    n = check_op(torch.add, [x, y], mesh, combos)
    for fn in (
        torch.sub,
        torch.mul,
        torch.div,
        lambda a, c: a * 2 - c / 3 + 1,
        lambda a, c: torch.maximum(a, c),
    ):
        n += check_op(fn, [x, y], mesh, _sample(combos, 40, world))
    # broadcasting against a 1-D tensor, both orders
    combos_b = all_combos([x, b], mesh.ndim)
    n += check_op(torch.add, [x, b], mesh, combos_b)
    n += check_op(lambda a, c: c * a, [x, b], mesh, _sample(combos_b, 40, world))
    return n


def check_unary_and_scalars(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    combos = all_combos([x], mesh.ndim, ("sum", "avg", "max"))
    n = 0
    for fn in (
        lambda a: a + 10,
        lambda a: 10 - a,
        lambda a: -5 * a,
        lambda a: 2 * a,
        lambda a: a / 4,
        lambda a: torch.exp(a),
        lambda a: torch.relu(a),
        lambda a: torch.nn.functional.silu(a),
        lambda a: torch.add(a, 3, alpha=2),
        lambda a: (a > 0).float() * a,
        lambda a: a * a,  # one object twice: each occurrence gets its own layout
        lambda a: torch.maximum(a, a - 1),
    ):
        n += check_op(fn, [x], mesh, combos)
    return n


def check_matmuls(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(5, 6, generator=g), torch.randn(6, 3, generator=g)
    n = check_op(torch.mm, [a, b], mesh, all_combos([a, b], mesh.ndim))  # every pair
    n += check_op(torch.matmul, [a, b], mesh, _sample(all_combos([a, b], mesh.ndim), 50, world))
    ba, bb = torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, 5, generator=g)
    n += check_op(torch.bmm, [ba, bb], mesh, _sample(all_combos([ba, bb], mesh.ndim), 80, world))
    x, w, bias = (
        torch.randn(2, 3, 6, generator=g),
        torch.randn(4, 6, generator=g),
        torch.randn(4, generator=g),
    )
    n += check_op(
        torch.nn.functional.linear,
        [x, w, bias],
        mesh,
        _sample(all_combos([x, w, bias], mesh.ndim), 80, world),
    )
    c = torch.randn(5, 3, generator=g)
    n += check_op(
        lambda i, m1, m2: torch.addmm(i, m1, m2),
        [c, a, b],
        mesh,
        _sample(all_combos([c, a, b], mesh.ndim), 60, world),
    )
    v = torch.randn(6, generator=g)
    n += check_op(torch.matmul, [a, v], mesh, _sample(all_combos([a, v], mesh.ndim), 40, world))
    w2 = torch.randn(4, 5, generator=g)
    n += check_op(torch.matmul, [ba, w2], mesh, _sample(all_combos([ba, w2], mesh.ndim), 40, world))
    return n


@pytest.mark.parametrize("world", [2, 4])
def test_binary_pointwise(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_binary_pointwise)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_unary_and_scalars(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_unary_and_scalars)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_matmuls(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_matmuls)
    assert counts[0] > 0 and len(set(counts)) == 1
