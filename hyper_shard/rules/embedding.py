"""Embedding lookups (``rule: embedding``): ``torch.nn.functional.embedding(input, weight,
padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)`` (``kind: embedding``, the
default) and the same lookup along any axis, ``Gather(params, indices, axis, batch_dims)``
(``kind: gather``: MindSpore's ``ops.gather``/``ops.Gather``, which ``nn.Embedding`` runs;
``numpy.take`` semantics, ``batch_dims`` 0). An embedding is the gather of a 2-D weight
along axis 0. Canonical names: ``input`` the indices, ``weight`` the looked-up tensor.

Per mesh dim (semantics as the op on the global tensors; ``a`` the axis, ``k`` the
indices' rank; the output is ``weight.shape[:a] + input.shape + weight.shape[a+1:]``):

* indices sharded on a dim ``j``, weight Replicate -> output sharded on ``a + j``;
* indices Replicate, weight sharded on a dim ``d != a`` (an embedding's column-sharded
  ``Shard(1)``) -> output sharded on ``d`` (``d < a``) or ``d + k - 1`` (its last dim);
* indices Replicate, weight sharded on the lookup axis (an embedding's row-sharded
  ``Shard(0)``, vocab-parallel) -> output ``Partial(sum)``: each rank looks up the rows it
  holds; indices outside its range read local row 0 and are masked to zero (so they
  contribute neither a value nor a gradient); ``padding_idx`` is passed to the rank
  holding that row only, shifted to its local index;
* indices Replicate, weight ``Partial(op)`` -> output ``Partial(op)`` (a row selection
  commutes with every elementwise reduction).

The dense backward is local autograd: a row-sharded weight gets a row-sharded gradient, a
Replicate weight a Partial(sum) one (the sum of every rank's lookups), as single-device.
``scale_grad_by_freq`` needs every index on every rank (counts are global), so the indices
are gathered and the weight is not row-sharded. ``max_norm`` renormalises the looked-up
weight rows in place (``torch.embedding_renorm_``: outside autograd), so the weight never
moves and the indices are gathered: with a Replicate weight every rank renormalises
identically; with a row-sharded weight each rank renormalises the looked-up rows it holds
(exactly the rows single-device torch changes, on their owners) and the lookup is
vocab-parallel as above; with a column-sharded weight (``Shard(1)``, alone or with
``Shard(0)`` on other mesh dims) each row's norm is completed over the column shards by one
all-reduce of the partial ``sum |w|^p`` (``norm_type`` p; max/min for +-inf) and each rank
rescales its slice (``kernels/embedding_renorm.py``). A ``Partial`` weight raises, and so
does ``scale_grad_by_freq`` with a row-sharded one (the counts need every index).
"""

from __future__ import annotations

from typing import Any, Literal

from ..dispatch.op import Binder, Layout, OpCall
from ..errors import ShardingError
from ..kernels import groups_of
from ..kernels.embedding_renorm import ShardedEmbeddingRenorm
from ..placement import Partial, Shard
from ..registry.models import RuleParams
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._util import R, normalize_dim
from .planned import OpPlan, PlannedOp, as_int, partials_of

__all__ = ["EmbeddingOp", "EmbeddingParams", "VocabParallelLookup"]

_PSUM = Partial("sum")

_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "embedding": (
        ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"),
        ("padding_idx", "max_norm", "scale_grad_by_freq"),
    ),
    "gather": (("weight", "input", "axis", "batch_dims"), ("axis", "batch_dims")),
}


