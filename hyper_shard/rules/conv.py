"""Convolutions (``rule: conv``): ``conv1d/2d/3d(input, weight, bias, stride, padding,
dilation, groups)`` and ``conv_transpose1d/2d/3d(input, weight, bias, stride, padding,
output_padding, groups, dilation)``, semantics as ``torch.nn.functional``'s (``padding``
may be ``'same'``/``'valid'``; an unbatched input has no batch dim).

Global shapes: input ``(N, C_in, *spatial)`` (or ``(C_in, *spatial)``); weight
``(C_out, C_in / groups, *k)``, transposed ``(C_in, C_out / groups, *k)``; bias ``(C_out,)``.
Per mesh dim:

* **batch-sharded** input -> batch-sharded output (weight and bias Replicate);
* **output channels** (``groups == 1``): weight sharded on its ``C_out`` dim (0, or 1
  transposed), bias on dim 0 -> output sharded on its channel dim;
* **input channels** (``groups == 1``): input sharded on ``C_in`` with the weight on its
  ``C_in`` dim (1, or 0 transposed) -> ``Partial(sum)`` output (each rank convolves its
  channels); the bias is made ``Partial(sum)`` too (a local step, no communication) so it is
  added once;
* ``Partial(sum|avg)`` input or weight (a convolution is linear in each) -> Partial output.

* **spatial** (sequence/height/width) shards are kept where no window crosses a shard
  boundary: a non-transposed convolution whose kernel equals its stride on that dim
  (``padding`` 0, ``dilation`` 1 there: a ViT patch embedding, a strided "patchify") keeps
  ``Shard(d)`` when every shard's size is a multiple of the stride and the output's
  ``torch.chunk`` layout is the shards' sizes divided by it (no communication).

Any other spatially sharded input is redistributed first, at the cheapest modelled cost
(to a batch or channel shard by an all-to-all, or gathered), as PyTorch DTensor does for a
placement an op cannot keep (never into a zero-padded ``Partial``: free to communicate,
but every rank would then convolve the whole tensor); windows that cross shard boundaries would need a halo
exchange of the neighbours' border rows, which hyper_shard does not implement (PyTorch
DTensor has one for the last spatial dim of 2-D convolutions).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import LINEAR_OPS, R, window_shards_align

__all__ = ["ConvOp", "ConvParams", "conv_output_shape"]


class ConvParams(RuleParams):
    """``dims``: spatial dims (1, 2 or 3); ``transposed``: a transposed convolution."""

    dims: Literal[1, 2, 3]
    transposed: bool = False


def _tuple(v: Any, n: int, what: str) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            v = v[0]
        else:
            if len(v) != n:
                raise ValueError(f"{what} must have {n} elements, got {list(v)}")
            return tuple(operator.index(x) for x in v)
    return (operator.index(v),) * n


def conv_output_shape(
    in_shape: Sequence[int],
    w_shape: Sequence[int],
    n: int,
    transposed: bool,
    stride: Any,
    padding: Any,
    dilation: Any,
    output_padding: Any = 0,
    groups: int = 1,
) -> tuple[int, ...]:
    """The output shape of a (transposed) convolution, as torch computes it.

    Raises:
        ValueError: arguments of the wrong length, or a non-positive output size.
    """
    batched = len(in_shape) == n + 2
    spatial = list(in_shape[-n:])
    k = list(w_shape[2:])
    s = _tuple(stride, n, "stride")
    d = _tuple(dilation, n, "dilation")
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"Invalid padding string {padding!r}, should be 'same' or 'valid'")
        out = (
            spatial
            if padding == "same"
            else [(L - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i, L in enumerate(spatial)]
        )
    else:
        p = _tuple(padding, n, "padding")
        if transposed:
            op = _tuple(output_padding, n, "output_padding")
            out = [
                (L - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1
                for i, L in enumerate(spatial)
            ]
        else:
            out = [
                (L + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i, L in enumerate(spatial)
            ]
    if any(o <= 0 for o in out):
        raise ValueError(
            f"the convolution's output size {out} is not positive (input {list(in_shape)}, "
            f"kernel {k})"
        )
    c_out = w_shape[1] * groups if transposed else w_shape[0]
    head = (in_shape[0], c_out) if batched else (c_out,)
    return (*head, *out)


@register_rule("conv")
class ConvOp(DistributedOp):
    """(Transposed) convolutions (see the module docstring).

    Raises:
        ShardingError: an input or weight that is not a DTensor next to DTensors, or shapes
            torch would reject.
    """

    Params = ConvParams
    signature = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    static_args = ("stride", "padding", "dilation", "groups")

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.transposed and self.params.signature is None:
            sig = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups",
                   "dilation")  # fmt: skip
            self.use_signature(sig)
            self.static_names = ("stride", "padding", "output_padding", "groups", "dilation")

    def _form(self, call: OpCall) -> tuple[Any, Any, int, int, int]:
        roles = call.arg_roles
        if "input" not in roles or "weight" not in roles:
            raise ShardingError(
                f"{call.describe()}: the input and the weight must both be DTensors on one "
                f"mesh; distribute the plain one (e.g. distribute_tensor(w, mesh, [Replicate()]))"
            )
        x, w = call.specs[roles.index("input")], call.specs[roles.index("weight")]
        n = self.params.dims
        if x.ndim not in (n + 1, n + 2) or w.ndim != n + 2:
            raise ShardingError(
                f"{call.describe()}: expected a {n + 1}-D (unbatched) or {n + 2}-D input and a "
                f"{n + 2}-D weight, got {x.ndim}-D and {w.ndim}-D"
            )
        batched = x.ndim == n + 2
        groups = operator.index(call.static.get("groups", call.get("groups", 1)) or 1)
        return x, w, (0 if batched else -1), (1 if batched else 0), groups

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        x, w, _, _, groups = self._form(call)
        st = call.static
        try:
            return [
                conv_output_shape(
                    x.shape,
                    w.shape,
                    self.params.dims,
                    self.params.transposed,
                    st.get("stride", call.get("stride", 1)) or 1,
                    st.get("padding", call.get("padding", 0)) or 0,
                    st.get("dilation", call.get("dilation", 1)) or 1,
                    st.get("output_padding", call.get("output_padding", 0)) or 0,
                    groups,
                )
            ]
        except (TypeError, ValueError) as e:
            raise ShardingError(f"{call.describe()}: {e}") from None

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        x, w, bdim, cdim, groups = self._form(call)
        roles = call.arg_roles
        ii, iw = roles.index("input"), roles.index("weight")
        ib = roles.index("bias") if "bias" in roles else None
        n = len(call.specs)
        tr = self.params.transposed
        w_out, w_in = (1, 0) if tr else (0, 1)

        def make(out: Placement, pin: Placement, pw: Placement, pb: Placement) -> SingleDimStrategy:
            ins: list[Placement] = [R] * n
            ins[ii], ins[iw] = pin, pw
            if ib is not None:
                ins[ib] = pb
            return ((out,), tuple(ins))

        out: list[SingleDimStrategy] = []
        if bdim >= 0:
            out.append(make(Shard(0), Shard(0), R, R))
        if groups == 1:
            out.append(make(Shard(cdim), R, Shard(w_out), Shard(0)))
            out.append(make(Partial("sum"), Shard(cdim), Shard(w_in), Partial("sum")))
        for op in LINEAR_OPS:
            out.append(make(Partial(op), Partial(op), R, Partial(op)))
            out.append(make(Partial(op), R, Partial(op), Partial(op)))
        for d in self._patch_dims(call, x, w, cdim):
            out.append(make(Shard(d), Shard(d), R, R))
        return out

    def _patch_dims(self, call: OpCall, x: Any, w: Any, cdim: int) -> list[int]:
        """The input's spatial dims where every window is its own stride-long piece
        (kernel == stride, padding 0, dilation 1; non-transposed): a shard of such a dim
        whose boundaries fall on window starts convolves locally."""
        if self.params.transposed:
            return []
        n = self.params.dims
        st = call.static
        try:
            k = tuple(w.shape[2:])
            s = _tuple(st.get("stride", call.get("stride", 1)) or 1, n, "stride")
            d = _tuple(st.get("dilation", call.get("dilation", 1)) or 1, n, "dilation")
            pad = st.get("padding", call.get("padding", 0)) or 0
            p = (
                (0,) * n
                if pad == "valid"
                else None
                if isinstance(pad, str)
                else _tuple(pad, n, "padding")
            )
        except (TypeError, ValueError):
            return []
        if p is None:
            return []
        return [cdim + 1 + i for i in range(n) if k[i] == s[i] and p[i] == 0 and d[i] == 1]

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        """A kept spatial shard tiles into whole windows (see ``window_shards_align``); a
        Partial input or weight only where the caller's was Partial (turning a shard into
        a zero-padded Partial costs no communication but makes every rank convolve the
        whole tensor)."""
        x, w, _, cdim, _ = self._form(call)
        for role, spec in (("input", x), ("weight", w)):
            tgt = inputs[call.arg_roles.index(role)]
            if tgt is not None and any(
                type(p) is Partial and type(q) is not Partial for p, q in zip(tgt, spec.placements)
            ):
                return False
        pl = inputs[call.arg_roles.index("input")]
        if pl is None:
            return True
        n = self.params.dims
        stride = _tuple(call.static.get("stride", call.get("stride", 1)) or 1, n, "stride")
        steps = {d: stride[d - cdim - 1] for d in self._patch_dims(call, x, w, cdim)}
        return window_shards_align(x.shape, pl, call.mesh.shape, steps, cdim + 1)

    def infer_layout(self, call: OpCall) -> Layout:
        layout = super().infer_layout(call)
        return _empty_shard_impl(call, layout, "bias" in call.arg_roles, self.params.dims)


def _local_shapes(call: OpCall, layout: Layout) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """This rank's local shapes of the (redistributed) inputs and of the output."""
    from ..spec import DTensorSpec, TensorMeta, contiguous_stride

    ins = [
        s.local_shape() if t is None else s.with_placements(t).local_shape()
        for s, t in zip(call.specs, layout.inputs)
    ]
    shape = layout.shapes[0]
    assert shape is not None and layout.outputs[0] is not None
    meta = TensorMeta(tuple(shape), contiguous_stride(shape), None)
    return ins, DTensorSpec(call.mesh, layout.outputs[0], meta).local_shape()


