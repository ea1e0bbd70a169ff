"""The Python class behind an op-spec entry: ``rule: NAME`` (a family in
:mod:`hyper_shard.rules`), ``class: module:Class``, or the seed format
(``distributed_op_class`` with ``distributed_op_file``/``distributed_op_module``), and the
op instance built from it with its validated parameters."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .messages import short, spec_error, suggest, validation_error
from .models import OpEntry, RuleParams
from .platforms import registered_platforms
from .sources import PY_ENV

if TYPE_CHECKING:
    from ..dispatch.op import DistributedOp

__all__ = ["build_op", "seed_names"]


def _import_class(
    file: str, name: str, fld: str, module: str, cls_name: str, builtin_pkg: bool
) -> type[DistributedOp]:
    from ..dispatch.op import DistributedOp

    candidates = [f"hyper_shard.rules.{module}", module] if builtin_pkg else [module]
    mod = None
    tried = []
    for cand in candidates:
        try:
            mod = importlib.import_module(cand)
            break
        except ModuleNotFoundError as e:
            if e.name is not None and (cand == e.name or cand.startswith(e.name + ".")):
                tried.append(cand)  # the candidate itself is missing: try the next one
                continue
            raise spec_error(
                file,
                name,
                fld,
                f"importing module {cand!r} failed: {e} (a module it imports is missing; "
                f"install it or add its directory to {PY_ENV})",
            ) from None
        except Exception as e:
            raise spec_error(
                file,
                name,
                fld,
                f"importing module {cand!r} failed: {type(e).__name__}: {e}; fix the module",
            ) from e  # the user's module raised: its traceback shows where
    if mod is None:
        raise spec_error(
            file,
            name,
            fld,
            f"module {module!r} not found (tried {', '.join(map(repr, tried))}); install it or "
            f"add its directory to {PY_ENV}",
        )
    cls = getattr(mod, cls_name, None)
    if cls is None:
        have = [n for n, v in vars(mod).items() if isinstance(v, type)]
        raise spec_error(
            file,
            name,
            fld,
            f"module {mod.__name__!r} ({getattr(mod, '__file__', '?')}) has no class "
            f"{cls_name!r}{suggest(cls_name, have)}",
        )
    if not (isinstance(cls, type) and issubclass(cls, DistributedOp)):
        raise spec_error(
            file,
            name,
            fld,
            f"{mod.__name__}.{cls_name} is not a DistributedOp subclass (it is "
            f"{short(cls, 40)}); subclass hyper_shard.dispatch.op.DistributedOp",
        )
    return cls


def seed_names(name: str) -> dict[str, list[str]]:
    """Platform key -> names, for a seed-format entry named after its op (each registered
    platform's ``seed_names`` says which op names it claims)."""
    out = {}
    for b in registered_platforms():
        names = b.seed_names(name) if b.seed_names is not None else []
        if names:
            out[b.key] = list(names)
    return out


def _op_class(file: str, name: str, entry: OpEntry) -> tuple[type[DistributedOp], str]:
    """The DistributedOp subclass of an entry and how to name it in messages."""
    from ..rules import RULES

    if entry.rule is not None:
        cls = RULES.get(entry.rule)
        if cls is None:
            raise spec_error(
                file,
                name,
                "rule",
                f"unknown rule {entry.rule!r}{suggest(entry.rule, RULES)} (known rules: "
                f"{', '.join(sorted(RULES))}); or write 'class: module:Class' for a custom op",
            )
        return cls, f"rule {entry.rule!r} ({cls.__name__})"
    if entry.class_ is not None:
        module, cls_name = entry.class_.split(":")
        cls = _import_class(file, name, "class", module, cls_name, builtin_pkg=False)
        return cls, f"class {entry.class_}"
    assert entry.distributed_op_class is not None
    if entry.distributed_op_module:
        cls = _import_class(
            file,
            name,
            "distributed_op_module",
            entry.distributed_op_module,
            entry.distributed_op_class,
            builtin_pkg=False,
        )
    else:
        assert entry.distributed_op_file is not None
        module = entry.distributed_op_file.removesuffix(".py")
        cls = _import_class(
            file,
            name,
            "distributed_op_file",
            module,
            entry.distributed_op_class,
            builtin_pkg=True,
        )
    return cls, f"class {cls.__module__}.{cls.__name__}"


_WITH_COMMON: dict[type, type[BaseModel]] = {}


def _params_model(cls: type[DistributedOp]) -> type[BaseModel]:
    """``cls.Params``, extended with the parameters every entry accepts (``signature``,
    ``static_args``) when a custom class's model does not declare them."""
    pm: type[BaseModel] = cls.Params
    if all(k in pm.model_fields for k in RuleParams.model_fields):
        return pm
    out = _WITH_COMMON.get(pm)
    if out is None:
        out = _WITH_COMMON[pm] = type(pm.__name__, (pm, RuleParams), {"__module__": pm.__module__})
    return out


def build_op(file: str, name: str, entry: OpEntry, from_default: set[str]) -> Any:
    cls, what = _op_class(file, name, entry)
    params = entry.rule_params()
    pmodel = _params_model(cls)
    try:
        p = pmodel(**params)
    except ValidationError as e:
        raise validation_error(file, name, e, from_default, pmodel.model_fields, what) from None
    except Exception as e:  # a validator raising something else
        raise spec_error(
            file, name, None, f"{what} rejected its parameters: {type(e).__name__}: {e}"
        ) from e  # a user's validator or class may have a bug: keep its traceback
    try:
        return cls(name, p)
    except ValidationError as e:
        raise validation_error(file, name, e, from_default, pmodel.model_fields, what) from None
    except Exception as e:
        raise spec_error(
            file, name, None, f"constructing {what} failed: {type(e).__name__}: {e}"
        ) from e
