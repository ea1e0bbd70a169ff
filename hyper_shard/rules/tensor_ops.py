"""Tensor ops that move, join, split or mask whole slices: cat/concat, stack, split, chunk,
unbind, narrow, select, flip, unfold (Tensor.unfold), repeat, triu/tril (``rule: tensor_op``, ``kind:`` picks the op).

Semantics (global shapes, dims, errors) are those of the torch functions of the same names.
How a layout is decided:

* the dims the op *touches* (the cat/split/narrow/select/flip/unfold dim, a repeated dim) are
  gathered to Replicate: the op's local call then sees the whole extent of that dim and its
  global arguments (split sizes, narrow start, select index) are right as they are;
* every other dim keeps its shard (moved to its output position): its extent is unchanged,
  so the local pieces are exactly the ``torch.chunk`` shards of the output;
* ``Partial(op)`` stays ``Partial(op)`` for every reduce op (these ops only move, repeat or
  zero elements, which commutes with an elementwise reduction over ranks); cat/stack need
  every input Partial with the same op;
* triu/tril keep shards on the matrix dims too: the local call gets the diagonal shifted
  by the shard's global row/column offsets (``diagonal + row_offset - col_offset``), a
  rank-local argument (:attr:`~hyper_shard.dispatch.op.Layout.overrides`).

Each ``kind`` is one planner method registered in the family's kind table (its canonical
signature and static arguments next to it); the base, :class:`~.planned.PlannedOp`,
searches the cheapest input placements for the plan.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, field_validator

from ..dispatch.op import Layout, OpCall
from ..dispatch.views import ViewOf
from ..errors import ShardingError
from ..placement import Shard
from ..registry.models import RuleParams
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._kinds import KindTable
from ._util import chunk_sizes_torch, normalize_dim, split_sizes
from .planned import (
    OpPlan,
    PlannedOp,
    ValueDependentShape,
    as_int,
    dims_arg,
    keep_strategies,
    partials_of,
)

__all__ = ["TensorOp", "TensorOpParams", "split_sizes", "chunk_sizes_torch"]


_KINDS = KindTable("tensor_op")


class TensorOpParams(RuleParams):
    """``kind``: which op the entry is (see the module docstring). ``outputs``: how many
    tensors the op returns (``sort``: values and indices; ``argsort``: 1). ``linear``: a
    ``scan`` that is linear in its input (``cumsum``), so ``Partial(sum)`` passes through.
    ``copies``: the op returns new tensors where its namesake returns views (the ``*_copy``
    variants, ``unsafe_split``): in-place writes to a result never reach the input.
    ``flatten_none``: a ``scan`` called with dim=None scans the flattened input (numpy's
    ``cumsum``; torch's needs a dim): every dim is gathered, the output is 1-D."""

    kind: str
    outputs: int = Field(default=1, ge=1)
    linear: bool = False
    copies: bool = False
    #: a ``scan`` whose dim=None scans the flattened input (numpy's ``cumsum(axis=None)``)
    flatten_none: bool = False

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        return _KINDS.validate(v)


@register_rule("tensor_op")
class TensorOp(PlannedOp):
    """cat, stack, split, chunk, unbind, narrow, select, flip, repeat, triu, tril; semantics
    as the torch functions of those names, on GLOBAL shapes (see the module docstring).

    Raises:
        ShardingError: arguments torch would reject for the global shapes (sizes that do not
            add up, mismatched cat shapes...), naming the call and its placements.
        IndexError: a dim out of range for the global rank.
        TypeError: a non-integer size, dim or index.
    """

    Params = TensorOpParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        k = _KINDS[self.params.kind]
        self.use_signature(k.signature, k.static)

    def plan(self, call: OpCall) -> OpPlan:
        plan = _KINDS[self.params.kind].plan(self, call, call.static)
        if self.params.copies:
            plan.view = None
        return plan

    # -- join ---------------------------------------------------------------------
    def _no_plain_members(self, call: OpCall) -> None:
        # a 0-d plain tensor in the tensor list reaches the rule as a "scalar"; it is a
        # member of the result, so the global shape would be wrong without it
        plain = [n for n in call.scalars if n.startswith("tensors[")]
        if plain:
            raise ShardingError(
                f"{call.describe()}: {plain[0]} is a plain tensor in a list of DTensors; "
                f"convert it with distribute_tensor(t, mesh, [Replicate()]) first, or call "
                f"inside `with hyper_shard.experimental.implicit_replication():`"
            )

    @_KINDS.kind("cat", ("tensors", "dim"), ("dim", "axis"))
    def _plan_cat(self, call: OpCall, st: dict) -> OpPlan:
        self._no_plain_members(call)
        specs = call.specs
        # torch.cat skips legacy 1-D empty tensors of shape (0,) next to tensors of other rank
        real = [s.ndim != 1 or s.shape != (0,) for s in specs]
        if not any(real):
            real = [True] * len(specs)
        main = [s for s, r in zip(specs, real) if r]
        ndim = main[0].ndim
        if ndim == 0:
            raise ValueError("zero-dimensional tensor cannot be concatenated")
        dim = normalize_dim(as_int(_pick(st, "dim", "axis", 0), "dim"), ndim, "dim")
        for s in main:
            if s.ndim != ndim or any(
                a != b for k, (a, b) in enumerate(zip(s.shape, main[0].shape)) if k != dim
            ):
                raise ValueError(
                    f"torch.cat: sizes of tensors must match except in dimension {dim}; got "
                    f"{[list(x.shape) for x in main]}"
                )
        shape = list(main[0].shape)
        shape[dim] = sum(s.shape[dim] for s in main)
        keep = {d: d for d in range(ndim) if d != dim}
        maps = [keep if r else None for r in real]
        return OpPlan([tuple(shape)], keep_strategies(maps, 1, partials_of(main), real))

    @_KINDS.kind("stack", ("tensors", "dim"), ("dim", "axis"))
    def _plan_stack(self, call: OpCall, st: dict) -> OpPlan:
        self._no_plain_members(call)
        specs = call.specs
        shape = specs[0].shape
        if any(s.shape != shape for s in specs):
            raise ValueError(
                f"stack expects each tensor to be equal size, got {[list(s.shape) for s in specs]}"
            )
        dim = normalize_dim(as_int(_pick(st, "dim", "axis", 0), "dim"), len(shape) + 1, "dim")
        keep = {d: d + (d >= dim) for d in range(len(shape))}
        out = (*shape[:dim], len(specs), *shape[dim:])
        return OpPlan([out], keep_strategies([keep] * len(specs), 1, partials_of(specs)))

    # -- split --------------------------------------------------------------------
    def _one(self, call: OpCall) -> Any:
        if len(call.specs) != 1:
            raise ShardingError(
                f"{call.describe()}: {self.name} takes one DTensor input; pass the other "
                f"arguments as python values"
            )
        return call.specs[0]

    def _split_plan(
        self,
        spec: Any,
        dim: int,
        sizes: list[int],
        drop: bool = False,
        starts: list[int] | None = None,
    ) -> OpPlan:
        """Pieces of ``sizes`` along ``dim`` (consecutive, or at ``starts``); other dims keep
        their shards; ``drop``: each piece loses the dim (unbind)."""
        shapes = []
        for n in sizes:
            s = list(spec.shape)
            if drop:
                del s[dim]
            else:
                s[dim] = n
            shapes.append(tuple(s))
        keep = {d: d - (drop and d > dim) for d in range(spec.ndim) if d != dim}
        at = starts if starts is not None else [sum(sizes[:i]) for i in range(len(sizes))]
        lead = (slice(None),) * dim

        def index(i: int) -> tuple:  # piece i of the input, as a basic index
            return (*lead, at[i]) if drop else (*lead, slice(at[i], at[i] + sizes[i]))

        return OpPlan(
            shapes,
            keep_strategies([keep], len(sizes), partials_of([spec])),
            view=ViewOf(index),
        )

    @_KINDS.kind(
        "split",
        ("input", "split_size", "dim"),
        ("split_size", "split_size_or_sections", "split_sizes", "dim"),
    )
    def _plan_split(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        split = _pick(st, "split_size", "split_size_or_sections", None)
        if split is None:
            split = st.get("split_sizes")
        if split is None:
            raise TypeError("split needs split_size_or_sections")
        dim = normalize_dim(as_int(_pick(st, "dim", None, 0), "dim"), spec.ndim, "dim")
        return self._split_plan(spec, dim, split_sizes(spec.shape[dim], split))

    @_KINDS.kind("chunk", ("input", "chunks", "dim"), ("chunks", "dim"))
    def _plan_chunk(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        chunks = as_int(st.get("chunks"), "chunks")
        dim = normalize_dim(as_int(_pick(st, "dim", None, 0), "dim"), spec.ndim, "dim")
        return self._split_plan(spec, dim, chunk_sizes_torch(spec.shape[dim], chunks))

    @_KINDS.kind("unbind", ("input", "dim"), ("dim",))
    def _plan_unbind(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        dim = normalize_dim(as_int(_pick(st, "dim", None, 0), "dim"), spec.ndim, "dim")
        return self._split_plan(spec, dim, [1] * spec.shape[dim], drop=True)

    # -- slices -------------------------------------------------------------------
    @_KINDS.kind("narrow", ("input", "dim", "start", "length"), ("dim", "start", "length"))
    def _plan_narrow(self, call: OpCall, st: dict) -> OpPlan:
        spec = call.specs[0]
        # start may be a 0-d DTensor (torch.narrow takes a 0-d tensor start): it is
        # gathered and the local call reads it; the output shape does not depend on it
        extra = call.specs[1:]
        if call.arg_roles[0] != "input" or any(
            s.ndim != 0 or r != "start" for s, r in zip(extra, call.arg_roles[1:])
        ):
            self._one(call)
        dim = normalize_dim(as_int(st.get("dim"), "dim"), spec.ndim, "dim")
        n = spec.shape[dim]
        length = as_int(st.get("length"), "length")
        start = None if extra else as_int(st.get("start"), "start")
        if start is not None and start < 0:
            start += n
        lo = 0 if start is None else start
        if not (0 <= lo <= n and 0 <= length <= n - lo):
            raise IndexError(
                f"narrow: start ({start}) + length ({length}) exceeds dimension size ({n})"
            )
        shape = list(spec.shape)
        shape[dim] = length
        keep = {d: d for d in range(spec.ndim) if d != dim}
        maps: list[dict[int, int] | None] = [keep] + [None] * len(extra)
        flags = [True] + [False] * len(extra)
        piece = (*(slice(None),) * dim, slice(lo, lo + length))
        return OpPlan(
            [tuple(shape)],
            keep_strategies(maps, 1, partials_of([spec]), flags),
            view=ViewOf(None if extra else lambda i: piece),
        )

    @_KINDS.kind("select", ("input", "dim", "index"), ("dim", "index"))
    def _plan_select(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        if spec.ndim == 0:
            raise IndexError("select() cannot be applied to a 0-dim tensor")
        dim = normalize_dim(as_int(st.get("dim"), "dim"), spec.ndim, "dim")
        n, i = spec.shape[dim], as_int(st.get("index"), "index")
        if not -n <= i < n:
            raise IndexError(
                f"select(): index {i} out of range for tensor of size {n} at dim {dim}"
            )
        shape = spec.shape[:dim] + spec.shape[dim + 1 :]
        keep = {d: d - (d > dim) for d in range(spec.ndim) if d != dim}
        at = (*(slice(None),) * dim, i)
        return OpPlan(
            [shape], keep_strategies([keep], 1, partials_of([spec])), view=ViewOf(lambda _: at)
        )

    @_KINDS.kind("flip", ("input", "*dims"), ("dims",))
    def _plan_flip(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        dims = st.get("dims")
        if dims is None:
            raise TypeError("flip needs dims")
        flipped = set(dims_arg(dims, spec.ndim, "flip"))
        keep = {d: d for d in range(spec.ndim) if d not in flipped}
        return OpPlan([spec.shape], keep_strategies([keep], 1, partials_of([spec])))

    @_KINDS.kind("unfold", ("input", "dimension", "size", "step"), ("dimension", "size", "step"))
    def _plan_unfold(self, call: OpCall, st: dict) -> OpPlan:
        # Tensor.unfold(dimension, size, step): the unfolded dim (gathered) becomes the
        # window count, a new last dim the window; the other dims keep their shards; a view
        # that only selects elements, so Partial values pass through
        spec = self._one(call)
        if st.get("dimension") is None or st.get("size") is None or st.get("step") is None:
            raise TypeError("unfold needs dimension, size and step")
        nd = max(spec.ndim, 1)
        dim = normalize_dim(as_int(st["dimension"], "dimension"), nd, "dimension")
        size, step = as_int(st["size"], "size"), as_int(st["step"], "step")
        n = spec.shape[dim] if spec.ndim else 1
        if size < 0 or size > n:
            raise ValueError(
                f"maximum size for tensor at dimension {dim} is {n} but size is {size}"
            )
        if step <= 0:
            raise ValueError(f"step is {step} but must be > 0")
        shape = list(spec.shape)
        if spec.ndim:
            shape[dim] = (n - size) // step + 1
        keep = {d: d for d in range(spec.ndim) if d != dim}
        return OpPlan(
            [(*shape, size)], keep_strategies([keep], 1, partials_of([spec])), view=ViewOf()
        )

    @_KINDS.kind("tile", ("input", "*dims"), ("dims",))
    def _plan_tile(self, call: OpCall, st: dict) -> OpPlan:
        # torch.tile: Tensor.repeat with the reps left-padded by ones to the tensor's rank
        spec = self._one(call)
        raw = st.get("dims")
        reps = [as_int(r, "dims") for r in (raw if isinstance(raw, (list, tuple)) else [raw])]
        reps = [1] * (spec.ndim - len(reps)) + reps
        return self._plan_repeat(call, {"repeats": reps})

    @_KINDS.kind("repeat", ("input", "*repeats"), ("repeats",))
    def _plan_repeat(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        raw = st.get("repeats")
        reps = [as_int(r, "repeats") for r in (raw if isinstance(raw, (list, tuple)) else [raw])]
        if len(reps) < spec.ndim:
            raise ValueError(
                "Number of dimensions of repeat dims can not be smaller than number of "
                "dimensions of tensor"
            )
        if any(r < 0 for r in reps):
            raise ValueError(f"repeat: repeats must be non-negative, got {reps}")
        lead = len(reps) - spec.ndim
        shape = tuple(reps[:lead]) + tuple(n * r for n, r in zip(spec.shape, reps[lead:]))
        keep = {d: d + lead for d in range(spec.ndim) if reps[lead + d] == 1}
        return OpPlan([shape], keep_strategies([keep], 1, partials_of([spec])))

    # -- along one dim: scans, sorts, rolls ---------------------------------------
    def _along(
        self, spec: Any, touched: set[int], shape: tuple[int, ...], partials: list
    ) -> OpPlan:
        # the touched dims are gathered where they are sharded (as PyTorch DTensor), not
        # moved to another dim: follow=True
        keep = {d: d for d in range(spec.ndim) if d not in touched}
        n = self.params.outputs
        return OpPlan([shape] * n, keep_strategies([keep], n, partials), follow=True)

    @_KINDS.kind("scan", ("input", "dim"), ("dim",))
    def _plan_scan(self, call: OpCall, st: dict) -> OpPlan:
        # cumsum/cumprod/cummax/cummin/logcumsumexp: the scanned dim is gathered; only a
        # linear scan (cumsum) lets Partial(sum) through
        spec = self._one(call)
        sums = [p for p in partials_of([spec]) if p.reduce_op == "sum"]
        if st.get("dim") is None:
            if not self.params.flatten_none:
                raise TypeError(f"{self.name} needs dim")
            # dim=None scans the flattened input (numpy's cumsum): every dim is gathered
            shape = (math.prod(spec.shape),)
            n = self.params.outputs
            return OpPlan([shape] * n, keep_strategies([{}], n, sums if self.params.linear else []))
        dim = normalize_dim(as_int(st["dim"], "dim"), max(spec.ndim, 1), "dim")
        return self._along(spec, {dim}, spec.shape, sums if self.params.linear else [])

    @_KINDS.kind("sort", ("input", "dim", "descending"), ("dim",))
    def _plan_sort(self, call: OpCall, st: dict) -> OpPlan:
        # sort/argsort/msort: the sorted dim is gathered; never Partial (not linear)
        spec = self._one(call)
        dim = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), max(spec.ndim, 1), "dim")
        return self._along(spec, {dim} if spec.ndim else set(), spec.shape, [])

    @_KINDS.kind("topk", ("input", "k", "dim", "largest", "sorted"), ("k", "dim"))
    def _plan_topk(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        k = as_int(st.get("k"), "k")
        dim = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), max(spec.ndim, 1), "dim")
        n = spec.shape[dim] if spec.ndim else 1
        if not 0 <= k <= n:
            raise IndexError(f"topk: selected index k ({k}) out of range for dim of size {n}")
        shape = list(spec.shape)
        if spec.ndim:
            shape[dim] = k
        return self._along(spec, {dim} if spec.ndim else set(), tuple(shape), [])

    @_KINDS.kind("kthvalue", ("input", "k", "dim", "keepdim"), ("k", "dim", "keepdim"))
    def _plan_kthvalue(self, call: OpCall, st: dict) -> OpPlan:
        # torch.kthvalue / torch.median(x, dim) / torch.mode(x, dim): (values, indices)
        # along one dim, which is gathered; other dims keep their shards
        spec = self._one(call)
        nd = max(spec.ndim, 1)
        dim = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), nd, "dim")
        keepdim = bool(st.get("keepdim"))
        if "k" in self.binder.pos:
            k = as_int(st.get("k"), "k")
            n = spec.shape[dim] if spec.ndim else 1
            if not 1 <= k <= n:
                raise IndexError(f"kthvalue(): selected number k={k} out of range for dim {dim}")
        shape = list(spec.shape)
        if spec.ndim:
            if keepdim:
                shape[dim] = 1
            else:
                del shape[dim]
        keep = {d: (d if keepdim or d < dim else d - 1) for d in range(spec.ndim) if d != dim}
        return OpPlan([tuple(shape)] * 2, keep_strategies([keep], 2, []), follow=True)

    @_KINDS.kind("roll", ("input", "shifts", "dims"), ("shifts", "dims"))
    def _plan_roll(self, call: OpCall, st: dict) -> OpPlan:
        # rolled dims are gathered; dims=None rolls the flattened tensor: every dim is
        # gathered. Elements only move, so every Partial passes through.
        spec = self._one(call)
        shifts, dims = st.get("shifts"), st.get("dims")
        if shifts is None:
            raise TypeError("roll needs shifts")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            touched = set(range(spec.ndim))
        else:
            n_sh = len(shifts) if isinstance(shifts, (list, tuple)) else 1
            dl = dims_arg(dims, spec.ndim, "roll") if spec.ndim else []
            if n_sh != len(dl):
                raise ValueError(
                    f"roll: shifts and dimensions must align. shifts: {n_sh}, dims: {len(dl)}"
                )
            touched = set(dl)
        return self._along(spec, touched, spec.shape, partials_of([spec]))

    @_KINDS.kind("pad", ("input", "pad", "mode", "value"), ("pad", "mode", "value"))
    def _plan_pad(self, call: OpCall, st: dict) -> OpPlan:
        # torch.nn.functional.pad: padded dims are gathered (their extent changes); the
        # others keep their shards. Padding only moves, copies or adds elements: a Partial
        # passes through unless a nonzero constant is added (it would be counted per rank).
        spec = self._one(call)
        pad = st.get("pad")
        if not isinstance(pad, (list, tuple)) or len(pad) % 2:
            raise ValueError(f"pad: padding length must be divisible by 2, got {pad!r}")
        pad = [as_int(p, "pad") for p in pad]
        if len(pad) // 2 > spec.ndim:
            raise ValueError(
                f"pad: padding length ({len(pad)}) too large for a {spec.ndim}-d input"
            )
        shape = list(spec.shape)
        touched = set()
        for k in range(len(pad) // 2):
            d = spec.ndim - 1 - k
            shape[d] += pad[2 * k] + pad[2 * k + 1]
            if shape[d] < 0:
                raise ValueError(f"pad: the padded size of dim {d} would be {shape[d]}")
            if pad[2 * k] or pad[2 * k + 1]:
                touched.add(d)
        mode, value = st.get("mode") or "constant", st.get("value")
        adds = mode == "constant" and value not in (None, 0, 0.0) and bool(touched)
        parts = [] if adds else partials_of([spec])
        if mode != "constant":
            # reflect/replicate/circular kernels want (batch, channel, *padded) inputs whose
            # non-batch dims are non-empty: only leading batch dims may stay sharded (an
            # uneven shard could otherwise be empty)
            touched |= set(range(max(0, spec.ndim - len(pad) // 2 - 1), spec.ndim))
        return self._along(spec, touched, tuple(shape), parts)

    @_KINDS.kind("diagonal", ("input", "offset", "dim1", "dim2"), ("offset", "dim1", "dim2"))
    def _plan_diagonal(self, call: OpCall, st: dict, dims: tuple[int, int] = (0, 1)) -> OpPlan:
        # torch.diagonal: the two dims become one trailing dim (gathered); other dims keep
        # their shards, moved to their output positions; elements are only selected
        spec = self._one(call)
        if spec.ndim < 2:
            raise ValueError("diagonal: the input needs at least 2 dimensions")
        off = as_int(st.get("offset") or 0, "offset")
        d1 = normalize_dim(as_int(_pick(st, "dim1", None, dims[0]), "dim1"), spec.ndim, "dim1")
        d2 = normalize_dim(as_int(_pick(st, "dim2", None, dims[1]), "dim2"), spec.ndim, "dim2")
        if d1 == d2:
            raise ValueError(f"diagonal dimensions cannot be identical {d1}, {d2}")
        n1, n2 = spec.shape[d1], spec.shape[d2]
        n = max(0, min(n1, n2 - off) if off >= 0 else min(n1 + off, n2))
        rest = [d for d in range(spec.ndim) if d not in (d1, d2)]
        shape = tuple(spec.shape[d] for d in rest) + (n,)
        keep = {d: i for i, d in enumerate(rest)}
        return OpPlan([shape], keep_strategies([keep], 1, partials_of([spec])), view=ViewOf())

    @_KINDS.kind("diag_embed", ("input", "offset", "dim1", "dim2"), ("offset", "dim1", "dim2"))
    def _plan_diag_embed(self, call: OpCall, st: dict) -> OpPlan:
        # torch.diag_embed: the last dim (gathered) becomes the diagonal of the new
        # (dim1, dim2) plane; the other dims keep their shards, moved to the output dims
        # left over; every other element is 0, so Partial values pass through
        spec = self._one(call)
        nd = spec.ndim + 1
        off = as_int(st.get("offset") or 0, "offset")
        d1 = normalize_dim(as_int(_pick(st, "dim1", None, -2), "dim1"), nd, "dim1")
        d2 = normalize_dim(as_int(_pick(st, "dim2", None, -1), "dim2"), nd, "dim2")
        if d1 == d2:
            raise ValueError(f"diagonal dimensions cannot be identical {d1}, {d2}")
        rest = [d for d in range(nd) if d not in (d1, d2)]
        n = (spec.shape[-1] if spec.ndim else 1) + abs(off)
        shape = [0] * nd
        for i, d in enumerate(rest):
            shape[d] = spec.shape[i]
        shape[d1] = shape[d2] = n
        keep = {i: d for i, d in enumerate(rest)}
        return OpPlan([tuple(shape)], keep_strategies([keep], 1, partials_of([spec])))

    @_KINDS.kind("linalg_diagonal", ("input", "offset", "dim1", "dim2"), ("offset", "dim1", "dim2"))
    def _plan_linalg_diagonal(self, call: OpCall, st: dict) -> OpPlan:
        # torch.linalg.diagonal(A, *, offset=0, dim1=-2, dim2=-1): torch.diagonal's layout
        # with the last two dims as defaults
        return self._plan_diagonal(call, st, (-2, -1))

    @_KINDS.kind(
        "repeat_interleave",
        ("input", "repeats", "dim", "output_size"),
        ("repeats", "dim", "output_size"),
    )
    def _plan_repeat_interleave(self, call: OpCall, st: dict) -> OpPlan:
        # an int `repeats` along `dim`: that dim is gathered, the others keep their shards;
        # dim=None repeats the flattened tensor (every dim gathered)
        if "repeats" in call.arg_roles:  # sized by the values of repeats: run it whole
            raise ValueDependentShape
        spec = self._one(call)
        reps = st.get("repeats")
        if reps is None and call.get("dim") is None:
            # torch.repeat_interleave(repeats): the index expansion of a tensor of repeats,
            # sized by its values: run it whole
            raise ValueDependentShape
        if isinstance(reps, bool) or not isinstance(reps, int):
            raise TypeError(
                "repeat_interleave on a DTensor takes an int `repeats` (a tensor of repeats "
                "gives a data-dependent shape)"
            )
        if reps < 0:
            raise ValueError(f"repeat_interleave: repeats must be non-negative, got {reps}")
        dim = st.get("dim")
        if dim is None:
            shape: tuple[int, ...] = (math.prod(spec.shape) * reps,)
            return OpPlan([shape], keep_strategies([None], 1, partials_of([spec])))
        d = normalize_dim(as_int(dim, "dim"), max(spec.ndim, 1), "dim")
        shp = list(spec.shape)
        if spec.ndim:
            shp[d] *= reps
        return self._along(spec, {d} if spec.ndim else set(), tuple(shp), partials_of([spec]))

    @_KINDS.kind("glu", ("input", "dim"), ("dim",))
    def _plan_glu(self, call: OpCall, st: dict) -> OpPlan:
        # torch.nn.functional.glu: the halved dim is gathered; not linear (no Partial)
        spec = self._one(call)
        if spec.ndim == 0:
            raise ValueError("glu does not support scalars because halving size must be even")
        d = normalize_dim(as_int(_pick(st, "dim", None, -1), "dim"), spec.ndim, "dim")
        if spec.shape[d] % 2:
            raise ValueError(
                f"Halving dimension must be even, but dimension {d} is size {spec.shape[d]}"
            )
        shape = list(spec.shape)
        shape[d] //= 2
        return self._along(spec, {d}, tuple(shape), [])

    # -- triangles ----------------------------------------------------------------
    @_KINDS.kind("tril", ("input", "diagonal"), ("diagonal",))
    @_KINDS.kind("triu", ("input", "diagonal"), ("diagonal",))
    def _plan_triu(self, call: OpCall, st: dict) -> OpPlan:
        spec = self._one(call)
        if spec.ndim < 2:
            raise ValueError(f"{self.params.kind}: input tensor must have at least 2 dimensions")
        k = as_int(st.get("diagonal") or 0, "diagonal")
        n = spec.ndim
        strategies = keep_strategies([{d: d for d in range(n)}], 1, partials_of([spec]))
        mesh = call.mesh

        def local(layout: Layout) -> Layout:
            coord = mesh.get_coordinate()
            out = layout.outputs[0]
            if coord is None or out is None:
                return layout
            if not any(type(p) is Shard and p.dim >= n - 2 for p in out):
                return layout
            _, off = compute_local_shape_and_offset(spec.shape, mesh.shape, out, coord)
            shifted = k + off[n - 2] - off[n - 1]
            if shifted != k:
                layout.overrides = {**(layout.overrides or {}), "diagonal": shifted}
            return layout

        return OpPlan([spec.shape], strategies, local=local)


def _pick(st: dict, name: str, alias: str | None, default: Any) -> Any:
    v = st.get(name)
    if v is None and alias is not None:
        v = st.get(alias)
    return default if v is None else v
