"""List ("foreach") ops — ``torch._foreach_add_``, ``_foreach_mul``, ``_foreach_lerp_``,
``_foreach_addcmul_``, ``_foreach_addcdiv_``, ``_foreach_sqrt``, ``_foreach_norm``... as
``torch.optim`` calls them with ``foreach=True`` (``rule: foreach``).

A foreach op is decided **per element**: element ``i`` of every list argument, plus the
arguments shared by all elements (a 0-d tensor scalar), form one elementwise call whose
placements are searched on their own, exactly as the single-tensor op would be. The
decisions are assembled into one layout (list outputs keep their order).

Per element, the output may be sharded wherever the element's inputs are (broadcast inputs
stay Replicate); Partial values follow ``partial:``, the element op's linearity:

=================  ============================================================
``partial``        Partial(op) kept (sum/avg)
=================  ============================================================
``none``           never: a Partial element is reduced first (sqrt, div by tensor...)
``linear``         every element input Partial (add, sub, neg); not with a python
                   scalar term (``_foreach_add_(xs, 1.0)``), which would be added once
                   per rank
``bilinear``       exactly one element input Partial, the others Replicate (mul)
``first``          only the first (the numerator) Partial (div)
``addcmul``        ``self`` and one of ``tensor1``/``tensor2`` Partial
``addcdiv``        ``self`` and ``tensor1`` Partial
``lerp``           ``self`` and ``end`` Partial (a tensor weight Replicate)
``copy``           ``self`` and ``src`` with the same Partial op, any op (copy_)
``any``            every placement of ``self`` passes (zero_)
``gather``         none, and the element is gathered whole (a 0-d result)
``norm``           ``_foreach_norm``: an element sharded on a mesh dim is reduced
                   shard-wise and one all-reduce per set of sharding groups serves
                   every element (``hyper_shard/kernels/vector_norm.py``): ``Replicate``
                   0-d results, never the elements' bytes moved
``powsum``         ``_foreach_powsum`` (``sum |x|^ord``, finite ``ord``): each
                   element's local sum, ``Partial(sum)`` on the mesh dims sharding it
                   (as PyTorch DTensor); a Partial element is reduced first
=================  ============================================================

In-place ops (a name ending in ``_``) keep every ``self`` element where it is: the other
inputs are moved to fit (except the lists named in ``written:``, which the op also writes:
the fused optimizer steps ``_fused_adam_``/``_fused_adamw_``/``_fused_sgd_``/
``_fused_adagrad_`` keep their moment buffers where they are). A Replicate parameter updated with a Partial(sum) gradient thus
gets the gradient all-reduced first — the data-parallel all-reduce.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy, search_strategy
from ..errors import ShardingError
from ..kernels import groups_of
from ..kernels.vector_norm import ForeachNorms
from ..placement import Partial, Placement, Shard
from ..redistribute.planner import cost_model_for
from ..registry.models import RuleParams
from . import register_rule
from ._util import LINEAR_OPS, R, broadcast_shapes

__all__ = ["ForeachOp", "ForeachParams", "element_strategies"]

PartialMode = Literal[
    "none",
    "linear",
    "bilinear",
    "first",
    "addcmul",
    "addcdiv",
    "lerp",
    "copy",
    "any",
    "gather",
    "norm",
    "powsum",
]
_ROLE = re.compile(r"^(.*)\[(\d+)\]$")


class ForeachParams(RuleParams):
    partial: PartialMode = "none"
    #: canonical names whose python scalars are additive terms (a scalar term forbids
    #: keeping a Partial element, which would count it once per rank)
    scalar_terms: list[str] = []
    #: list arguments besides ``self`` that the op writes in place (the fused optimizer
    #: steps' moment buffers): their elements keep their placements too, as ``self``'s
    written: list[str] = []


def element_strategies(
    shapes: list[tuple[int, ...]],
    n_elem: int,
    mode: str,
    partial_ok: bool,
    placements: list[tuple[Placement, ...]],
) -> list[SingleDimStrategy]:
    """Single-dim strategies of one element call.

    Args:
        shapes: global shapes of the element's inputs (element inputs first, then shared).
        n_elem: how many of them are list elements (the rest are shared: always Replicate).
        mode: the ``partial`` mode (see the module docstring).
        partial_ok: False when a python scalar term forbids Partial outputs.
        placements: the inputs' current placements (``any`` keeps every Partial op).
    """
    n_in = len(shapes)
    if mode == "gather":
        return []
    out_shape = broadcast_shapes(*shapes)
    nd = len(out_shape)
    strategies: list[SingleDimStrategy] = []
    for d in range(nd):
        ins: list[Placement] = []
        for s in shapes:
            k = d - (nd - len(s))
            ins.append(R if k < 0 or (s[k] == 1 and out_shape[d] != 1) else Shard(k))
        strategies.append(((Shard(d),), tuple(ins)))
    if not partial_ok:
        return strategies
    shared = [R] * (n_in - n_elem)

    def add(ops: tuple[str, ...], *patterns: tuple[bool, ...]) -> None:
        for op in ops:
            p = Partial(op)
            for pat in patterns:
                if len(pat) == n_elem:
                    strategies.append(((p,), tuple(p if f else R for f in pat) + tuple(shared)))

    if mode == "linear":
        add(LINEAR_OPS, (True,) * n_elem)
    elif mode == "bilinear":
        add(LINEAR_OPS, *[tuple(i == j for i in range(n_elem)) for j in range(n_elem)])
    elif mode == "first":
        add(LINEAR_OPS, (True,) + (False,) * (n_elem - 1))
    elif mode == "addcmul":
        add(LINEAR_OPS, (True, True, False), (True, False, True))
    elif mode == "addcdiv":
        add(LINEAR_OPS, (True, True, False))
    elif mode == "lerp":
        add(LINEAR_OPS, (True, True), (True, True, False))
    elif mode in ("any", "copy"):
        ops = tuple(dict.fromkeys(p.reduce_op for p in placements[0] if type(p) is Partial))
        add(ops, (True,) * n_elem)
    return strategies


@register_rule("foreach")
class ForeachOp(DistributedOp):
    """A ``torch._foreach_*`` op, decided per element (see the module docstring).

    Outputs: one DTensor per element: out of place, the broadcast shape of the element's
    inputs (``gather`` mode: 0-d); in place, the ``self`` elements (torch returns them).

    Raises:
        ShardingError: lists of different lengths, or an in-place element whose ``self``
            placements no strategy can keep (e.g. a Partial ``self`` plus a python scalar
            term): redistribute it first.
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = ForeachParams
    signature = ("self", "other", "*args")
    #: plain tensors in the lists (parameters of modules left out of a TP plan, their
    #: gradients and optimizer states) are taken as Replicate elements, each element
    #: being its own op: torch.optim with foreach=True steps mixed models as on one device
    replicate_plain_lists = True

    def infer_layout(self, call: OpCall) -> Layout:
        # group the DTensor inputs: list elements by (argument, index); the rest is shared
        groups: dict[str, dict[int, int]] = {}
        shared: list[int] = []
        for k, role in enumerate(call.arg_roles):
            m = _ROLE.match(role)
            if m:
                groups.setdefault(m.group(1), {})[int(m.group(2))] = k
            else:
                shared.append(k)
        if not groups:
            raise ShardingError(
                f"{call.describe()}: a foreach op needs lists of DTensors as its list arguments"
            )
        first = next(iter(groups))
        n = max(groups[first]) + 1
        if any(len(g) != n or max(g) + 1 != n for g in groups.values()):
            raise ShardingError(
                f"{call.describe()}: every tensor list must hold {n} DTensors (no plain tensors "
                f"mixed in), got {[len(g) for g in groups.values()]}"
            )
        inplace = call.platform_name.endswith("_")
        mode = self.params.partial
        if mode in ("norm", "powsum") and not shared:
            layout = self._norm_layout(call, groups, n, mode)
            if layout is not None:
                return layout
            mode = "gather"
        terms = set(self.params.scalar_terms)
        has_term = any(_ROLE.sub(r"\1", name) in terms for name in call.scalars)
        written = set(self.params.written)
        mesh = call.mesh
        cm = cost_model_for(mesh)
        rep = (R,) * mesh.ndim
        shared_specs = [call.specs[k].with_placements(rep) for k in shared]
        targets: list[Any] = [None] * len(call.specs)
        for k in shared:
            targets[k] = rep
        outputs: list[tuple[Placement, ...] | None] = []
        shapes: list[tuple[int, ...] | None] = []
        sources: list[list[int]] = []
        cost = 0.0
        memo: dict[tuple, Any] = {}
        objs = _dtensor_ids(call)
        for i in range(n):
            idx = [g[i] for g in groups.values()]
            specs = [call.specs[k] for k in idx] + shared_specs
            # the same DTensor twice in one element (addcmul_(v, g, g)) gets one placement:
            # the dispatcher substitutes redistributed inputs per object
            same = _same_object_groups([objs[k] for k in idx])
            key = (tuple(s.key for s in specs), same)
            res = memo.get(key)
            if res is None:
                strategies = element_strategies(
                    [s.shape for s in specs],
                    len(idx),
                    mode,
                    not has_term,
                    [s.placements for s in specs],
                )
                if same:
                    strategies = [
                        st
                        for st in strategies
                        if all(len({st[1][j] for j in g}) == 1 for g in same)
                    ]
                if inplace:  # self (and a written list) holds the result: the same placement
                    keep = [0, *(j for j, g in enumerate(groups) if g in written)]
                    strategies = [
                        st for st in strategies if all(st[1][j] == st[0][0] for j in keep)
                    ]
                fixed = (
                    ((0,) if inplace else ())
                    + tuple(j for j, g in enumerate(groups) if g in written)
                    + tuple(range(len(idx), len(specs)))
                )
                try:
                    res = search_strategy(specs, strategies, 1, cm, fixed=fixed)
                except ValueError as e:
                    kept = [j for j in fixed if j < len(idx)]
                    what = ", ".join(
                        f"{call.arg_roles[idx[j]]} {list(specs[j].placements)}" for j in kept
                    )
                    partial = any(type(p) is Partial for j in kept for p in specs[j].placements)
                    raise ShardingError(
                        f"{call.describe()}: element {i} cannot be updated in place by "
                        f"{call.platform_name} while keeping the placements of what it writes "
                        f"({what})"
                        + (" (a python scalar term on a Partial value)" if has_term else "")
                        + "; redistribute it first (e.g. to Replicate())"
                        + (
                            ". A Partial(sum) element is typically the gradient of a Replicate "
                            "parameter (Partial here, docs/parallel.md) or a value computed from "
                            "it: in torch.optim pass foreach=False (fused=False), or reduce the "
                            "gradients first (p.grad = p.grad.redistribute(placements="
                            "[Replicate()]))"
                            if partial
                            else ""
                        )
                    ) from e
                memo[key] = res
            for j, k in enumerate(idx):
                targets[k] = res.inputs[j]
            sources.append(idx)
            cost += res.cost
            if inplace:  # the local op returns the self list: the elements as they are
                outputs.append(specs[0].placements)
                shapes.append(specs[0].shape)
            else:
                outputs.append(res.outputs[0])
                el_shape = broadcast_shapes(*(s.shape for s in specs))
                shapes.append(() if mode == "gather" else el_shape)
        return Layout(targets, outputs, shapes, cost=cost, out_sources=sources)

    def _norm_layout(
        self, call: OpCall, groups: dict[str, dict[int, int]], n: int, mode: str
    ) -> Layout | None:
        """``_foreach_norm`` / ``_foreach_powsum`` without gathering (see the module
        docstring); None where the order is not a number (or not finite, for powsum)."""
        ord_ = call.static["ord"] if "ord" in call.static else call.get("ord", 2)
        try:
            p = 2.0 if ord_ is None else float(ord_)
        except (TypeError, ValueError):
            return None
        if math.isnan(p) or (mode == "powsum" and not math.isfinite(p)):
            return None
        mesh = call.mesh
        idx = [groups["self"][i] for i in range(n)] if "self" in groups else None
        if idx is None:
            return None
        targets: list[Any] = [None] * len(call.specs)
        outputs: list[tuple[Placement, ...] | None] = []
        shard_groups: list[tuple] = []
        for k in idx:
            tgt = tuple(R if type(pl) is Partial else pl for pl in call.specs[k].placements)
            targets[k] = tgt
            sharded = [m for m, pl in enumerate(tgt) if type(pl) is Shard]
            if mode == "powsum":
                outputs.append(
                    tuple(Partial("sum") if m in sharded else R for m in range(len(tgt)))
                )
            else:
                outputs.append((R,) * mesh.ndim)
            shard_groups.append(groups_of(mesh, sharded) if sharded else ())
        layout = Layout(targets, outputs, [()] * n, out_sources=[[k] for k in idx])
        if mode == "norm" and any(shard_groups) and not mesh.is_abstract:
            layout.impl = ForeachNorms(
                call.binder or self.binder, call.platform, call.func, shard_groups
            )
        return layout


def _dtensor_ids(call: OpCall) -> list[int]:
    """``id()`` of every DTensor input, in ``call.specs`` order (the dispatcher's flattening:
    positional arguments, then keyword arguments, lists one level deep)."""
    out: list[int] = []
    for a in (*call.args, *call.kwargs.values()):
        if hasattr(a, "_spec"):
            out.append(id(a))
        elif type(a) in (list, tuple):
            out.extend(id(x) for x in a if hasattr(x, "_spec"))
    return out


def _same_object_groups(ids: list[int]) -> tuple[tuple[int, ...], ...]:
    """Positions holding the same object, for every object held more than once."""
    pos: dict[int, list[int]] = {}
    for j, o in enumerate(ids):
        pos.setdefault(o, []).append(j)
    return tuple(tuple(p) for p in pos.values() if len(p) > 1)
