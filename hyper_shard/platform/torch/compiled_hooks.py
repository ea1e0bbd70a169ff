"""The torch hooks of hyper_shard's compiled path that act while dynamo builds a region in
Python (its fakes and guards), and how hyper_shard's own frames are kept out of dynamo
([Note: compiled DTensor] in ``compiled.py``). Installed once, by :func:`install`."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from ...dtensor import DTensor

T: Any = torch.Tensor


def python_level(func: Any, args: tuple, kwargs: dict) -> Any:
    """A call dynamo makes in Python while it compiles (building fake tensors and guards):
    the DTensor answers as its local tensor (see the module note)."""
    if len(sys.modules) != _MODULES_SEEN[0]:
        skip_frames()  # hyper_shard modules imported since
    if args and isinstance(args[0], DTensor):
        from .compiled import _spec_id

        _spec_id(args[0]._spec)  # the region may read this DTensor: know its spec by id
    with DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _local_while_compiling(func: Any, handler: Any) -> Any:
    """A global-metadata handler that answers with the local tensor's metadata while a
    compile runs in Python (dynamo building fakes and guards; see the module note)."""
    comp = torch.compiler

    def h(args: Any, kwargs: dict) -> Any:
        if comp._is_compiling_flag:
            return python_level(func, args, kwargs)
        return handler(args, kwargs)

    return h


#: the eager handlers that report global metadata (the local tensor's while compiling)
_GLOBAL_METADATA = (
    T.shape.__get__, T.size, T.stride, T.numel, T.nelement, torch.numel, T.is_contiguous,
    T.__len__, T.nbytes.__get__,
)  # fmt: skip


_SKIPPED: set[str] = set()
_MODULES_SEEN = [0]


def _codes(obj: Any, seen: set[int]) -> Iterator[Any]:
    """The code objects of a module's functions and classes, nested ones included."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _codes(f, seen)
        return
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        stack = [code]
        while stack:
            c = stack.pop()
            yield c
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    elif isinstance(obj, type):
        for v in vars(obj).values():
            yield from _codes(v, seen)


def skip_frames() -> None:
    """[Note: compiled DTensor frames] dynamo inlines hyper_shard's code into the user's
    traced frame (``__torch_function__``, the DTensor API, the styles' conversions). After a
    graph break it runs the rest of the user's frame eagerly and compiles each frame that
    code calls on its own — a dispatcher frame compiled by itself would run aten ops on
    DTensors outside any dispatch. Every code object of the loaded ``hyper_shard`` modules
    is marked to run as plain Python when it is a frame of its own, and so is everything it
    calls (``FrameAction.SKIP`` for the frame and its callees); inlining is not affected."""
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    _MODULES_SEEN[0] = len(sys.modules)
    strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for name, mod in list(sys.modules.items()):
        if mod is None or name in _SKIPPED or not name.startswith("hyper_shard"):
            continue
        _SKIPPED.add(name)
        seen: set[int] = set()
        for v in list(vars(mod).values()):
            if getattr(v, "__module__", None) != name:
                continue
            for code in _codes(v, seen):
                set_code_exec_strategy(code, strategy)


def _marked_dims(self: Any) -> set:
    """``torch._dynamo.mark_dynamic`` on a DTensor: a DTensor's layout (global shape and
    placements) is a static part of the region, so a dim marked dynamic is recorded as
    ``maybe_mark_dynamic`` (dynamo's fakes never see a strict mark the layout would
    violate: the region specializes that dim, a new size recompiles)."""
    weak = self.__dict__.get("_dynamo_weak_dynamic_indices")
    if weak is None or torch.compiler._is_compiling_flag:
        raise AttributeError("_dynamo_dynamic_indices")
    return weak  # type: ignore[no-any-return]


def _mark_dims(self: Any, dims: Any) -> None:
    self.__dict__["_dynamo_weak_dynamic_indices"] = set(dims)


def _static_type(self: Any) -> str:
    """``torch._dynamo.mark_static_address(dt, guard=True)`` (the optimizer marks its
    parameters and state so): dynamo would install a "guarded" static tensor as a graph
    attribute, a plain tensor to the region; a DTensor stays a graph input, with its
    ``__torch_function__`` (and its layout guarded as every input's)."""
    v = self.__dict__.get("_hs_static_input_type")
    if v is None:
        raise AttributeError("_dynamo_static_input_type")
    return v  # type: ignore[no-any-return]


def _set_static_type(self: Any, v: str) -> None:
    self.__dict__["_hs_static_input_type"] = "unguarded" if v == "guarded" else v


def _del_static_type(self: Any) -> None:
    self.__dict__.pop("_hs_static_input_type", None)


