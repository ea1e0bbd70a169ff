"""Expert parallelism for mixture-of-experts layers: :class:`ExpertParallel` and
:class:`ExpertTensorParallel` (as torchtitan's), framework-neutral parallel styles.

A style applies to the *experts module* of an MoE layer: the module whose stacked
parameters hold every expert (``[E, ...]``) and whose forward takes this rank's tokens
and the router's choice, ``forward(hidden_states [T, H], top_k_index [T, K],
top_k_weights [T, K]) -> [T, H]`` (Hugging Face's ``MixtralExperts``,
``Qwen3MoeExperts``, ``DeepseekV3NaiveMoe``..., and the MindSpore job's ``MoEExperts``):

* ``gate_up_proj`` ``[E, 2I, H]`` (the gate and up projections packed as the module packs
  them) or ``up_proj`` ``[E, I, H]`` (no gate), ``down_proj`` ``[E, H, I]``; ``[E, in,
  out]`` when the module says ``is_transposed``; optional ``gate_up_proj_bias`` /
  ``up_proj_bias`` ``[E, out]`` and ``down_proj_bias`` ``[E, H]`` (``has_bias``);
* the activation is the module's own ``_apply_gate`` (gated; default
  ``act_fn(gate) * up`` of the two halves) or ``act_fn`` (``has_gate=False``).

The style shards those parameters on the expert dim (``Shard(0)``) and replaces the
module's forward by the expert-parallel layer of :mod:`hyper_shard.kernels.moe`: the
count exchange, the token exchange (an all-to-all of variable pieces, composed where the
backend lacks it), the local experts (grouped matrix products), the exchange back and the
weighted combine. The module's hooks, the router before it and everything after it are
unchanged.

**Tokens are data parallel over the expert-parallel ranks.** Each rank passes its own
tokens (plain local tensors, as a data-parallel rank holds its slice of the batch) and
gets its own tokens' outputs back. The experts' gradient is, by local autograd through
both exchanges, the sum over the ranks' losses; the style divides it by
``gradient_divide_factor`` (default: the number of expert-parallel ranks), so it is the
gradient of the *mean* of the ranks' losses, the objective data parallelism optimises
(FSDP and DDP average the other parameters' gradients over the ranks). Pass ``1.0`` when
each rank's loss is already its share of a global sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..dtensor import COMPILED_API, DTensor, distribute_tensor
from ..kernels import moe
from ..kernels.moe_padded import moe_forward_padded
from ..mesh import DeviceMesh
from ..placement import Partial, Placement, Replicate, Shard
from ._adapter import adapter_for
from ._convert import to_local
from .distribute import distribute_module
from .style import ParallelStyle

__all__ = [
    "ExpertParallel",
    "ExpertTensorParallel",
    "ExpertsLayout",
    "experts_layout",
    "traced_layer",
    "traced_forward",
]

#: every applied layer's static arguments (style, mesh, layout, ep dim, tp dim), by key: a
#: compiled region names its layer by the key (a constant), and its weights are inputs
_LAYERS: list[tuple[Any, DeviceMesh, Any, int, int | None]] = []


@dataclass(frozen=True)
class ExpertsLayout:
    """Where an experts module keeps its stacked weights and how it computes.

    Attributes:
        num_experts: ``E`` (the stacked weights' dim 0).
        up / down: the attribute names of the up (packed gate/up) and down projections.
        up_bias / down_bias: the biases' attribute names, or None.
        transposed: weights stored ``[E, in, out]``.
        activation: ``[S, out] -> [S, I]`` on plain local tensors (the module's own).
        up_dim / mid_dim: the up projection's output dim and the down projection's input
            (intermediate) dim in the stacked weights.
    """

    num_experts: int
    up: str
    down: str
    up_bias: str | None
    down_bias: str | None
    transposed: bool
    activation: Callable[[Any], Any]

    @property
    def up_dim(self) -> int:
        return 2 if self.transposed else 1

    @property
    def mid_dim(self) -> int:
        return 1 if self.transposed else 2


def _gated(plat: Any, act: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def gate(h: Any) -> Any:  # act(gate) * up on the two halves of the packed output
        half = plat.shape(h)[-1] // 2
        return act(plat.narrow(h, -1, 0, half)) * plat.narrow(h, -1, half, half)

    return gate


def experts_layout(module: Any, plat: Any) -> ExpertsLayout:
    """Read an experts module's layout (see the module docstring).

    Raises:
        TypeError: ``module`` has no stacked ``gate_up_proj``/``up_proj`` and
            ``down_proj`` parameters (it is not an experts module: apply the style to
            ``<layer>.mlp.experts``; a ``ModuleList`` of experts is not supported).
        NotImplementedError: a post-expert norm (``has_post_expert_norm``).
    """
    params = dict(adapter_for(module).direct_params(module))
    up = "gate_up_proj" if params.get("gate_up_proj") is not None else "up_proj"
    name = type(module).__name__
    if params.get(up) is None or params.get("down_proj") is None:
        raise TypeError(
            f"expert parallelism applies to an experts module with stacked parameters "
            f"gate_up_proj (or up_proj) [E, ...] and down_proj [E, ...]; {name} has "
            f"{sorted(k for k, v in params.items() if v is not None)}. Apply it to the MoE "
            f"layer's experts module (e.g. 'model.layers.*.mlp.experts'); a ModuleList of "
            f"expert Linears (transformers 4) has no stacked weights to shard"
        )
    if getattr(module, "has_post_expert_norm", False):
        raise NotImplementedError(
            f"expert parallelism: {name} applies a norm after each expert "
            f"(has_post_expert_norm), which the expert-parallel layer does not run yet"
        )
    has_gate = bool(getattr(module, "has_gate", up == "gate_up_proj"))
    act = getattr(module, "act_fn", None)
    if has_gate:
        activation = getattr(module, "_apply_gate", None)
        if activation is None:
            if act is None:
                raise TypeError(f"expert parallelism: {name} has neither _apply_gate nor act_fn")
            activation = _gated(plat, act)
    else:
        if act is None:
            raise TypeError(f"expert parallelism: {name} has no act_fn")
        activation = act
    e = int(tuple(params[up].shape)[0])  # global: a DTensor answers its global shape
    declared = getattr(module, "num_experts", e)
    if isinstance(declared, int) and declared != e:
        raise ValueError(
            f"expert parallelism: {name}.num_experts is {declared} but {up} stacks {e}"
        )

    def bias(attr: str) -> str | None:
        return attr if params.get(attr) is not None else None

    return ExpertsLayout(
        num_experts=e,
        up=up,
        down="down_proj",
        up_bias=bias(up + "_bias"),
        down_bias=bias("down_proj_bias"),
        transposed=bool(getattr(module, "is_transposed", False)),
        activation=activation,
    )


#: the experts' forward arguments by position, and the keyword names modules give them
_ARGS = (
    ("hidden_states",),
    ("top_k_index", "router_indices"),
    ("top_k_weights", "routing_weights"),
)


def _inputs(module: Any, args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    """``(hidden_states, top_k_index, top_k_weights)`` from an experts module's call
    (positional, or by the keyword names Hugging Face's modules use).

    Raises:
        TypeError: an argument missing, or one the layer does not know.
    """
    out, rest = list(args[:3]), dict(kwargs)
    for names in _ARGS[len(out) :]:
        key = next((n for n in names if n in rest), None)
        if key is None:
            raise TypeError(
                f"{type(module).__name__} (expert parallel): missing argument {names[0]!r}; "
                f"call it as experts(hidden_states, top_k_index, top_k_weights)"
            )
        out.append(rest.pop(key))
    if len(args) > 3 or rest:
        raise TypeError(
            f"{type(module).__name__} (expert parallel): unexpected arguments "
            f"{list(rest) or len(args)}; the layer takes (hidden_states, top_k_index, "
            f"top_k_weights)"
        )
    return out[0], out[1], out[2]


def _dim_of(mesh: DeviceMesh, name: str, default: int) -> int:
    names = mesh.mesh_dim_names or ()
    return names.index(name) if name in names else default


class ExpertParallel(ParallelStyle):
    """Shard an experts module's stacked weights on the expert dim over a 1-D
    expert-parallel mesh and route each rank's tokens to their experts' ranks (as
    torchtitan's ``ExpertParallel``; see the module docstring for the modules it takes).

    Rank ``c`` of ``n`` holds experts ``c * E / n ... (c + 1) * E / n - 1`` (``Shard(0)``
    DTensor parameters, an optimizer steps them as they are). Forward, on each rank's
    tokens ``hidden_states [T, H]`` and router output ``top_k_index``/``top_k_weights``
    ``[T, K]`` (plain local tensors): the token counts are exchanged (one all-gather of
    ``n x E`` integers, which also agrees on a bad router index), the tokens travel to the
    ranks of their experts and back by all-to-alls of variable pieces, the local experts
    run as grouped matrix products, and the outputs are weighted and summed in token
    order: ``[T, H]``, the module's own result for this rank's tokens. Backward: through
    both all-to-alls to the tokens, to the router weights and to every local expert.

    Keyword Args:
        gradient_divide_factor: the experts' gradients (the sum of every rank's loss's
            gradient) are divided by it; default the number of expert-parallel ranks (the
            gradient of the mean of the ranks' losses, as data parallelism averages).

    Raises (at ``parallelize_module``, on every rank, before any collective):
        ValueError: a mesh that is not 1-D, or ``E`` not divisible by the mesh size.
        TypeError: the module is not an experts module.
    """

    def __init__(self, *, gradient_divide_factor: float | None = None) -> None:
        super().__init__()
        if gradient_divide_factor is not None and not gradient_divide_factor > 0:
            raise ValueError(
                f"{type(self).__name__}: gradient_divide_factor must be positive, got "
                f"{gradient_divide_factor!r}"
            )
        self.gradient_divide_factor = gradient_divide_factor

    # ---------------------------------------------------------------- layout
    def _ep_tp_dims(self, mesh: DeviceMesh) -> tuple[int, int | None]:
        if mesh.ndim != 1:
            raise ValueError(
                f"{type(self).__name__}: expert parallelism takes a 1-D DeviceMesh, got shape "
                f"{mesh.shape}; slice it first (mesh['ep']), or use ExpertTensorParallel on an "
                f"('ep', 'tp') mesh"
            )
        return 0, None

    def _placements(
        self, layout: ExpertsLayout, attr: str, tp: int | None
    ) -> tuple[Placement, ...]:
        return (Shard(0),)

    def _check(self, layout: ExpertsLayout, module: Any, mesh: DeviceMesh, ep: int) -> None:
        n = mesh.shape[ep]
        if layout.num_experts % n:
            raise ValueError(
                f"{type(self).__name__}: {type(module).__name__} has {layout.num_experts} "
                f"experts, which {n} expert-parallel ranks cannot share evenly (Shard(0) of "
                f"{layout.up} needs the expert count divisible by the mesh size); choose an "
                f"expert-parallel size that divides {layout.num_experts}"
            )

    # ---------------------------------------------------------------- apply
    def _apply(self, module: Any, device_mesh: DeviceMesh) -> Any:
        ep, tp = self._ep_tp_dims(device_mesh)
        plat = device_mesh.platform
        layout = experts_layout(module, plat)
        self._check(layout, module, device_mesh, ep)
        ad = adapter_for(module)
        names = {layout.up, layout.down, layout.up_bias, layout.down_bias} - {None}

        def partition(name: str, sub: Any, mesh: DeviceMesh) -> None:
            if name != "":
                return
            for attr in sorted(a for a in names if a is not None):
                p = getattr(sub, attr)
                dt = distribute_tensor(
                    plat.detach(p),
                    mesh,
                    list(self._placements(layout, attr, tp)),
                    src_data_rank=self.src_data_rank,
                )
                ad.set_param(sub, attr, dt, ad.requires_grad(p))

        distribute_module(module, device_mesh, partition)
        key = str(len(_LAYERS))
        _LAYERS.append((self, device_mesh, layout, ep, tp))
        ad.set_forward(module, partial(self._forward, module, device_mesh, layout, ep, tp, key))
        return module

    # ---------------------------------------------------------------- forward
    def _groups(
        self, mesh: DeviceMesh, ep: int, tp: int | None, module: Any, layout: ExpertsLayout
    ) -> tuple[moe.Group, moe.TensorSplit | None]:
        coord = mesh.get_coordinate() or [0] * mesh.ndim
        return moe.Group(mesh._group(ep), mesh.shape[ep], coord[ep]), None

    def _weight(
        self, module: Any, attr: str | None, plat: Any, ep_size: int, tp: int | None
    ) -> Any:
        if attr is None:
            return None
        p = getattr(module, attr)
        if not isinstance(p, DTensor):
            local = p
        elif all(type(q) is Shard for q in p.placements):
            local = to_local(p)
        else:  # a Replicate dim (ExpertTensorParallel's down bias, added on tp rank 0 only):
            # each rank's gradient is its contribution
            local = p.to_local(
                grad_placements=[Partial() if type(q) is Replicate else q for q in p.placements]
            )
        factor = self.gradient_divide_factor or float(ep_size)
        if factor == 1.0 or not plat.requires_grad(local):
            return local
        return plat.custom_autograd(lambda t: t, lambda g: plat.scale(g, 1.0 / factor), local)

    def _forward(
        self,
        module: Any,
        mesh: DeviceMesh,
        layout: ExpertsLayout,
        ep: int,
        tp: int | None,
        key: str,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        plat = mesh.platform
        hidden_states, top_k_index, top_k_weights = _inputs(module, args, kwargs)
        for what, t in (("hidden_states", hidden_states), ("top_k_index", top_k_index),
                        ("top_k_weights", top_k_weights)):  # fmt: skip
            if isinstance(t, DTensor):
                raise TypeError(
                    f"{type(self).__name__} ({type(module).__name__}): {what} is a DTensor "
                    f"with {list(t.placements)}; pass each rank's own tokens as plain local "
                    f"tensors (to_local() first: the tokens are data parallel over the "
                    f"expert-parallel ranks)"
                )
        if COMPILED_API and COMPILED_API[0]():  # dynamo traces this call: one region call
            if tp is not None:
                raise NotImplementedError(  # dynamo breaks the graph: this call runs eagerly
                    f"{type(self).__name__}: the expert x tensor-parallel layer is not traced "
                    f"in a compiled region yet (it runs eagerly there)"
                )
            params = tuple(
                None if a is None else getattr(module, a)
                for a in (layout.up, layout.down, layout.up_bias, layout.down_bias)
            )
            return COMPILED_API[1]("ep_moe", key, hidden_states, top_k_index, top_k_weights, params)
        group, split = self._groups(mesh, ep, tp, module, layout)
        weights = moe.ExpertWeights(
            up=self._weight(module, layout.up, plat, group.size, tp),
            down=self._weight(module, layout.down, plat, group.size, tp),
            up_bias=self._weight(module, layout.up_bias, plat, group.size, tp),
            down_bias=self._weight(module, layout.down_bias, plat, group.size, tp),
            activation=layout.activation,
            transposed=layout.transposed,
        )
        return moe.moe_forward(
            plat,
            hidden_states,
            top_k_index,
            top_k_weights,
            weights,
            layout.num_experts,
            group,
            split,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gradient_divide_factor={self.gradient_divide_factor})"


class ExpertTensorParallel(ExpertParallel):
    """Expert parallelism with each expert split by tensor parallelism (as torchtitan's
    ``ExpertTensorParallel``), on a 2-D ``("ep", "tp")`` mesh: the experts are sharded on
    ``ep`` as :class:`ExpertParallel` shards them, and each expert's up projection
    column-wise (its output dim, ``Shard(1)``, packed gate/up included) and its down
    projection row-wise (the intermediate dim, ``Shard(2)``; ``[E, in, out]`` layouts
    the other way round) on ``tp``; the up projection's bias ``Shard`` on its output dim,
    the down projection's bias ``Replicate`` (added once).

    The tokens are data parallel over ``ep`` and the same on every ``tp`` rank (as after a
    tensor-parallel attention whose output is replicated). Each tp slice exchanges its
    tokens over its ``ep`` group; after the up projection the output columns of the tp
    ranks are all-gathered (reduce-scattered in backward: the packed gate/up layout and
    the module's own activation need the whole row; torchtitan's separate w1/w3 weights
    avoid that collective), each tp rank runs the down projection on its chunk of the
    intermediate dim, and the partial sums are all-reduced after the combine (the
    gradient passes unchanged, as after a row-parallel linear).

    Raises (at ``parallelize_module``): ValueError for a mesh that is not 2-D, an expert
    count not divisible by the ``ep`` size, or an intermediate size not divisible by the
    ``tp`` size.
    """

    def _ep_tp_dims(self, mesh: DeviceMesh) -> tuple[int, int | None]:
        if mesh.ndim != 2:
            raise ValueError(
                f"{type(self).__name__}: takes a 2-D ('ep', 'tp') DeviceMesh, got shape "
                f"{mesh.shape}; use ExpertParallel on a 1-D mesh"
            )
        ep = _dim_of(mesh, "ep", 0)
        return ep, 1 - ep

    def _placements(
        self, layout: ExpertsLayout, attr: str, tp: int | None
    ) -> tuple[Placement, ...]:
        if attr == layout.up:
            inner: Placement = Shard(layout.up_dim)
        elif attr == layout.down:
            inner = Shard(layout.mid_dim)
        elif attr == layout.up_bias:
            inner = Shard(1)
        else:
            inner = Replicate()
        return (Shard(0), inner) if tp == 1 else (inner, Shard(0))

    def _check(self, layout: ExpertsLayout, module: Any, mesh: DeviceMesh, ep: int) -> None:
        super()._check(layout, module, mesh, ep)
        down = getattr(module, layout.down)
        mid = down.shape[layout.mid_dim]
        n = mesh.shape[1 - ep]
        if mid % n:
            raise ValueError(
                f"{type(self).__name__}: {type(module).__name__}'s intermediate size {mid} "
                f"({layout.down} dim {layout.mid_dim}) is not divisible by the {n} "
                f"tensor-parallel ranks; choose a tp size that divides it"
            )

    def _groups(
        self, mesh: DeviceMesh, ep: int, tp: int | None, module: Any, layout: ExpertsLayout
    ) -> tuple[moe.Group, moe.TensorSplit | None]:
        assert tp is not None
        group = super()._groups(mesh, ep, tp, module, layout)[0]
        coord = mesh.get_coordinate() or [0] * mesh.ndim
        n = mesh.shape[tp]
        cols = getattr(module, layout.up).shape[layout.up_dim]
        mid = getattr(module, layout.down).shape[layout.mid_dim]
        split = moe.TensorSplit(
            mesh._group(tp), n, coord[tp], up_sizes=(cols // n,) * n, mid_sizes=(mid // n,) * n
        )
        return group, split


def traced_layer(key: str) -> tuple[Any, DeviceMesh, Any, int, int | None]:
    """The static arguments of applied layer ``key`` (style, mesh, layout, ep dim, tp
    dim)."""
    return _LAYERS[int(key)]


def traced_forward(
    key: str, hidden_states: Any, top_k_index: Any, top_k_weights: Any, params: tuple
) -> Any:
    """Layer ``key``'s forward while a compiled region is traced: the static-shape layer of
    :mod:`hyper_shard.kernels.moe_padded` (no count exchange: the padded even all-to-all),
    on the region's weights ``params`` (up, down, up bias, down bias: DTensors or None).
    The caller checks the router's ids (:func:`~hyper_shard.kernels.moe_padded.
    bad_index_count`)."""
    style, mesh, layout, ep, tp = traced_layer(key)
    plat = mesh.platform
    coord = mesh.get_coordinate() or [0] * mesh.ndim
    group = moe.Group(mesh._group(ep), mesh.shape[ep], coord[ep])
    factor = style.gradient_divide_factor or float(group.size)

    def local(p: Any) -> Any:
        if p is None:
            return None
        t = to_local(p) if isinstance(p, DTensor) else p
        if factor == 1.0 or not plat.requires_grad(t):
            return t
        return plat.custom_autograd(lambda x: x, lambda g: plat.scale(g, 1.0 / factor), t)

    up, down, up_bias, down_bias = (local(p) for p in params)
    weights = moe.ExpertWeights(
        up=up,
        down=down,
        up_bias=up_bias,
        down_bias=down_bias,
        activation=layout.activation,
        transposed=layout.transposed,
    )
    return moe_forward_padded(
        plat, hidden_states, top_k_index, top_k_weights, weights, layout.num_experts, group
    )
