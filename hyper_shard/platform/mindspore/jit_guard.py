"""Refusing DTensors in compiled MindSpore code (``mindspore.jit``, ``GRAPH_MODE``).

A MindSpore DTensor *is* its local shard to MindSpore's C++ (an alias made by
``Tensor._make_subclass``). PyNative hands every Primitive call with a DTensor argument
to ``__fallback__``, where hyper_shard dispatches it; a compiled graph never calls
``__fallback__``: it runs on each rank's local shard and returns a plain tensor of local
values. ``ms.jit(lambda a: ops.sum(a * 2.0))(d)`` on a ``Shard(0)`` DTensor of
``arange(16).reshape(4, 4)`` on 2 ranks returns 56.0 and 184.0 (each rank's own sum)
where PyNative gives 240.0 on both.

Until hyper_shard has a compiled MindSpore path, every entry into compiled code that
receives a DTensor raises :class:`CompiledDTensorError` before anything is compiled (on
every rank alike, with no collective, so no rank waits for another): an argument (also
inside a tuple, list or dict), or a parameter of a Cell the compiled function belongs to
or receives. The entries (replaced by :mod:`.hooks`): ``capture_mode="ast"`` (the
default; ``ms.jit(f)``, ``@jit`` on ``construct``, ``ms.jit(cell)``),
``capture_mode="bytecode"``, ``capture_mode="trace"`` and ``GRAPH_MODE`` Cells.

One exception: MindSpore's optimizers compile their ``construct`` (``@jit``), and those
whose update of an element reads only that element of the parameter, its gradient and
its state (:data:`PER_ELEMENT`: ``nn.SGD``, ``nn.Adam``...) are exact on the local
shards, which is how they step DTensor parameters (docs/mindspore.md, "Parameters and
optimizers"). They run, provided each DTensor gradient has its parameter's placements
(else the error names ``optimizer_grads``). ``nn.LARS``/``nn.Lamb`` (whole-parameter
norms), ``nn.LazyAdam``/``Adam(use_lazy=True)`` (row indices) and a subclass overriding
``construct`` are refused.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from mindspore import Tensor, nn

from ...dtensor import DTensor
from ...errors import HyperShardError

__all__ = ["CompiledDTensorError", "find_dtensor", "refuse", "PER_ELEMENT"]

#: MindSpore optimizers (``mindspore.nn``) whose update is per element: exact when run
#: compiled on the local shards of parameters and gradients with the same placements
PER_ELEMENT = frozenset(
    {
        "SGD", "Momentum", "Adam", "AdamWeightDecay", "AdamOffload", "AdaMax", "Adagrad",
        "Adadelta", "ASGD", "FTRL", "ProximalAdagrad", "RMSProp", "Rprop",
    }
)  # fmt: skip


class CompiledDTensorError(HyperShardError, NotImplementedError):
    """A DTensor reached compiled MindSpore code (``mindspore.jit``, ``GRAPH_MODE``),
    which would run on the local shards: hyper_shard runs DTensors in PyNative mode."""


def _layout(d: Any) -> str:
    spec = d._spec
    if spec is None:
        return "a DTensor"
    places = ", ".join(str(p) for p in spec.placements)
    return (
        f"global shape {list(spec.shape)}, placements ({places}) on mesh {tuple(spec.mesh.shape)}"
    )


def _in(x: Any, depth: int) -> str | None:
    """Where a DTensor is inside ``x`` (``""`` for ``x`` itself), or None."""
    t = type(x)
    if t is Tensor or t in (int, float, bool, str, type(None)):
        return None
    if isinstance(x, DTensor):
        return ""
    if isinstance(x, nn.Cell):
        for name, p in x.parameters_and_names():
            if isinstance(p, DTensor):
                return f" (parameter {name!r} of {type(x).__name__})"
        return None
    if depth <= 0:
        return None
    items: Any = None
    if t is tuple or t is list:
        items = enumerate(x)
    elif t is dict:
        items = x.items()
    for k, v in items or ():
        where = _in(v, depth - 1)
        if where is not None:
            return f"[{k!r}]{where}"
    return None


def find_dtensor(args: tuple, kwargs: dict) -> str | None:
    """A description of the first DTensor in ``args``/``kwargs`` (also inside a tuple, list
    or dict, or a parameter of a Cell among them), or None."""
    for i, a in enumerate(args):
        where = _in(a, 3)
        if where is not None:
            return f"argument {i}{where}"
    for k, v in (kwargs or {}).items():
        where = _in(v, 3)
        if where is not None:
            return f"argument {k!r}{where}"
    return None


def _name(fn: Any) -> str:
    if isinstance(fn, nn.Cell):
        fn = type(fn).construct
    fn = getattr(fn, "__func__", fn)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(name)
    return f"{name!r} ({code.co_filename}:{code.co_firstlineno})"


def _first(args: tuple, kwargs: dict) -> Any:
    """The first top-level DTensor argument or DTensor parameter of a Cell argument."""
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, DTensor):
            return a
        if isinstance(a, nn.Cell):
            for _, p in a.parameters_and_names():
                if isinstance(p, DTensor):
                    return p
    return None


def _per_element(opt: Any) -> bool:
    """``opt`` is a :data:`PER_ELEMENT` optimizer (a subclass that keeps its construct)."""
    if getattr(opt, "use_lazy", False):
        return False
    for cls in type(opt).__mro__:
        if cls.__module__.startswith("mindspore.nn.optim.") and cls.__name__ in PER_ELEMENT:
            return getattr(type(opt), "construct", None) is getattr(cls, "construct", 0)
    return False


def _check_gradients(opt: Any, rest: tuple, kwargs: dict) -> None:
    grads = rest[0] if rest else (kwargs or {}).get("gradients", ())
    params = tuple(getattr(opt, "_parameters", ()) or ())
    for i, (p, g) in enumerate(zip(params, grads if isinstance(grads, (tuple, list)) else ())):
        if not isinstance(g, DTensor):
            continue
        if (
            isinstance(p, DTensor)
            and g.placements == p.placements
            and g.device_mesh == p.device_mesh
        ):
            continue
        want = (
            f"({', '.join(map(str, p.placements))})" if isinstance(p, DTensor) else "a plain tensor"
        )
        raise CompiledDTensorError(
            f"{type(opt).__name__}: gradient {i} (for parameter {getattr(p, 'name', i)!r}) is a "
            f"DTensor with placements ({', '.join(map(str, g.placements))}) but the parameter "
            f"is {want}: the optimizer steps each rank's local shard, which would read a "
            f"gradient of another layout (an unreduced Partial one, or another shard); pass "
            f"hyper_shard.platform.mindspore.autograd.optimizer_grads(grads, opt.parameters)"
        )


def refuse(entry: str, fn: Any, args: tuple, kwargs: dict) -> None:
    """Raise :class:`CompiledDTensorError` if a DTensor is among ``args``/``kwargs`` of
    compiled function ``fn`` (entry: how it was compiled); return otherwise.

    Raises:
        CompiledDTensorError: names the entry, the function, where the DTensor is, its
            layout, and the fix (PyNative).
    """
    opt = args[0] if args and isinstance(args[0], nn.Optimizer) else None
    if opt is not None and _per_element(opt):
        _check_gradients(opt, args[1:], kwargs)
        return
    where = find_dtensor(args, kwargs)
    if where is None:
        return
    d = _first(args, kwargs)
    layout = f": {_layout(d)}" if d is not None else ""
    fix = (
        "call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)"
        if entry == "GRAPH_MODE"
        else "call it without mindspore.jit (remove @jit from it, or from the Cell's construct)"
    )
    why = ""
    if opt is not None:
        why = (
            f" ({type(opt).__name__} is not one of MindSpore's per-element optimizers, which "
            f"step DTensor parameters on their local shards: {', '.join(sorted(PER_ELEMENT))})"
        )
    raise CompiledDTensorError(
        f"{entry}: the compiled function {_name(fn)} received a DTensor ({where}{layout}). "
        f"Compiled MindSpore code runs on each rank's local shard and would return a wrong "
        f"value{why}; hyper_shard runs DTensors in PyNative mode only: {fix}, or pass "
        f"dt.to_local() if a per-rank computation on the local shard is meant"
    )


def guard_ast(orig: Callable) -> Callable:
    """``_JitExecutor.__call__`` (every ``capture_mode="ast"`` call, a Cell's first)."""

    @functools.wraps(orig)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        refuse("mindspore.jit", self.fn, args, kwargs)
        return orig(self, *args, **kwargs)

    return __call__


def guard_graph_mode(orig: Callable) -> Callable:
    """``_CellGraphExecutor.compile(obj, *args)`` (a Cell called in ``GRAPH_MODE``)."""

    @functools.wraps(orig)
    def compile(self: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        refuse("GRAPH_MODE", obj, (obj, *args), kwargs)
        return orig(self, obj, *args, **kwargs)

    return compile


def guard_bytecode(orig: Callable) -> Callable:
    """``pijit_context.PreJit(args, kwds)``, called by every ``capture_mode="bytecode"``
    wrapper with its ``PIJitCaptureContext`` as ``self`` (read from the caller's frame)."""

    @functools.wraps(orig)
    def PreJit(args: tuple, kwds: dict) -> Any:  # noqa: N802  (MindSpore's name)
        ctx = sys._getframe(1).f_locals.get("self")
        refuse("mindspore.jit(capture_mode='bytecode')", getattr(ctx, "fn", None), args, kwds)
        return orig(args, kwds)

    return PreJit


def guard_trace(orig: Callable) -> Callable:
    """``jit_trace._jit_trace_begin``, called by every ``capture_mode="trace"`` wrapper
    before it traces; the function and its full arguments are the caller's ``fn`` and
    ``args`` (read from its frame: ``_jit_trace_begin`` gets them without the Cell)."""

    @functools.wraps(orig)
    def _jit_trace_begin(fn_name: str, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_locals
        full = caller.get("args", args)
        user_kwargs = caller.get("kwargs") or {}
        refuse("mindspore.jit(capture_mode='trace')", caller.get("fn"), full, user_kwargs)
        return orig(fn_name, *args, **kwargs)

    return _jit_trace_begin
