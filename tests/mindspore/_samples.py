"""Sample calls of the MindSpore conformance suite added with the transformer bindings
(issue 15): trigonometric and rounding ops, activations, binary and in-place ops,
reductions, views and tensor ops, the legacy/deprecated Primitive forms MindSpore code
calls (``ops.MatMul``, ``ops.LayerNorm``, ``Tensor.sum(axis=...)``...) and the Python-level
functions bound whole (``ops.cross_entropy``, ``ops.dropout``...). Built inside the
MindSpore workers (they import MindSpore)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FWD_TOL = 1e-5


@dataclass
class Sample:
    """``fn(*dtensors)`` on inputs made from ``inputs`` (global numpy values).

    ``value``: the output is not a tensor (a type, a flag): compared with ``str``.
    ``shard_dims`` keeps the combinations of many-input, high-rank samples few."""

    desc: str
    fn: Callable[..., Any]
    inputs: list[np.ndarray]
    grad: tuple[int, ...] | None = None  # input positions differentiated (None: all float)
    partial: list[bool] = field(default_factory=list)  # Partial placements allowed per input
    tol: float = FWD_TOL
    value: bool = False
    #: per input, the tensor dims a Shard placement may take (None: every dim)
    shard_dims: list[tuple[int, ...] | None] | None = None


class Originals:
    """A module whose bound functions (:mod:`hyper_shard.platform.mindspore.functions`)
    resolve to the original MindSpore functions."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._module, name)
        return getattr(fn, "__hyper_shard_original__", fn)


