"""Readable, registry-style names of torch functions (``torch.add``, ``Tensor.add_``,
``torch.nn.functional.linear``, ``Tensor.shape.__get__``)."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

import torch

__all__ = ["torch_op_name", "resolve_torch_op", "aten_aliases"]

_NAMESPACES: list[tuple[str, Any]] = [
    ("torch", torch),
    ("Tensor", torch.Tensor),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.linalg", torch.linalg),
    ("torch.special", torch.special),
    ("torch.fft", torch.fft),
]
_BY_FUNC: dict[Any, str] | None = None


def _preference(name: str) -> tuple[bool, int, str]:
    return (name.startswith("_"), len(name), name)


def _build() -> dict[Any, str]:
    out: dict[Any, str] = {}
    for prefix, ns in reversed(_NAMESPACES):  # earlier namespaces win
        names: dict[Any, str] = {}
        for n in dir(ns):
            try:
                f = getattr(ns, n)
            except Exception:  # some attributes raise on access
                continue
            if callable(f) and not isinstance(f, type):
                try:
                    old = names.get(f)
                except TypeError:  # unhashable
                    continue
                # aliases compare equal (torch.mm == torch.spmm == torch.dsmm): name the
                # public, shortest one
                if old is None or _preference(n) < _preference(old):
                    names[f] = n
        out.update({f: f"{prefix}.{n}" for f, n in names.items()})
    return out


def torch_op_name(func: Any) -> str:
    """The public name of a torch function as our YAML spells it."""
    global _BY_FUNC
    if _BY_FUNC is None:
        _BY_FUNC = _build()
    try:
        name = _BY_FUNC.get(func)
    except TypeError:
        name = None
    if name is not None:
        return name
    if isinstance(func, torch._ops.OpOverloadPacket):  # torch.ops.aten.linalg_vector_norm
        ns, _, op = func._qualified_op_name.partition("::")
        return f"torch.ops.{ns}.{op}"
    if isinstance(func, torch._ops.OpOverload):  # torch.ops.aten.linalg_vector_norm.default
        ns, _, op = func._overloadpacket._qualified_op_name.partition("::")
        return f"torch.ops.{ns}.{op}.{func._overloadname}"
    fname = getattr(func, "__name__", None)
    if fname in ("__get__", "__set__", "__delete__"):
        desc = getattr(func, "__self__", None)
        return f"Tensor.{getattr(desc, '__name__', '?')}.{func.__name__}"
    mod = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or fname or repr(func)
    if qual.startswith("_VariableFunctionsClass."):  # torch's own builtins: torch.<name>
        return f"torch.{qual.split('.', 1)[1]}"
    if "pybind11" in qual or "pybind11" in mod:  # never name an internal binding
        return f"{mod + '.' if mod else ''}{fname or repr(func)}"
    return f"{mod + '.' if mod else ''}{qual}"


def _getattr_chain(obj: Any, parts: list[str], name: str, where: str) -> Any:
    for p in parts:
        try:
            obj = getattr(obj, p)
        except AttributeError:
            close = difflib.get_close_matches(p, [n for n in dir(obj) if not n.startswith("_")], 1)
            shown = "Tensor" if where == "torch.Tensor" else where
            hint = f"; did you mean '{shown}.{close[0]}'?" if close else ""
            raise LookupError(f"{name!r}: {where} has no attribute {p!r}{hint}") from None
        where = f"{where}.{p}"
    return obj


def _import_qualified(name: str) -> Any:
    """``package.module.attr[.attr...]``: the longest importable module prefix, then
    attributes.

    Raises:
        LookupError: no prefix imports, importing it fails, or an attribute is missing.
    """
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        modname = ".".join(parts[:i])
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name is not None and (modname == e.name or modname.startswith(e.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise LookupError(f"{name!r}: importing module {modname!r} failed: {e}") from None
        except Exception as e:
            raise LookupError(
                f"{name!r}: importing module {modname!r} failed: {type(e).__name__}: {e}"
            ) from None
        return _getattr_chain(mod, parts[i:], name, modname)
    raise LookupError(
        f"{name!r}: no module {parts[0]!r} can be imported; torch op names start with 'torch.' "
        f"or 'Tensor.', a custom function is 'module.function' with the module importable "
        f"from sys.path (installed, or in a directory of HYPER_PARALLEL_OPS_PYTHON_PATH)"
    )


def resolve_torch_op(name: str) -> Any:
    """The function object named ``name``, as ``__torch_function__`` will receive it.

    Accepted: torch functions and methods (``torch.add``, ``Tensor.add_``,
    ``torch.nn.functional.linear``, ``Tensor.shape.__get__``...) and any fully qualified
    importable function that takes part in ``__torch_function__`` (``my_pkg.ops.fused_op``:
    the longest importable module prefix, then attributes; modules are imported from
    ``sys.path``, which holds ``HYPER_PARALLEL_OPS_PYTHON_PATH`` once the registry is built).

    Raises:
        LookupError: no such function, its module fails to import, or the name is not
            callable (e.g. ``torch.float32``, or ``Tensor.shape`` instead of
            ``Tensor.shape.__get__``).
    """
    if not name or any(not p for p in name.split(".")):
        raise LookupError(f"{name!r}: not a dotted name like 'torch.add' or 'my_module.my_op'")
    parts = name.split(".")
    if parts[0] == "Tensor":
        obj = _getattr_chain(torch.Tensor, parts[1:], name, "torch.Tensor")
    elif parts[0] == "torch":
        try:
            obj = _getattr_chain(torch, parts[1:], name, "torch")
        except LookupError as first:
            try:  # a torch submodule that `import torch` does not import
                obj = _import_qualified(name)
            except LookupError:
                raise first from None
    else:
        obj = _import_qualified(name)
    if not callable(obj):
        hint = (
            f"; a property is bound as {name + '.__get__'!r}"
            if hasattr(obj, "__get__") and not isinstance(obj, type)
            else ""
        )
        raise LookupError(f"{name!r} is not a function (it is a {type(obj).__name__}){hint}")
    return obj


#: aten ops whose public torch function has another name
_ATEN_RENAMED = {"_to_copy": "Tensor.to"}


def aten_aliases(func: Any) -> list[Any]:
    """The public torch functions an ``torch.ops.aten.<op>[.<overload>]`` call stands for, in
    the order to try them: ``torch.<op>``, then ``Tensor.<op>`` (``Tensor.add_`` for
    ``aten.add_.Tensor``). aten schemas take their arguments in the public functions' order
    (``self`` first), so the public function's sharding rule reads them unchanged. Empty for
    other functions and other namespaces."""
    if isinstance(func, torch._ops.OpOverload):
        func = func._overloadpacket
    if not isinstance(func, torch._ops.OpOverloadPacket):
        return []
    ns, _, op = func._qualified_op_name.partition("::")
    if ns != "aten":
        return []
    names = [_ATEN_RENAMED[op]] if op in _ATEN_RENAMED else [f"torch.{op}", f"Tensor.{op}"]
    out = []
    for n in names:
        head, _, attr = n.partition(".")
        obj = getattr(torch if head == "torch" else torch.Tensor, attr, None)
        if obj is not None and callable(obj):
            out.append(obj)
    return out
