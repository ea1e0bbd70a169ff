"""Batched linear algebra (``rule: batched_linalg``, ``kind:`` picks the op): determinants,
inverses, factorizations, solves and matrix norms over the trailing matrix dims; semantics
(shapes, argument names) as ``torch.linalg`` and the ``torch`` functions of those names.

Every tensor argument is ``(*batch, *core)``: ``core`` is its last one or two dims (a
matrix, or a vector such as LU pivots or Householder ``tau``), ``batch`` the leading dims,
broadcast across the arguments as torch broadcasts them. The op maps each batch element
independently, so:

* the core dims are gathered (a ``Shard`` of them becomes ``Replicate``; the local call
  sees whole matrices and its results are right as they are);
* a batch dim keeps its shard, in every argument that has it (a size-1 batch dim, broadcast
  or not, is ``Replicate``: no rank runs the op on an empty batch, whose backward torch
  leaves undefined), and every output is sharded on that batch dim;
  outputs that carry only one argument's batch (``solve_ex``'s ``info``: ``A``'s) take
  that argument's placement;
* ``Partial`` is always reduced first: none of these maps is linear (``solve`` is linear
  in ``B``, but not in ``A``; a Partial-keeping strategy is not offered).

``matrix_norm``/``norm`` reduce over their core dims the same way: the other dims keep
their shards. ``vander`` (``x (*, n) -> (*, n, N)``, elementwise in ``x``) keeps every
shard when ``N`` is given, and gathers the last dim when it defaults to the global ``n``. A tensor argument the kind does not declare (a tensor ``atol``) is
``Replicate``. Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import field_validator

from ..dispatch.op import OpCall
from ..dispatch.search import SingleDimStrategy
from ..placement import Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import R, broadcast_shapes
from .planned import OpPlan, PlannedOp, dims_arg, no_empty_shards

__all__ = ["BatchedLinalgOp", "BatchedLinalgParams"]

Shape = tuple[int, ...]
#: one output: its core shape and whose batch it carries (None: the broadcast batch)
Out = tuple[Shape, str | None]


@dataclass(frozen=True)
class _Kind:
    signature: tuple[str, ...]
    static: tuple[str, ...]
    cores: dict[str, int]  # canonical argument name -> number of trailing core dims
    outs: Callable[[dict[str, Shape], dict[str, Any]], list[Out]]


def _mn(c: dict[str, Shape], role: str = "input") -> tuple[int, int]:
    m, n = c[role]
    return m, n


def _square(c: dict[str, Shape], role: str = "input") -> int:
    m, n = _mn(c, role)
    if m != n:
        raise ValueError(f"{role} must be batches of square matrices, got {m} by {n} matrices")
    return n


def _scalars(c: dict[str, Shape], n: int) -> list[Out]:
    """``n`` outputs of one number per square matrix (det, slogdet's sign and logabsdet)."""
    _square(c)
    return [((), None)] * n


def _qr_outs(c: dict[str, Shape], st: dict[str, Any]) -> list[Out]:
    m, n = _mn(c)
    k = min(m, n)
    mode = st.get("mode") or "reduced"
    if "some" in st and st.get("some") is not None:
        mode = "reduced" if st["some"] else "complete"
    if mode == "complete":
        return [((m, m), None), ((m, n), None)]
    if mode == "r":
        return [((0,), "-"), ((k, n), None)]
    return [((m, k), None), ((k, n), None)]


def _svd_outs(c: dict[str, Shape], st: dict[str, Any]) -> list[Out]:
    m, n = _mn(c)
    k = min(m, n)
    some = st.get("some")
    some = True if some is None else bool(some)
    uv = st.get("compute_uv")
    uv = True if uv is None else bool(uv)
    if some and uv:
        return [((m, k), None), ((k,), None), ((n, k), None)]
    return [((m, m), None), ((k,), None), ((n, n), None)]


def _lu_outs(c: dict[str, Shape], st: dict[str, Any]) -> list[Out]:
    m, n = _mn(c)
    k = min(m, n)
    pivot = st.get("pivot")
    p_shape: Shape = (m, m) if pivot is None or pivot else (0,)
    return [(p_shape, None if p_shape != (0,) else "-"), ((m, k), None), ((k, n), None)]


def _lu_unpack_outs(c: dict[str, Shape], st: dict[str, Any]) -> list[Out]:
    # torch.lu_unpack(LU_data, LU_pivots, unpack_data, unpack_pivots): (P, L, U), an empty
    # tensor for a part not unpacked
    m, n = c["LU_data"]
    k = min(m, n)
    data = st.get("unpack_data")
    piv = st.get("unpack_pivots")
    outs: list[Out] = [((m, m), None) if piv is None or piv else ((0,), "-")]
    if data is None or data:
        return outs + [((m, k), None), ((k, n), None)]
    return outs + [((0,), "-"), ((0,), "-")]


def _solve_outs(c: dict[str, Shape], st: dict[str, Any]) -> list[Out]:
    return [(c["B"], None)]


def _k(sig: Sequence[str], static: Sequence[str], cores: dict[str, int], outs: Any) -> _Kind:
    return _Kind(tuple(sig), tuple(static), cores, outs)


A2 = {"input": 2}
_KINDS: dict[str, _Kind] = {
    "det": _k(("input",), (), A2, lambda c, st: _scalars(c, 1)),
    "slogdet": _k(("input",), (), A2, lambda c, st: _scalars(c, 2)),
    "inv": _k(("input",), (), A2, lambda c, st: [((_square(c),) * 2, None)]),
    "inv_ex": _k(
        ("input", "check_errors"), (), A2, lambda c, st: [((_square(c),) * 2, None), ((), None)]
    ),
    "square": _k(("input", "*args"), (), A2, lambda c, st: [((_square(c),) * 2, None)]),
    "cholesky_ex": _k(
        ("input", "upper", "check_errors"),
        (),
        A2,
        lambda c, st: [((_square(c),) * 2, None), ((), None)],
    ),
    "pinv": _k(("input", "*args"), (), A2, lambda c, st: [(_mn(c)[::-1], None)]),
    "batch_scalar": _k(("input", "*args"), (), A2, lambda c, st: [((), None)]),
    "eig": _k(("input",), (), A2, lambda c, st: [((_square(c),), None), ((_square(c),) * 2, None)]),
    "eigvals": _k(("input",), (), A2, lambda c, st: [((_square(c),), None)]),
    "qr": _k(("input", "mode"), ("mode",), A2, _qr_outs),
    "qr_some": _k(("input", "some"), ("some",), A2, _qr_outs),
    "svd_some": _k(("input", "some", "compute_uv"), ("some", "compute_uv"), A2, _svd_outs),
    "lu": _k(("input", "pivot"), ("pivot",), A2, _lu_outs),
    "lu_factor": _k(
        ("input", "pivot"),
        (),
        A2,
        lambda c, st: [(c["input"], None), ((min(_mn(c)),), None)],
    ),
    "lu_factor_ex": _k(
        ("input", "pivot", "check_errors"),
        (),
        A2,
        lambda c, st: [(c["input"], None), ((min(_mn(c)),), None), ((), None)],
    ),
    "ldl_factor": _k(
        ("input", "hermitian"), (), A2, lambda c, st: [(c["input"], None), ((_square(c),), None)]
    ),
    "ldl_factor_ex": _k(
        ("input", "hermitian", "check_errors"),
        (),
        A2,
        lambda c, st: [(c["input"], None), ((_square(c),), None), ((), None)],
    ),
    "geqrf": _k(("input",), (), A2, lambda c, st: [(c["input"], None), ((min(_mn(c)),), None)]),
    "householder_product": _k(
        ("input", "tau"), (), {"input": 2, "tau": 1}, lambda c, st: [(c["input"], None)]
    ),
    "ormqr": _k(
        ("input", "input2", "input3", "left", "transpose"),
        (),
        {"input": 2, "input2": 1, "input3": 2},
        lambda c, st: [(c["input3"], None)],
    ),
    # X = A^-1 B: B (*, n, k), or the vector case (*, n) (as torch's linalg_solve_is_vector_rhs)
    "solve": _k(("input", "B", "left"), ("left",), {"input": 2, "B": 2}, _solve_outs),
    "solve_ex": _k(
        ("input", "B", "left", "check_errors"),
        ("left",),
        {"input": 2, "B": 2},
        lambda c, st: [(c["B"], None), ((), "input")],
    ),
    "solve_triangular": _k(
        ("input", "B", "upper", "left", "unitriangular"),
        (),
        {"input": 2, "B": 2},
        _solve_outs,
    ),
    # torch.cholesky_solve(B, L) / torch.triangular_solve(b, A) / torch.lu_solve(b, LU, piv):
    # the right-hand side first (torch's argument name: input)
    "cholesky_solve": _k(
        ("input", "input2", "upper"),
        (),
        {"input": 2, "input2": 2},
        lambda c, st: [(c["input"], None)],
    ),
    "triangular_solve": _k(
        ("input", "A", "upper", "transpose", "unitriangular"),
        (),
        {"input": 2, "A": 2},
        lambda c, st: [(c["input"], None), (c["A"], None)],
    ),
    "lu_solve": _k(
        ("LU", "pivots", "B", "left", "adjoint"),
        (),
        {"LU": 2, "pivots": 1, "B": 2},
        _solve_outs,
    ),
    "lu_unpack": _k(
        ("LU_data", "LU_pivots", "unpack_data", "unpack_pivots"),
        ("unpack_data", "unpack_pivots"),
        {"LU_data": 2, "LU_pivots": 1},
        _lu_unpack_outs,
    ),
    "lu_solve_old": _k(
        ("input", "LU_data", "LU_pivots"),
        (),
        {"input": 2, "LU_data": 2, "LU_pivots": 1},
        lambda c, st: [(c["input"], None)],
    ),
    "ldl_solve": _k(
        ("LD", "pivots", "B", "hermitian"), (), {"LD": 2, "pivots": 1, "B": 2}, _solve_outs
    ),
}
#: kinds that reduce over chosen dims (the other dims keep their shards, in order)
_NORM_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "matrix_norm": (("input", "ord", "dim", "keepdim", "dtype"), ("dim", "keepdim")),
    "norm": (("input", "ord", "dim", "keepdim", "dtype"), ("ord", "dim", "keepdim")),
    "vander": (("input", "N"), ("N",)),
}


