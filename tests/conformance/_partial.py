"""DTensors with exactly decomposed Partial(sum) values, for the conformance suite.

:func:`tests._helpers.dt_from_global` splits a Partial value into random zero-sum noise;
reducing it gives the global value only up to rounding, which a rounding, comparison or
``pow`` op then amplifies (``x == x.clone()`` false on one element, ``floor`` one lower).
OpInfo samples contain exactly such inputs, so here every Partial(sum) value is split
*exactly*: the value rounded to a few mantissa bits and the (exactly representable)
remainder, assigned to the mesh coordinates at random per element, signs mixed. Any
order of summing the pieces gives the global value bit for bit; elements where a 2-D
split would not be exact in every order keep the whole value on coordinate 0.

A rule that mishandles a Partial value still shows: a piece differs from the value by
~1% (or is ~1% of it), far above the tolerance.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from hyper_shard import DTensor, Partial, Replicate, distribute_tensor
from hyper_shard.placement import Placement

#: mantissa bits kept by the first split, then by the second (2-D meshes)
_BITS = (6, 3)


def _round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    m, e = torch.frexp(x)
    hi = torch.ldexp(torch.round(m * 2.0**bits), (e - bits).to(x.dtype))
    return torch.where(torch.isfinite(x), hi, x)


def _split2(x: torch.Tensor, bits: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = a + b`` exactly, ``a``/``b`` the rounded value and the remainder in a random
    order per element."""
    hi = _round_bits(x, bits)
    lo = torch.where(torch.isfinite(x), x - hi, torch.zeros_like(x))
    swap = torch.rand(x.shape, generator=g) < 0.5
    return torch.where(swap, lo, hi), torch.where(swap, hi, lo)


def _exact_in_every_order(x: torch.Tensor, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    ok = torch.ones(x.shape, dtype=torch.bool)
    for perm in itertools.permutations(pieces):
        acc = perm[0]
        for p in perm[1:]:
            acc = acc + p
        ok &= (acc == x) | ~torch.isfinite(x)
    if len(pieces) == 4:  # pairwise trees (one mesh dim reduced, then the other)
        a, b, c, d = pieces
        for s in ((a + b) + (c + d), (a + c) + (b + d), (a + d) + (b + c)):
            ok &= (s == x) | ~torch.isfinite(x)
    return ok


def split_exact(x: torch.Tensor, sizes: Sequence[int], seed: int) -> torch.Tensor:
    """Pieces of ``x``, shape ``(*sizes, *x.shape)``, whose sum in any order is ``x``.

    ``sizes``: the sizes of the Partial mesh dims (2 each; any other size falls back to
    the whole value on the first coordinate).
    """
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros((*sizes, *x.shape), dtype=x.dtype)
    if not x.is_floating_point() or x.numel() == 0 or any(n != 2 for n in sizes) or len(sizes) > 2:
        out[(0,) * len(sizes)] = x
        return out
    a, b = _split2(x, _BITS[0], g)
    if len(sizes) == 1:
        out[0], out[1] = a, b
        return out
    a0, a1 = _split2(a, _BITS[1], g)
    b0, b1 = _split2(b, _BITS[1], g)
    pieces = [a0, a1, b0, b1]
    ok = _exact_in_every_order(x, pieces)
    zero = torch.zeros_like(x)
    out[0, 0] = torch.where(ok, a0, x)
    out[0, 1] = torch.where(ok, a1, zero)
    out[1, 0] = torch.where(ok, b0, zero)
    out[1, 1] = torch.where(ok, b1, zero)
    return out


def dt_exact(
    t: torch.Tensor,
    mesh: Any,
    placements: Sequence[Placement],
    seed: int = 0,
    requires_grad: bool = False,
    cache: dict | None = None,
) -> Any:
    """A DTensor whose global value is ``t`` laid out by ``placements`` (as
    :func:`tests._helpers.dt_from_global`), Partial(sum) mesh dims holding an exact random
    split of the value (see the module docstring). ``cache``: a dict the caller keeps
    across calls on the same unchanged ``t`` (the placement combinations of one sample):
    each (placements, seed) local is cut once, every DTensor gets its own copy.

    Raises:
        ValueError: a Partial placement other than Partial(sum).
    """
    if cache is not None:
        key = (id(t), tuple(placements), seed)
        hit = cache.get(key)
        if hit is None or hit[0] is not t:
            hit = cache[key] = (t, dt_exact(t, mesh, placements, seed).to_local())
        out = DTensor.from_local(
            hit[1].clone(), mesh, placements, shape=tuple(t.shape), stride=t.stride()
        )
        return out.detach().requires_grad_() if requires_grad else out
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    for m in pdims:
        if placements[m].reduce_op != "sum":  # type: ignore[attr-defined]
            raise ValueError(f"dt_exact splits Partial(sum) only, not {placements[m]}")
    plain = [Replicate() if isinstance(p, Partial) else p for p in placements]
    local = distribute_tensor(t.detach(), mesh, plain, src_data_rank=None).to_local().clone()
    if pdims:
        coord = mesh.get_coordinate()
        pieces = split_exact(local, [mesh.shape[m] for m in pdims], seed * 131 + 17)
        local = pieces[tuple(coord[m] for m in pdims)].clone()
    out = DTensor.from_local(local, mesh, placements, shape=tuple(t.shape), stride=t.stride())
    if requires_grad:
        out = out.detach().requires_grad_()
    return out
