"""Worker side of the OpInfo conformance suite: run one entry's cases on this rank.

:func:`run_entry` is sent to every rank of a gloo pool (``tests/_dist.py``). For each
bound variant, each shrunk sample and each placement combination of the sample's tensors
it builds DTensors with :func:`tests.conformance._partial.dt_exact` (as
:func:`tests._helpers.dt_from_global`, with Partial values split at random but exactly, so
reducing them gives the global value bit for bit), calls the variant exactly as the OpInfo
sample does (``sample.input``, ``*sample.args``, ``**sample.kwargs``; non-tensor arguments
passed through, every tensor argument a DTensor) and compares with plain torch on the same
global tensors:

* forward: every output's ``full_tensor()`` equals torch's (``assert_close``, NaNs equal,
  dtypes equal; float32 tolerance ``rtol=1e-4, atol=1e-5`` because sharded sums add in
  another order, or a larger one declared with its reason in ``tolerances.py``);
* backward, where the OpInfo supports autograd: the gradient of ``sum(out * w)`` (fixed
  random ``w``) w.r.t. every input equals torch's, as a DTensor whose ``full_tensor()``
  is compared.

Ranks agree after each phase (one tiny all-reduce of a failure flag), so a case that
raises on one rank never leaves the others waiting in a collective.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._comparison import default_tolerances

from hyper_shard import DTensor, init_device_mesh
from hyper_shard.errors import ShardingError
from hyper_shard.placement import Partial
from tests._helpers import _local_objective, _np, partial_deferrable, partial_value

from . import _cases as C
from ._partial import dt_exact
from .refusals import REFUSED_ON_PARTIAL_TARGET
from .tolerances import EXTRA_TOLERANCE

_MESHES: dict[int, Any] = {}


def _mesh(world: int) -> Any:
    mesh = _MESHES.get(world)
    if mesh is None:
        mesh = _MESHES[world] = init_device_mesh("cpu", (2, 2) if world == 4 else (world,))
    return mesh


def _agree(flag: bool, every: bool = False) -> bool:
    """True when some rank's ``flag`` is true (``every``: when all are), by an all-reduce."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN if every else dist.ReduceOp.MAX)
    return bool(t.item())


def _flatten(out: Any) -> list[Any]:
    """The op's outputs as one list: nested tuples/lists (``histogramdd``'s bin edges)
    are flattened, in order."""
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _flatten(o)]
    return [out]


def _msg(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


#: float32 tolerance floor (rtol, atol): a sharded sum adds in another order than torch's
FLOAT32_TOL = (1e-4, 1e-5)


def _tol(expected: torch.Tensor, tol: tuple[float, float] | None) -> dict[str, float]:
    if not expected.is_floating_point():
        return {}
    rtol, atol = default_tolerances(expected)
    if expected.dtype == torch.float32:
        rtol, atol = max(rtol, FLOAT32_TOL[0]), max(atol, FLOAT32_TOL[1])
    if tol is not None:
        atol, rtol = max(atol, tol[0]), max(rtol, tol[1])
    return {"rtol": rtol, "atol": atol}


def _close(actual: Any, expected: Any, tol: tuple[float, float] | None, what: str) -> None:
    if isinstance(expected, torch.Tensor):
        kw = _tol(expected, tol)
        if _surely_close(actual, expected, kw):
            return
        torch.testing.assert_close(
            actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}", **kw
        )
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def _surely_close(actual: Any, expected: torch.Tensor, kw: dict[str, float]) -> bool:
    """A fast pass of :func:`torch.testing.assert_close` (``equal_nan=True``): plain
    strided tensors of one shape, dtype and device whose values are equal (exact dtypes)
    or ``isclose`` with the same tolerances. False sends the pair to ``assert_close``
    (which decides, and words the failure)."""
    if not (
        type(actual) is torch.Tensor
        and type(expected) is torch.Tensor
        and actual.layout == expected.layout == torch.strided
        and actual.shape == expected.shape
        and actual.dtype == expected.dtype
        and actual.device == expected.device
    ):
        return False
    if not expected.is_floating_point():
        return not expected.is_complex() and torch.equal(actual, expected)
    return bool(torch.isclose(actual, expected, equal_nan=True, **kw).all())