def _empty_shard_impl(call: OpCall, layout: Layout, has_bias: bool, dims: int = 0) -> Layout:
    """On a rank whose shard of an input or of the output is empty (a channel dim smaller
    than the mesh), torch's kernels return the wrong shape or raise: the local result is
    then the output's local zeros (plus the local bias on the channel dim), connected to the
    inputs for autograd (a zero gradient). ``dims``: the spatial dims (the channel dim is
    the one before them: 1 batched, 0 unbatched)."""
    if call.mesh.get_coordinate() is None:
        return layout
    ins, out = _local_shapes(call, layout)
    if all(0 not in s for s in ins) and 0 not in out:
        return layout
    layout.impl = _ZerosOut(out, max(len(out) - dims - 1, 0), has_bias)
    return layout


class _ZerosOut:
    """Zeros of the local output shape, plus a broadcast bias; connected to the inputs."""

    __slots__ = ("shape", "cdim", "has_bias")

    def __init__(self, shape: tuple[int, ...], cdim: int, has_bias: bool) -> None:
        self.shape, self.cdim, self.has_bias = shape, cdim, has_bias

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if hasattr(a, "new_zeros")]
        out = tensors[0].new_zeros(self.shape)
        for t in tensors:
            out = out + t.sum() * 0
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        if self.has_bias and bias is not None and 0 not in self.shape:
            view = [1] * len(self.shape)
            view[self.cdim] = -1
            out = out + bias.reshape(view)
        return out
