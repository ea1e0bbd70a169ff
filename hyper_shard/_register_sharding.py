"""``register_sharding``: a sharding strategy given as a Python function at run time, as
PyTorch DTensor's ``torch.distributed.tensor.experimental.register_sharding``.

The function becomes a registry entry (``override: true``) whose rule is
:class:`RegisteredSharding`: on a layout-cache miss it calls the user's function with the
call's arguments (DTensors replaced by their :class:`~hyper_shard.spec.DTensorSpec`), reads
the acceptable ``(output placements, input placements)`` pairs for one mesh dim, and lets
the strategy search expand them to the mesh and pick the cheapest redistribution, exactly
as a YAML entry's ``single_dim_strategies`` (docs/custom_ops.md section 3.3). Output
shapes come from the platform running the op without data (torch: meta tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dispatch.op import DistributedOp, Layout, OpCall
from .dispatch.search import SingleDimStrategy, search_strategy
from .errors import ShardingError
from .placement import Placement
from .redistribute.planner import cost_model_for

if TYPE_CHECKING:
    from .platform.base import Platform

__all__ = ["OpSchemaInfo", "RegisteredSharding", "register"]


@dataclass
class OpSchemaInfo:
    """A framework op as :func:`register` binds it (given by ``Platform.op_schema``).

    Attributes:
        label: the op's name in messages (``torch.ops.aten.argmax.default``).
        names: the registry names that bind it (the platform resolves each to the object
            its dispatch receives).
        positional: positional argument names in order; ``kw_only`` keyword-only ones.
        tensor_args: which argument names are tensors (the others enter the cache key).
        n_outputs: number of tensor outputs (0: the op returns nothing, e.g. it only
            mutates an argument).
        mutated: the argument names the op writes in place (torch: ``Tensor(a!)``).
        variadic: the op returns a list of tensors whose length each call decides (torch's
            ``Tensor[]``); the output count is then read from the call's output shapes.
    """

    label: str
    names: list[str]
    positional: list[str]
    kw_only: list[str] = field(default_factory=list)
    tensor_args: set[str] = field(default_factory=set)
    n_outputs: int = 1
    mutated: set[str] = field(default_factory=set)
    variadic: bool = False


class RegisteredSharding(DistributedOp):
    """The rule of a :func:`register`-ed op: the user's strategy function, per call
    signature (every non-tensor argument is static: its value enters the cache key)."""

    def __init__(self, name: str, fn: Callable[..., Any], info: OpSchemaInfo) -> None:
        super().__init__(name)
        self.use_signature(info.positional)
        self.static_names = tuple(
            n for n in (*info.positional, *info.kw_only) if n not in info.tensor_args
        )
        self.n_outputs = info.n_outputs  # type: ignore[misc]
        self.fn = fn
        self.info = info

    def _user_args(self, call: OpCall) -> tuple[list[Any], dict[str, Any], list[int]]:
        """The call's arguments with DTensors replaced by their specs, and for each DTensor
        input (``call.specs`` order) the index of its argument in args + kwargs values."""
        from .dtensor import DTensor

        specs = iter(call.specs)
        where: list[int] = []

        def sub(v: Any, flat_index: int) -> Any:
            if isinstance(v, DTensor):
                where.append(flat_index)
                return next(specs)
            if type(v) in (list, tuple):
                return type(v)(sub(x, flat_index) for x in v)
            return v

        args = [sub(a, i) for i, a in enumerate(call.args)]
        n = len(call.args)
        kwargs = {k: sub(v, n + j) for j, (k, v) in enumerate(call.kwargs.items())}
        return args, kwargs, where

    def infer_layout(self, call: OpCall) -> Layout:
        """The search over the user's strategies, with the call's own output count when the
        op returns a list of tensors (``Tensor[]``), and every argument the op writes in
        place (its schema's ``Tensor(a!)``) kept where it is: a redistributed copy would
        take the write and the argument would silently keep its old values."""
        shapes = self.output_shapes(call)
        n_out = len(shapes) if self.info.variadic else self.n_outputs
        strategies = self.single_dim_strategies(call, n_out)
        written = self._written_inputs(call)
        fixed = sorted({*written, *((0,) if call.inplace else ())})
        target = call.specs[0].placements

        def keeps_target(ins: tuple, outs: tuple) -> bool:  # an in-place result is the target
            return not (call.inplace and outs and outs[0] != target)

        try:
            res = search_strategy(
                call.specs,
                strategies,
                n_out,
                cost_model_for(call.mesh),
                fixed=fixed,
                accept=keeps_target,
            )
        except ValueError:
            moved = ", ".join(f"{n} ({call.specs[i].placements})" for i, n in written.items())
            raise ShardingError(
                f"{call.describe()}: no strategy of register_sharding function "
                f"{self.fn.__name__} keeps the placements of the arguments the op writes in "
                f"place ({moved or 'its first argument'}); a redistributed copy would take the "
                f"write. Add a strategy that keeps them, or redistribute them before the call"
            ) from None
        layout = Layout(list(res.inputs), list(res.outputs), shapes, cost=res.cost)
        return self.expand_impl(call, layout)

    def _written_inputs(self, call: OpCall) -> dict[int, str]:
        """DTensor inputs (``call.specs`` index) the op writes in place -> argument name."""
        if not self.info.mutated:
            return {}
        names = [*self.info.positional[: len(call.args)], *call.kwargs]
        _, _, where = self._user_args(call)
        return {
            i: names[flat]
            for i, flat in enumerate(where)
            if flat < len(names) and names[flat] in self.info.mutated
        }

    def single_dim_strategies(
        self, call: OpCall, n_outputs: int | None = None
    ) -> list[SingleDimStrategy]:
        args, kwargs, where = self._user_args(call)
        n_out = self.n_outputs if n_outputs is None else n_outputs
        n_flat = len(args) + len(kwargs)
        label = self.info.label
        pairs = self.fn(*args, **kwargs)
        out: list[SingleDimStrategy] = []
        for k, pair in enumerate(pairs):
            try:
                outs, ins = pair
            except (TypeError, ValueError):
                raise ShardingError(
                    f"{label}: register_sharding function {self.fn.__name__} returned "
                    f"{pair!r} as strategy {k}; return (output placements, input placements) "
                    f"pairs, e.g. ([Shard(0)], [Shard(0), None])"
                ) from None
            if isinstance(outs, Placement) or isinstance(ins, Placement):
                raise ShardingError(
                    f"{label}: register_sharding function {self.fn.__name__}'s strategy {k} "
                    f"is {pair!r}; give the output and the input placements as lists, e.g. "
                    f"([Shard(0)], [Shard(0), None])"
                )
            outs, ins = list(outs), list(ins)
            if len(ins) != n_flat or len(outs) != n_out:
                raise ShardingError(
                    f"{label}: register_sharding function {self.fn.__name__}'s strategy {k} "
                    f"gives {len(outs)} output and {len(ins)} input placements, but the call "
                    f"has {n_out} tensor output(s) and {n_flat} argument(s); give one "
                    f"placement per output and one entry per argument (None for non-tensors)"
                )
            per_input: list[Placement] = []
            seen: dict[int, int] = {}
            for idx in where:  # a list argument: one placement per element, or one for all
                p = ins[idx]
                if isinstance(p, Sequence) and not isinstance(p, Placement):
                    j = seen.get(idx, 0)
                    seen[idx] = j + 1
                    p = p[j]
                if not isinstance(p, Placement):
                    raise ShardingError(
                        f"{label}: register_sharding function {self.fn.__name__}'s strategy "
                        f"{k} gives {p!r} for a DTensor argument; give its placement"
                    )
                per_input.append(p)
            out.append((tuple(outs), tuple(per_input)))
        return out

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        """Run the op on plain local aliases of the DTensor arguments: a custom op's own
        autograd formula (``register_autograd``) then saves and computes on local tensors,
        as the gradients it receives are local (hyper_shard's local autograd)."""
        layout.impl = _OnLocals(call.func, call.platform)
        return layout

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        shapes = call.platform.meta_output_shapes(call.func, call.args, call.kwargs)
        if self.info.variadic:
            return list(shapes)
        if not self.n_outputs:
            return []
        return (list(shapes) + [None] * self.n_outputs)[: self.n_outputs]


class _OnLocals:
    """``func`` called with every DTensor argument (lists included) replaced by its
    plain local alias (``Platform.local_of``: the same data and autograd graph)."""

    __slots__ = ("func", "platform")

    def __init__(self, func: Any, platform: Platform) -> None:
        self.func, self.platform = func, platform

    def _plain(self, v: Any) -> Any:
        from .dtensor import DTensor

        if isinstance(v, DTensor):
            return self.platform.local_of(v)
        if type(v) in (list, tuple):
            return type(v)(self._plain(x) for x in v)
        return v

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(
            *[self._plain(a) for a in args], **{k: self._plain(v) for k, v in kwargs.items()}
        )


def register(platform: Platform, op: Any, fn: Callable[..., Any]) -> None:
    """Bind ``op`` (a framework op ``platform.op_schema`` understands) to strategy function
    ``fn``, replacing any earlier binding of the same names; the layout cache is cleared.

    Raises:
        TypeError: ``op`` is not an op the platform can register (the message says what
            is).
    """
    from .registry import registry as R
    from .registry.loader import LoadedEntry
    from .registry.models import OpEntry

    info = platform.op_schema(op)
    name = f"register_sharding:{info.label}"
    entry = OpEntry.model_validate(
        {
            "class": "hyper_shard._register_sharding:RegisteredSharding",
            "override": True,
            "doc": f"strategy function {getattr(fn, '__qualname__', fn)!r} (register_sharding)",
            platform.name: list(info.names),
        }
    )
    le = LoadedEntry(
        name,
        "<register_sharding>",
        entry,
        RegisteredSharding(name, fn, info),
        {platform.name: list(info.names)},
    )
    R.add_runtime_entry(le)


def unregister(platform: Platform, op: Any) -> None:
    """Drop ``op``'s :func:`register`-ed strategy (the op's earlier rule, if any, binds
    again); nothing happens if it has none."""
    from .registry import registry as R

    R.remove_runtime_entry(f"register_sharding:{platform.op_schema(op).label}")