class _Ref:
    """Plain torch on the global tensors: outputs, objective weights, input gradients."""

    def __init__(self, v: C.Variant, s: C.Sample, grad: bool, seed: int) -> None:
        self.seed = seed
        leaves = s.leaves
        self.rg = [grad and t.requires_grad and t.is_floating_point() for t in leaves]
        ins = [t.detach().clone().requires_grad_(r) for t, r in zip(leaves, self.rg)]
        inp, args, kwargs = C.replace_leaves((s.input, s.args, s.kwargs), iter(ins))
        if v.kind == "inplace":
            inp = inp.clone()
        # random ops: the same stream for torch and for every DTensor run of the case
        torch.default_generator.manual_seed(seed)
        out = v.fn(inp, *args, **kwargs)  # raises: the case is not applicable
        self.outs = _flatten(out)
        g = torch.Generator().manual_seed(seed)
        self.weights = [
            torch.randn(r.shape, generator=g, dtype=r.dtype)
            if isinstance(r, torch.Tensor) and r.is_floating_point() and r.requires_grad
            else None
            for r in self.outs
        ]
        self.grads: list[torch.Tensor | None] = [None] * len(ins)
        self.grad_note = ""
        if grad and any(w is not None for w in self.weights):
            try:
                loss = sum((r * w).sum() for r, w in zip(self.outs, self.weights) if w is not None)
                loss.backward()  # type: ignore[union-attr]
                self.grads = [t.grad if r else None for t, r in zip(ins, self.rg)]
            except Exception as e:  # torch cannot differentiate this sample
                self.grad_note = f"torch backward raises ({_msg(e)})"
        self.grad = any(gr is not None for gr in self.grads)
        self.outs = [o.detach() if isinstance(o, torch.Tensor) else o for o in self.outs]


def _check_structure(outs: list[Any], ref: _Ref, plat: Any) -> None:
    assert len(outs) == len(ref.outs), f"{len(outs)} outputs, torch gives {len(ref.outs)}"
    for i, (o, r) in enumerate(zip(outs, ref.outs)):
        if not isinstance(r, torch.Tensor):
            continue
        assert isinstance(o, DTensor), f"output {i} is a {type(o).__name__}, not a DTensor"
        spec = o._spec
        assert tuple(spec.shape) == tuple(r.shape), (
            f"output {i}: global shape {tuple(spec.shape)}, torch gives {tuple(r.shape)}"
        )
        assert o.dtype == r.dtype, f"output {i}: dtype {o.dtype}, torch gives {r.dtype}"
        local = plat.shape(o)
        assert tuple(local) == tuple(spec.local_shape()), (
            f"output {i}: local shape {tuple(local)} but {spec} gives {tuple(spec.local_shape())}"
        )


def _run_combo(
    v: C.Variant,
    s: C.Sample,
    ref: _Ref,
    combo: tuple,
    mesh: Any,
    tol: Any,
    clone: Any,
    values: bool = True,
    ctx: Any = contextlib.nullcontext,
    refusable: bool = False,
    pending: list[Any] | None = None,
    cache: dict | None = None,
) -> tuple[str, str, str]:
    """One placement combination: (status, phase, message); every rank agrees on the
    status of the forward and backward phases. Status ``retry``: every rank was told to
    use ``loss_parallel()`` (class-sharded logits of a loss). ``refusable``: the entry is
    declared in refusals.py (an in-place call on a Partial target may be refused)."""
    with ctx():
        return _run_combo_in(
            v,
            s,
            ref,
            combo,
            mesh,
            tol,
            clone,
            values,
            refusable,
            [] if pending is None else pending,
            cache,
        )