class VocabParallelLookup:
    """The local lookup of a weight sharded on its lookup axis, holding global rows
    ``[lo, lo + rows)`` of ``vocab``: indices shifted to local rows, those outside masked to
    row 0 and their output rows zeroed; ``padding_idx`` passed only where it is local.
    Called like the op it replaces (the same arguments, local tensors): only the indices
    (and ``padding_idx``) are replaced before calling it."""

    __slots__ = ("func", "binder", "lo", "rows", "vocab", "axis")

    def __init__(
        self, func: Any, binder: Binder, lo: int, rows: int, vocab: int, axis: int = 0
    ) -> None:
        self.func, self.binder, self.lo, self.rows, self.vocab = func, binder, lo, rows, vocab
        self.axis = axis

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b, a = self.binder, self.axis
        ids = b.get(args, kwargs, "input")
        weight = b.get(args, kwargs, "weight")
        wshape = tuple(weight.shape)
        ishape = tuple(ids.shape)
        if self.rows == 0:  # an empty shard: zeros, still connected to the (empty) weight
            out = weight.new_zeros((*wshape[:a], *ishape, *wshape[a + 1 :]))
            return out + weight.sum() * 0
        local = ids - self.lo
        outside = (local < 0) | (local >= self.rows)
        if b.get(args, kwargs, "max_norm") is not None:
            # renormalise only the rows this rank holds that are looked up (a lookup of
            # them alone does it, in place, as torch), then look up without max_norm
            a2, k2 = b.replace(args, kwargs, "input", local[~outside])
            a2, k2 = b.replace(a2, k2, "padding_idx", None)  # maybe not a local row
            self.func(*a2, **k2)
            args, kwargs = b.replace(args, kwargs, "max_norm", None)
        args, kwargs = b.replace(args, kwargs, "input", local.masked_fill(outside, 0))
        pad = b.get(args, kwargs, "padding_idx")
        if pad is not None:
            p = pad + self.vocab if pad < 0 else pad
            lpad = p - self.lo if self.lo <= p < self.lo + self.rows else None
            args, kwargs = b.replace(args, kwargs, "padding_idx", lpad)
        out = self.func(*args, **kwargs)
        mask = outside.reshape((1,) * a + ishape + (1,) * (len(wshape) - a - 1))
        return out.masked_fill(mask, 0)


class EmbeddingParams(RuleParams):
    """``kind``: ``embedding`` (torch's argument order, 2-D weight, axis 0) or ``gather``
    (``Gather(params, indices, axis, batch_dims)``, any rank, any axis)."""

    kind: Literal["embedding", "gather"] = "embedding"


