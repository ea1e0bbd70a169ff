"""DistributedOp: the Python class behind every registry entry, and what a decision holds.

The three phases of a call each use one part of an op:

1. **preprocess** — :meth:`BoundOp.key` scans the call's arguments once: the DTensor
   inputs (in order, lists included), and the cache key made of the op's id, each input
   spec (hash computed once per spec), the values of the *declared* static args only, and a
   type tag for every other argument.
2. **infer_layout** — on a cache miss only: :meth:`DistributedOp.infer_layout` returns a
   :class:`Layout` (target input placements, output placements and shapes, and optionally
   an expanded local implementation or rank-local argument overrides). The simplest rule
   implements :meth:`DistributedOp.single_dim_strategies` and gets the N-D expansion and the
   cheapest input redistribution from :mod:`hyper_shard.dispatch.search`.
3. **execute & wrap** — the cached :class:`Decision` redistributes the inputs that need it,
   the platform runs the local op (or the expanded one) and :meth:`Decision.wrap` wraps the
   result; an in-place op returns its ``self`` DTensor.

No framework import here: platforms supply tensor checks and wrapping.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from ..errors import ShardingError
from ..placement import Placement
from ..redistribute.planner import Plan, cost_model_for, plan_redistribute
from ..registry.models import RuleParams
from ..registry.platforms import signature_keys
from ..spec import DTensorSpec, TensorMeta, contiguous_stride
from .search import SingleDimStrategy, search_strategy
from .views import ViewCopySpec

__all__ = [
    "DistributedOp",
    "BoundOp",
    "OpCall",
    "Layout",
    "Decision",
    "Binder",
    "NoParams",
    "fmt_placements",
]

_ids = itertools.count(1)


def fmt_placements(spec: DTensorSpec) -> str:
    return f"DTensor{list(spec.shape)}[{', '.join(str(p) for p in spec.placements)}]"


class NoParams(RuleParams):
    """Parameters of a rule that takes none from YAML beyond the shared ``signature`` and
    ``static_args``."""


# ---------------------------------------------------------------------- binding
class Binder:
    """Maps an op's canonical argument names to where a call passes them.

    ``names`` lists positional parameters in order (``input`` is position 0); a name starting
    with ``*`` collects the remaining positionals (``view(self, *size)``). Keyword arguments
    are matched by name; ``"dim|axis"`` names the canonical ``dim`` and accepts the keyword
    ``axis`` for it too (MindSpore's 1.x Tensor methods spell ``dim`` ``axis``).
    """

    __slots__ = ("names", "pos", "varargs", "aliases")

    def __init__(self, names: Sequence[str]) -> None:
        self.aliases: dict[str, tuple[str, ...]] = {}  # canonical -> other keyword names
        canon = []
        for n in names:
            head, *alts = n.split("|")
            canon.append(head)
            if alts:
                self.aliases[head.lstrip("*")] = tuple(alts)
        self.names = tuple(canon)
        self.pos: dict[str, int] = {}
        self.varargs: tuple[str, int] | None = None
        for i, n in enumerate(self.names):
            if n.startswith("*"):
                self.varargs = (n[1:], i)
                break
            self.pos[n] = i

    def keyword(self, kwargs: dict[str, Any], name: str) -> str | None:
        """The keyword under which ``kwargs`` passes canonical ``name``, or None."""
        if name in kwargs:
            return name
        for alt in self.aliases.get(name, ()):
            if alt in kwargs:
                return alt
        return None

    def get(
        self, args: Sequence[Any], kwargs: dict[str, Any], name: str, default: Any = None
    ) -> Any:
        if name in kwargs:
            return kwargs[name]
        if self.aliases and (k := self.keyword(kwargs, name)) is not None:
            return kwargs[k]
        i = self.pos.get(name)
        if i is not None:
            return args[i] if i < len(args) else default
        if self.varargs is not None and self.varargs[0] == name:
            rest = tuple(args[self.varargs[1] :])
            if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
                return tuple(rest[0])
            return rest if rest else default
        return default

    def splice(
        self, args: Sequence[Any], kwargs: dict[str, Any], overrides: dict[str, Any]
    ) -> tuple[int, int, tuple] | None:
        """``(i, j, mid)`` such that ``args[:i] + mid + args[j:]`` is what :meth:`replace`
        gives for every override in ``overrides`` on a call of this form (the same number
        of positional arguments, the same keywords), when that is one positional
        replacement; else None."""
        if len(overrides) != 1:
            return None
        ((name, value),) = overrides.items()
        if kwargs and self.keyword(kwargs, name) is not None:
            return None
        i = self.pos.get(name)
        if i is not None:
            return (i, i + 1, (value,)) if i < len(args) else None
        if self.varargs is not None and self.varargs[0] == name:
            return (self.varargs[1], len(args), (tuple(value),))
        return None

    def replace(
        self, args: Sequence[Any], kwargs: dict[str, Any], name: str, value: Any
    ) -> tuple[tuple, dict]:
        k = self.keyword(kwargs, name) if kwargs else None
        if k is not None:
            kw = dict(kwargs)
            kw[k] = value
            return tuple(args), kw
        i = self.pos.get(name)
        if i is not None and i < len(args):
            a = list(args)
            a[i] = value
            return tuple(a), kwargs
        if self.varargs is not None and self.varargs[0] == name:
            return (*args[: self.varargs[1]], tuple(value)), kwargs
        kw = dict(kwargs)
        kw[name] = value
        return tuple(args), kw


# ---------------------------------------------------------------------- call info
@dataclass
class OpCall:
    """What a rule sees on a cache miss.

    Attributes:
        name: the op's registry name (``add``, ``mm``...); ``platform_name`` the function
            called (``torch.add``, ``Tensor.add_``, ``AddExt``...).
        specs: the DTensor inputs' specs, in argument order.
        arg_roles: for every DTensor input, the canonical argument name (``input``,
            ``other``, ``weight``...) or ``name[i]`` for the i-th tensor of a list argument.
        static: the declared static arguments' values by canonical name.
        scalars: canonical names of python-scalar (or 0-d plain tensor) arguments.
        inplace: the call writes into its first argument.
        reflected: a reflected operator (``__radd__``): the DTensor is the right operand.
        args/kwargs: the raw call (read-only: for rules that need more than static args).
        func: the platform function called (an ``impl`` may call it on local data).
        binder: how this platform's call passes the canonical arguments.
        platform: the Platform (neutral local tensor primitives for an ``impl``).
    """

    name: str
    platform_name: str
    specs: list[DTensorSpec]
    arg_roles: list[str]
    static: dict[str, Any]
    scalars: dict[str, Any]
    inplace: bool
    reflected: bool
    args: tuple
    kwargs: dict
    func: Any = None
    binder: Binder | None = None
    platform: Any = None

    def get(self, name: str, default: Any = None) -> Any:
        """The value of canonical argument ``name`` in this call."""
        b = self.binder
        if b is None:
            return self.static.get(name, default)
        return b.get(self.args, self.kwargs, name, default)

    @property
    def mesh(self) -> Any:
        return self.specs[0].mesh

    def describe(self) -> str:
        ins = ", ".join(f"{r}={fmt_placements(s)}" for r, s in zip(self.arg_roles, self.specs))
        return f"{self.platform_name}({ins})"


@dataclass
class Layout:
    """A rule's decision for one call signature.

    Attributes:
        inputs: target placements of every DTensor input (None: keep as is).
        outputs: placements of every output tensor (None for a non-tensor output).
        shapes: global shapes of the outputs (None where unknown/non-tensor).
        impl: a local implementation replacing the platform function, called with the
            (redistributed) local args; or None.
        overrides: canonical arg name -> rank-local value to pass instead (e.g. a view's
            local shape, a scalar zeroed on non-zero coordinates).
        cost: modelled redistribution cost (seconds).
        out_sources: per output, the inputs whose shards it is made of (default: every
            input); read only for inputs with a shard order (:mod:`.order`).
        view: a :class:`~hyper_shard.dispatch.views.ViewOf` when the outputs are views of
            the first DTensor input (as the framework's op returns views), else None.
    """

    inputs: Sequence[tuple[Placement, ...] | None]
    outputs: Sequence[tuple[Placement, ...] | None]
    shapes: Sequence[tuple[int, ...] | None]
    impl: Callable | None = None
    overrides: dict[str, Any] | None = None
    cost: float = 0.0
    out_sources: Sequence[Sequence[int]] | None = None
    view: Any = None


# ---------------------------------------------------------------------- the op
class DistributedOp:
    """Base class of every op's sharding rule (declarative families and custom classes).

    Subclass and implement either :meth:`single_dim_strategies` + :meth:`output_shapes`
    (the short path) or :meth:`infer_layout` (full control). YAML parameters are validated
    by the class's ``Params`` pydantic model and available as ``self.params``.

    Args:
        name: the registry entry's name.
        params: the entry's rule parameters (a dict or a ``Params`` instance).
    """

    #: pydantic model of the YAML parameters this rule accepts
    Params: ClassVar[type[BaseModel]] = NoParams
    #: canonical positional argument names (position 0 is the first tensor)
    signature: ClassVar[tuple[str, ...]] = ("input", "*args")
    #: canonical names whose values enter the cache key and reach the rule
    static_args: ClassVar[tuple[str, ...]] = ()
    #: number of output tensors (single_dim_strategies give this many output placements)
    n_outputs: ClassVar[int] = 1
    #: the local kernel works on local data only and every output shard comes from an
    #: input shard on the same mesh dims, so inputs with a shard order keep it and outputs
    #: inherit it; otherwise the rule decides on left-to-right specs (see dispatch/order.py)
    keeps_shard_order: ClassVar[bool] = False
    #: the op has no layout of its own: the dispatcher runs the framework function's body on
    #: the DTensors (the platform's ``decompose``) and each inner op dispatches
    #: (``rule: composite``)
    runs_as_parts: ClassVar[bool] = False

    def __init__(self, name: str, params: BaseModel | dict[str, Any] | None = None) -> None:
        self.name = name
        if params is None:
            params = {}
        self.params: Any = params if isinstance(params, BaseModel) else self.Params(**params)
        sig = getattr(self.params, "signature", None) or self.signature
        #: how a call passes the canonical arguments (on every platform the entry gives no
        #: signature of its own: :meth:`binder_for`)
        self.binder = Binder(sig)
        #: platform key -> canonical positional names of that platform's calls (the YAML's
        #: ``signatures``, plus those ``extend: true`` entries add)
        self.signatures: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in (getattr(self.params, "signatures", None) or {}).items()
        }
        self._binders: dict[str, Binder] = {}
        st = getattr(self.params, "static_args", None)
        self.static_names: tuple[str, ...] = (
            tuple(st) if st is not None else tuple(self.static_args)
        )

    def replicates_plain(self) -> bool:
        """True when the op's plain-tensor arguments (rank >= 1) are to be taken as
        ``Replicate`` DTensors, as inside ``implicit_replication()`` (``loss_parallel()``
        takes plain targets and class weights so, as PyTorch's does)."""
        return False

    def use_signature(self, sig: Sequence[str], static: Sequence[str] | None = None) -> None:
        """Set the rule's own canonical signature (and static args) for this entry, e.g.
        the one of its ``kind``, unless the YAML entry gives its own. Platforms whose calls
        pass the arguments otherwise say so in the entry (``signatures: {KEY: [...]}``)."""
        if getattr(self.params, "signature", None) is None:
            self.binder = Binder(sig)
            self._binders.clear()
        if static is not None and getattr(self.params, "static_args", None) is None:
            self.static_names = tuple(static)

    def add_signatures(self, signatures: dict[str, Sequence[str]]) -> None:
        """Add per-platform signatures (an ``extend: true`` entry's); a platform's own
        earlier one is replaced."""
        self.signatures.update({k: tuple(v) for k, v in signatures.items()})
        self._binders.clear()

    # -- phase 2 ----------------------------------------------------------------
    def binder_for(self, platform: str | None) -> Binder:
        """The argument binder of the calls of the platform keyed ``platform``: the
        signature its declaration's ``signature_source`` finds in :attr:`signatures`, else
        :attr:`binder` (None: :attr:`binder`)."""
        if platform is None:
            return self.binder
        b = self._binders.get(platform)
        if b is None:
            sig = next(
                (self.signatures[k] for k in signature_keys(platform) if k in self.signatures), None
            )
            b = self._binders[platform] = Binder(sig) if sig else self.binder
        return b

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        """Strategies for ONE mesh dim: ``(output placements, input placements)`` pairs,
        one placement per output and per DTensor input. All-Replicate need not be listed."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither single_dim_strategies nor infer_layout"
        )

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        """Global shapes of the outputs (default: the first input's shape)."""
        return [call.specs[0].shape] * self.n_outputs

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        """Refuse an N-D combination the single-dim view cannot see (default: accept)."""
        return True

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        """Add a local implementation or rank-local overrides to a decided layout."""
        return layout

    def infer_layout(self, call: OpCall) -> Layout:
        """Decide input targets and outputs (default: search over single-dim strategies)."""
        strategies = self.single_dim_strategies(call)
        cm = cost_model_for(call.mesh)
        fixed = (0,) if call.inplace else ()
        accept = None
        custom = type(self).accept is not DistributedOp.accept
        if custom or call.inplace:
            target = call.specs[0].placements

            def accept(ins: tuple, outs: tuple) -> bool:
                # an in-place result must keep the target's placements
                if call.inplace and outs and outs[0] != target:
                    return False
                return not custom or self.accept(call, ins, outs)

        try:
            res = search_strategy(
                call.specs, strategies, self.n_outputs, cm, fixed=fixed, accept=accept
            )
        except ValueError as e:
            raise ShardingError(
                f"{call.describe()}: in-place operations that require placement changes are not "
                f"supported: no sharding strategy keeps the in-place target's placements; "
                f"redistribute it first, or use the out-of-place op"
            ) from e
        layout = Layout(
            list(res.inputs), list(res.outputs), self.output_shapes(call), cost=res.cost
        )
        return self.expand_impl(call, layout)


# ---------------------------------------------------------------------- decisions
class Decision:
    """A cached decision: how to redistribute the inputs, what to run, how to wrap.

    Output specs are made per output dtype on first use (the dtype comes from the local
    result) and reused.
    """

    __slots__ = (
        "plans",
        "targets",
        "needs_redist",
        "outputs",
        "shapes",
        "impl",
        "overrides",
        "inplace",
        "direct",
        "out_specs",
        "out0",
        "mesh",
        "cost",
        "layout",
        "out_orders",
        "view",
        "link_views",
        "writes_back",
        "self_wrapped",
        "hits",
        "seen_hits",
        "override_only",
        "splice",
    )

    def __init__(self, call: OpCall, layout: Layout, keeps_order: bool | None = None) -> None:
        #: layout-cache hits of this decision, and the count the cache's eviction last saw
        self.hits = 0
        self.seen_hits = 0
        self.mesh = call.mesh
        self.layout = layout
        self.cost = layout.cost
        self.plans: list[Plan | None] = []
        self.targets: list[DTensorSpec | None] = []
        self.out_orders: list[Any] | None = None
        if keeps_order is None:  # no input has a shard order
            for spec, tgt in zip(call.specs, layout.inputs):
                if tgt is None or tuple(tgt) == spec.placements:
                    self.plans.append(None)
                    self.targets.append(None)
                else:
                    dst = spec.with_placements(tgt)
                    self.plans.append(plan_redistribute(spec, dst.placements))
                    self.targets.append(dst)
        else:
            self._ordered(call, layout, keeps_order)
        self.needs_redist = any(t is not None for t in self.targets)
        self.outputs = [None if o is None else tuple(o) for o in layout.outputs]
        self.shapes = list(layout.shapes)
        self.impl = layout.impl
        self.overrides = layout.overrides
        self.inplace = call.inplace
        self.view = layout.view
        copied_input = bool(call.specs) and type(call.specs[0]) is ViewCopySpec
        #: the outputs are copied views, or views of one, to link to their base
        self.link_views = (
            layout.view is not None
            and getattr(call.platform, "view_semantics", False)
            and (copied_input or (bool(self.targets) and self.targets[0] is not None))
        )
        #: an in-place op on a copied view: written back to its base after it runs
        self.writes_back = call.inplace and copied_input
        #: the rule declares no output placements: its local implementation returns its
        #: outputs wrapped (an op whose output shape depends on the values)
        self.self_wrapped = bool(self.outputs) and all(o is None for o in self.outputs)
        #: nothing to move, no rank-local override, not in place, no copied-view input
        #: (see :mod:`hyper_shard.dispatch.views`): the hot path runs it
        self.direct = (
            not self.needs_redist
            and not self.overrides
            and not self.inplace
            and not any(type(s) is ViewCopySpec for s in call.specs)
        )
        #: only rank-local argument overrides (nothing moves, not in place, no view to
        #: link): once :attr:`splice` is known the hot path runs it like a direct one
        self.override_only = (
            not self.needs_redist
            and bool(self.overrides)
            and not self.inplace
            and not self.link_views
            and not any(type(s) is ViewCopySpec for s in call.specs)
        )
        #: ``(i, j, mid)``: the positional arguments of the local call are
        #: ``args[:i] + mid + args[j:]`` (:meth:`Binder.splice`; set on the first run)
        self.splice: tuple[int, int, tuple] | None = None
        #: (output index, dtype) -> output spec, made by :meth:`out_spec` on first use
        self.out_specs: dict[tuple[int, Any], DTensorSpec] = {}
        #: (dtype, spec) of the last single-tensor result wrapped, for a platform's hot
        #: path: it compares the result's dtype by identity (a dtype whose hash is costly,
        #: such as MindSpore's, is then not hashed per call)
        self.out0: tuple[Any, DTensorSpec] | None = None
        if call.inplace and self.outputs and self.outputs[0] is not None:
            if self.outputs[0] != call.specs[0].placements or (
                self.shapes[0] is not None and tuple(self.shapes[0]) != call.specs[0].shape
            ):
                raise ShardingError(
                    f"{call.describe()}: in-place operations that require placement changes are "
                    f"not supported: the in-place result would be {list(self.outputs[0])} with "
                    f"shape {self.shapes[0]}, not the target's {fmt_placements(call.specs[0])}; use "
                    f"the out-of-place op"
                )

    def _ordered(self, call: OpCall, layout: Layout, keeps: bool) -> None:
        """Targets and output orders when an input has a shard order (dispatch/order.py)."""
        from .order import ordered_targets

        if call.inplace and not keeps and call.specs[0].shard_order is not None:
            raise ShardingError(
                f"{call.describe()}: the in-place target has a shard order "
                f"{call.specs[0].shard_order} this op's rule cannot keep; call it on "
                f"x.redistribute(...) (a left-to-right copy) or use the out-of-place op"
            )
        dsts, self.out_orders = ordered_targets(
            call.specs, layout.inputs, layout.outputs, keeps, layout.out_sources
        )
        for spec, dst in zip(call.specs, dsts):
            if dst == spec:
                self.plans.append(None)
                self.targets.append(None)
            else:
                self.plans.append(
                    plan_redistribute(spec, dst.placements, shard_order=dst.shard_order)
                )
                self.targets.append(dst)

    def out_spec(self, i: int, dtype: Any, itemsize: int) -> DTensorSpec:
        """The spec of output ``i`` for a local result of ``dtype`` (made once, then kept in
        :attr:`out_specs`)."""
        key = (i, dtype)
        spec = self.out_specs.get(key)
        if spec is None:
            shape = self.shapes[i]
            pl = self.outputs[i]
            assert shape is not None and pl is not None
            spec = DTensorSpec(
                self.mesh,
                pl,
                TensorMeta(tuple(shape), contiguous_stride(shape), dtype, itemsize),
                self.out_orders[i] if self.out_orders else None,
            )
            self.out_specs[key] = spec
        return spec


# ---------------------------------------------------------------------- registry binding
_SCALAR_TYPES = (int, float, bool, complex)
_SCALAR_SET = frozenset({int, float, bool, complex, type(None)})


class BoundOp:
    """One op bound to one platform function name (``torch.add``, ``Tensor.add_``...).

    Holds what the hot path needs: the op, an interned id, the in-place/reflected flags and
    which argument positions/names are static. ``platform`` is the key of the platform
    whose calls it binds: their arguments are read with ``op.binder_for(platform)``.
    """

    __slots__ = (
        "op",
        "name",
        "id",
        "inplace",
        "reflected",
        "static_pos",
        "static_kw",
        "binder",
        "is_dtensor",
        "tensor_type",
        "dt_type",
    )

    def __init__(
        self,
        op: DistributedOp,
        name: str,
        *,
        inplace: bool,
        reflected: bool,
        is_dtensor: Callable[[Any], bool],
        tensor_type: type,
        platform: str | None = None,
        dt_type: type | None = None,
    ) -> None:
        self.op = op
        self.name = name
        self.id = next(_ids)
        self.inplace = inplace
        self.reflected = reflected
        b = self.binder = op.binder_for(platform)
        self.static_kw = frozenset(op.static_names) | frozenset(
            alt for n in op.static_names for alt in b.aliases.get(n, ())
        )
        self.static_pos = frozenset(b.pos[n] for n in op.static_names if n in b.pos)
        if b.varargs is not None and b.varargs[0] in op.static_names:
            self.static_pos = self.static_pos | frozenset(range(b.varargs[1], 64))
        self.is_dtensor = is_dtensor
        self.tensor_type = tensor_type
        self.dt_type = dt_type  # the exact DTensor class: a fast identity check before isinstance

    def key(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, list]:
        """The cache key and the DTensor inputs (argument order, lists flattened).

        The common calls (positional DTensors of the exact DTensor class and python
        scalars, no keyword arguments) take the unrolled and the plain loop below; they
        build the same key as the general path (:meth:`_key`)."""
        if not kwargs:
            dt_type: Any = self.dt_type
            n = len(args)
            if n == 2:
                a, b = args
                if type(a) is dt_type:
                    tb = type(b)
                    if tb is dt_type:
                        return (self.id, a._spec._id, b._spec._id), [a, b]
                    if tb in _SCALAR_SET:
                        return (self.id, a._spec._id, b if 1 in self.static_pos else tb), [a]
            elif n == 3:
                a, b, c = args
                if type(a) is dt_type:
                    tb = type(b)
                    tc = type(c)
                    if tb is dt_type:
                        if tc is dt_type:
                            return (self.id, a._spec._id, b._spec._id, c._spec._id), [a, b, c]
                        if tc in _SCALAR_SET:
                            cp = c if 2 in self.static_pos else tc
                            return (self.id, a._spec._id, b._spec._id, cp), [a, b]
                    elif tb in _SCALAR_SET and tc in _SCALAR_SET:
                        sp = self.static_pos
                        return (self.id, a._spec._id, b if 1 in sp else tb, c if 2 in sp else tc), [
                            a
                        ]
            elif n == 1:
                a = args[0]
                if type(a) is dt_type:
                    return (self.id, a._spec._id), [a]
            if n > 3 or n == 0:
                parts: list[Any] = [self.id]
                dts: list[Any] = []
                sp = self.static_pos
                i = 0
                for a in args:
                    ta = type(a)
                    if ta is dt_type:
                        parts.append(a._spec._id)
                        dts.append(a)
                    elif ta in _SCALAR_SET:
                        parts.append(a if i in sp else ta)
                    else:
                        break
                    i += 1
                else:
                    return tuple(parts), dts
        return self._key(args, kwargs)

    def _key(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple, list]:
        """:meth:`key` for any call."""
        parts: list[Any] = [self.id]
        dts: list[Any] = []
        is_dt = self.is_dtensor
        dt_type = self.dt_type
        sp = self.static_pos
        for i, a in enumerate(args):
            ta = type(a)
            if ta is dt_type:
                parts.append(a._spec._id)
                dts.append(a)
            elif ta in _SCALAR_SET:  # never a DTensor: its value keys a static argument
                parts.append(a if i in sp else ta)
            elif is_dt(a):
                parts.append(a._spec._id)
                dts.append(a)
            elif ta is list or ta is tuple:
                parts.append(self._seq_key(a, dts, i in self.static_pos))
            elif i in self.static_pos:
                parts.append(_hashable(a))
            else:
                parts.append(self._tag(a))
        if kwargs:
            skw = self.static_kw
            for k, v in kwargs.items():
                tv = type(v)
                if tv in _SCALAR_SET or tv is str:
                    # the common keyword arguments (None, flags, sizes, reduction="mean"):
                    # no DTensor check; the same key part as the general path below
                    parts.append((k, v if (tv is str or k in skw) else tv))
                elif tv is dt_type or is_dt(v):
                    parts.append((k, v._spec._id))
                    dts.append(v)
                elif tv is list or tv is tuple:
                    parts.append((k, self._seq_key(v, dts, k in self.static_kw)))
                elif k in self.static_kw:
                    parts.append((k, _hashable(v)))
                else:
                    parts.append((k, self._tag(v)))
        return tuple(parts), dts

    def _seq_key(self, seq: Sequence[Any], dts: list, static: bool) -> Any:
        out = []
        for a in seq:
            if self.is_dtensor(a):
                out.append(a._spec._id)
                dts.append(a)
            elif static:
                out.append(_hashable(a))
            else:
                out.append(self._tag(a))
        return (type(seq), *out)  # a list and a tuple index differently (x[[0, 2]] vs x[0, 2])

    def _tag(self, a: Any) -> Any:
        t = type(a)
        if t in _SCALAR_TYPES or a is None:
            return t
        if isinstance(a, self.tensor_type):
            t_: Any = a
            return ("T", tuple(t_.shape), t_.dtype)  # a plain tensor: refused unless 0-d
        try:
            hash(a)  # str, dtype, device, enum...: cheap and exact
        except TypeError:
            return t
        return a


_IMMUTABLE = frozenset({int, float, bool, str, bytes, complex, type(None)})


def _hashable(v: Any) -> Any:
    """A hashable, exact stand-in for a static argument value (cache key part)."""
    t = type(v)
    if t in _IMMUTABLE:
        return v
    if t is tuple or t is list:
        return (t, *(_hashable(x) for x in v))
    if t is slice:
        return (slice, _hashable(v.start), _hashable(v.stop), _hashable(v.step))
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v
