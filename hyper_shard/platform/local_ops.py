"""The local tensor primitives a platform provides: the :class:`LocalOps` protocol (one of
the five of :mod:`hyper_shard.platform.base`), used by the redistribution executor, the
composed collectives (:mod:`hyper_shard.platform.compose`) and the neutral kernels
(:mod:`hyper_shard.kernels`). Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, NoReturn, Protocol

__all__ = ["LocalOps", "unimplemented"]


def unimplemented(plat: object, method: str, what: str = "") -> NoReturn:
    """The default of a primitive a platform does not implement: a clear error."""
    raise NotImplementedError(
        f"{type(plat).__name__} {what or 'does not implement ' + method} "
        f"(Platform.{method}; see hyper_shard/platform/base.py)"
    )


class LocalOps(Protocol):
    """Local tensor primitives: plain local tensors in and out, differentiable by the
    framework's own autograd unless said otherwise. Semantics follow torch's functions of
    the same name (dims may be negative)."""

    def shape(self, t: Any) -> tuple[int, ...]:
        unimplemented(self, "shape")

    def narrow(self, t: Any, dim: int, start: int, length: int) -> Any:
        unimplemented(self, "narrow")

    def cat(self, ts: Sequence[Any], dim: int) -> Any:
        unimplemented(self, "cat")

    def pad_dim(self, t: Any, dim: int, size: int) -> Any:
        """Zero-pad ``t`` at the end of ``dim`` to ``size``."""
        unimplemented(self, "pad_dim")

    def embed(self, t: Any, dim: int, start: int, extent: int) -> Any:
        """Zeros with ``extent`` along ``dim`` and ``t`` placed at ``start``."""
        unimplemented(self, "embed")

    def zeros_like(self, t: Any) -> Any:
        unimplemented(self, "zeros_like")

    def ones_like(self, t: Any) -> Any:
        unimplemented(self, "ones_like")

    def scale(self, t: Any, factor: float) -> Any:
        unimplemented(self, "scale")

    def eq_mask(self, a: Any, b: Any) -> Any:
        """``a == b`` as a tensor of ``a``'s dtype (1 where equal, 0 elsewhere)."""
        unimplemented(self, "eq_mask")

    def mul(self, a: Any, b: Any) -> Any:
        unimplemented(self, "mul")

    def div(self, a: Any, b: Any) -> Any:
        unimplemented(self, "div")

    def exp(self, t: Any) -> Any:
        unimplemented(self, "exp")

    def log(self, t: Any) -> Any:
        unimplemented(self, "log")

    def amax(self, t: Any, dim: int | Sequence[int], keepdim: bool = False) -> Any:
        """The maximum over ``dim`` (an int or a sequence), as ``torch.amax``."""
        unimplemented(self, "amax")

    def amin(self, t: Any, dim: int | Sequence[int], keepdim: bool = False) -> Any:
        unimplemented(self, "amin")

    def sum(self, t: Any, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
        """The sum over ``dim`` (None: every element, a 0-d result), as ``torch.sum``."""
        unimplemented(self, "sum")

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """``a`` where ``cond`` else ``b`` (``b`` may be a python scalar), as ``torch.where``."""
        unimplemented(self, "where")

    def gather(self, t: Any, dim: int, index: Any) -> Any:
        """As ``torch.gather(t, dim, index)``: ``out[i][j] = t[i][index[i][j]]`` along ``dim``."""
        unimplemented(self, "gather")

    def take_rows(self, t: Any, index: Any) -> Any:
        """``t[index]``: rows of ``t`` along dim 0 picked by an integer tensor of any shape."""
        unimplemented(self, "take_rows")

    def stack(self, ts: Sequence[Any], dim: int) -> Any:
        unimplemented(self, "stack")

    def select(self, t: Any, dim: int, index: int) -> Any:
        """``t`` at ``index`` along ``dim``, which is removed (as ``torch.select``)."""
        unimplemented(self, "select")

    def unsqueeze(self, t: Any, dim: int) -> Any:
        unimplemented(self, "unsqueeze")

    def squeeze(self, t: Any, dim: int) -> Any:
        unimplemented(self, "squeeze")

    def transpose(self, t: Any, dim0: int, dim1: int) -> Any:
        unimplemented(self, "transpose")

    def movedim(self, t: Any, source: int, destination: int) -> Any:
        """``t`` with dim ``source`` moved to ``destination`` (a view; as ``torch.movedim``)."""
        unimplemented(self, "movedim")

    def reshape(self, t: Any, shape: Sequence[int]) -> Any:
        """``t`` viewed with ``shape`` (same elements, row-major; a view where possible)."""
        unimplemented(self, "reshape")

    def matmul(self, a: Any, b: Any) -> Any:
        unimplemented(self, "matmul")

    def grouped_mm(self, x: Any, w: Any, sizes: Sequence[int]) -> Any:
        """The grouped matrix product: ``x`` ``[S, K]`` holds ``sizes[g]`` rows for each
        group ``g`` in turn (``sum(sizes) == S``), ``w`` is ``[G, K, N]``; row block ``g``
        of the ``[S, N]`` result is ``x``'s block ``g`` times ``w[g]``. Default: a loop over
        the groups (``narrow`` + ``matmul``; a group of no rows costs nothing)."""
        outs, start = [], 0
        for g, s in enumerate(sizes):
            if s:
                outs.append(self.matmul(self.narrow(x, 0, start, s), self.select(w, 0, g)))
            start += s
        if not outs:  # no rows at all: an empty [0, N] result, still connected to x and w
            return self.matmul(self.narrow(x, 0, 0, 0), self.select(w, 0, 0))
        return outs[0] if len(outs) == 1 else self.cat(outs, 0)

    def softmax(self, t: Any, dim: int) -> Any:
        unimplemented(self, "softmax")

    def isfinite(self, t: Any) -> Any:
        unimplemented(self, "isfinite")

    def attention_lse(
        self, q: Any, k: Any, v: Any, causal: bool, scale: float
    ) -> tuple[Any, Any] | None:
        """A fused local attention returning ``(out, lse)`` — ``softmax(q k^T * scale) v``
        (``causal``: torch's top-left mask) and its log-sum-exp over the keys
        ``(..., L)`` — for ``q (..., H, L, E)``, ``k (..., H, S, E)``, ``v (..., H, S,
        Ev)``; or None where the platform has none (the kernels compose the math,
        :mod:`hyper_shard.kernels.attention_block`). Default: None."""
        return None

    def attention_lse_backward(
        self, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: float
    ) -> tuple[Any, Any, Any] | None:
        """``(dq, dk, dv)`` of :meth:`attention_lse` from the given ``out`` and ``lse``
        (which may be those of a larger attention the block is part of), or None
        (compose). Default: None."""
        return None

    def repeat_interleave(self, t: Any, repeats: int, dim: int) -> Any:
        unimplemented(self, "repeat_interleave")

    def full(self, shape: Sequence[int], value: Any, like: Any, dtype: Any = None) -> Any:
        """A new tensor of ``shape`` filled with ``value``, with ``like``'s dtype (or
        ``dtype``) and device."""
        unimplemented(self, "full")

    def argsort(self, t: Any) -> Any:
        """The indices (int64) that sort 1-D ``t`` ascending, equal values in their
        original order (a stable sort; not differentiable)."""
        unimplemented(self, "argsort")

    def bincount(self, t: Any, length: int) -> Any:
        """How many times each of ``0 .. length - 1`` occurs in the 1-D integer ``t``
        (int64, ``[length]``; values outside are not counted). Default: a comparison with
        ``arange(length)`` summed (``O(len(t) * length)``)."""
        with self.no_grad():
            hits = self.unsqueeze(t, 1) == self.unsqueeze(self.arange(0, length, t), 0)
            return self.sum(self.cast(hits, self.dtype_of(self.arange(0, 1, t))), 0)

    def tolist(self, t: Any) -> list[Any]:
        """The values of a small 1-D tensor as python numbers (a copy to the host)."""
        unimplemented(self, "tolist")

    def arange(self, start: int, end: int, like: Any) -> Any:
        """The integers ``[start, end)`` (int64) on ``like``'s device."""
        unimplemented(self, "arange")

    def new_tensor(
        self, kind: str, shape: Sequence[int], fill_value: Any, dtype: Any, device: Any = None
    ) -> Any:
        """A new plain tensor (kind: zeros/ones/empty/full/rand/randn) on the mesh's device
        type ``device``."""
        unimplemented(self, "new_tensor")

    def clone(self, t: Any) -> Any:
        """An owned contiguous copy of local ``t`` (differentiable; never a view)."""
        unimplemented(self, "clone", "cannot clone local tensors")

    def detach(self, t: Any) -> Any:
        unimplemented(self, "detach")

    def contiguous(self, t: Any) -> Any:
        unimplemented(self, "contiguous")

    def cast(self, t: Any, dtype: Any) -> Any:
        """``t`` converted to ``dtype`` (differentiable; a plain local tensor)."""
        unimplemented(self, "cast", "cannot cast local tensors (forward_dtype/backward_dtype)")

    def dropout(self, t: Any, p: float) -> Any:
        """The framework's own training-mode dropout of ``t`` (``input * mask / (1 - p)``),
        drawn from its default generator."""
        unimplemented(self, "dropout")

    def no_grad(self) -> AbstractContextManager[Any]:
        """A context in which the framework records no gradients."""
        unimplemented(self, "no_grad")

    def is_tensor(self, obj: Any) -> bool:
        unimplemented(self, "is_tensor")

    def is_dtype(self, obj: Any) -> bool:
        """True if ``obj`` is one of the framework's dtypes."""
        unimplemented(self, "is_dtype")

    def dtype_of(self, t: Any) -> Any:
        unimplemented(self, "dtype_of")

    def loss_precision(self, t: Any) -> Any:
        """``t`` in the precision the framework's autocast runs losses in (torch: float32
        for a half-precision input while autocast is on); ``t`` itself otherwise."""
        return t

    def assign(self, dst: Any, src: Any, no_grad: bool = False) -> Any:
        """Write ``src``'s values into the plain local tensor ``dst`` in place; returns
        ``dst``. ``no_grad``: outside autograd (as ``nn.init`` writes)."""
        unimplemented(self, "assign")

    def inplace_mul(self, dst: Any, other: Any) -> Any:
        """``dst *= other`` in place; returns ``dst``."""
        unimplemented(self, "inplace_mul")

    def put_rows_(self, dst: Any, index: Any, rows: Any) -> Any:
        """``dst[index] = rows`` in place along dim 0, outside autograd (``index`` a 1-D
        integer tensor, duplicates only with equal rows; ``rows`` of shape
        ``(len(index), *dst.shape[1:])``); returns ``dst``."""
        unimplemented(self, "put_rows_")

    def copy_plain(self, dst: Any, src: Any) -> None:
        """``dst`` (a plain local tensor, possibly a view) overwritten in place with ``src``
        (differentiable)."""
        unimplemented(self, "copy_plain", "cannot copy into local tensors")