def _run_combo_in(
    v: C.Variant,
    s: C.Sample,
    ref: _Ref,
    combo: tuple,
    mesh: Any,
    tol: Any,
    clone: Any,
    values: bool,
    refusable: bool,
    pending: list[Any],
    cache: dict | None,
) -> tuple[str, str, str]:
    plat = mesh.platform
    leaves = s.leaves
    err: BaseException | None = None
    outs: list[Any] = []
    dts: list[Any] = []
    try:
        dts = [
            dt_exact(t, mesh, pl, seed=s.index * 7 + i, requires_grad=r, cache=cache)
            for i, (t, pl, r) in enumerate(zip(leaves, combo, ref.rg))
        ]
        inp, args, kwargs = C.replace_leaves((s.input, s.args, s.kwargs), iter(dts))
        if v.kind == "inplace" and ref.rg[0]:
            inp = clone(inp)  # an in-place op on a leaf that requires grad is refused by torch
        torch.default_generator.manual_seed(ref.seed)
        out = v.fn(inp, *args, **kwargs)
        if v.kind == "inplace":
            assert out is inp, "the in-place op did not return its target DTensor"
        outs = _flatten(out)
        _check_structure(outs, ref, plat)
    except Exception as e:
        err = e
    if _agree(err is not None):
        wants_lp = isinstance(err, ShardingError) and "loss_parallel()" in str(err)
        if _agree(wants_lp, every=True) and not _in_loss_parallel():
            return "retry", "forward", _msg(err)  # type: ignore[arg-type]
        if err is None:
            return "fail", "forward", "failed on another rank"
        partial_target = any(isinstance(p, Partial) for p in combo[0])
        if (
            v.kind == "inplace" and partial_target and refusable and isinstance(err, ShardingError)
        ):  # a declared refusal (refusals.py): the op cannot keep a Partial target
            return "refused", "forward", _msg(err)
        return "fail", "forward", _msg(err)

    if ref.grad:
        try:
            parts = [
                _local_objective(o, w)
                for o, w in zip(outs, ref.weights)
                if w is not None and isinstance(o, DTensor) and o.requires_grad
            ]
            if parts:
                sum(parts).backward()  # type: ignore[union-attr]
            for i, (d, g) in enumerate(zip(dts, ref.grads)):
                if g is None:
                    continue
                dg = d.grad
                assert isinstance(dg, DTensor), f"input {i} got gradient {type(dg).__name__}"
                assert tuple(dg.shape) == tuple(g.shape), f"input {i}: gradient shape {dg.shape}"
                assert tuple(plat.shape(dg)) == tuple(dg._spec.local_shape()), (
                    f"input {i}: gradient local shape {tuple(plat.shape(dg))} but "
                    f"{dg._spec} gives {tuple(dg._spec.local_shape())}"
                )
        except Exception as e:
            err = e
        if _agree(err is not None):
            return "fail", "backward", _msg(err) if err is not None else "failed on another rank"

    try:
        pairs = _compare_pairs(outs, dts, ref, values, pending)
        for what, a, r in pairs:
            _close(a, r, tol, what)
    except Exception as e:
        return "fail", "compare", _msg(e)
    return "pass", "", ""


def _slice(ref: torch.Tensor, spec: Any) -> torch.Tensor:
    off, ls = spec.global_offset(), spec.local_shape()
    return ref[tuple(slice(o, o + n) for o, n in zip(off, ls))]


def _compare_pairs(
    outs: list[Any], dts: list[Any], ref: _Ref, values: bool, pending: list[Any]
) -> list[tuple[str, Any, Any]]:
    """The (what, actual, expected) pairs of one case, without a collective where
    possible: a DTensor without Partial is compared shard by shard (this rank's local
    against its slice of torch's value); a Partial one is put in ``pending`` (its locals
    are exchanged once per entry, at the end of :func:`run_entry`); other Partial values
    (reduce ops that do not commute) are gathered with ``full_tensor`` now. Every rank
    makes the same collective calls here, before any comparison can fail."""
    items: list[tuple[str, Any, Any]] = []
    if values:
        items += [(f"output {i}", o, r) for i, (o, r) in enumerate(zip(outs, ref.outs))]
    items += [
        (f"gradient of input {i}", d.grad, g)
        for i, (d, g) in enumerate(zip(dts, ref.grads))
        if g is not None
    ]
    pairs: list[tuple[str, Any, Any]] = []
    with torch.no_grad():
        for what, a, r in items:
            if not (isinstance(a, DTensor) and isinstance(r, torch.Tensor)):
                pairs.append((what, a, r))
            elif not any(isinstance(p, Partial) for p in a._spec.placements):
                pairs.append((what, a.to_local(), _slice(r, a._spec)))
            elif partial_deferrable(a._spec, r):
                pending.append((what, a.to_local().detach().clone(), a._spec, r))
            else:
                pairs.append((what, a.full_tensor(), r))
    return pairs


def _check_pending(
    cases: list[dict[str, Any]], pending: dict[int, list[Any]], mesh: Any, tols: Any
) -> None:
    """Compare the Partial values of every case (see :func:`_compare_pairs`) after one
    ``all_gather_object`` of their locals; a mismatch fails its case (phase ``compare``)."""
    mine = tuple(mesh.get_coordinate())
    local = {(ci, what): _np(x) for ci, items in pending.items() for what, x, _, _ in items}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, local))
    for ci, items in pending.items():
        for what, _, spec, r in items:
            got = [(c, locs[(ci, what)]) for c, locs in gathered if (ci, what) in locs]
            if len(got) != len(gathered):
                continue  # the case failed on another rank before comparing
            try:
                _close(partial_value(spec, mine, got), _slice(r, spec), tols, what)
            except Exception as e:
                if cases[ci]["status"] == "pass":
                    cases[ci].update(status="fail", phase="compare", msg=_msg(e))
                break


