"""Discrete Fourier transforms (``rule: fft``, ``kind:`` picks the transform): the
``torch.fft`` functions ``fft``/``ifft``/``rfft``/``irfft``/``hfft``/``ihfft`` and their
``2``/``n`` forms, and ``fftshift``/``ifftshift``; semantics (argument names, defaults,
output sizes) as torch's.

* the transformed dims are gathered (a ``Shard`` of them becomes ``Replicate``): the local
  call sees whole signals, and ``n``/``s`` are the global lengths as they are;
* every other dim keeps its shard (its extent is unchanged, the transform maps each of its
  slices independently), unless some rank's shard would be empty (MKL's FFT rejects an
  empty batch): then it is gathered too;
* ``Partial`` is reduced first for the transforms (they are linear, but a Partial result
  would be complex for the real-input ones and a real ``irfft`` of a Partial would mix
  the parts' Hermitian completion; reducing first is always right); ``fftshift`` is a
  permutation, so ``Partial`` passes through it.

Output sizes along the transformed dims (``k`` the last one), from the signal sizes ``s``
(the given ``n``/``s``, else the input's sizes): ``c2c`` (fft, ifft): ``s``; ``r2c``
(rfft, ihfft): ``s`` with ``s[k] // 2 + 1``; ``c2r`` (irfft, hfft): ``s``, where ``s[k]``
defaults to ``2 * (size - 1)``. Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any, Literal

from ..dispatch.op import OpCall
from ..registry.models import RuleParams
from . import register_rule
from ._util import as_int
from .planned import OpPlan, PlannedOp, dims_arg, keep_strategies, no_empty_shards, partials_of

__all__ = ["FftOp", "FftParams"]


class FftParams(RuleParams):
    """``kind``: ``c2c``/``r2c``/``c2r`` (the transform's size rule) or ``shift``;
    ``ndims``: ``1`` (``n``, ``dim``), ``2`` (``s``, ``dim=(-2, -1)``) or ``n`` (``s``,
    ``dim=None``: every dim, or the last ``len(s)``)."""

    kind: Literal["c2c", "r2c", "c2r", "shift"]
    ndims: Literal["1", "2", "n"] = "1"


@register_rule("fft")
class FftOp(PlannedOp):
    """One ``torch.fft`` function (see the module docstring). Shapes are GLOBAL.

    Raises:
        ShardingError: ``s`` and ``dim`` of different lengths, or a repeated dim.
        IndexError: a dim out of range.
    """

    Params = FftParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.kind == "shift":
            self.use_signature(("input", "dim"), ("dim",))
        elif self.params.ndims == "1":
            self.use_signature(("input", "n", "dim", "norm"), ("n", "dim"))
        else:
            self.use_signature(("input", "s", "dim", "norm"), ("s", "dim"))

    def plan(self, call: OpCall) -> OpPlan:
        if len(call.specs) != 1:
            raise ValueError("only the input may be a DTensor")
        spec = call.specs[0]
        nd = spec.ndim
        st = call.static
        shape = list(spec.shape)
        if self.params.kind == "shift":
            dim = st.get("dim")
            dims = list(range(nd)) if dim is None else dims_arg(dim, nd, "dim")
            keep = {d: d for d in range(nd) if d not in dims}
            return OpPlan([tuple(shape)], keep_strategies([keep], 1, partials_of([spec])))
        sizes: list[int | None]
        if self.params.ndims == "1":
            dim = st.get("dim")
            dims = dims_arg(-1 if dim is None else dim, nd, "dim")
            n = st.get("n")
            sizes = [None if n is None else as_int(n, "n")]
        else:
            s, dim = st.get("s"), st.get("dim")
            if dim is None and self.params.ndims == "2":
                dim = (-2, -1)
            if dim is None:
                dims = list(range(nd)) if s is None else list(range(nd - len(s), nd))
                dims = dims_arg(dims, nd, "dim") if dims else []
            else:
                dims = dims_arg(dim, nd, "dim")
            if s is None:
                sizes = [None] * len(dims)
            else:
                sizes = [None if v == -1 else as_int(v, "s") for v in s]
                if len(sizes) != len(dims):
                    raise ValueError(
                        f"s and dim must have the same length, got s={list(s)} and dim={dim!r}"
                    )
        for i, (d, v) in enumerate(zip(dims, sizes)):
            last = i == len(dims) - 1
            if v is None:
                v = 2 * (shape[d] - 1) if last and self.params.kind == "c2r" else shape[d]
            if v < 1:
                raise ValueError(f"invalid number of data points ({v}) specified")
            shape[d] = v // 2 + 1 if last and self.params.kind == "r2c" else v
        keep = {d: d for d in range(nd) if d not in dims}
        # MKL's FFT rejects an empty batch: no rank may hold an empty shard
        return OpPlan([tuple(shape)], keep_strategies([keep], 1), accept=no_empty_shards([spec]))
