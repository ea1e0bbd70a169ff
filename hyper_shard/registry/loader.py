"""Loading op specs: built-ins, entry points, and the directories named by the environment.

Sources, in order:

1. the built-in ``op_specs/`` (inside the wheel as ``hyper_shard/op_specs``);
2. installed packages' entry points in group ``hyper_shard.op_specs`` — each loads to a
   module/package (its directory's YAML files), a directory path, or a callable returning
   one or more directory paths;
3. every directory in ``HYPER_PARALLEL_OPS_YAML_DIR`` (``os.pathsep``-separated).

Python classes named by ``class: module:Class`` (or the seed format's
``distributed_op_file``/``distributed_op_module``) are imported from installed packages or
from the directories in ``HYPER_PARALLEL_OPS_PYTHON_PATH``, which are *appended* to
``sys.path`` (never placed before the standard library or site-packages).

Every problem raises :class:`~hyper_shard.errors.OpSpecError` naming the file, the entry
and the field; nothing is half-registered.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import OpSpecError
from .models import OpEntry

__all__ = ["LoadedEntry", "load_all", "load_dir", "load_file", "builtin_dirs", "env_dirs"]

YAML_ENV = "HYPER_PARALLEL_OPS_YAML_DIR"
PY_ENV = "HYPER_PARALLEL_OPS_PYTHON_PATH"
EP_GROUP = "hyper_shard.op_specs"


@dataclass
class LoadedEntry:
    """A validated entry with its op instance and provenance."""

    name: str
    file: str
    entry: OpEntry
    op: Any
    torch: list[str] = field(default_factory=list)
    mindspore: list[str] = field(default_factory=list)


def builtin_dirs() -> list[Path]:
    """The built-in op-spec directory (wheel layout, else the source checkout's)."""
    here = Path(__file__).resolve().parent.parent
    for d in (here / "op_specs", here.parent / "op_specs"):
        if d.is_dir():
            return [d]
    return []


def env_dirs() -> list[Path]:
    """The directories in ``HYPER_PARALLEL_OPS_YAML_DIR``.

    Raises:
        OpSpecError: a listed directory does not exist.
    """
    out = []
    for part in os.environ.get(YAML_ENV, "").split(os.pathsep):
        if not part.strip():
            continue
        p = Path(part).expanduser()
        if not p.is_dir():
            raise OpSpecError(f"{YAML_ENV}: {part!r} is not a directory")
        out.append(p)
    return out


def entry_point_dirs() -> list[Path]:
    """Directories contributed by installed packages (entry-point group ``hyper_shard.op_specs``).

    Raises:
        OpSpecError: an entry point fails to load or gives something that is not a directory.
    """
    out: list[Path] = []
    for ep in importlib.metadata.entry_points(group=EP_GROUP):
        try:
            obj = ep.load()
        except Exception as e:
            raise OpSpecError(
                f"entry point {ep.name!r} ({ep.value}) in group {EP_GROUP}: {e}"
            ) from None
        if callable(obj) and not isinstance(obj, type):
            obj = obj()
        items: Iterable[Any] = obj if isinstance(obj, (list, tuple)) else [obj]
        for it in items:
            p = Path(it.__file__).parent if hasattr(it, "__file__") else Path(str(it))
            if not p.is_dir():
                raise OpSpecError(f"entry point {ep.name!r} ({ep.value}): {p} is not a directory")
            out.append(p)
    return out


def _add_python_path() -> None:
    for part in os.environ.get(PY_ENV, "").split(os.pathsep):
        part = part.strip()
        if part and part not in sys.path:
            sys.path.append(part)


def _err(file: str, entry: str | None, fld: str | None, msg: str) -> OpSpecError:
    where = f"{file}"
    if entry is not None:
        where += f": entry {entry!r}"
    if fld is not None:
        where += f", field {fld!r}"
    return OpSpecError(f"{where}: {msg}")


def _import_class(
    file: str, name: str, fld: str, module: str, cls_name: str, builtin_pkg: bool
) -> type:
    from ..dispatch.op import DistributedOp

    candidates = [f"hyper_shard.rules.{module}", module] if builtin_pkg else [module]
    mod = None
    errors = []
    for cand in candidates:
        try:
            mod = importlib.import_module(cand)
            break
        except ModuleNotFoundError as e:
            if e.name is not None and (cand == e.name or cand.startswith(e.name + ".")):
                errors.append(cand)  # the candidate itself is missing: try the next one
                continue
            raise _err(file, name, fld, f"importing module {cand!r} failed: {e}") from None
        except Exception as e:
            raise _err(
                file, name, fld, f"importing module {cand!r} failed: {type(e).__name__}: {e}"
            ) from None
    if mod is None:
        raise _err(
            file,
            name,
            fld,
            f"module {module!r} not found (tried {', '.join(errors)}); install it or add its "
            f"directory to {PY_ENV}",
        )
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise _err(file, name, fld, f"module {mod.__name__!r} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, DistributedOp)):
        raise _err(
            file,
            name,
            fld,
            f"{mod.__name__}.{cls_name} is not a hyper_shard DistributedOp subclass (subclass "
            f"hyper_shard.dispatch.op.DistributedOp)",
        )
    return cls


def _seed_names(name: str) -> tuple[list[str], list[str]]:
    """Platform names for a seed-format entry named after its op."""
    if "." in name:
        return [name], []
    if name[:1].isupper():
        return [], [name]
    return [f"torch.{name}", f"Tensor.{name}"], []


def _build_op(file: str, name: str, entry: OpEntry) -> Any:
    from ..rules import RULES

    params = entry.rule_params()
    if entry.rule is not None:
        cls = RULES.get(entry.rule)
        if cls is None:
            raise _err(
                file,
                name,
                "rule",
                f"unknown rule {entry.rule!r}; known rules: {', '.join(sorted(RULES))}",
            )
    elif entry.class_ is not None:
        module, cls_name = entry.class_.split(":")
        cls = _import_class(file, name, "class", module, cls_name, builtin_pkg=False)
    else:
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
    try:
        return cls(name, cls.Params(**params)) if params or entry.rule else cls(name)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "?"
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            known = ", ".join(sorted(cls.Params.model_fields))
            msg = f"unknown parameter for rule/class {cls.__name__} (it accepts: {known})"
        raise _err(file, name, loc, msg) from None
    except (ValueError, TypeError) as e:
        raise _err(file, name, None, f"{cls.__name__} rejected its parameters: {e}") from None


def load_file(path: Path) -> list[LoadedEntry]:
    """Validate one YAML file into loaded entries.

    Raises:
        OpSpecError: bad YAML, a bad entry, or a class that cannot be imported.
    """
    file = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise OpSpecError(f"{file}: invalid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    except OSError as e:
        raise OpSpecError(f"{file}: cannot read: {e}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise OpSpecError(
            f"{file}: the top level must be a mapping of entry names to entries, got {type(data).__name__}"
        )
    default = data.get("__default__", {}) or {}
    if not isinstance(default, dict):
        raise _err(file, "__default__", None, "must be a mapping")
    out = []
    for name, body in data.items():
        if name == "__default__":
            continue
        if not isinstance(name, str) or not name:
            raise OpSpecError(f"{file}: entry names must be non-empty strings, got {name!r}")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _err(file, name, None, f"must be a mapping, got {type(body).__name__}")
        merged = {**default, **body}
        if any(k in body for k in ("class", "distributed_op_class")) and "rule" not in body:
            merged.pop("rule", None)
        try:
            entry = OpEntry.model_validate(merged)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first["loc"]) or None
            raise _err(file, name, loc, first["msg"]) from None
        op = _build_op(file, name, entry)
        torch_names, ms_names = list(entry.torch), list(entry.mindspore)
        if entry.distributed_op_class and not torch_names and not ms_names:
            torch_names, ms_names = _seed_names(name)
        out.append(LoadedEntry(name, file, entry, op, torch_names, ms_names))
    return out


def load_dir(d: Path) -> list[LoadedEntry]:
    """Every ``*.yaml``/``*.yml`` file of a directory, sorted by name."""
    files = sorted([*d.glob("*.yaml"), *d.glob("*.yml")])
    return [e for f in files for e in load_file(f)]


def load_all(extra_dirs: Iterable[Path] = ()) -> list[LoadedEntry]:
    """Entries from every source, in order, with duplicates resolved.

    Raises:
        OpSpecError: a name (entry or platform op) defined twice without ``override: true``
            (the message names both files).
    """
    _add_python_path()
    dirs = [*builtin_dirs(), *entry_point_dirs(), *env_dirs(), *extra_dirs]
    by_name: dict[str, LoadedEntry] = {}
    seen_dirs = set()
    for d in dirs:
        rd = d.resolve()
        if rd in seen_dirs:
            continue
        seen_dirs.add(rd)
        for le in load_dir(d):
            prev = by_name.get(le.name)
            if prev is not None and not le.entry.override:
                raise OpSpecError(
                    f"{le.file}: entry {le.name!r} is already defined in {prev.file}; rename it, or "
                    f"add 'override: true' to replace the earlier one"
                )
            by_name[le.name] = le
    # a platform op bound by two entries is an error too (unless the later overrides)
    owners: dict[tuple[str, str], LoadedEntry] = {}
    for le in by_name.values():
        for plat, names in (("torch", le.torch), ("mindspore", le.mindspore)):
            for n in names:
                prev = owners.get((plat, n))
                if prev is not None and prev is not le:
                    if le.entry.override:
                        prev_list = prev.torch if plat == "torch" else prev.mindspore
                        prev_list.remove(n)
                    elif prev.entry.override:
                        (le.torch if plat == "torch" else le.mindspore).remove(n)
                        continue
                    else:
                        raise OpSpecError(
                            f"{le.file}: entry {le.name!r}, field {plat!r}: {n!r} is already bound "
                            f"by entry {prev.name!r} in {prev.file}; keep one, or add 'override: true'"
                        )
                owners[(plat, n)] = le
    return list(by_name.values())