def _in_loss_parallel() -> bool:
    from hyper_shard.parallel.loss import LOSS_PARALLEL

    return bool(LOSS_PARALLEL.get())


def _loss_parallel() -> Any:
    from hyper_shard.parallel import loss_parallel

    return loss_parallel()


def _clone_fn() -> Any:
    """How an in-place case copies its leaf input: ``Tensor.clone`` when bound, else ``* 1``
    (placement-preserving for every placement, Partial included)."""
    if torch.Tensor.clone in C.bound_table():
        return lambda x: x.clone()
    return lambda x: x * 1


def run_entry(rank: int, world: int, key: str) -> dict[str, Any]:
    """Run entry ``key`` on this rank: every shrunk sample on a mesh of 2 (``world == 2``),
    or the chosen sample on a (2, 2) mesh (``world == 4``). Returns the case records."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    mesh = _mesh(world)
    op = C.entries()[key]
    variants = C.bound_variants(op)
    chosen, n_total = C.samples(key, op)
    dtype = C.sample_dtype(op)
    tol = EXTRA_TOLERANCE.get(key, (0.0, 0.0, ""))[:2]
    clone = _clone_fn()
    refusable = key in REFUSED_ON_PARTIAL_TARGET
    if world == 4:
        s2 = C.sample_2d(chosen)
        chosen = [s2] if s2 is not None else []
        if C.is_elementwise(op):
            variants = variants[:1]  # see C.MAX_COMBOS_2D
    cases: list[dict[str, Any]] = []
    pending: dict[int, list[Any]] = {}
    for s in chosen:
        for vi, v in enumerate(variants):
            grad = bool(op.supports_autograd) and (
                v.kind != "inplace" or bool(op.supports_inplace_autograd)
            )
            seed = zlib.crc32(f"{key}/{s.index}/{v.kind}".encode())
            base = {"variant": v.name, "sample": s.index}
            try:
                ref = _Ref(v, s, grad, seed)
            except Exception as e:
                cases.append({**base, "status": "n/a", "msg": f"torch raises: {_msg(e)}"})
                continue
            first = C.MAX_COMBOS_FOR.get(key, C.MAX_COMBOS)
            cap = C.MAX_COMBOS_2D if world == 4 else first if vi == 0 else C.MAX_COMBOS_OTHER
            chosen_combos, _ = C.combos(s.leaves, mesh.ndim, cap, seed)
            values = op.name not in C.VALUES_UNSPECIFIED
            cache: dict = {}  # each leaf's local per placements, cut once for the combos
            for combo in chosen_combos:
                todo: list[Any] = []
                status, phase, msg = _run_combo(
                    v,
                    s,
                    ref,
                    combo,
                    mesh,
                    tol,
                    clone,
                    values,
                    refusable=refusable,
                    pending=todo,
                    cache=cache,
                )
                lp = status == "retry"
                if lp:  # the loss asks for loss_parallel(): run the combination inside it
                    todo = []
                    status, phase, msg = _run_combo(
                        v,
                        s,
                        ref,
                        combo,
                        mesh,
                        tol,
                        clone,
                        values,
                        _loss_parallel,
                        refusable,
                        todo,
                        cache,
                    )
                if todo and status == "pass":
                    pending[len(cases)] = todo
                cases.append(
                    {
                        **base,
                        "combo": C.fmt_combo(combo),
                        "status": status,
                        "phase": phase,
                        "msg": msg,
                        "grad": ref.grad,
                        "uneven": C.is_uneven(s.leaves, combo, mesh.shape),
                        "loss_parallel": lp,
                    }
                )
            if ref.grad_note:
                cases.append({**base, "status": "note", "msg": ref.grad_note})
    _check_pending(cases, pending, mesh, tol)
    return {
        "key": key,
        "mesh": "x".join(str(n) for n in mesh.shape),
        "variants": [v.name for v in variants],
        "dtype": str(dtype).replace("torch.", ""),
        "samples_total": n_total,
        "samples": {s.index: s.describe() for s in chosen},
        "autograd": bool(op.supports_autograd),
        "cases": cases,
        "seconds": time.perf_counter() - t0,
    }
