"""Helpers for op tests: DTensors with any placements (Partial values split at random) and
a comparison of a DTensor computation with plain torch on the same global inputs, forward
and backward."""

from __future__ import annotations

import itertools
import math
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
    cache: dict | None = None,
) -> DTensor:
    """A DTensor whose global value is ``t`` laid out by ``placements``.

    Partial mesh dims hold a random decomposition (not zeros off coordinate 0), so a rule
    that mishandles Partial values shows. ``cache``: a dict kept by the caller across calls
    on the same unchanged ``t`` (a sweep over placement combinations): each (placements,
    seed) local is cut once, every DTensor gets its own copy.
    """
    if cache is not None:
        key = (id(t), tuple(placements), seed)
        hit = cache.get(key)
        if hit is None or hit[0] is not t:
            local = dt_from_global(t, mesh, placements, seed).to_local()
            hit = cache[key] = (t, local)
        out = DTensor.from_local(
            hit[1].clone(), mesh, placements, shape=tuple(t.shape), stride=t.stride()
        )
        return out.detach().requires_grad_() if requires_grad else out
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


def assert_close_any(got: Any, ref: torch.Tensor, **kw: Any) -> None:
    """``got`` (a DTensor, compared by its global value, or a plain tensor) equals ``ref``."""
    if isinstance(got, DTensor):
        assert_dtensor_close(got, ref, **kw)
    else:
        torch.testing.assert_close(got, ref, **kw)


def replicate(t: torch.Tensor, mesh: Any) -> Any:
    """``t`` as a DTensor Replicate on every dim of ``mesh``."""
    return distribute_tensor(t, mesh, [Replicate()] * mesh.ndim)


def _local_objective(o: Any, w: torch.Tensor) -> torch.Tensor:
    """This rank's share of ``sum(o * w)`` computed on the local shard (PyTorch's default
    gradient placements of ``to_local`` make the shares add up to the global objective)."""
    spec = o._spec
    off, ls = spec.global_offset(), spec.local_shape()
    wl = w[tuple(slice(a, a + n) for a, n in zip(off, ls))]
    return (o.to_local() * wl).sum()


#: Partial reduce ops whose reconstruction from the ranks' locals does not depend on the
#: order the mesh dims are reduced in (any mix of sum and avg; max alone; min alone)
_ORDER_FREE = ({"sum", "avg"}, {"max"}, {"min"})


def _np(t: torch.Tensor) -> Any:
    """``t`` as a numpy array when numpy has its dtype (cheap to pickle), else ``t``."""
    try:
        return t.numpy()
    except TypeError:
        return t


def partial_deferrable(spec: Any, ref: torch.Tensor) -> bool:
    """True when a value with ``spec`` can be rebuilt by :func:`partial_value` from every
    rank's local (its Partial reduce ops commute, a whole-world mesh, not bool)."""
    import torch.distributed as dist

    ops = {p.reduce_op for p in spec.placements if isinstance(p, Partial)}
    return (
        any(ops <= ok for ok in _ORDER_FREE)
        and ref.dtype != torch.bool
        and dist.is_initialized()
        and dist.get_world_size() == spec.mesh.size()
    )


def partial_value(spec: Any, mine: Sequence[int], locals_: Sequence[tuple[Any, Any]]) -> Any:
    """The reduced value of this rank's slice of a Partial DTensor with ``spec``, from the
    (mesh coordinate, local tensor) pairs of every rank: the locals of the ranks that
    differ from ``mine`` only on the Partial mesh dims, reduced by their reduce op."""
    mesh = spec.mesh
    pdims = [m for m, p in enumerate(spec.placements) if isinstance(p, Partial)]
    group = [
        torch.as_tensor(x)
        for coord, x in locals_
        if all(coord[m] == mine[m] for m in range(mesh.ndim) if m not in pdims)
    ]
    ops = {spec.placements[m].reduce_op for m in pdims}
    stacked = torch.stack(group)
    if ops <= {"sum", "avg"}:
        value = stacked.sum(0)
        n_avg = math.prod(mesh.shape[m] for m in pdims if spec.placements[m].reduce_op == "avg")
        if n_avg > 1:
            value = value / n_avg
        return value
    if ops == {"max"}:
        return stacked.amax(0)
    return stacked.amin(0)


