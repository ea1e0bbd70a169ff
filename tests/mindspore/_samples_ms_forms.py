"""Sample calls of the MindSpore conformance suite for the ``ops.*``/``mint.*``/``Tensor.*``
sweep on 2-rank DTensors: MindSpore-only call forms (numpy semantics where they differ
from torch: ``squeeze()`` of an empty axis, ``transpose()`` with no axes, ``cumsum()`` of
the flattened tensor, ``ops.any`` over an empty axis), the ``*Ext`` and legacy Primitives
``Tensor`` methods reach, and the Python-level functions bound whole
(``ops.isposinf``, ``ops.count_nonzero``, ``ops.diff``...). Built inside the MindSpore
workers (they import MindSpore)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tests.mindspore._samples import Originals, Sample, rs


def ms_form_samples() -> dict[str, list[Sample]]:
    """Primitive (or bound function) name -> sample calls."""
    from mindspore import mint
    from mindspore import ops as ops_w

    ops = Originals(ops_w)  # a Primitive row: the original function, not its bound wrapper

    A, A3, V = rs(1, 5, 4), rs(5, 3, 5, 4), rs(3, 4)
    A1 = rs(10, 1, 5, 4)
    Ap = np.abs(A) + 0.5
    Au = np.tanh(A) * 0.9
    C = A > 0
    Z = A * (A > 0)  # zeros to count
    Ainf = A.copy()
    Ainf[0, 1], Ainf[3, 2], Ainf[4, 0] = np.inf, -np.inf, np.inf
    nograd: tuple[int, ...] = ()
    # no Partial placement: a random split of an inf is NaN, and the parts of an exact zero
    # do not add up to an exact zero in floating point
    whole = [False]

    def S(desc: str, fn: Callable, *inputs: np.ndarray, **kw: Any) -> Sample:
        return Sample(desc, fn, list(inputs), **kw)

    return {
        # -- numpy semantics of MindSpore's call forms (bugs the sweep found)
        "Squeeze": [
            S("a.squeeze() (no size-1 dim)", lambda a: a.squeeze(), A),
            S("ops.squeeze(a1) (an empty axis: every size-1 dim)", ops.squeeze, A1),
            S("ops.cov(a) (squeezes inside)", ops.cov, A),
        ],
        "Softmax": [
            S("ops.Softmax()(a) (its axis as a 1-tuple)", lambda a: ops.Softmax()(a), A),
            S("ops.softmin(a, 0)", lambda a: ops.softmin(a, 0), A),
        ],
        "DeprecatedTranspose": [
            S("a3.transpose() (reverses every dim)", lambda a: a.transpose(), A3)
        ],
        "DeprecatedPermute": [S("a3.permute() (reverses every dim)", lambda a: a.permute(), A3)],
        "DeprecatedCumsum": [S("a.cumsum() (the flattened tensor)", lambda a: a.cumsum(), A)],
        "ReduceAny": [
            S("ops.any(c) (an empty axis: every dim)", ops.any, C, grad=nograd, partial=whole)
        ],
        "ReduceAll": [
            S("ops.all(c, ())", lambda c: ops.all(c, ()), C, grad=nograd, partial=whole),
            S("c.all(axis=0)", lambda c: c.all(axis=0), C, grad=nograd, partial=whole),
        ],
        "DeprecatedReduceAny": [S("c.any(())", lambda c: c.any(()), C, grad=nograd, partial=whole)],
        "DeprecatedSum": [S("a.sum(axis=0, initial=1.0)", lambda a: a.sum(axis=0, initial=1.0), A)],
        # -- Primitives Tensor methods reach
        "AcosExt": [S("u.acos()", lambda a: a.acos(), Au)],
        "AsinExt": [S("u.asin()", lambda a: a.asin(), Au)],
        "AtanExt": [S("a.atan()", lambda a: a.atan(), A)],
        "AsinhExt": [S("a.asinh()", lambda a: a.asinh(), A)],
        "AcoshExt": [S("(p + 1).acosh()", lambda a: a.acosh(), Ap + 1)],
        "Log10": [S("p.log10()", lambda a: a.log10(), Ap)],
        "Log2": [S("p.log2()", lambda a: a.log2(), Ap)],
        "Frac": [S("a.frac()", lambda a: a.frac(), A * 3)],
        "Std": [
            S("a.std()", lambda a: a.std(), A),
            S(
                "a.std(1, correction=0, keepdim=True)",
                lambda a: a.std(1, correction=0, keepdim=True),
                A,
            ),
        ],
        "ArgMinExt": [
            S("a.argmin()", lambda a: a.argmin(), A, grad=nograd),
            S("a.argmin(1)", lambda a: a.argmin(1), A, grad=nograd),
        ],
        "ArgSort": [S("a.argsort()", lambda a: a.argsort(), A, grad=nograd)],
        "TraceV2": [S("a.trace()", lambda a: a.trace(), A)],
        "TraceExt": [S("mint.trace(a)", mint.trace, A)],
        "DiagExt": [S("mint.diag(a)", mint.diag, A)],
        "CountNonZero": [
            S("z.count_nonzero()", lambda a: a.count_nonzero(), Z, grad=nograd, partial=whole)
        ],
        "IsNegInf": [S("mint.isneginf(a)", mint.isneginf, Ainf, grad=nograd, partial=whole)],
        "DeprecatedMax": [
            S("a.ptp()", lambda a: a.ptp(), A),
            S("a.max(axis=0, initial=2.0)", lambda a: a.max(axis=0, initial=2.0), A),
        ],
        "DeprecatedMin": [
            S("a.min(axis=1, keepdims=True)", lambda a: a.min(axis=1, keepdims=True), A)
        ],
        # -- legacy Primitives of ops.* functions
        "IsNan": [
            S("ops.isnan(a)", ops.isnan, A, grad=nograd),
            S("ops.nansum(a, 1) (IsNan inside)", lambda a: ops.nansum(a, 1), A),
        ],
        "Inv": [S("ops.inv(p)", ops.inv, Ap)],
        "Mod": [S("ops.frac(a) (Mod inside)", ops.frac, A * 3)],
        "Softplus": [S("ops.Softplus()(a)", lambda a: ops.Softplus()(a), A)],
        "SeLU": [S("ops.selu(a)", ops.selu, A)],
        "ReLU6": [S("ops.relu6(4a)", ops.relu6, A * 4)],
        "Trace": [S("ops.trace(a)", ops.trace, A)],
        "Flatten": [
            S("ops.flatten(a3)", ops.flatten, A3),
            S("ops.flatten(v) (1-D: (4, 1))", ops.flatten, V),
        ],
        "Diag": [S("ops.diag(v)", ops.diag, V)],
        # -- Python-level functions bound whole (the wrappers: ops_w)
        "mindspore.ops.isposinf": [
            S("ops.isposinf(a)", ops_w.isposinf, Ainf, grad=nograd, partial=whole)
        ],
        "mindspore.ops.isneginf": [
            S("ops.isneginf(a)", ops_w.isneginf, Ainf, grad=nograd, partial=whole)
        ],
        "mindspore.ops.count_nonzero": [
            S("ops.count_nonzero(z)", ops_w.count_nonzero, Z, grad=nograd, partial=whole),
            S(
                "ops.count_nonzero(z, 0)",
                lambda a: ops_w.count_nonzero(a, 0),
                Z,
                grad=nograd,
                partial=whole,
            ),
        ],
        "mindspore.ops.nanmean": [
            S("ops.nanmean(a, 0)", lambda a: ops_w.nanmean(a, 0), A),
            S("a.nanmean() (Tensor.nanmean)", lambda a: a.nanmean(), A),
        ],
        "mindspore.ops.diff": [
            S("ops.diff(a)", ops_w.diff, A),
            S("a.diff(axis=0) (Tensor.diff)", lambda a: a.diff(axis=0), A),
        ],
        "mindspore.ops.tril": [
            S("ops.tril(a)", ops_w.tril, A),
            S("ops.tril(a, 1)", lambda a: ops_w.tril(a, 1), A),
        ],
        "mindspore.ops.argsort": [
            S("ops.argsort(a)", ops_w.argsort, A, grad=nograd),
            S("ops.argsort(a, 0, True)", lambda a: ops_w.argsort(a, 0, True), A, grad=nograd),
        ],
        "mindspore.ops.msort": [S("ops.msort(a)", ops_w.msort, A)],
    }