def rs(seed: int, *shape: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def transformer_samples() -> dict[str, list[Sample]]:
    """Primitive (or bound function) name -> sample calls."""
    import mindspore as ms
    import mindspore.mint.nn.functional as F
    from mindspore import Tensor, mint, ops

    from hyper_shard.parallel import loss_parallel
    from hyper_shard.platform.mindspore import functional as hsF

    orig = Originals(mint)  # a Primitive row: the original function, not its bound wrapper

    A, B, V = rs(1, 5, 4), rs(2, 5, 4), rs(3, 4)
    Ap, Bp = np.abs(A) + 0.5, np.abs(B) + 0.5
    Au = np.tanh(A) * 0.9
    C = A > 0
    D = B > 0
    ints = (np.abs(A) * 10).astype(np.int32)
    ints2 = (np.abs(B) * 10).astype(np.int32) + 1
    A3, B3 = rs(5, 3, 5, 4), rs(6, 3, 4, 2)
    M = rs(4, 4, 3)
    D6 = rs(13, 5, 6)
    gidx = np.array([[3, 0, 1, 1], [2, 2, 0, 3], [0, 1, 2, 3], [1, 1, 1, 0], [3, 2, 1, 0]])
    logits = rs(30, 6, 7)  # 7 classes: uneven class shards
    labels = np.array([1, 6, 3, 0, 2, 6], np.int32)
    labels_ign = labels.copy()
    labels_ign[2] = -100
    Q, K, Vv = rs(31, 2, 2, 6, 4), rs(32, 2, 2, 6, 4), rs(33, 2, 2, 6, 3)
    nograd: tuple[int, ...] = ()

    def S(desc: str, fn: Callable, *inputs: np.ndarray, **kw: Any) -> Sample:
        return Sample(desc, fn, list(inputs), **kw)

    def inplace(method: str, *extra: Any) -> Callable:
        return lambda a, *b: getattr(a, method)(*(b or extra))

    def seeded(fn: Callable) -> Callable:
        def run(*xs: Any) -> Any:
            ms.set_seed(11)
            return fn(*xs)

        return run

    def lp(fn: Callable) -> Callable:  # class-sharded logits need loss_parallel
        def run(*xs: Any) -> Any:
            with loss_parallel():
                return fn(*xs)

        return run

    return {
        # -- elementwise, one tensor
        "ACos": [S("ops.acos(u)", ops.acos, Au)],
        "Acosh": [S("ops.acosh(p + 1)", lambda a: ops.acosh(a), Ap + 1)],
        "Asin": [S("ops.asin(u)", ops.asin, Au)],
        "Asinh": [S("ops.asinh(a)", ops.asinh, A)],
        "Atan": [S("ops.atan(a)", ops.atan, A)],
        "Atanh": [S("mint.atanh(u)", mint.atanh, Au)],
        "Tan": [S("mint.tan(u)", mint.tan, Au)],
        "Sinh": [S("mint.sinh(a)", mint.sinh, A)],
        "Cosh": [S("mint.cosh(a)", mint.cosh, A)],
        "Erfc": [S("mint.erfc(a)", mint.erfc, A)],
        "Erfinv": [S("mint.erfinv(u)", mint.erfinv, Au, tol=1e-4)],
        "Expm1": [S("mint.expm1(a)", mint.expm1, A)],
        "Log1p": [S("mint.log1p(p)", mint.log1p, Ap)],
        "Reciprocal": [S("mint.reciprocal(p)", mint.reciprocal, Ap)],
        "Sign": [S("mint.sign(a)", mint.sign, A)],
        "Floor": [S("mint.floor(a)", mint.floor, A)],
        "Ceil": [S("mint.ceil(a)", mint.ceil, A)],
        "Round": [S("mint.round(a)", mint.round, A)],
        "Trunc": [S("mint.trunc(a)", mint.trunc, A)],
        "Sinc": [S("mint.sinc(a)", mint.sinc, A)],
        "Logit": [S("ops.logit(s, 1e-6)", lambda a: ops.logit(a, 1e-6), np.abs(Au))],
        "NanToNum": [S("mint.nan_to_num(a)", mint.nan_to_num, A)],
        "LogicalNot": [S("mint.logical_not(c)", mint.logical_not, C, grad=nograd)],
        "IsInf": [S("mint.isinf(a)", mint.isinf, A, grad=nograd)],
        "IsFinite": [S("mint.isfinite(a)", mint.isfinite, A, grad=nograd)],
        # -- activations
        "HSwish": [S("F.hardswish(3a)", F.hardswish, A * 3)],
        "HSigmoid": [S("F.hardsigmoid(3a)", F.hardsigmoid, A * 3)],
        "Elu": [S("ops.elu(a)", ops.elu, A)],
        "CeLU": [S("ops.celu(a)", ops.celu, A)],
        "FastGeLU": [S("ops.fast_gelu(a)", ops.fast_gelu, A)],
        # plain MindSpore's SoftplusExt backward fails on CPU: forward only
        "SoftplusExt": [S("F.softplus(a)", F.softplus, A, grad=nograd)],
        "Mish": [S("ops.mish(a)", ops.mish, A)],
        "HShrink": [S("F.hardshrink(a)", F.hardshrink, A)],
        "SoftShrink": [S("F.softshrink(a)", F.softshrink, A)],
        "Softsign": [S("ops.softsign(a)", ops.softsign, A)],
        # -- elementwise, two or more tensors / a tensor and a number
        "Atan2": [S("ops.atan2(a, b)", ops.atan2, A, B)],
        "FloorDiv": [
            S("mint.floor_divide(a, p)", mint.floor_divide, A, Bp),
            S("a // 2", lambda a: a // 2, A),
        ],
        "FloorMod": [S("ops.floor_mod(a, p)", ops.floor_mod, A, Bp)],
        "FmodScalar": [S("mint.fmod(a, 1.5)", lambda a: mint.fmod(a, 1.5), A)],
        "FmodTensor": [S("mint.fmod(a, p)", mint.fmod, A, Bp)],
        "RemainderTensorTensor": [S("mint.remainder(a, p)", mint.remainder, A, Bp)],
        "RemainderTensorScalar": [S("mint.remainder(a, 1.5)", lambda a: mint.remainder(a, 1.5), A)],
        "RemainderScalarTensor": [
            S("mint.remainder(1.5, p)", lambda b: mint.remainder(1.5, b), Bp)
        ],
        "Xlogy": [S("mint.xlogy(a, p)", mint.xlogy, A, Bp)],
        "XLogYScalarOther": [S("mint.xlogy(a, 2)", lambda a: mint.xlogy(a, 2), A)],
        "NextAfter": [S("ops.nextafter(a, b)", ops.nextafter, A, B, grad=nograd)],
        "Gcd": [S("mint.gcd(i, j)", mint.gcd, ints, ints2, grad=nograd)],
        "LogicalAnd": [S("mint.logical_and(c, d)", mint.logical_and, C, D, grad=nograd)],
        "LogicalOr": [S("mint.logical_or(c, d)", mint.logical_or, C, D, grad=nograd)],
        "LogicalXor": [S("mint.logical_xor(c, d)", mint.logical_xor, C, D, grad=nograd)],
        "BitwiseAndTensor": [
            S("mint.bitwise_and(i, j)", mint.bitwise_and, ints, ints2, grad=nograd)
        ],
        "Lerp": [
            S("mint.lerp(a, b, w)", mint.lerp, A, B, Au),
            S("mint.lerp(a, b, 0.3)", lambda a, b: mint.lerp(a, b, 0.3), A, B),
        ],
        "Addcmul": [
            S(
                "ops.addcmul(a, b, c, 0.5)",
                lambda a, b, c: ops.addcmul(a, b, c, Tensor(0.5)),
                A,
                B,
                Au,
            )
        ],
        "Addcdiv": [
            S(
                "ops.addcdiv(a, b, p, 0.5)",
                lambda a, b, c: ops.addcdiv(a, b, c, Tensor(0.5)),
                A,
                B,
                Bp,
            )
        ],
        "DivMod": [
            S(
                "mint.div(a, p, rounding_mode='floor')",
                lambda a, b: orig.div(a, b, rounding_mode="floor"),
                A,
                Bp,
            )
        ],
        "IsClose": [S("mint.isclose(a, a + 1e-9)", mint.isclose, A, A + 1e-9, grad=nograd)],
        "MaskedFill": [
            S(
                "ops.masked_fill(a, c, 0.5)",
                lambda a, c: ops.masked_fill(a, c, 0.5),
                A,
                C,
                grad=(0,),
                partial=[True, False],
            )
        ],
        "Hypot": [S("ops.hypot(a, b)", ops.hypot, A, B)],
        "Heaviside": [S("ops.heaviside(a, b)", ops.heaviside, A, B, grad=nograd)],
        "EqScalar": [S("mint.eq(a, 0.5)", lambda a: mint.eq(a, 0.5), A, grad=nograd)],
        "LessScalar": [S("mint.lt(a, 0.)", lambda a: mint.lt(a, 0.0), A, grad=nograd)],
        "GreaterEqualScalar": [S("mint.ge(a, 0.)", lambda a: mint.ge(a, 0.0), A, grad=nograd)],
        # -- in place (CPU kernels that exist)
        "InplaceExp": [S("a.exp_()", inplace("exp_"), A, grad=nograd, partial=[False, True])],
        "InplaceFloorDivide": [
            S(
                "a.floor_divide_(p)",
                inplace("floor_divide_"),
                A,
                Bp,
                grad=nograd,
                partial=[False, True],
            )
        ],
        "InplaceFloorDivides": [
            S(
                "a.floor_divide_(2.)",
                inplace("floor_divide_", 2.0),
                A,
                grad=nograd,
                partial=[False, True],
            )
        ],
        "InplaceRemainderTensorScalar": [
            S(
                "a.remainder_(1.5)",
                inplace("remainder_", 1.5),
                A,
                grad=nograd,
                partial=[False, True],
            )
        ],
        "InplaceRemainderTensorTensor": [
            S("a.remainder_(p)", inplace("remainder_"), A, Bp, grad=nograd, partial=[False, True])
        ],
        "InplaceDivMods": [
            S(
                "a.div_(2., rounding_mode='floor')",
                lambda a: a.div_(2.0, rounding_mode="floor"),
                A,
                grad=nograd,
                partial=[False, True],
            )
        ],
        "InplaceDivMod": [
            S(
                "a.div_(p, rounding_mode='floor')",
                lambda a, b: a.div_(b, rounding_mode="floor"),
                A,
                Bp,
                grad=nograd,
                partial=[False, True],
            )
        ],
        "Assign": [S("ops.assign(a, b)", lambda a, b: ops.assign(a, b), A, B, grad=nograd)],
        "AssignAdd": [
            S("ops.assign_add(a, b)", lambda a, b: ops.assign_add(a, b), A, B, grad=nograd)
        ],
        "AssignSub": [
            S("ops.assign_sub(a, b)", lambda a, b: ops.assign_sub(a, b), A, B, grad=nograd)
        ],
        # -- reductions
        "ReduceProd": [S("ops.ReduceProd()(a, 1)", lambda a: ops.ReduceProd()(a, 1), A)],
        "ReduceAny": [
            S(
                "ops.ReduceAny()(c, 1)",
                lambda c: ops.ReduceAny()(c, 1),
                C,
                grad=nograd,
                partial=[False],
            )
        ],
        "ArgMaxWithValue": [S("ops.max(a, 1)", lambda a: ops.max(a, 1), A)],
        "ArgMinWithValue": [S("ops.min(a, 0)", lambda a: ops.min(a, 0), A)],
        "Argmax": [S("ops.argmax(a, 1)", lambda a: ops.argmax(a, 1), A, grad=nograd)],
        "Argmin": [S("ops.argmin(a, 0)", lambda a: ops.argmin(a, 0), A, grad=nograd)],
        "Nansum": [S("mint.nansum(a, 1)", lambda a: mint.nansum(a, 1), A)],
        "DeprecatedSum": [
            S("a.sum(axis=1)", lambda a: a.sum(axis=1), A),
            S("a.sum(0, keepdims=True)", lambda a: a.sum(0, keepdims=True), A),
        ],
        "DeprecatedMean": [
            S("a.mean(1, keep_dims=True)", lambda a: a.mean(1, keep_dims=True), A),
            S("a.mean(0)", lambda a: a.mean(0), A),
        ],
        "CumSum": [S("ops.cumsum(a, 1)", lambda a: ops.cumsum(a, 1), A)],
        "CumProd": [S("ops.cumprod(a, 0)", lambda a: ops.cumprod(a, 0), A)],
        "TopK": [S("ops.topk(a, 2)", lambda a: ops.topk(a, 2), A)],
        # -- products and norms in their legacy Primitive forms (nn.LayerNorm, ops.bmm...)
        "MatMul": [
            S("ops.MatMul()(a, m)", lambda a, m: ops.MatMul()(a, m), A, M),
            S(
                "ops.MatMul(transpose_b=True)(a, b)",
                lambda a, b: ops.MatMul(transpose_b=True)(a, b),
                A,
                B,
            ),
            S(
                "ops.MatMul(transpose_a=True)(a, b)",
                lambda a, b: ops.MatMul(transpose_a=True)(a, b),
                A,
                B,
            ),
        ],
        "BatchMatMul": [
            S("ops.bmm(a3, b3)", ops.bmm, A3, B3),
            S(
                "ops.BatchMatMul(transpose_b=True)(a3, b3t)",
                lambda a, b: ops.BatchMatMul(transpose_b=True)(a, b),
                A3,
                np.ascontiguousarray(np.swapaxes(B3, -1, -2)),
            ),
        ],
        "LayerNorm": [
            S(
                "ops.LayerNorm(-1, -1)(a, g, b)",
                lambda a, g, b: ops.LayerNorm(-1, -1)(a, g, b),
                A,
                V,
                rs(26, 4),
            ),
            S(
                "ops.LayerNorm(1, 1)(a3, g, b) (normalises 2 dims)",
                lambda a, g, b: ops.LayerNorm(1, 1)(a, g, b),
                A3,
                rs(27, 5, 4),
                rs(28, 5, 4),
            ),
        ],
        # -- views and tensor ops
        "Split": [S("ops.chunk(a, 2, 1)", lambda a: ops.chunk(a, 2, 1), A)],
        "SplitWithSizeView": [S("mint.split(a, [2, 3])", lambda a: mint.split(a, [2, 3]), A)],
        "SplitTensor": [S("a.split(2, 1)", lambda a: a.split(2, 1), A)],
        "SplitWithSize": [S("a.split([1, 4], 0)", lambda a: a.split([1, 4], 0), A)],
        "ChunkView": [S("mint.chunk(a, 2)", lambda a: mint.chunk(a, 2), A)],
        # plain MindSpore's backward of these views fails on CPU: forward only
        "SelectExtView": [
            S("mint.select(a, 1, 2)", lambda a: mint.select(a, 1, 2), A, grad=nograd)
        ],
        "UnstackExtView": [S("mint.unbind(a, 1)", lambda a: mint.unbind(a, 1), A, grad=nograd)],
        "Tile": [S("mint.tile(a, (2, 1))", lambda a: mint.tile(a, (2, 1)), A)],
        "Triu": [S("mint.triu(a, 1)", lambda a: mint.triu(a, 1), A)],
        "GatherD": [S("mint.gather(a, 1, idx)", lambda a, i: mint.gather(a, 1, i), A, gidx)],
        "Diagonal": [
            S("ops.diagonal(a)", ops.diagonal, A),
            S("a.diagonal(1)", lambda a: a.diagonal(1), A),
        ],
        "Identity": [S("ops.deepcopy(a)", ops.deepcopy, A)],
        "View": [
            S("ops.auto_generate.view(a, (20,))", lambda a: ops.auto_generate.view(a, (20,)), A)
        ],
        "GLU": [S("F.glu(d6)", F.glu, D6)],
        "ZerosLike": [S("ops.zeros_like(a)", ops.zeros_like, A, grad=nograd)],
        "OnesLike": [S("ops.ones_like(a)", ops.ones_like, A, grad=nograd)],
        "EmptyLike": [
            S("mint.empty_like(a) * 0", lambda a: mint.empty_like(a) * 0, A, grad=nograd)
        ],
        # -- softmax family and losses (Python-level functions bound whole)
        "LogSoftmaxExt": [
            S("mint.nn.functional.log_softmax(a, 1)", lambda a: F.log_softmax(a, 1), A)
        ],
        "mindspore.ops.cross_entropy": [
            S(
                "ops.cross_entropy(x, t)",
                lp(ops.cross_entropy),
                logits,
                labels,
                partial=[True, False],
            ),
            S(
                "ops.cross_entropy(x, t, ignore_index, label_smoothing=.1)",
                lp(lambda x, t: ops.cross_entropy(x, t, label_smoothing=0.1)),
                logits,
                labels_ign,
                partial=[True, False],
            ),
            S(
                "ops.cross_entropy(x, t, reduction='sum')",
                lp(lambda x, t: ops.cross_entropy(x, t, reduction="sum")),
                logits,
                labels,
                partial=[True, False],
            ),
        ],
        "mindspore.ops.nll_loss": [
            S(
                "ops.nll_loss(ops.log_softmax(x, 1), t)",
                lp(lambda x, t: ops.nll_loss(ops.log_softmax(x, 1), t)),
                logits,
                labels_ign,
                partial=[True, False],
            ),
            # MindSpore's nll_loss smooths (torch's has no label_smoothing): in loss_parallel
            # and outside it (the classes gathered); the original ops.cross_entropy with
            # label_smoothing reaches this function too, on the log-softmax it computes
            S(
                "ops.nll_loss(ops.log_softmax(x, 1), t, label_smoothing=0.1)",
                lp(lambda x, t: ops.nll_loss(ops.log_softmax(x, 1), t, label_smoothing=0.1)),
                logits,
                labels_ign,
                partial=[True, False],
            ),
            S(
                "ops.nll_loss(x, t, reduction='sum', label_smoothing=0.2) (gathered)",
                lambda x, t: ops.nll_loss(
                    ops.log_softmax(x, 1), t, reduction="sum", label_smoothing=0.2
                ),
                logits,
                labels,
                partial=[True, False],
            ),
        ],
        "mindspore.mint.nn.functional.cross_entropy": [
            S("F.cross_entropy(x, t)", lp(F.cross_entropy), logits, labels, partial=[True, False])
        ],
        "mindspore.mint.nn.functional.nll_loss": [
            S(
                "F.nll_loss(ops.log_softmax(x, 1), t)",
                lp(lambda x, t: F.nll_loss(ops.log_softmax(x, 1), t)),
                logits,
                labels_ign,
                partial=[True, False],
            )
        ],
        "mindspore.ops.dropout": [
            S("ops.dropout(a, 0.4) (seeded)", seeded(lambda a: ops.dropout(a, 0.4)), A)
        ],
        # -- tensors inside a tuple (the legacy Stack Primitive is hooked: no local stack)
        "mindspore.ops.stack": [
            S("ops.stack((a, b))", lambda a, b: ops.stack((a, b)), A, B),
            S("ops.stack([a, b], axis=2)", lambda a, b: ops.stack([a, b], axis=2), A, B),
        ],
        "StackExt": [S("mint.stack((a, b), 1)", lambda a, b: orig.stack((a, b), 1), A, B)],
        "mindspore.ops.sort": [
            S("ops.sort(a, 0)", lambda a: ops.sort(a, 0), A),
            S(
                "ops.sort(a, axis=1, descending=True)",
                lambda a: ops.sort(a, axis=1, descending=True),
                A,
            ),
        ],
        "CumsumExt": [S("mint.cumsum(a, 0)", lambda a: orig.cumsum(a, 0), A)],
        "Any": [S("(c).any()", lambda c: c.any(), C, grad=nograd, partial=[False])],
        "ReduceStd": [
            S("ops.std(a, 1)", lambda a: ops.std(a, 1), A),
            S("ops.std(a)", lambda a: ops.std(a), A),
            S(
                "ops.std(a, 0, ddof=1, keepdims=True)",
                lambda a: ops.std(a, 0, ddof=1, keepdims=True),
                A,
            ),
        ],
        "mindspore.mint.nn.functional.dropout": [
            S("F.dropout(a, 0.4) (seeded)", seeded(lambda a: F.dropout(a, 0.4)), A)
        ],
        "hyper_shard.platform.mindspore.functional.scaled_dot_product_attention": [
            S(
                "sdpa(q, k, v, is_causal=True)",
                lambda q, k, v: hsF.scaled_dot_product_attention(q, k, v, is_causal=True),
                Q,
                K,
                Vv,
                shard_dims=[(0, 1, 2), (1,), (1,)],
                partial=[False, False, False],
            ),
            S(
                "sdpa(q, k, v, dropout_p=0.3) (seeded)",
                seeded(lambda q, k, v: hsF.scaled_dot_product_attention(q, k, v, dropout_p=0.3)),
                Q,
                K,
                Vv,
                shard_dims=[(0, 1, 2), (1,), (1,)],
                partial=[False, False, False],
            ),
        ],
        # -- MindSpore 1.x Tensor-method forms (C++ overloads named Deprecated*)
        "DeprecatedCumsum": [S("a.cumsum(axis=1)", lambda a: a.cumsum(axis=1), A)],
        "DeprecatedChunk": [
            S("a.chunk(2, axis=1)", lambda a: a.chunk(2, axis=1), A),
            S("a.chunk(3, 0)", lambda a: a.chunk(3, 0), A),
        ],
        "DeprecatedSplit": [
            S("a.split(2, axis=1)", lambda a: a.split(2, axis=1), A),
            S("a.split([1, 4], 0)", lambda a: a.split([1, 4], 0), A),
        ],
        "DeprecatedTranspose": [S("a3.transpose((2, 0, 1))", lambda a: a.transpose((2, 0, 1)), A3)],
        "DeprecatedArgmax": [S("a.argmax(axis=1)", lambda a: a.argmax(axis=1), A, grad=nograd)],
        "DeprecatedArgmin": [S("a.argmin(axis=0)", lambda a: a.argmin(axis=0), A, grad=nograd)],
        "DeprecatedNansum": [S("a.nansum(axis=1)", lambda a: a.nansum(axis=1), A)],
        "DeprecatedReduceAny": [
            S("c.any(axis=1)", lambda c: c.any(axis=1), C, grad=nograd, partial=[False])
        ],
        "DeprecatedProd": [S("a.prod(1)", lambda a: a.prod(1), A)],
        "DeprecatedRepeatInterleave": [
            S("a.repeat_interleave(2, dim=0)", lambda a: a.repeat_interleave(2, dim=0), A)
        ],
        "DeprecatedGather": [
            S("a.gather(idx, 0)", lambda a, i: a.gather(i, 0), A, np.array([1, 0, 4], np.int32))
        ],
        "DeprecatedStd": [S("a.std(axis=1)", lambda a: a.std(axis=1), A)],
        "DeprecatedVar": [S("a.var(axis=0, ddof=1)", lambda a: a.var(axis=0, ddof=1), A)],
        "TrilExt": [S("a.tril(-1)", lambda a: a.tril(-1), A)],
        "SortExt": [S("a.sort(1)", lambda a: a.sort(1), A)],
        "LogSumExp": [S("a.logsumexp(1)", lambda a: a.logsumexp(1), A)],
        "NewOnes": [S("a.new_ones((2, 3))", lambda a: a.new_ones((2, 3)), A, grad=nograd)],
        "NewZeros": [S("a.new_zeros(a.shape)", lambda a: a.new_zeros((5, 4)), A, grad=nograd)],
        "SquaredDifference": [
            S("ops.SquaredDifference()(a, b)", lambda a, b: ops.SquaredDifference()(a, b), A, B)
        ],
        # plain MindSpore's Cummax backward fails on CPU: forward only
        "Cummax": [S("ops.cummax(a, 1)", lambda a: ops.cummax(a, 1), A, grad=nograd)],
        "RmsNorm": [S("ops.rms_norm(a, g)", lambda a, g: ops.rms_norm(a, g), A, V)],
        # -- Tensor methods a DTensor dispatches from Python (no C++ fallback detour)
        "Tensor.__add__": [
            S("a + b", lambda a, b: a + b, A, B),
            S("a + v (broadcast)", lambda a, v: a + v, A, V),
            S("a + 1.5", lambda a: a + 1.5, A),
        ],
        "Tensor.__sub__": [
            S("a - b", lambda a, b: a - b, A, B),
            S("a - 1.5", lambda a: a - 1.5, A),
        ],
        "Tensor.__mul__": [
            S("a * b", lambda a, b: a * b, A, B),
            S("a * 2.5", lambda a: a * 2.5, A),
        ],
        "Tensor.__truediv__": [
            S("a / p", lambda a, b: a / b, A, Bp),
            S("a / 2.0", lambda a: a / 2.0, A),
        ],
        "Tensor.__matmul__": [
            S("a @ m", lambda a, m: a @ m, A, M),
            S("a3 @ b3", lambda a, b: a @ b, A3, B3),
        ],
        "Tensor.__neg__": [S("-a", lambda a: -a, A)],
        "Tensor.reshape": [
            S("a.reshape(2, 10)", lambda a: a.reshape(2, 10), A),
            S("a3.reshape((15, 4))", lambda a: a.reshape((15, 4)), A3),
            S("a.reshape(-1)", lambda a: a.reshape(-1), A),
        ],
        "Tensor.unsqueeze": [S("a.unsqueeze(1)", lambda a: a.unsqueeze(1), A)],
        "typeof": [
            S("F.typeof(a)", lambda a: ops.functional.typeof(a), A, grad=nograd, value=True)
        ],
    }
