"""Helpers for op tests: DTensors with any placements (Partial values split at random) and
a comparison of a DTensor computation with plain torch on the same global inputs, forward
and backward."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor
from hyper_shard.placement import Placement


def dt_from_global(
    t: torch.Tensor,
    mesh: Any,
    placements: Sequence[Placement],
    seed: int = 0,
    requires_grad: bool = False,
) -> DTensor:
    """A DTensor whose global value is ``t`` laid out by ``placements``.

    Partial mesh dims hold a random decomposition (not zeros off coordinate 0), so a rule
    that mishandles Partial values shows.
    """
    plain = [Replicate() if isinstance(p, Partial) else p for p in placements]
    dt = distribute_tensor(t.detach(), mesh, plain, src_data_rank=None)
    local = dt.to_local().clone()
    coord = mesh.get_coordinate()
    for m, p in enumerate(placements):
        if not isinstance(p, Partial):
            continue
        n = mesh.shape[m]
        g = torch.Generator().manual_seed(seed * 131 + m)
        if local.is_floating_point():
            noise = torch.randn((n, *local.shape), generator=g, dtype=local.dtype)
        else:
            noise = torch.randint(-3, 4, (n, *local.shape), generator=g).to(local.dtype)
        if p.reduce_op in ("sum", "avg"):
            if local.is_floating_point():
                noise = noise - noise.mean(0, keepdim=True)  # sums to zero over the mesh dim
            elif p.reduce_op == "avg":
                raise ValueError("integer Partial(avg) test values are not exact")
            else:
                noise[-1] = -noise[:-1].sum(0)
            if p.reduce_op == "sum":  # coordinate 0 holds the value, everyone a zero-sum noise
                local = (local if coord[m] == 0 else torch.zeros_like(local)) + noise[coord[m]]
            else:
                local = local + noise[coord[m]]
        elif p.reduce_op in ("max", "min"):
            delta = noise.abs()
            delta[0] = 0
            local = local - delta[coord[m]] if p.reduce_op == "max" else local + delta[coord[m]]
        else:
            raise ValueError(f"no test decomposition for {p}")
    out = DTensor.from_local(local, mesh, placements, shape=tuple(t.shape), stride=t.stride())
    if requires_grad:
        out = out.detach().requires_grad_()
    return out


def assert_dtensor_close(
    dt: Any, ref: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    """``dt``'s global value equals ``ref``. Without Partial placements every rank checks its
    own shard against the same slice of ``ref`` (no communication); with Partial ones the
    full tensor is gathered."""
    spec = dt._spec
    assert tuple(spec.shape) == tuple(ref.shape), (tuple(spec.shape), tuple(ref.shape))
    if any(isinstance(p, Partial) for p in spec.placements):
        torch.testing.assert_close(dt.full_tensor(), ref, rtol=rtol, atol=atol)
        return
    off, ls = spec.global_offset(), spec.local_shape()
    want = ref[tuple(slice(o, o + n) for o, n in zip(off, ls))]
    torch.testing.assert_close(dt.to_local(), want, rtol=rtol, atol=atol)


def _local_objective(o: Any, w: torch.Tensor) -> torch.Tensor:
    """This rank's share of ``sum(o * w)`` computed on the local shard (PyTorch's default
    gradient placements of ``to_local`` make the shares add up to the global objective)."""
    spec = o._spec
    off, ls = spec.global_offset(), spec.local_shape()
    wl = w[tuple(slice(a, a + n) for a, n in zip(off, ls))]
    return (o.to_local() * wl).sum()


def placement_options(ndim: int, partials: Sequence[str] = ("sum",)) -> list[Placement]:
    return [Replicate(), *[Shard(d) for d in range(ndim)], *[Partial(op) for op in partials]]


def all_combos(
    tensors: Sequence[torch.Tensor], mesh_ndim: int, partials: Sequence[str] = ("sum",)
) -> list[tuple]:
    """Every combination of placements (one list per tensor) on a mesh of ``mesh_ndim`` dims."""
    per = [
        list(
            itertools.product(
                placement_options(t.ndim, partials if t.is_floating_point() else ()),
                repeat=mesh_ndim,
            )
        )
        for t in tensors
    ]
    return list(itertools.product(*per))


def check_op(
    fn: Callable[..., Any],
    tensors: Sequence[torch.Tensor],
    mesh: Any,
    combos: Sequence[Sequence[Sequence[Placement]]],
    *,
    grad: bool = True,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    seed: int = 0,
) -> int:
    """Run ``fn`` on DTensors for every placement combination and on the plain tensors;
    compare forward values and (if ``grad``) the gradients of ``sum(out * w)``.

    Returns the number of combinations checked. Raises AssertionError naming the combo.
    """
    ref_inputs = [
        t.detach().clone().requires_grad_(grad and t.is_floating_point()) for t in tensors
    ]
    ref = fn(*ref_inputs)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    weights = [
        torch.randn(r.shape, generator=torch.Generator().manual_seed(99 + i), dtype=r.dtype)
        if r.is_floating_point()
        else None
        for i, r in enumerate(refs)
    ]
    if grad:
        loss = sum(
            (r * w).sum() for r, w in zip(refs, weights) if w is not None and r.requires_grad
        )
        if isinstance(loss, torch.Tensor):
            loss.backward()
    n = 0
    for combo in combos:
        ins = [
            dt_from_global(t, mesh, pl, seed=seed + i, requires_grad=grad and t.is_floating_point())
            for i, (t, pl) in enumerate(zip(tensors, combo))
        ]
        try:
            out = fn(*ins)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            assert len(outs) == len(refs)
            for o, r in zip(outs, refs):
                if isinstance(r, torch.Tensor):
                    assert isinstance(o, DTensor), f"expected a DTensor output, got {type(o)}"
                    assert_dtensor_close(o, r.detach(), rtol, atol)
                else:
                    assert o == r
            if grad and any(i.requires_grad for i in ins):
                parts = [
                    _local_objective(o, w)
                    for o, w, r in zip(outs, weights, refs)
                    if w is not None and r.requires_grad
                ]
                if parts:
                    sum(parts).backward()
                    for i, (dti, rin) in enumerate(zip(ins, ref_inputs)):
                        if rin.grad is None:
                            continue
                        assert dti.grad is not None, f"input {i} got no gradient"
                        assert_dtensor_close(dti.grad, rin.grad, rtol, atol)
        except Exception as e:
            desc = [[str(p) for p in pl] for pl in combo]
            raise AssertionError(f"placements {desc}: {type(e).__name__}: {e}") from e
        n += 1
    return n
