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
    "native_batch_norm": (
        ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"),
        ("training",),
    ),
    "batch_norm_with_update": (
        ("input", "weight", "bias", "running_mean", "running_var", "momentum", "eps"), (),
    ),
    "native_group_norm": (
        ("input", "weight", "bias", "N", "C", "HxW", "group", "eps"), ("N", "C", "HxW", "group"),
    ),
}  # fmt: skip
#: the aten forms' extra outputs (after ``out``): the saved statistics, and
#: ``_batch_norm_with_update``'s (empty) reserve
_N_OUT = {"native_batch_norm": 3, "batch_norm_with_update": 4, "native_group_norm": 3}

_STATS = ("running_mean", "running_var")
_PER_CHANNEL = ("running_mean", "running_var", "weight", "bias")


class ChannelNormParams(RuleParams):
    kind: Literal[
        "batch_norm",
        "instance_norm",
        "group_norm",
        "native_batch_norm",
        "batch_norm_with_update",
        "native_group_norm",
    ]


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
        if kind in ("batch_norm", "native_batch_norm"):
            input_stats = bool(st.get("training"))
        elif kind == "batch_norm_with_update":
            input_stats = True
        elif kind == "instance_norm":
            input_stats = st.get("use_input_stats") is None or bool(st.get("use_input_stats"))
        else:
            input_stats = True
        group = kind in ("group_norm", "native_group_norm")
        updates = input_stats and any(r in _STATS for r in roles) and not group
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
            return (self._outs(Shard(d), channel, input_stats), tuple(ins))

        if x.ndim >= 2:
            if group:
                strategies.append(strat(0, False))
            elif not input_stats:  # a per-channel affine map: every dim
                strategies += [strat(d, d == 1) for d in range(x.ndim)]
            else:
                strategies.append(strat(1, True))
                if kind == "instance_norm" and not updates:
                    strategies.append(strat(0, False))
        fixed = tuple(i for i, r in enumerate(roles) if r in _STATS) if updates else ()
        return OpPlan(
            self._shapes(call, x, input_stats),
            strategies,
            fixed=fixed,
            accept=nonempty_shards(call, lambda d: d > 0),
            local=self._local_n(call, ix) if kind == "native_group_norm" else None,
        )

    def _outs(self, p: Placement, channel: bool, input_stats: bool) -> tuple[Placement, ...]:
        """The output placements of a strategy sharding the input by ``p``: the aten forms'
        statistics are per channel (batch norm, sharded with the channels) or per sample
        and group (group norm, sharded with the batch); empty ones are Replicate."""
        kind = self.params.kind
        if kind not in _N_OUT:
            return (p,)
        if kind == "native_group_norm":
            return (p, p, p)
        stat: Placement = Shard(0) if channel and input_stats else R
        return (p, stat, stat, R)[: _N_OUT[kind]]

    def _shapes(self, call: OpCall, x: Any, input_stats: bool) -> list[tuple[int, ...]]:
        kind = self.params.kind
        shape = tuple(x.shape)
        if kind == "native_group_norm":
            g = int(call.static.get("group") or 1)
            return [shape, (shape[0], g), (shape[0], g)]
        if kind not in _N_OUT:
            return [shape]
        stat = (shape[1],) if input_stats and len(shape) > 1 else (0,)
        return [shape, stat, stat, (0,)][: _N_OUT[kind]]

    @staticmethod
    def _local_n(call: OpCall, ix: int) -> Any:
        """``native_group_norm``'s ``N`` is the batch size it is given: each rank passes
        its own shard's."""
        from ..spec import compute_local_shape_and_offset

        x = call.specs[ix]

        def local(layout: Any) -> Any:
            coord = call.mesh.get_coordinate()
            if coord is None:
                return layout
            pl = layout.inputs[ix] or x.placements
            shape, _ = compute_local_shape_and_offset(x.shape, tuple(call.mesh.shape), pl, coord)
            layout.overrides = {**(layout.overrides or {}), "N": shape[0]}
            return layout

        return local