class Comparisons:
    """Value checks of DTensors against plain tensors, run together by :meth:`flush` (one
    per :func:`check_op` call, at its end).

    A DTensor value equals its reference when every rank's shard equals the same slice of
    the reference (outputs without Partial) or when, for every rank, the reduction of the
    locals of the ranks that differ from it only on the Partial mesh dims equals its slice
    (Partial outputs: the ranks' locals are exchanged in one ``all_gather_object`` per
    ``check_op`` call instead of a ``full_tensor`` per value). The comparisons themselves
    are one ``torch.testing.assert_close`` per dtype over the concatenated values (the same
    elementwise tolerance); a failure is re-checked value by value to name its placements.
    Partial outputs whose reduce ops do not commute, or on a mesh that is not the whole
    world, are checked at once with ``full_tensor`` as before.
    """

    def __init__(self, mesh: Any, rtol: float, atol: float) -> None:
        import torch.distributed as dist

        self.mesh, self.rtol, self.atol = mesh, rtol, atol
        self.pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.partial: list[tuple[str, torch.Tensor, Any, torch.Tensor]] = []
        self.world = (
            dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        )

    def add(self, what: str, dt: Any, ref: torch.Tensor) -> None:
        """Check (now or at :meth:`flush`) that ``dt``'s global value equals ``ref``."""
        spec = dt._spec
        assert tuple(spec.shape) == tuple(ref.shape), (what, tuple(spec.shape), tuple(ref.shape))
        if not any(isinstance(p, Partial) for p in spec.placements):
            off, ls = spec.global_offset(), spec.local_shape()
            want = ref[tuple(slice(o, o + n) for o, n in zip(off, ls))]
            self.pairs.append((what, dt.to_local().detach().clone(), want.detach()))
        elif partial_deferrable(spec, ref):
            self.partial.append((what, dt.to_local().detach().clone(), spec, ref.detach()))
        else:
            self.pairs.append((what, dt.full_tensor().detach(), ref.detach()))

    def _reduce_partials(self) -> None:
        import torch.distributed as dist

        mesh = self.mesh
        mine = mesh.get_coordinate()
        gathered: list[Any] = [None] * self.world
        # numpy arrays: pickling thousands of small torch tensors costs seconds
        dist.all_gather_object(gathered, (mine, [_np(x) for _, x, _, _ in self.partial]))
        for _, locals_ in gathered:
            assert len(locals_) == len(self.partial), "ranks checked different values"
            locals_[:] = [torch.as_tensor(x) for x in locals_]
        for i, (what, _, spec, ref) in enumerate(self.partial):
            value = partial_value(spec, mine, [(c, locals_[i]) for c, locals_ in gathered])
            off, ls = spec.global_offset(), spec.local_shape()
            want = ref[tuple(slice(o, o + n) for o, n in zip(off, ls))]
            self.pairs.append((what, value, want))

    def flush(self) -> None:
        """Run the deferred checks; raise AssertionError naming the first failing value."""
        if self.partial:
            self._reduce_partials()
        by_dtype: dict[Any, list[tuple[str, torch.Tensor, torch.Tensor]]] = {}
        for what, got, want in self.pairs:
            if got.shape != want.shape or got.dtype != want.dtype:
                self._one(what, got, want)  # raises: shape or dtype differ
            by_dtype.setdefault(got.dtype, []).append((what, got, want))
        for items in by_dtype.values():
            got = torch.cat([g.reshape(-1) for _, g, _ in items])
            want = torch.cat([w.reshape(-1) for _, _, w in items])
            try:
                torch.testing.assert_close(got, want, rtol=self.rtol, atol=self.atol)
            except AssertionError:
                for what, g, w in items:
                    self._one(what, g, w)
                raise

    def _one(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        try:
            torch.testing.assert_close(got, want, rtol=self.rtol, atol=self.atol)
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from e


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
    checks = Comparisons(mesh, rtol, atol)
    n = 0
    cache: dict = {}  # each input's local for each of its placements, cut once
    for combo in combos:
        desc = [[str(p) for p in pl] for pl in combo]
        ins = [
            dt_from_global(
                t,
                mesh,
                pl,
                seed=seed + i,
                requires_grad=grad and t.is_floating_point(),
                cache=cache,
            )
            for i, (t, pl) in enumerate(zip(tensors, combo))
        ]
        try:
            out = fn(*ins)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            assert len(outs) == len(refs)
            for k, (o, r) in enumerate(zip(outs, refs)):
                if isinstance(r, torch.Tensor):
                    assert isinstance(o, DTensor), f"expected a DTensor output, got {type(o)}"
                    checks.add(f"placements {desc}: output {k}", o, r.detach())
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
                        checks.add(f"placements {desc}: gradient of input {i}", dti.grad, rin.grad)
        except Exception as e:
            raise AssertionError(f"placements {desc}: {type(e).__name__}: {e}") from e
        n += 1
    checks.flush()
    return n