class BatchedLinalgParams(RuleParams):
    """``kind``: which op the entry is (its argument roles, core dims and outputs)."""

    kind: str

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in _KINDS and v not in _NORM_KINDS:
            known = ", ".join([*_KINDS, *_NORM_KINDS])
            raise ValueError(f"unknown kind {v!r} for rule 'batched_linalg'; known kinds: {known}")
        return v


def _vector_rhs(a: Sequence[int], b: Sequence[int]) -> bool:
    """torch.linalg.solve's vector case: B is (n,) or A's shape without its last dim."""
    return len(b) == 1 or (len(b) == len(a) - 1 and tuple(b) == tuple(a[:-1]))


@register_rule("batched_linalg")
class BatchedLinalgOp(PlannedOp):
    """Batched matrix ops: core dims gathered, batch dims kept (see the module docstring).

    Shapes are GLOBAL: input ``(*batch, m, n)`` (matrices; ``(*batch, k)`` for vector
    arguments), outputs ``(*broadcast batch, *core out)``, core outputs as torch's.

    Raises:
        ShardingError: a non-square matrix where the op needs square ones, an argument of
            too few dims, or batch shapes that do not broadcast.
    """

    Params = BatchedLinalgParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        kind = self.params.kind
        if kind in _KINDS:
            k = _KINDS[kind]
            self.use_signature(k.signature, k.static)
        else:
            self.use_signature(*_NORM_KINDS[kind])

    def plan(self, call: OpCall) -> OpPlan:
        if self.params.kind in _NORM_KINDS:
            return self._plan_norm(call)
        kind = _KINDS[self.params.kind]
        st = call.static
        cores = dict(kind.cores)
        roles = list(call.arg_roles)
        shapes = {r: tuple(s.shape) for r, s in zip(roles, call.specs)}
        if self.params.kind in ("solve", "solve_ex") and "input" in shapes and "B" in shapes:
            if _vector_rhs(shapes["input"], shapes["B"]):
                cores["B"] = 1
        core_of: dict[str, Shape] = {}
        batch_of: dict[str, Shape] = {}
        for r, shp in shapes.items():
            c = cores.get(r)
            if c is None:
                continue
            if len(shp) < c:
                raise ValueError(f"{r} must have at least {c} dimensions, got shape {list(shp)}")
            core_of[r] = shp[len(shp) - c :]
            batch_of[r] = shp[: len(shp) - c]
        missing = [r for r in cores if r not in core_of]
        if missing:
            raise ValueError(f"{', '.join(missing)} must be a DTensor like the matrix")
        outs = kind.outs(core_of, st)
        batch = broadcast_shapes(*batch_of.values())
        out_shapes: list[Shape] = []
        for core, whose in outs:
            if whose == "-":
                out_shapes.append(core)
            elif whose is None:
                out_shapes.append((*batch, *core))
            else:
                out_shapes.append((*batch_of[whose], *core))
        nb = len(batch)
        strategies: list[SingleDimStrategy] = []
        for d in range(nb):
            if batch[d] == 1:
                continue
            ins: list[Placement] = []
            aligned: dict[str, Placement] = {}
            for r in roles:
                if r not in batch_of:
                    ins.append(R)
                    continue
                b = batch_of[r]
                k = d - (nb - len(b))
                # a size-1 batch dim (broadcast, or sharded to one rank's only element) is
                # whole on every rank: no rank runs the op on an empty batch
                pl: Placement = R if k < 0 or b[k] == 1 else Shard(k)
                aligned[r] = pl
                ins.append(pl)
            o: list[Placement] = []
            for _core, whose in outs:
                if whose == "-":
                    o.append(R)
                elif whose is None:
                    o.append(Shard(d))
                else:
                    o.append(aligned[whose])
            strategies.append((tuple(o), tuple(ins)))
        return OpPlan(out_shapes, strategies, accept=no_empty_shards(list(call.specs)))

    def _plan_vander(self, call: OpCall) -> OpPlan:
        # torch.linalg.vander(x, N): (*, n) -> (*, n, N), out[..., i, j] = x[..., i] ** j:
        # elementwise in x, so every dim of x keeps its shard; without N (N = n, the GLOBAL
        # size) the last dim is gathered, so the local call's default N is the global n
        spec = call.specs[0]
        if len(call.specs) != 1:
            raise ValueError("only x may be a DTensor")
        n_arg = call.static.get("N")
        shape = tuple(spec.shape) or (1,)  # a 0-d x is (1,), as torch's
        n = shape[-1] if n_arg is None else int(n_arg)
        if n < 1:
            raise ValueError(f"N must be greater than 1, got {n}")
        kept = range(spec.ndim) if n_arg is not None else range(spec.ndim - 1)
        strategies: list[SingleDimStrategy] = [((Shard(d),), (Shard(d),)) for d in kept]
        return OpPlan([(*shape, n)], strategies)

    def _plan_norm(self, call: OpCall) -> OpPlan:
        if self.params.kind == "vander":
            return self._plan_vander(call)
        spec = call.specs[0]
        if len(call.specs) != 1:
            raise ValueError("only the input may be a DTensor")
        st = call.static
        nd = spec.ndim
        dim = st.get("dim")
        if self.params.kind == "matrix_norm":
            core = dims_arg((-2, -1) if dim is None else dim, nd, "dim")
            if len(core) != 2:
                raise ValueError(f"dim must be a 2-tuple, got {dim!r}")
        elif dim is None:
            core = list(range(nd))
        else:
            core = dims_arg(dim, nd, "dim")
        keep = bool(st.get("keepdim"))
        out: list[int] = []
        dmap: dict[int, int] = {}
        for d in range(nd):
            if d in core:
                if keep:
                    out.append(1)
            else:
                dmap[d] = len(out)
                out.append(spec.shape[d])
        strategies: list[SingleDimStrategy] = [((Shard(o),), (Shard(d),)) for d, o in dmap.items()]
        return OpPlan([tuple(out)], strategies)