@register_rule("embedding")
class EmbeddingOp(PlannedOp):
    """Lookups of ``weight`` entries by integer ``input`` indices (see the module
    docstring). Global output shape: ``weight.shape[:axis] + input.shape +
    weight.shape[axis+1:]`` (an embedding: ``input.shape + (weight.shape[1],)``).

    Raises:
        ShardingError: indices or weight that are not DTensors, an embedding weight that is
            not 2-D, indices that are not integers, ``batch_dims`` other than 0, or
            ``max_norm`` with a Partial weight (or with ``scale_grad_by_freq`` and a
            row-sharded one).
        IndexError: an axis out of range.
    """

    Params = EmbeddingParams
    signature = _SIGNATURES["embedding"][0]
    static_args = _SIGNATURES["embedding"][1]

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        self.use_signature(*_SIGNATURES[self.params.kind])

    def plan(self, call: OpCall) -> OpPlan:
        roles = call.arg_roles
        if sorted(roles) != ["input", "weight"]:
            raise ShardingError(
                f"{call.describe()}: {self.name} needs both the indices and the looked-up tensor "
                f"as DTensors on one mesh; distribute the plain one (e.g. distribute_tensor(ids, "
                f"mesh, [Replicate()]))"
            )
        ii, iw = roles.index("input"), roles.index("weight")
        ids, w = call.specs[ii], call.specs[iw]
        gather = self.params.kind == "gather"
        if gather:
            if w.ndim == 0:
                raise ShardingError(f"{call.describe()}: the looked-up tensor must not be 0-d")
            axis = normalize_dim(as_int(call.static.get("axis", 0), "axis"), w.ndim, "axis")
            if as_int(call.static.get("batch_dims") or 0, "batch_dims") != 0:
                raise ShardingError(
                    f"{call.describe()}: batch_dims other than 0 is not supported; gather each "
                    f"batch separately, or use batch_dims=0 with offset indices"
                )
        else:
            if w.ndim != 2:
                raise ShardingError(f"{call.describe()}: 'weight' must be 2-D, got {w.ndim}-D")
            axis = 0
        name = str(ids.dtype).rsplit(".", 1)[-1].lower()
        if not name.startswith(("int", "uint", "long")):
            raise ShardingError(
                f"{call.describe()}: Expected tensor for argument 'indices' to have one of the "
                f"following scalar types: Long, Int; but got {ids.dtype} instead"
            )
        k = ids.ndim
        out_shape = (*w.shape[:axis], *ids.shape, *w.shape[axis + 1 :])
        max_norm = call.static.get("max_norm")
        by_freq = bool(call.static.get("scale_grad_by_freq"))

        def pair(pi: Any, pw: Any) -> tuple:
            ins = [R, R]
            ins[ii], ins[iw] = pi, pw
            return tuple(ins)

        if max_norm is not None:
            return self._max_norm_plan(call, ii, iw, out_shape, by_freq)
        strategies: list = []
        if not by_freq:
            strategies += [((Shard(axis + j),), pair(Shard(j), R)) for j in range(k)]
        for d in range(w.ndim):
            if d != axis:
                strategies.append(((Shard(d if d < axis else d + k - 1),), pair(R, Shard(d))))
        if not by_freq:
            strategies.append(((_PSUM,), pair(R, Shard(axis))))
        strategies += [((p,), pair(R, p)) for p in partials_of([w])]
        return OpPlan([out_shape], strategies, local=self._vocab_local(call, iw, w, axis))

    def _max_norm_plan(
        self, call: OpCall, ii: int, iw: int, out_shape: tuple, by_freq: bool
    ) -> OpPlan:
        """``max_norm`` renormalises the looked-up weight rows in place, so the weight never
        moves; the indices are gathered so every rank renormalises the rows it holds that
        any rank looks up. A row-sharded weight (``Shard(0)``) renormalises each row on its
        owner (vocab-parallel lookup, ``Partial(sum)``); a column-sharded one (``Shard(1)``)
        completes each row's norm over its column shards (one all-reduce,
        :class:`~hyper_shard.kernels.embedding_renorm.ShardedEmbeddingRenorm`) and gives
        an output sharded on its last dim."""
        w = call.specs[iw]
        row, col = Shard(0), Shard(1)
        bad = [p for p in w.placements if p != row and p != col and type(p) is not type(R)]
        if bad:
            raise ShardingError(
                f"{call.describe()}: max_norm renormalises the looked-up weight rows in "
                f"place, from each row's whole norm: the weight must be Replicate, row-sharded "
                f"(Shard(0)) or column-sharded (Shard(1)), not {bad[0]}; redistribute the "
                f"weight or drop max_norm"
            )
        if by_freq and row in w.placements:
            raise ShardingError(
                f"{call.describe()}: scale_grad_by_freq counts every index, which a "
                f"row-sharded (Shard(0)) weight cannot see, and max_norm keeps the weight "
                f"where it is; redistribute the weight to Replicate or Shard(1), or drop one "
                f"of the two options"
            )

        def pair(pw: Any) -> tuple:
            ins = [R, R]
            ins[iw] = pw
            return tuple(ins)

        strategies: list = []
        if row in w.placements:
            strategies.append(((_PSUM,), pair(row)))
        if col in w.placements:
            strategies.append(((Shard(call.specs[ii].ndim),), pair(col)))
        plan = OpPlan([out_shape], strategies, fixed=(iw,))
        if strategies:
            plan.local = self._renorm_local(call, iw, w)
        return plan

    def _renorm_local(self, call: OpCall, iw: int, w: Any) -> Any:
        """The step installing the max_norm lookup of a sharded weight: the vocab-parallel
        lookup (which renormalises its own rows) and, where columns are sharded, the
        renormalisation over the column shards before it."""
        vocab = self._vocab_local(call, iw, w, 0)
        mesh = call.mesh
        binder = call.binder or self.binder

        def local(layout: Layout) -> Layout:
            wt = layout.inputs[iw] or w.placements
            coord = mesh.get_coordinate()
            cols = [m for m, p in enumerate(wt) if p == Shard(1)]
            layout = vocab(layout)
            if coord is None or not cols:
                return layout
            ls, off = compute_local_shape_and_offset(w.shape, mesh.shape, wt, coord)
            lookup = layout.impl if layout.impl is not None else call.func
            layout.impl = ShardedEmbeddingRenorm(
                lookup, binder, mesh.platform, (off[0], ls[0], w.shape[0]), groups_of(mesh, cols)
            )
            return layout

        return local

    def _vocab_local(self, call: OpCall, iw: int, w: Any, axis: int) -> Any:
        """The step installing :class:`VocabParallelLookup` where the decided weight layout
        shards the lookup axis."""
        mesh = call.mesh
        binder = call.binder or self.binder
        func = call.func

        def local(layout: Layout) -> Layout:
            wt = layout.inputs[iw] or w.placements
            coord = mesh.get_coordinate()
            if coord is None or not any(p == Shard(axis) for p in wt):
                return layout
            ls, off = compute_local_shape_and_offset(w.shape, mesh.shape, wt, coord)
            layout.impl = VocabParallelLookup(
                func, binder, off[axis], ls[axis], w.shape[axis], axis
            )
            return layout

        return local
