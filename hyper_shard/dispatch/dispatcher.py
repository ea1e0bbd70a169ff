"""The three-phase dispatcher: preprocess -> cached layout inference -> execute/wrap.

One :class:`Dispatcher` per platform, and ONE path for every call, which both platforms'
hooks (torch's ``__torch_function__``, MindSpore's ``__fallback__``) enter through
:meth:`Dispatcher.dispatch`. The platform supplies only what differs between frameworks:

* ``bound_of(func)``: the op bound to a framework function (a dict lookup; None when the
  function has no entry or the binding table is not built yet);
* ``run_local(fn, args, kwargs)``: run ``fn`` on the local data of DTensor arguments;
* ``run_wrap(fn, args, kwargs, decision)``: ``run_local`` then wrap the outputs (the
  platform's fastest form of both, used on the hot path);
* ``wrap_outputs(out, decision)``, ``name_of``, ``is_dtensor``, ``lookup`` (builds the
  binding table when the registry changed) and optionally ``decompose``.

The hot path (a layout-cache hit whose decision moves nothing): the bound-op lookup, one
scan of the arguments for the key (:meth:`BoundOp.key`), one dict lookup, the decision's
hit count, ``run_wrap``. Everything else — a miss, a redistribution, rank-local overrides, an
in-place op, ``out=``, implicit replication, an unregistered op — takes the slow path,
which is the same code for every platform.

Unregistered ops raise :class:`~hyper_shard.errors.OpNotRegisteredError` naming the op,
the input placements and the YAML entry to add, unless the platform can decompose a
composite function into registered ones, or ``hyper_shard.config.fallback = "replicate"``
(gather the inputs, run the plain op, return Replicate DTensors; warns once per op). An
entry whose rule runs the op as its parts (``rule: composite``) is decomposed the same way,
by declaration.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import OpNotRegisteredError, ShardingError
from ..flight.context import OpFrame, stack
from ..placement import Replicate
from ..redistribute.executor import redistribute_with_plan
from ..spec import DTensorSpec
from . import switches
from .cross_mesh import adopt_scalars, foreign_mesh, split_foreach
from .op import BoundOp, Decision, OpCall, fmt_placements
from .order import any_ordered, left_to_right_call_specs
from .out_variant import write_out
from .participation import outside_mesh_layout
from .plain import describe, find_dtensors, replicate_plain
from .plain_scalars import replicate_one_element
from .views import link_views, write_back

if TYPE_CHECKING:
    from ..platform.base import Platform

__all__ = ["Dispatcher", "config", "cache_info", "clear_cache"]


class _Config:
    """Dispatcher policy (process-wide settings, not context switches). ``fallback``:
    ``"error"`` (default) or ``"replicate"``; ``cache_size``: decisions kept (evicted
    least recently used first, approximately: :func:`_evict`).
    ``implicit_replication`` (read-only) is the current context's switch, set by
    :func:`hyper_shard.experimental.implicit_replication`."""

    fallback: str = "error"
    cache_size: int = 8192

    @property
    def implicit_replication(self) -> bool:
        return switches.implicit_replication_enabled()


config = _Config()

#: key -> decision, in insertion order (a plain dict: a hit costs one lookup and one
#: counter increment on the decision, no reordering). Per rank without costing a lookup: a
#: key holds its DTensors' spec ids, and a spec's mesh is keyed by the rank holding it, so
#: ranks that are threads of one process never share a decision (docs/architecture.md,
#: "Ranks as threads")
_CACHE: dict[tuple, Decision] = {}
#: misses, and the hits of decisions no longer cached (the cached ones count their own)
_STATS = {"hits": 0, "misses": 0}
_WARNED: set[str] = set()


def cache_info() -> dict[str, int]:
    """Layout-cache hits, misses and size."""
    hits = _STATS["hits"] + sum(d.hits for d in list(_CACHE.values()))  # a copy: threads
    return {
        "hits": hits,
        "misses": _STATS["misses"],
        "size": len(_CACHE),
        "max_size": config.cache_size,
    }


def clear_cache() -> None:
    """Forget every cached decision and reset the counters."""
    _CACHE.clear()
    _STATS["hits"] = _STATS["misses"] = 0


def _evict(cache: dict[tuple, Decision], size: int) -> None:
    """Drop decisions until ``cache`` holds ``size``: the oldest first, except that one hit
    since it was last looked at gets a second chance (it moves to the end, its hits
    marked seen). An approximate LRU (CLOCK) whose hits cost one counter increment and no
    reordering; at most one pass over the cache per eviction, since a second look at an
    entry evicts it. Safe against other threads evicting at the same time."""
    while len(cache) > size:
        try:
            key = next(iter(cache))
        except StopIteration:  # emptied by another thread
            continue
        dec = cache.pop(key, None)
        if dec is None:  # another thread took it
            continue
        if dec.hits != dec.seen_hits:
            dec.seen_hits = dec.hits
            cache[key] = dec
        else:
            _STATS["hits"] += dec.hits


class Dispatcher:
    """Routes ops called on a platform's DTensors (see the module docstring).

    Args:
        platform: the Platform, or a zero-argument function returning it (called on first use).
        bound_of: hot lookup: framework function -> BoundOp, or None.
        lookup: slow lookup: as ``bound_of``, building the binding table if needed.
        name_of: readable name of a framework function (for errors).
        run_local: ``run_local(fn, args, kwargs)`` runs ``fn`` on local data.
        run_wrap: ``run_wrap(fn, args, kwargs, decision)``: run then wrap.
        wrap_outputs: ``wrap_outputs(out, decision)`` wraps local results.
        is_dtensor: the platform's DTensor check.
        decompose: optional ``decompose(func)`` -> a callable running a composite function
            through its registered parts, or None.
    """

    def __init__(
        self,
        platform: Platform | Callable[[], Platform],
        *,
        bound_of: Callable[[Any], BoundOp | None],
        lookup: Callable[[Any], BoundOp | None],
        name_of: Callable[[Any], str],
        run_local: Callable[[Callable, tuple, dict], Any],
        run_wrap: Callable[[Callable, tuple, dict, Decision], Any],
        wrap_outputs: Callable[[Any, Decision], Any],
        is_dtensor: Callable[[Any], bool],
        decompose: Callable[[Any], Callable | None] | None = None,
    ) -> None:
        self._platform = platform
        self.bound_of = bound_of
        self.lookup = lookup
        self.name_of = name_of
        self.run_local = run_local
        self.run_wrap = run_wrap
        self.wrap_outputs = wrap_outputs
        self.is_dtensor = is_dtensor
        self.decompose = decompose
        self.dispatch, self.dispatch_bound = self._make_dispatch()

    @property
    def platform(self) -> Platform:
        """The Platform (made on first use when a factory was given)."""
        p = self._platform
        if isinstance(p, types.FunctionType):
            p = self._platform = p()
        return p  # type: ignore[return-value]

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Dispatch one call (the same path as :attr:`dispatch`)."""
        return self.dispatch(func, args, kwargs)

    def _make_dispatch(
        self,
    ) -> tuple[Callable[[Any, tuple, dict], Any], Callable[[BoundOp, Any, tuple, dict], Any]]:
        # the hot path as closures: their collaborators are cell variables, not attribute
        # lookups on self (these functions run once per op call on DTensors)
        bound_of, run_wrap, slow, execute = self.bound_of, self.run_wrap, self._slow, self.execute
        cache, active = _CACHE, switches.ACTIVE

        def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
            """Dispatch one framework call that has a DTensor argument."""
            bound = bound_of(func)
            if bound is not None and not active.n and not (kwargs and "out" in kwargs):
                key, dts = bound.key(args, kwargs)
                dec = cache.get(key)
                if dec is not None:
                    dec.hits += 1
                    if dec.direct:
                        return run_wrap(dec.impl or func, args, kwargs, dec)
                    sp = dec.splice  # only rank-local overrides (e.g. a view's local shape)
                    if sp is not None:
                        i, j, mid = sp
                        return run_wrap(dec.impl or func, args[:i] + mid + args[j:], kwargs, dec)
                    return execute(bound, func, args, kwargs, dts, dec)
            return slow(bound, func, args, kwargs)

        def dispatch_bound(bound: BoundOp, func: Any, args: tuple, kwargs: dict) -> Any:
            """:func:`dispatch` for a caller that already holds ``func``'s bound op (a
            platform's own Python entry point, e.g. a hot Tensor method): the same path,
            without the ``bound_of`` lookup."""
            if not active.n and not (kwargs and "out" in kwargs):
                key, dts = bound.key(args, kwargs)
                dec = cache.get(key)
                if dec is not None:
                    dec.hits += 1
                    if dec.direct:
                        return run_wrap(dec.impl or func, args, kwargs, dec)
                    sp = dec.splice  # only rank-local overrides (e.g. a view's local shape)
                    if sp is not None:
                        i, j, mid = sp
                        return run_wrap(dec.impl or func, args[:i] + mid + args[j:], kwargs, dec)
                    return execute(bound, func, args, kwargs, dts, dec)
            return slow(bound, func, args, kwargs)

        return dispatch, dispatch_bound

    def decide(self, func: Any, args: tuple, kwargs: dict) -> Decision:
        """The decision this call gets (looked up, or made and cached), without running it.

        Raises:
            OpNotRegisteredError: ``func`` has no entry.
        """
        bound = self.bound_of(func) or self.lookup(func)
        if bound is None:
            raise OpNotRegisteredError(f"op {self.name_of(func)!r} has no sharding rule")
        args, kwargs = self._prepare(bound, args, kwargs)
        key, dts = bound.key(args, kwargs)
        dec = _CACHE.get(key)
        return dec if dec is not None else self._miss(bound, func, args, kwargs, dts, key)

    # ------------------------------------------------------------------ slow path
    def _prepare(self, bound: BoundOp | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Plain tensors the current switches (or the op) take as Replicate DTensors; a
        plain one-element tensor always (as PyTorch DTensor: :mod:`.plain_scalars`)."""
        if switches.implicit_replication_enabled() or (
            bound is not None and bound.op.replicates_plain()
        ):
            return replicate_plain(self.platform, self.is_dtensor, args, kwargs)
        if bound is not None and getattr(bound.op, "replicate_plain_lists", False):
            args, kwargs = replicate_plain(
                self.platform, self.is_dtensor, args, kwargs, lists_only=True
            )
        return replicate_one_element(self.platform, self.is_dtensor, args, kwargs)

    def _slow(self, bound: BoundOp | None, func: Any, args: tuple, kwargs: dict) -> Any:
        if bound is None:
            bound = self.lookup(func)
        args, kwargs = self._prepare(bound, args, kwargs)
        if kwargs and kwargs.get("out") is not None:
            return self._with_out(func, args, kwargs)
        if bound is None:
            return self._unregistered(func, args, kwargs)
        if bound.op.runs_as_parts:
            return self._as_parts(bound, func, args, kwargs)
        key, dts = bound.key(args, kwargs)
        dec = _CACHE.get(key)
        if dec is None and foreign_mesh(dts):  # DTensors of several meshes: cross_mesh.py
            if getattr(bound.op, "replicate_plain_lists", False):  # a foreach op
                done, out = split_foreach(self.dispatch, func, args, kwargs, self.is_dtensor)
                if done:
                    return out
            args, kwargs = adopt_scalars(dts, args, kwargs, self.is_dtensor)
            key, dts = bound.key(args, kwargs)
            dec = _CACHE.get(key)
        if dec is None:
            dec = self._miss(bound, func, args, kwargs, dts, key)
            out = self.execute(bound, func, args, kwargs, dts, dec)
            if not dec.inplace:
                self._check_local_shapes(bound, func, out, key)
            return out
        dec.hits += 1
        return self.execute(bound, func, args, kwargs, dts, dec)

    def execute(
        self, bound: BoundOp, func: Any, args: tuple, kwargs: dict, dts: list, dec: Decision
    ) -> Any:
        """Phase 3: redistribute the inputs a decision moves, run the local op, wrap.

        An in-place op on a copied view is written back to its base; a view op whose
        decision moved its input links its outputs to it (:mod:`.views`)."""
        call_args, call_kwargs = args, kwargs
        if dec.needs_redist:
            args, kwargs = self._redistribute(func, args, kwargs, dts, dec)
        if dec.overrides:
            if dec.override_only and type(args) is tuple:  # once: how the hot path applies them
                dec.splice = bound.binder.splice(args, kwargs, dec.overrides)
                dec.override_only = False
            for name, value in dec.overrides.items():
                args, kwargs = bound.binder.replace(args, kwargs, name, value)
        if dec.inplace:
            target = dts[0]  # the target (first DTensor input, positional or keyword)
            self.run_local(dec.impl or func, args, kwargs)
            if dec.writes_back:
                write_back(target, self)
            return target
        out = self.run_wrap(dec.impl or func, args, kwargs, dec)
        if dec.link_views:
            link_views(out, dts, dec.targets[0] is not None, dec.view, func, call_args, call_kwargs)
        return out

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

    def _with_out(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``out=`` variants: compute out of place, then write into ``out`` in ``out``'s
        placements, as PyTorch DTensor (see :mod:`hyper_shard.dispatch.out_variant`)."""
        kw = dict(kwargs)
        out = kw.pop("out")
        if not find_dtensors(args, kw, self.is_dtensor):
            # a factory writing into a DTensor (torch.eye(n, out=d), what nn.init.eye_ runs):
            # every rank builds the whole plain result (factories take the same arguments on
            # every rank) as a Replicate DTensor on out's mesh, then out keeps its layout
            result = self._replicated_plain(func, args, kw, out)
        else:
            result = self.dispatch(func, args, kw)
        return write_out(self.platform, self.name_of(func), self.is_dtensor, out, result)

    def _replicated_plain(self, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        """``func`` run on plain arguments, its tensor results wrapped as ``Replicate``
        DTensors on the mesh of the first ``out`` DTensor (no communication)."""
        plat, is_dt = self.platform, self.is_dtensor
        outs = out if isinstance(out, (tuple, list)) else (out,)
        first = next((o for o in outs if is_dt(o)), None)
        if first is None:
            raise ShardingError(
                f"{self.name_of(func)}: out= must be a DTensor when called with DTensors, got "
                f"{type(out).__name__}"
            )
        mesh = first._spec.mesh
        plain = self.run_local(func, args, kwargs)
        reps = [Replicate()] * mesh.ndim

        def wrap(t: Any) -> Any:
            if plat.is_tensor(t) and not is_dt(t):
                return plat.wrap(t, DTensorSpec(mesh, reps, plat.tensor_meta(t)))
            return t

        if isinstance(plain, (tuple, list)):
            return type(plain)(wrap(t) for t in plain)
        return wrap(plain)

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
            # a rule's own shape/argument check: name the call and its placements (the
            # original error stays the cause: a bug inside a rule keeps its traceback)
            msg = str(e)
            if type(e) in (ValueError, IndexError, TypeError) and call.platform_name not in msg:
                raise type(e)(f"{call.describe()}: {msg}") from e
            raise
        if call.mesh.get_coordinate() is None:  # a rank outside the mesh: nothing runs
            layout = outside_mesh_layout(call, layout)
        dec = Decision(call, layout, keeps)
        if len(_CACHE) >= config.cache_size:
            _evict(_CACHE, max(config.cache_size - 1, 0))  # room for the new one
        _CACHE[key] = dec
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
                    f"an op takes DTensors of one DeviceMesh (redistribute does not change "
                    f"meshes): rebuild one with DTensor.from_local(t.to_local(), mesh, "
                    f"placements); for clip_grad_norm_ over parameters on several meshes, "
                    f"get each mesh's norm and combine them (docs/fsdp.md)"
                )
        binder = bound.binder
        names = list(binder.names)
        roles: list[str] = []
        scalars: dict[str, Any] = {}
        ids = {id(d) for d in dts}
        plat = self.platform
        plain_tensor = plat.is_tensor

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
                if len(plat.shape(a)) == 0:
                    scalars[name] = a
                else:
                    raise ShardingError(
                        f"{pname}: got a plain tensor of shape "
                        f"{tuple(plat.shape(a))} for {name!r} mixed with DTensor inputs "
                        f"({describe(dts)}); convert it with "
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
            platform=plat,
        )

    def _redistribute(
        self, func: Any, args: tuple, kwargs: dict, dts: list, dec: Decision
    ) -> tuple[tuple, dict]:
        """Replace every DTensor occurrence the decision moves by its redistributed local.

        Occurrences are matched in the order :meth:`BoundOp.key` found them, so one object
        passed twice (``x * x``) may get two layouts; the same object moved to the same
        layout twice is redistributed once. The moves run inside an
        :class:`~hyper_shard.flight.context.OpFrame` (the op and its input layouts, for a
        CollectiveError, the flight recorder and the consistency mode)."""
        plat = self.platform
        new: list[Any] = []
        done: dict[tuple[int, Any], Any] = {}
        frames = stack()
        frames.append(OpFrame(self.name_of, func, [d._spec for d in dts]))
        try:
            for dt, plan, tgt in zip(dts, dec.plans, dec.targets):
                if plan is None or tgt is None:
                    new.append(None)
                    continue
                k = (id(dt), tgt.placements)
                r = done.get(k)
                if r is None:
                    r = done[k] = _moved(plat, dt, plan, tgt)
                new.append(r)
        finally:
            frames.pop()
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
    def _as_parts(self, bound: BoundOp, func: Any, args: tuple, kwargs: dict) -> Any:
        """An entry declared ``rule: composite``: run the function's own body on the
        DTensors, each inner op dispatching (the platform's ``decompose``).

        Raises:
            OpNotRegisteredError: the platform cannot decompose ``func`` (not a
                Python-level function of the framework).
        """
        fn = self.decompose(func) if self.decompose is not None else None
        name = self.name_of(func)
        if fn is None:
            raise OpNotRegisteredError(
                f"{name}: entry {bound.op.name!r} says the op runs as its parts (rule: "
                f"composite), but {self.platform.name} cannot run {name} on DTensors as its "
                f"parts (it is not a Python-level function); give the entry a sharding rule"
            )
        with switches.decomposing(name):
            return fn(*args, **kwargs)

    def _unregistered(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.decompose is not None:
            fn = self.decompose(func)
            if fn is not None:
                with switches.decomposing(self.name_of(func)):
                    return fn(*args, **kwargs)
        name = self.name_of(func)
        dts = find_dtensors(args, kwargs, self.is_dtensor)
        if config.fallback == "replicate" and dts:
            return self._replicate_fallback(func, name, args, kwargs, dts)
        desc = describe(dts) or "no DTensor"
        short = name.split(".")[-1].rstrip("_")
        inside, bind = "", name
        stack = switches.decomposition_stack()
        if stack:
            outer = bind = stack[0]
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


def _moved(plat: Platform, dt: Any, plan: Any, tgt: Any) -> Any:
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