def _grad_while_compiling(handler: Any) -> Any:
    """``p.grad`` of a DTensor parameter read while dynamo builds a region (a compiled
    ``optimizer.step()``): dynamo reads the gradient through ``__torch_function__`` but its
    guards read the C++ ``.grad`` slot, where local autograd left the plain local gradient.
    The DTensor gradient is stored in that slot (the same storage), and so it is after
    every later backward (a post-accumulate-grad hook on that parameter): the guards then
    see the DTensor the region was traced with."""
    comp = torch.compiler
    _EAGER_GRAD[:] = [handler]

    def h(args: Any, kwargs: dict) -> Any:
        out = handler(args, kwargs)
        if comp._is_compiling_flag and out is not None:
            p = args[0]
            _store_grad(p)
            if "_hs_grad_hook" not in p.__dict__:
                with DisableTorchFunctionSubclass():
                    if p.is_leaf and p.requires_grad:
                        hook = T.register_post_accumulate_grad_hook(p, _store_grad)
                        p.__dict__["_hs_grad_hook"] = hook
        return out

    return h


_EAGER_GRAD: list[Any] = []


def _store_grad(p: Any) -> None:
    with DisableTorchFunctionSubclass():
        g = T.grad.__get__(p)
    if g is not None and not isinstance(g, DTensor):
        wrapped = _EAGER_GRAD[0]((p,), {})  # the DTensor gradient, an alias of g
        with DisableTorchFunctionSubclass():
            T.grad.__set__(p, wrapped)


def in_compiled_backward() -> bool:
    """Whether the autograd engine is running a compiled region's backward graph.

    Dynamo runs a compiled region's forward graph with ``__torch_function__`` subclasses
    disabled (its aten ops on DTensor inputs are local ops), but not the backward graph
    AOTAutograd built with it, whose saved tensors include the DTensor inputs themselves
    (``x * w`` saves ``x`` and ``w``): there an aten op on a DTensor is a local op too,
    metadata ones included (the graph's program is the local one)."""
    if torch._C._current_graph_task_id() == -1:  # no backward running: the eager fast exit
        return False
    node = torch._C._current_autograd_node()
    return node is not None and node.name() == "CompiledFunctionBackward"


def local_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` on the local tensors (see :func:`in_compiled_backward`)."""
    with DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _flatten_tuples_too() -> None:
    """Dynamo decides whether a torch function call dispatches to a tensor subclass's
    ``__torch_function__`` by flattening the arguments' lists and dicts, not their tuples
    (``torch._dynamo.variables.torch_function._flatten_vts``, torch 2.13), so
    ``torch.cat((a, b))`` over DTensors made in the region ran as a plain op on the local
    tensors and returned a plain tensor (eager torch looks into tuples too). The same
    flattening, tuples included."""
    from torch._dynamo.variables import torch_function as tf
    from torch._dynamo.variables.lists import TupleVariable

    orig = tf._flatten_vts
    if getattr(orig, "_hs_tuples", False):
        return

    def flatten(vts: Any) -> list:
        out: list = []
        for vt in orig(vts):
            if not vt.is_realized() and vt.peek_type() is tuple:  # type: ignore[attr-defined]
                vt = vt.realize()
            if isinstance(vt, TupleVariable):
                out.extend(flatten(vt.items))
            else:
                out.append(vt)
        return out

    flatten._hs_tuples = True  # type: ignore[attr-defined]
    tf._flatten_vts = flatten


def install() -> None:
    """Route the neutral DTensor API through :func:`api_call` while dynamo traces, and let
    dynamo's fakes see the local tensor."""
    from ... import dtensor as _dt
    from .compiled import api_call
    from .dtensor import PROTOCOL_HANDLERS, TorchDTensor

    if not _dt.COMPILED_API:
        _dt.COMPILED_API[:] = [torch.compiler.is_dynamo_compiling, api_call]
        skip_frames()
        _flatten_tuples_too()
        for f in _GLOBAL_METADATA:
            PROTOCOL_HANDLERS[f] = _local_while_compiling(f, PROTOCOL_HANDLERS[f])
        PROTOCOL_HANDLERS[T.grad.__get__] = _grad_while_compiling(PROTOCOL_HANDLERS[T.grad.__get__])
        # the attributes dynamo's mark_dynamic / mark_static_address set on a tensor
        attrs = {
            "_dynamo_dynamic_indices": property(_marked_dims, _mark_dims),
            "_dynamo_static_input_type": property(_static_type, _set_static_type, _del_static_type),
        }
        for name, prop in attrs.items():
            setattr(TorchDTensor, name, prop)
