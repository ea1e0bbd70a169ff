"""The three-phase dispatcher: preprocess -> cached layout inference -> execute/wrap.

One :class:`Dispatcher` per platform. The hot path (a cache hit with no redistribution)
is: one dict lookup for the bound op, one scan of the arguments for the key, one
OrderedDict lookup, the local call, the wrap. Everything else happens on a miss.

Unregistered ops raise :class:`~hyper_shard.errors.OpNotRegisteredError` naming the op,
the input placements and the YAML entry to add, unless the platform can decompose a
composite function into registered ones, or ``hyper_shard.config.fallback = "replicate"``
(gather the inputs, run the plain op, return Replicate DTensors; warns once per op).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import OpNotRegisteredError, ShardingError
from ..redistribute.executor import backward_plan, execute_plan
from .op import BoundOp, Decision, OpCall, fmt_placements
from .order import any_ordered, left_to_right_call_specs

__all__ = ["Dispatcher", "config", "cache_info", "clear_cache"]


class _Config:
    """Dispatcher policy. ``fallback``: ``"error"`` (default) or ``"replicate"``;
    ``cache_size``: decisions kept (LRU); ``implicit_replication``: treat plain tensors
    mixed with DTensors as ``Replicate`` (set by
    :func:`hyper_shard.experimental.implicit_replication`)."""

    fallback: str = "error"
    cache_size: int = 8192
    implicit_replication: bool = False


config = _Config()

_CACHE: OrderedDict[tuple, Decision] = OrderedDict()
_STATS = {"hits": 0, "misses": 0}
_WARNED: set[str] = set()
_DECOMPOSING: list[str] = []  # composite functions being run as their parts (outermost first)


def cache_info() -> dict[str, int]:
    """Layout-cache hits, misses and size."""
    return {**_STATS, "size": len(_CACHE), "max_size": config.cache_size}


def clear_cache() -> None:
    """Forget every cached decision and reset the counters."""
    _CACHE.clear()
    _STATS["hits"] = _STATS["misses"] = 0


class Dispatcher:
    """Routes ops called on a platform's DTensors.

    Args:
        platform: the Platform (collectives, wrapping).
        lookup: platform function -> BoundOp, or None.
        name_of: readable name of a platform function (for errors).
        run_local: ``run_local(fn, args, kwargs)`` runs ``fn`` on local data.
        wrap_outputs: ``wrap_outputs(out, decision)`` wraps local results.
        is_dtensor: the platform's DTensor check.
        decompose: optional ``decompose(func)`` -> a callable running a composite function
            through its registered parts, or None.
    """

    def __init__(
        self,
        platform: Any,
        lookup: Callable[[Any], BoundOp | None],
        name_of: Callable[[Any], str],
        run_local: Callable[[Callable, tuple, dict], Any],
        wrap_outputs: Callable[[Any, Decision], Any],
        is_dtensor: Callable[[Any], bool],
        decompose: Callable[[Any], Callable | None] | None = None,
    ) -> None:
        self.platform = platform
        self.lookup = lookup
        self.name_of = name_of
        self.run_local = run_local
        self.wrap_outputs = wrap_outputs
        self.is_dtensor = is_dtensor
        self.decompose = decompose

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        bound = self.lookup(func)
        if config.implicit_replication:
            args, kwargs = self._replicate_plain(args, kwargs)
        elif bound is not None and getattr(bound.op, "replicate_plain_lists", False):
            args, kwargs = self._replicate_plain(args, kwargs, lists_only=True)
        if kwargs and kwargs.get("out") is not None:
            return self._with_out(func, args, kwargs)
        if bound is None:
            return self._unregistered(func, args, kwargs)
        key, dts = bound.key(args, kwargs)
        dec = _CACHE.get(key)
        if dec is None:
            dec = self._miss(bound, func, args, kwargs, dts, key)
            out = self.execute(bound, func, args, kwargs, dts, dec)
            if not dec.inplace:
                self._check_local_shapes(bound, func, out, key)
            return out
        _STATS["hits"] += 1
        _CACHE.move_to_end(key)
        return self.execute(bound, func, args, kwargs, dts, dec)

    def _check_local_shapes(self, bound: BoundOp, func: Any, out: Any, key: tuple) -> None:
        """On a decision's first run: every output's local shape must be the one its spec
        gives this rank, else the rule does not describe the op (e.g. an op that changes
        shapes declared ``rule: pointwise``). The decision is dropped and the error names
        the op, its entry and the shapes; nothing is returned half-wrapped."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        is_dt = self.is_dtensor
        for i, o in enumerate(outs):
            if not is_dt(o):
                continue
            spec = o._spec
            if spec.mesh.get_coordinate() is None:
                continue
            want = tuple(spec.local_shape())
            got = tuple(self.platform.shape(self.platform.local_of(o)))
            if got != want:
                _CACHE.pop(key, None)
                raise ShardingError(
                    f"{self.name_of(func)}: the sharding rule of entry {bound.op.name!r} "
                    f"({type(bound.op).__name__}) says output {i} is {fmt_placements(spec)}, "
                    f"whose local shard here has shape {want}, but the local op returned "
                    f"{got}: the rule does not describe this op. Pick the rule that does "
                    f"(docs/custom_ops.md) or write a class for it"
                )

    def _replicate_plain(
        self, args: tuple, kwargs: dict, lists_only: bool = False
    ) -> tuple[tuple, dict]:
        """Under implicit replication: every plain tensor of rank >= 1 next to a DTensor,
        and every plain tensor inside a list or tuple (0-d too), becomes a ``Replicate``
        DTensor on that DTensor's mesh (an alias: same storage, autograd kept). The plain
        tensor must hold the same values on every rank, as in PyTorch DTensor's
        ``implicit_replication``; ``out=`` tensors are left alone. ``lists_only``: only
        the list elements (the default for foreach ops, whose elements are independent)."""
        is_dt = self.is_dtensor
        plain = self.platform.is_tensor
        mesh = None
        found = False

        def scan(a: Any, nested: bool = False) -> None:
            nonlocal mesh, found
            if is_dt(a):
                if mesh is None:
                    mesh = a._spec.mesh
            elif type(a) in (list, tuple):
                for x in a:
                    scan(x, True)
            elif plain(a) and (nested or (not lists_only and len(self.platform.shape(a)) > 0)):
                found = True

        for a in args:
            scan(a)
        for k, v in kwargs.items():
            if k != "out":
                scan(v)
        if mesh is None or not found:
            return args, kwargs
        from ..placement import Replicate
        from ..spec import DTensorSpec

        plat = self.platform
        reps = [Replicate()] * mesh.ndim

        def conv(a: Any, nested: bool = False) -> Any:
            if is_dt(a):
                return a
            if type(a) in (list, tuple):
                return type(a)(conv(x, True) for x in a)
            if plain(a) and (nested or (not lists_only and len(plat.shape(a)) > 0)):
                return plat.wrap(a, DTensorSpec(mesh, reps, plat.tensor_meta(a)))
            return a

        args = tuple(conv(a) for a in args)
        kwargs = {k: (v if k == "out" else conv(v)) for k, v in kwargs.items()}
        return args, kwargs

    def execute(
        self, bound: BoundOp, func: Any, args: tuple, kwargs: dict, dts: list, dec: Decision
    ) -> Any:
        """Phase 3: redistribute the inputs a decision moves, run the local op, wrap."""
        if dec.needs_redist:
            args, kwargs = self._redistribute(args, kwargs, dts, dec)
        if dec.overrides:
            for name, value in dec.overrides.items():
                args, kwargs = bound.binder.replace(args, kwargs, name, value)
        out = self.run_local(dec.impl or func, args, kwargs)
        if dec.inplace:
            return dts[0]  # the target (first DTensor input, positional or keyword)
        return self.wrap_outputs(out, dec)

    def _with_out(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``out=`` variants: compute out of place, then write into ``out`` when it is a
        DTensor with exactly the result's layout (else a clear error; nothing is written)."""
        kw = dict(kwargs)
        out = kw.pop("out")
        result = self(func, args, kw)
        name = self.name_of(func)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(outs) != len(results):
            raise ShardingError(
                f"{name}: out= has {len(outs)} tensors, the op returns {len(results)}"
            )
        for o, r in zip(outs, results):
            if not self.is_dtensor(o):
                raise ShardingError(
                    f"{name}: out= must be a DTensor when the inputs are DTensors, got "
                    f"{type(o).__name__}; call without out= (or pass a DTensor)"
                )
            if o._spec.placements != r._spec.placements or o._spec.shape != r._spec.shape:
                raise ShardingError(
                    f"{name}: out= is {fmt_placements(o._spec)} but the result is "
                    f"{fmt_placements(r._spec)}; call without out= and redistribute, or pass an "
                    f"out= with the result's placements"
                )
        for o, r in zip(outs, results):
            self.platform.copy_into(o, r)
        return out

    # ------------------------------------------------------------------ miss path
    def _miss(
        self, bound: BoundOp, func: Any, args: tuple, kwargs: dict, dts: list, key: tuple
    ) -> Decision:
        _STATS["misses"] += 1
        call = self._make_call(bound, func, args, kwargs, dts)
        keeps: bool | None = None
        rule_call = call
        if any_ordered(call.specs):  # an input with a shard order (dispatch/order.py)
            keeps = bound.op.keeps_shard_order
            if not keeps:
                rule_call = dataclasses.replace(call, specs=left_to_right_call_specs(call.specs))
        try:
            layout = bound.op.infer_layout(rule_call)
        except (ValueError, IndexError, TypeError) as e:
            # a rule's own shape/argument check: name the call and its placements
            msg = str(e)
            if type(e) in (ValueError, IndexError, TypeError) and call.platform_name not in msg:
                raise type(e)(f"{call.describe()}: {msg}") from None
            raise
        dec = Decision(call, layout, keeps)
        _CACHE[key] = dec
        if len(_CACHE) > config.cache_size:
            _CACHE.popitem(last=False)
        return dec

    def _make_call(self, bound: BoundOp, func: Any, args: tuple, kwargs: dict, dts: list) -> OpCall:
        op = bound.op
        pname = self.name_of(func)
        if not dts:
            raise OpNotRegisteredError(f"{pname}: called with no DTensor input")
        mesh = dts[0]._spec.mesh
        for d in dts[1:]:
            if d._spec.mesh != mesh:
                raise ShardingError(
                    f"{pname}: inputs live on different meshes ({mesh} and {d._spec.mesh}); "
                    f"redistribute them onto one DeviceMesh first"
                )
        binder = bound.binder
        names = list(binder.names)
        roles: list[str] = []
        scalars: dict[str, Any] = {}
        ids = {id(d) for d in dts}
        plain_tensor = self.platform.is_tensor

        def role_of(i: int | str) -> str:
            if isinstance(i, str):
                return i
            if binder.varargs is not None and i >= binder.varargs[1]:
                return f"{binder.varargs[0]}[{i - binder.varargs[1]}]"
            return names[i] if i < len(names) else f"arg{i}"

        def visit(name: str, a: Any) -> None:
            if id(a) in ids and self.is_dtensor(a):
                roles.append(name)
            elif type(a) in (list, tuple):
                for j, x in enumerate(a):
                    visit(f"{name}[{j}]", x)
            elif isinstance(a, (int, float, bool, complex)):
                scalars[name] = a
            elif plain_tensor(a):
                if len(self.platform.shape(a)) == 0:
                    scalars[name] = a
                else:
                    raise ShardingError(
                        f"{pname}: got a plain {type(a).__name__} of shape "
                        f"{tuple(self.platform.shape(a))} for {name!r} mixed with DTensor inputs "
                        f"({_describe(dts)}); convert it with "
                        f"distribute_tensor(t, mesh, [Replicate()]) or DTensor.from_local first, "
                        f"or call inside `with hyper_shard.experimental.implicit_replication():` "
                        f"if it holds the same values on every rank"
                    )

        for i, a in enumerate(args):
            visit(role_of(i), a)
        for k, v in kwargs.items():
            visit(k, v)
        static = {n: binder.get(args, kwargs, n) for n in op.static_names}
        return OpCall(
            name=op.name,
            platform_name=pname,
            specs=[d._spec for d in dts],
            arg_roles=roles,
            static=static,
            scalars=scalars,
            inplace=bound.inplace,
            reflected=bound.reflected,
            args=args,
            kwargs=kwargs,
            func=func,
            binder=binder,
            platform=self.platform,
        )

    def _redistribute(
        self, args: tuple, kwargs: dict, dts: list, dec: Decision
    ) -> tuple[tuple, dict]:
        """Replace every DTensor occurrence the decision moves by its redistributed local.

        Occurrences are matched in the order :meth:`BoundOp.key` found them, so one object
        passed twice (``x * x``) may get two layouts; the same object moved to the same
        layout twice is redistributed once."""
        plat = self.platform
        new: list[Any] = []
        done: dict[tuple[int, Any], Any] = {}
        for dt, plan, tgt in zip(dts, dec.plans, dec.targets):
            if plan is None or tgt is None:
                new.append(None)
                continue
            k = (id(dt), tgt.placements)
            r = done.get(k)
            if r is None:
                r = done[k] = _moved(plat, dt, plan, tgt)
            new.append(r)
        it = iter(zip(dts, new))
        is_dt = self.is_dtensor

        def sub(a: Any) -> Any:
            if is_dt(a):
                dt, r = next(it)
                assert dt is a
                return a if r is None else r
            if type(a) in (list, tuple):
                return type(a)(sub(x) for x in a)
            return a

        args2 = tuple(sub(a) for a in args)
        return args2, {k: sub(v) for k, v in kwargs.items()}

    # ------------------------------------------------------------------ unregistered
    def _unregistered(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.decompose is not None:
            fn = self.decompose(func)
            if fn is not None:
                _DECOMPOSING.append(self.name_of(func))
                try:
                    return fn(*args, **kwargs)
                finally:
                    _DECOMPOSING.pop()
        name = self.name_of(func)
        dts = _find_dtensors(args, kwargs, self.is_dtensor)
        if config.fallback == "replicate" and dts:
            return self._replicate_fallback(func, name, args, kwargs, dts)
        desc = _describe(dts) or "no DTensor"
        short = name.split(".")[-1].rstrip("_")
        inside, bind = "", name
        if _DECOMPOSING:
            outer = bind = _DECOMPOSING[0]
            short = outer.split(".")[-1].rstrip("_")
            inside = (
                f" It was called by {outer}, which has no entry either and which hyper_shard "
                f"ran as its parts; binding {outer} itself (its public name) may be simpler."
            )
        raise OpNotRegisteredError(
            f"op {name!r} has no sharding rule registered (inputs: {desc}).{inside}\n"
            f"Add a YAML entry to a file in HYPER_PARALLEL_OPS_YAML_DIR, e.g.\n"
            f"  {short}:\n    rule: pointwise   # only if elementwise; else einsum, reduction, view, "
            f"tensor_op... (docs/custom_ops.md), or class: module:Class\n"
            f"    {self.platform.name}: [{bind}]\n"
            f"or set hyper_shard.config.fallback = 'replicate' to gather the inputs and run it "
            f"plainly, or call to_local()/full_tensor() yourself"
        )

    def _replicate_fallback(
        self, func: Any, name: str, args: tuple, kwargs: dict, dts: list
    ) -> Any:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(
                f"hyper_shard: {name} has no sharding rule; gathering its inputs and running it "
                f"replicated (hyper_shard.config.fallback='replicate')",
                stacklevel=3,
            )
        mesh = dts[0]._spec.mesh
        full = {id(d): d.full_tensor() for d in dts}

        def sub(a: Any) -> Any:
            if id(a) in full:
                return full[id(a)]
            if type(a) in (list, tuple):
                return type(a)(sub(x) for x in a)
            return a

        out = self.run_local(
            func, tuple(sub(a) for a in args), {k: sub(v) for k, v in kwargs.items()}
        )
        from ..dtensor import DTensor
        from ..placement import Replicate

        def one(t: Any) -> Any:
            if self.platform.is_tensor(t) and not self.is_dtensor(t):
                return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim)
            return t

        return type(out)(one(x) for x in out) if isinstance(out, (tuple, list)) else one(out)


def _describe(dts: list, limit: int = 4) -> str:
    """The inputs' layouts for an error message (the first ``limit``, then a count)."""
    shown = ", ".join(fmt_placements(d._spec) for d in dts[:limit])
    return shown + (f", ... ({len(dts) - limit} more DTensors)" if len(dts) > limit else "")


def _find_dtensors(args: tuple, kwargs: dict, is_dt: Callable[[Any], bool]) -> list:
    out = []
    for a in list(args) + list(kwargs.values()):
        if is_dt(a):
            out.append(a)
        elif type(a) in (list, tuple):
            out.extend(x for x in a if is_dt(x))
    return out


def _moved(plat: Any, dt: Any, plan: Any, tgt: Any) -> Any:
    """``dt``'s local data redistributed to ``tgt``. A DTensor that needs no gradient
    keeps its last result while its data is unchanged (same version counter), so a
    gradient read by several optimizer ops is reduced once per step."""
    local = plat.local_of(dt)
    if plat.requires_grad(local):
        return redistribute_with_plan(plat, local, dt._spec, plan)
    ver = plat.version(dt)
    if ver is None:
        return redistribute_with_plan(plat, local, dt._spec, plan)
    memo = dt.__dict__.get("_hs_moved")
    if memo is not None and memo[0] == ver and memo[1] == tgt.placements:
        return memo[2]
    r = redistribute_with_plan(plat, local, dt._spec, plan)
    dt.__dict__["_hs_moved"] = (ver, tgt.placements, r)
    return r


def redistribute_with_plan(
    plat: Any, local: Any, spec: Any, plan: Any, backward_dtype: Any = None
) -> Any:
    """Run a precomputed redistribution plan on a local tensor, differentiably.
    ``backward_dtype``: run the backward collectives on the gradient cast to this dtype
    (cast back afterwards)."""
    if not plat.requires_grad(local):
        return execute_plan(plat, local, spec, plan)
    saved: list[Any] = []
    if backward_dtype is None:
        bwd = lambda g: backward_plan(plat, g, spec, plan, saved)  # noqa: E731
    else:

        def bwd(g: Any) -> Any:
            low = plat.cast(g, backward_dtype)
            return plat.cast(backward_plan(plat, low, spec, plan, saved), g.dtype)

    return plat.custom_autograd(
        lambda x: execute_plan(plat, x, spec, plan, saved),
        bwd,
        local,
    )
