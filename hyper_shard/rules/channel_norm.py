"""Per-channel normalisation (``rule: channel_norm``): ``batch_norm``, ``instance_norm``,
``group_norm`` (``kind:``), semantics and argument names as ``torch.nn.functional``'s.

Global shapes: input ``(N, C, *spatial)`` (``batch_norm`` also ``(N, C)``), the per-channel
tensors (``running_mean``, ``running_var``, ``weight``, ``bias``) ``(C,)``. A statistic is
computed over the dims it spans, which must be whole on every rank; the others keep
their shards:

* ``batch_norm``, training (statistics over batch and spatial dims): the channel dim may
  stay sharded, with every per-channel tensor ``Shard(0)``; evaluation (the running
  statistics, a per-channel affine map): every dim keeps its shard, the channel dim with
  the per-channel tensors sharded alike;
* ``instance_norm`` with input statistics (over the spatial dims, per sample and
  channel): batch and channel dims keep their shards (but not the batch dim when running
  statistics are given: they are updated with the batch mean); with
  ``use_input_stats=False``, as ``batch_norm``'s evaluation;
* ``group_norm`` (over the channels of a group and the spatial dims): the batch dim
  keeps its shard, ``weight``/``bias`` Replicate.

Running statistics are updated IN PLACE when the input statistics are used: they never
move (an update of a moved copy would be lost), so ``running_mean`` and ``running_var``
must share one placement (``Replicate``, or ``Shard(0)`` with the channels), and a
``Partial`` running statistic raises (the parts' update is not the update of their sum). No Partial input otherwise:
normalisation is not linear. Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from typing import Any, Literal

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import R
from .planned import OpPlan, PlannedOp
from .tensor_along import nonempty_shards

__all__ = ["ChannelNormOp", "ChannelNormParams"]

_SIGNATURES = {
    "batch_norm": (
        ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
        ("training",),
    ),
    "instance_norm": (
        ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats",
         "momentum", "eps"),
        ("use_input_stats",),
    ),
    "group_norm": (("input", "num_groups", "weight", "bias", "eps"), ("num_groups",)),
}  # fmt: skip

_STATS = ("running_mean", "running_var")
_PER_CHANNEL = ("running_mean", "running_var", "weight", "bias")


class ChannelNormParams(RuleParams):
    kind: Literal["batch_norm", "instance_norm", "group_norm"]


@register_rule("channel_norm")
class ChannelNormOp(PlannedOp):
    """batch_norm / instance_norm / group_norm (see the module docstring).

    Raises:
        ShardingError: the input is not a DTensor, or a Partial running statistic that
            would be updated in place.
    """

    Params = ChannelNormParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        sig, static = _SIGNATURES[self.params.kind]
        self.use_signature(sig, static)

    def plan(self, call: OpCall) -> OpPlan:
        roles = call.arg_roles
        if "input" not in roles:
            raise ShardingError(f"{call.describe()}: {self.name} needs its input as a DTensor")
        x = call.specs[roles.index("input")]
        kind = self.params.kind
        st = call.static
        if kind == "batch_norm":
            input_stats = bool(st.get("training"))
        elif kind == "instance_norm":
            input_stats = st.get("use_input_stats") is None or bool(st.get("use_input_stats"))
        else:
            input_stats = True
        updates = input_stats and any(r in _STATS for r in roles) and kind != "group_norm"
        if updates:
            stats = {r: s.placements for r, s in zip(roles, call.specs) if r in _STATS}
            if len(set(stats.values())) > 1:
                raise ShardingError(
                    f"{call.describe()}: running_mean and running_var are updated in place, "
                    f"where they are, so they must share one placement (Replicate(), or "
                    f"Shard(0) with the channels); redistribute them to the same placements "
                    f"first"
                )
            for r, s in zip(roles, call.specs):
                if r in _STATS and any(type(p) is Partial for p in s.placements):
                    raise ShardingError(
                        f"{call.describe()}: {r} is updated in place with the batch statistics; "
                        f"a Partial {r} cannot be updated exactly (the parts' update is not the "
                        f"update of their sum); redistribute it to Replicate() or Shard(0) first"
                    )
        n_in = len(call.specs)
        ix = roles.index("input")
        strategies = []

        def strat(d: int, channel: bool) -> tuple[tuple[Placement, ...], tuple[Placement, ...]]:
            ins: list[Placement] = [R] * n_in
            ins[ix] = Shard(d)
            if channel:
                for i, r in enumerate(roles):
                    if r in _PER_CHANNEL:
                        ins[i] = Shard(0)
            return ((Shard(d),), tuple(ins))

        if x.ndim >= 2:
            if kind == "group_norm":
                strategies.append(strat(0, False))
            elif not input_stats:  # a per-channel affine map: every dim
                strategies += [strat(d, d == 1) for d in range(x.ndim)]
            else:
                strategies.append(strat(1, True))
                if kind == "instance_norm" and not updates:
                    strategies.append(strat(0, False))
        fixed = tuple(i for i, r in enumerate(roles) if r in _STATS) if updates else ()
        return OpPlan(
            [x.shape], strategies, fixed=fixed, accept=nonempty_shards(call, lambda d: d > 0)
        )
