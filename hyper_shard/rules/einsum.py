"""Einsum-like ops: mm, bmm, matmul, linear, addmm, baddbmm, einsum.

``equation`` names every dim of every factor operand and of the output, operands separated
by commas: ``"m k, k n -> m n"`` (labels separated by spaces; single-letter labels may be
written without spaces: ``"mk,kn->mn"``). ``...`` stands for leading broadcast dims.
An optional additive operand (``bias:`` its labels, ``bias_arg:`` its argument name) is
added to the product, as in ``linear`` and ``addmm``.

Per mesh dim, for every label:

* an output label: the factors (and bias) holding it are sharded on its dim (a size-1
  broadcast dim stays Replicate), the output is sharded there;
* a contracted label: the factors holding it are sharded on its dim, the output is
  ``Partial(sum)`` and the bias ``Partial(sum)`` too (so it is added once);
* multilinearity: exactly one factor ``Partial(op)`` (op sum/avg), the others Replicate,
  gives ``Partial(op)`` (with a ``Partial(op)`` bias).

Semantics follow ``torch.einsum``/``torch.matmul``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import field_validator

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import LINEAR_OPS, R

__all__ = ["EinsumOp", "MatmulOp", "parse_equation", "Equation"]


@dataclass(frozen=True)
class Equation:
    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]


def _labels(part: str) -> tuple[str, ...]:
    part = part.strip()
    if not part:
        return ()
    if " " in part:
        return tuple(part.split())
    out: list[str] = []
    i = 0
    while i < len(part):
        if part.startswith("...", i):
            out.append("...")
            i += 3
        else:
            out.append(part[i])
            i += 1
    return tuple(out)


def parse_equation(eq: str, repeats: bool = False) -> Equation:
    """Parse ``"m k, k n -> m n"``. ``repeats``: a label may repeat within one input operand
    (``torch.einsum``'s diagonal, ``"i i -> i"``); never within the output.

    Raises:
        ValueError: no ``->``, a label repeated in one operand (without ``repeats``, or in
            the output), an output label that no input has, or ``...`` used inconsistently.
    """
    if "->" not in eq:
        raise ValueError(f"equation {eq!r} needs '->' (e.g. 'm k, k n -> m n')")
    lhs, rhs = eq.split("->")
    ins = tuple(_labels(p) for p in lhs.split(","))
    out = _labels(rhs)
    if not ins or any(len(x) == 0 for x in ins) and len(ins) > 1:
        raise ValueError(f"equation {eq!r} has an empty operand")
    for labels in (*(() if repeats else ins), out):
        real = [x for x in labels if x != "..."]
        if len(set(real)) != len(real):
            raise ValueError(f"equation {eq!r}: a label repeats within {' '.join(labels)!r}")
    for labels in (*ins, out):
        if labels.count("...") > 1:
            raise ValueError(f"equation {eq!r}: '...' appears twice in one operand")
    known = {x for labels in ins for x in labels}
    for x in out:
        if x not in known:
            raise ValueError(f"equation {eq!r}: output label {x!r} is in no input")
    return Equation(ins, out)


class EinsumParams(RuleParams):
    equation: str
    bias: str | None = None
    bias_arg: str = "bias"

    @field_validator("equation")
    @classmethod
    def _check(cls, v: str) -> str:
        parse_equation(v)
        return v


def _expand(
    eq: Equation, ndims: list[int], bias: tuple[str, ...] | None, bias_ndim: int | None
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...], tuple[str, ...] | None]:
    """Replace ``...`` by concrete labels (aligned from the right across operands)."""
    n_ell = 0
    for labels, nd in zip(eq.inputs, ndims):
        if "..." in labels:
            n_ell = max(n_ell, nd - (len(labels) - 1))
    ell = tuple(f"_{i}" for i in range(n_ell))

    def sub(labels: tuple[str, ...], nd: int | None) -> tuple[str, ...]:
        if "..." not in labels:
            return labels
        k = (nd - (len(labels) - 1)) if nd is not None else n_ell
        i = labels.index("...")
        return labels[:i] + ell[n_ell - k :] + labels[i + 1 :]

    ins = tuple(sub(lab, nd) for lab, nd in zip(eq.inputs, ndims))
    out = sub(eq.output, None)
    b = sub(bias, bias_ndim) if bias is not None else None
    return ins, out, b


@register_rule("einsum")
class EinsumOp(DistributedOp):
    """Products of tensors described by an einsum equation (see module docstring)."""

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = EinsumParams
    signature = ("input", "other", "*args")

    def equation(self, call: OpCall) -> Equation:
        return parse_equation(self.params.equation)

    def _operands(self, call: OpCall) -> tuple[list[int], int | None, Any, tuple[str, ...], Any]:
        bias_arg = self.params.bias_arg if self.params.bias else None
        factors = [i for i, r in enumerate(call.arg_roles) if r != bias_arg]
        bias_idx = next((i for i, r in enumerate(call.arg_roles) if r == bias_arg), None)
        eq = self.equation(call)
        if len(factors) != len(eq.inputs):
            raise ShardingError(
                f"{call.describe()}: the equation {self.params.equation!r} has {len(eq.inputs)} "
                f"operands but the call passes {len(factors)} DTensor factors; every operand must "
                f"be a DTensor on the same mesh"
            )
        bias_labels = tuple(self.params.bias.split()) if self.params.bias else None
        ndims = [call.specs[i].ndim for i in factors]
        bnd = call.specs[bias_idx].ndim if bias_idx is not None else None
        ins, out, blab = _expand(eq, ndims, bias_labels, bnd)
        for labels, i in zip(ins, factors):
            if len(labels) != call.specs[i].ndim:
                raise ShardingError(
                    f"{call.describe()}: operand {call.arg_roles[i]!r} has rank {call.specs[i].ndim} "
                    f"but the equation {self.params.equation!r} gives it {len(labels)} labels"
                )
        if blab is not None and bias_idx is not None:
            # a bias broadcasts from the right against the output
            blab = (
                out[len(out) - call.specs[bias_idx].ndim :]
                if len(blab) != call.specs[bias_idx].ndim
                else blab
            )
        return factors, bias_idx, ins, out, blab

    def _sizes(self, call: OpCall, factors: list[int], ins: Any) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for labels, i in zip(ins, factors):
            for lab, n in zip(labels, call.specs[i].shape):
                if n != 1 or lab not in sizes:
                    prev = sizes.get(lab)
                    if prev is not None and prev != 1 and n != 1 and prev != n:
                        raise ShardingError(
                            f"{call.describe()}: dim {lab!r} has sizes {prev} and {n}; shapes do not match"
                        )
                    sizes[lab] = n if prev is None or prev == 1 else prev
        return sizes

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        factors, _, ins, out, _ = self._operands(call)
        sizes = self._sizes(call, factors, ins)
        return [tuple(sizes[lab] for lab in out)]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        factors, bias_idx, ins, out, blab = self._operands(call)
        sizes = self._sizes(call, factors, ins)
        nin = len(call.specs)
        strategies: list[SingleDimStrategy] = []
        all_labels = list(dict.fromkeys(lab for labels in ins for lab in labels))
        # a label repeated within one operand takes that operand's diagonal (torch.einsum's
        # "i i -> i"): its dims stay whole everywhere, so the local call sees the diagonal
        diagonal = {lab for labels in ins for lab in labels if labels.count(lab) > 1}
        for lab in all_labels:
            if lab in diagonal:
                continue
            placements: list[Placement] = [R] * nin
            for labels, i in zip(ins, factors):
                if lab in labels:
                    k = labels.index(lab)
                    placements[i] = (
                        R if (call.specs[i].shape[k] == 1 and sizes[lab] != 1) else Shard(k)
                    )
            if lab in out:
                if bias_idx is not None and blab is not None and lab in blab:
                    k = blab.index(lab)
                    placements[bias_idx] = (
                        R if call.specs[bias_idx].shape[k] == 1 and sizes[lab] != 1 else Shard(k)
                    )
                o: Placement = Shard(out.index(lab))
            else:
                if bias_idx is not None:
                    placements[bias_idx] = Partial("sum")
                o = Partial("sum")
            if all(p == R for p in placements):
                continue  # every factor broadcasts this label: nothing to shard
            strategies.append(((o,), tuple(placements)))
        for op in LINEAR_OPS:
            for j in factors:
                pl: list[Placement] = [R] * nin
                pl[j] = Partial(op)
                if bias_idx is not None:
                    pl[bias_idx] = Partial(op)
                strategies.append(((Partial(op),), tuple(pl)))
        return strategies


class _MatmulParams(RuleParams):
    bias: None = None
    bias_arg: str = "bias"
    equation: str = "torch.matmul"


@register_rule("matmul")
class MatmulOp(EinsumOp):
    """``torch.matmul`` semantics: 1-D, 2-D and batched (broadcast) operands; the equation
    is chosen from the operands' ranks."""

    Params = _MatmulParams  # type: ignore[assignment]
    signature = ("input", "other", "*args")

    def equation(self, call: OpCall) -> Equation:
        a, b = call.specs[0].ndim, call.specs[1].ndim
        if a == 0 or b == 0:
            raise ShardingError(
                f"{call.describe()}: both arguments to matmul need at least 1 dimension"
            )
        left = "k" if a == 1 else ("m k" if a == 2 else "... m k")
        right = "k" if b == 1 else ("k n" if b == 2 else "... k n")
        outs = []
        if a > 2 or b > 2:
            outs.append("...")
        if a >= 2:
            outs.append("m")
        if b >= 2:
            outs.append("n")
        return parse_equation(f"{left}, {right} -> {' '.join(outs)}")


class _EinsumCallParams(RuleParams):
    bias: None = None
    bias_arg: str = "bias"
    equation: str = "from the call"


def torch_einsum_equation(eq: Any) -> Equation:
    """Parse a ``torch.einsum`` equation (``"bij,bjk->bik"``, spaces ignored, ``...``
    allowed; without ``->`` the output is the labels used once, in alphabetical order,
    after ``...``, as torch.einsum).

    A label repeated within one operand takes its diagonal (``"ii->i"``, ``"bii->b"``), as
    torch.einsum: the rule keeps that label's dims whole.

    Raises:
        ValueError: not a string, or a label repeated in the output.
    """
    if not isinstance(eq, str):
        raise ValueError(f"einsum: the equation must be a string, got {type(eq).__name__}")
    s = eq.replace(" ", "")
    if "->" not in s:
        lhs = s
        counts: dict[str, int] = {}
        for part in lhs.split(","):
            for lab in _labels(part):
                counts[lab] = counts.get(lab, 0) + 1
        ell = ["..."] if "..." in counts else []
        s = (
            lhs
            + "->"
            + "".join(ell + sorted(k for k, v in counts.items() if v == 1 and k != "..."))
        )
    lhs, _, rhs = s.partition("->")
    spaced = ",".join(" ".join(_labels(p)) for p in lhs.split(",")) + "->" + " ".join(_labels(rhs))
    return parse_equation(spaced, repeats=True)


@register_rule("einsum_call")
class EinsumCallOp(EinsumOp):
    """``torch.einsum(equation, *operands)`` (or ``einsum(equation, [operands])``): the
    einsum rule with the equation read from the call (a static argument, part of the cache
    key). Every operand must be a DTensor on one mesh; an equation that takes a diagonal
    (``"ii->i"``) keeps the repeated label's dims whole (gathered)."""

    Params = _EinsumCallParams  # type: ignore[assignment]
    signature = ("equation", "*operands")  # type: ignore[assignment]

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            self.static_names = ("equation",)

    def equation(self, call: OpCall) -> Equation:
        eq = call.static.get("equation")
        try:
            return torch_einsum_equation(eq)
        except ValueError as e:
            raise ShardingError(f"{call.describe()}: {e}") from e


class _TransposedMatmulParams(RuleParams):
    bias: None = None
    bias_arg: str = "bias"
    equation: str = "from transpose_a / transpose_b"


@register_rule("transposed_matmul")
class TransposedMatmulOp(EinsumOp):
    """``matmul(input, other, transpose_a=False, transpose_b=False)``: the einsum rule of
    ``op(input) @ op(other)`` where ``op`` swaps the last two dims when its flag is set
    (MindSpore's ``MatMul``/``BatchMatMul`` Primitives, ``ops.MatMul(transpose_b=True)``).
    2-D operands, or batched ones (leading dims broadcast as ``torch.matmul``'s); the flags
    are static arguments (part of the cache key)."""

    Params = _TransposedMatmulParams  # type: ignore[assignment]
    signature = ("input", "other", "transpose_a", "transpose_b")  # type: ignore[assignment]
    static_args = ("transpose_a", "transpose_b")

    def equation(self, call: OpCall) -> Equation:
        a, b = call.specs[0].ndim, call.specs[1].ndim
        if a < 2 or b < 2:
            raise ShardingError(
                f"{call.describe()}: both operands of a transposed matmul need at least 2 dims"
            )
        ta, tb = bool(call.static.get("transpose_a")), bool(call.static.get("transpose_b"))
        left = ("... " if a > 2 else "") + ("k m" if ta else "m k")
        right = ("... " if b > 2 else "") + ("n k" if tb else "k n")
        out = ("... " if a > 2 or b > 2 else "") + "m n"
        return parse_equation(f"{left}, {right} -> {out}")
