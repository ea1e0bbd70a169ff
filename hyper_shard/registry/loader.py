"""Loading op specs: built-ins, entry points, and the directories named by the environment.

Sources, in order:

1. the built-in ``op_specs/`` (inside the wheel as ``hyper_shard/op_specs``);
2. installed packages' entry points in group ``hyper_shard.op_specs`` — each loads to a
   module/package (its directory's YAML files), a directory path, or a callable returning
   one or more directory paths;
3. every directory in ``HYPER_PARALLEL_OPS_YAML_DIR`` (``os.pathsep``-separated);
4. the ``extra_dirs`` given to :func:`load_all` / :func:`hyper_shard.registry.reload`.

Python classes named by ``class: module:Class`` (or the seed format's
``distributed_op_file``/``distributed_op_module``) are imported from installed packages or
from the directories in ``HYPER_PARALLEL_OPS_PYTHON_PATH``, which are *appended* to
``sys.path`` (never placed before the standard library or site-packages).

Every problem raises one :class:`~hyper_shard.errors.OpSpecError` naming the file, the
entry and the field, and saying how to fix it; the YAML/pydantic exception it came from is
not chained (the message carries everything). Nothing is half-registered: a source is
either loaded completely or the whole load fails.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import OpSpecError
from . import hyper_parallel
from .models import ENTRY_FIELDS, KIND_FIELDS, OpEntry, RuleParams

if TYPE_CHECKING:
    from ..dispatch.op import DistributedOp

__all__ = [
    "LoadedEntry",
    "load_all",
    "load_dir",
    "load_file",
    "builtin_dirs",
    "entry_point_dirs",
    "env_dirs",
    "YAML_ENV",
    "PY_ENV",
    "EP_GROUP",
]

YAML_ENV = "HYPER_PARALLEL_OPS_YAML_DIR"
PY_ENV = "HYPER_PARALLEL_OPS_PYTHON_PATH"
EP_GROUP = "hyper_shard.op_specs"

#: keys of a file that are not entries
_SPECIAL = ("__default__",)
#: seed-format keys that belong with ``distributed_op_class``
_SEED_FIELDS = ("distributed_op_file", "distributed_op_module", "dist_op_name")


@dataclass
class LoadedEntry:
    """A validated entry with its op instance and provenance.

    Attributes:
        name: the entry's name (the YAML key).
        file: the YAML file it came from.
        entry: the validated :class:`~hyper_shard.registry.models.OpEntry`.
        op: the :class:`~hyper_shard.dispatch.op.DistributedOp` instance.
        torch / mindspore: the platform op names the entry binds.
    """

    name: str
    file: str
    entry: OpEntry
    op: Any
    torch: list[str] = field(default_factory=list)
    mindspore: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """``rule: NAME``, ``class: module:Class`` or the seed form, as the YAML says it."""
        e = self.entry
        if e.rule is not None:
            return f"rule: {e.rule}"
        if e.class_ is not None:
            return f"class: {e.class_}"
        src = e.distributed_op_module or e.distributed_op_file
        return f"distributed_op_class: {e.distributed_op_class} ({src})"


# ---------------------------------------------------------------------- sources
def builtin_dirs() -> list[Path]:
    """The built-in op-spec directory (wheel layout, else the source checkout's)."""
    here = Path(__file__).resolve().parent.parent
    for d in (here / "op_specs", here.parent / "op_specs"):
        if d.is_dir():
            return [d]
    return []


def env_dirs() -> list[Path]:
    """The directories in ``HYPER_PARALLEL_OPS_YAML_DIR`` (``os.pathsep``-separated).

    Raises:
        OpSpecError: a listed directory does not exist.
    """
    out = []
    for part in os.environ.get(YAML_ENV, "").split(os.pathsep):
        if not part.strip():
            continue
        p = Path(part.strip()).expanduser()
        if not p.is_dir():
            raise OpSpecError(
                f"{YAML_ENV}: {part!r} is not a directory; create it, or remove it from "
                f"{YAML_ENV} (entries are separated by {os.pathsep!r})"
            )
        out.append(p)
    return out


def entry_point_dirs() -> list[Path]:
    """Directories contributed by installed packages (entry-point group ``hyper_shard.op_specs``).

    An entry point may load to a module or package (its directory is used), a path, or a
    callable returning one path or a list of them.

    Raises:
        OpSpecError: an entry point fails to load or gives something that is not a directory.
    """
    out: list[Path] = []
    for ep in importlib.metadata.entry_points(group=EP_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r} (group {EP_GROUP!r})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj = obj()
        except Exception as e:
            raise OpSpecError(
                f"{where}: loading it failed: {type(e).__name__}: {e}; fix or uninstall the "
                f"package that declares it"
            ) from None
        items: Iterable[Any] = obj if isinstance(obj, (list, tuple)) else [obj]
        for it in items:
            if getattr(it, "__file__", None):
                p = Path(it.__file__).parent
            elif getattr(it, "__path__", None):  # a namespace package
                p = Path(next(iter(it.__path__)))
            else:
                p = Path(str(it))
            if not p.is_dir():
                raise OpSpecError(
                    f"{where}: {p} is not a directory; the entry point must name a package "
                    f"holding YAML files, a directory, or a callable returning directories"
                )
            out.append(p)
    return out


def _python_path_dirs() -> list[str]:
    out = []
    for part in os.environ.get(PY_ENV, "").split(os.pathsep):
        part = part.strip()
        if not part:
            continue
        if not Path(part).expanduser().is_dir():
            raise OpSpecError(
                f"{PY_ENV}: {part!r} is not a directory; create it, or remove it from {PY_ENV} "
                f"(entries are separated by {os.pathsep!r})"
            )
        out.append(str(Path(part).expanduser()))
    return out


def add_python_path_at_import() -> None:
    """Append the existing directories of ``HYPER_PARALLEL_OPS_PYTHON_PATH`` to ``sys.path``
    when hyper_shard is imported, so a user's op module (``import scaled_add_ops``) imports
    before the registry is first built; a bad entry is left for the registry to report."""
    added = False
    for part in os.environ.get(PY_ENV, "").split(os.pathsep):
        d = str(Path(part.strip()).expanduser()) if part.strip() else ""
        if d and Path(d).is_dir() and d not in sys.path:
            sys.path.append(d)  # after the stdlib and site-packages, never before
            added = True
    if added:
        importlib.invalidate_caches()


def _add_python_path() -> None:
    added = False
    for part in _python_path_dirs():
        if part not in sys.path:
            sys.path.append(part)  # after the stdlib and site-packages, never before
            added = True
    if added:
        importlib.invalidate_caches()


# ---------------------------------------------------------------------- messages
def _err(file: str, entry: str | None, fld: str | None, msg: str) -> OpSpecError:
    where = f"{file}"
    if entry is not None:
        where += f": entry {entry!r}"
    if fld is not None:
        where += f", field {fld!r}"
    return OpSpecError(f"{where}: {msg}")


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_FIELD_HINTS = {
    "torch": "a list of torch function names, e.g. [torch.add, Tensor.add, Tensor.add_]",
    "mindspore": "a list of MindSpore Primitive names, e.g. [AddExt, Add]",
    "signature": "a list of argument names, e.g. [input, other]",
    "static_args": "a list of argument names, e.g. [dim, keepdim]",
}


def _describe_error(err: Any, from_default: set[str], accepted: Iterable[str]) -> tuple[str, str]:
    """One pydantic error as ``(field, message)`` (field ``""`` for whole-entry errors)."""
    loc = ".".join(str(x) for x in err["loc"])
    msg = str(err["msg"])
    kind = err["type"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    top = str(err["loc"][0]) if err["loc"] else ""
    if kind == "extra_forbidden":
        known = sorted(accepted)
        own = [k for k in known if k not in RuleParams.model_fields]
        msg = (
            f"unknown parameter (this rule's own parameters: {', '.join(own) or 'none'}; every "
            f"entry accepts {', '.join([*ENTRY_FIELDS[:6], *RuleParams.model_fields])})"
            f"{_suggest(loc, [*known, *ENTRY_FIELDS])}"
        )
    elif kind == "missing":
        msg = "a required parameter is missing; add it to the entry (or the file's __default__)"
    elif kind == "bool_type":
        msg = f"must be true or false, got {_short(err.get('input'))}"
    elif kind not in ("value_error", "assertion_error") and "input" in err:
        msg = f"{msg}, got {_short(err['input'])}"
        if top in _FIELD_HINTS:
            msg += f" (expected {_FIELD_HINTS[top]})"
    if top in from_default:
        msg += " (the value comes from this file's __default__)"
    return loc, msg


def _validation_error(
    file: str,
    name: str,
    e: ValidationError,
    from_default: set[str],
    accepted: Iterable[str] = (),
    what: str = "",
) -> OpSpecError:
    """One OpSpecError for every problem pydantic found (``what``: the rule or class)."""
    parts = [_describe_error(x, from_default, accepted) for x in e.errors()]
    tail = f" [{what}]" if what else ""
    if len(parts) == 1:
        loc, msg = parts[0]
        return _err(file, name, loc or None, msg + tail)
    listed = "; ".join(f"field {loc!r}: {msg}" if loc else msg for loc, msg in parts)
    return _err(file, name, None, f"{len(parts)} problems: {listed}{tail}")


# ---------------------------------------------------------------------- classes
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
            raise _err(
                file,
                name,
                fld,
                f"importing module {cand!r} failed: {e} (a module it imports is missing; "
                f"install it or add its directory to {PY_ENV})",
            ) from None
        except Exception as e:
            raise _err(
                file,
                name,
                fld,
                f"importing module {cand!r} failed: {type(e).__name__}: {e}; fix the module",
            ) from None
    if mod is None:
        raise _err(
            file,
            name,
            fld,
            f"module {module!r} not found (tried {', '.join(map(repr, tried))}); install it or "
            f"add its directory to {PY_ENV}",
        )
    cls = getattr(mod, cls_name, None)
    if cls is None:
        have = [n for n, v in vars(mod).items() if isinstance(v, type)]
        raise _err(
            file,
            name,
            fld,
            f"module {mod.__name__!r} ({getattr(mod, '__file__', '?')}) has no class "
            f"{cls_name!r}{_suggest(cls_name, have)}",
        )
    if not (isinstance(cls, type) and issubclass(cls, DistributedOp)):
        raise _err(
            file,
            name,
            fld,
            f"{mod.__name__}.{cls_name} is not a DistributedOp subclass (it is "
            f"{_short(cls, 40)}); subclass hyper_shard.dispatch.op.DistributedOp",
        )
    return cls


def _seed_names(name: str) -> tuple[list[str], list[str]]:
    """Platform names for a seed-format entry named after its op."""
    if "." in name:
        return [name], []
    if name[:1].isupper():
        return [], [name]
    return [f"torch.{name}", f"Tensor.{name}"], []


def _op_class(file: str, name: str, entry: OpEntry) -> tuple[type[DistributedOp], str]:
    """The DistributedOp subclass of an entry and how to name it in messages."""
    from ..rules import RULES

    if entry.rule is not None:
        cls = RULES.get(entry.rule)
        if cls is None:
            raise _err(
                file,
                name,
                "rule",
                f"unknown rule {entry.rule!r}{_suggest(entry.rule, RULES)} (known rules: "
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


def _build_op(file: str, name: str, entry: OpEntry, from_default: set[str]) -> Any:
    if (hp := hyper_parallel.build(file, name, entry)) is not None:  # its built-in classes
        return hp
    cls, what = _op_class(file, name, entry)
    params = entry.rule_params()
    pmodel = _params_model(cls)
    try:
        p = pmodel(**params)
    except ValidationError as e:
        raise _validation_error(file, name, e, from_default, pmodel.model_fields, what) from None
    except Exception as e:  # a validator raising something else
        raise _err(
            file, name, None, f"{what} rejected its parameters: {type(e).__name__}: {e}"
        ) from None
    try:
        return cls(name, p)
    except ValidationError as e:
        raise _validation_error(file, name, e, from_default, pmodel.model_fields, what) from None
    except Exception as e:
        raise _err(
            file, name, None, f"constructing {what} failed: {type(e).__name__}: {e}"
        ) from None


# ---------------------------------------------------------------------- YAML
class _SpecLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (plain YAML silently keeps the last)."""


def _construct_mapping(loader: _SpecLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found an unhashable key {_short(key)}",
                key_node.start_mark,
            ) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {first + 1}); YAML would keep only the "
                f"last one: remove or rename one of them",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(file: str, path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise OpSpecError(
            f"{file}: cannot read: not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    except OSError as e:
        raise OpSpecError(f"{file}: cannot read: {e.strerror or e}") from None
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        detail = f"{problem} ({context})" if context and "duplicate" not in problem else problem
        raise OpSpecError(f"{file}: invalid YAML{at}: {detail}") from None


def _merge_default(default: dict[str, Any], body: dict[str, Any]) -> tuple[dict, set[str]]:
    """``body`` over ``default``; a body naming its own kind drops the default's kind."""
    base = dict(default)
    body_kinds = [k for k in KIND_FIELDS if k in body]
    if body_kinds:
        for k in KIND_FIELDS:
            if k not in body:
                base.pop(k, None)
        if "distributed_op_class" not in body:
            for k in _SEED_FIELDS:
                base.pop(k, None)
    merged = {**base, **body}
    from_default = {k for k in base if k not in body}
    return merged, from_default


def load_file(path: str | Path) -> list[LoadedEntry]:
    """Validate one YAML file into loaded entries (classes are imported, ops constructed).

    Args:
        path: the YAML file.

    Returns:
        One :class:`LoadedEntry` per entry, in file order (an empty file gives none).

    Raises:
        OpSpecError: unreadable file, bad YAML (duplicate keys included), a top level that is
            not a mapping, a malformed entry or ``__default__``, an unknown rule or parameter,
            or a class that cannot be imported or is not a DistributedOp subclass. The
            message names the file, the entry and the field.
    """
    path = Path(path)
    file = str(path)
    data = _read_yaml(file, path)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise OpSpecError(
            f"{file}: the top level must be a mapping of entry names to entries (e.g. "
            f"'my_op: {{rule: pointwise, torch: [...]}}'), got a {type(data).__name__}"
        )
    default = data.get("__default__", {})
    if default is None:
        default = {}
    if not isinstance(default, dict):
        raise _err(
            file,
            "__default__",
            None,
            f"must be a mapping of fields shared by every entry of the file (e.g. "
            f"'__default__: {{rule: pointwise}}'), got a {type(default).__name__}",
        )
    if "override" in default:
        raise _err(
            file,
            "__default__",
            "override",
            "'override' cannot be a file default; put 'override: true' on each entry that "
            "replaces an earlier one",
        )
    out = []
    for name, body in data.items():
        if name in _SPECIAL:
            continue
        if not isinstance(name, str) or not name:
            raise OpSpecError(
                f"{file}: entry names must be non-empty strings, got {name!r}; quote it"
            )
        if hyper_parallel.special_name(name, body, default):  # __invert__ as an op name
            raise _err(
                file,
                name,
                None,
                f"unknown special key (the only one is '__default__'){_suggest(name, _SPECIAL)}",
            )
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _err(
                file,
                name,
                None,
                f"must be a mapping of fields (e.g. '{name}: {{rule: pointwise, torch: "
                f"[torch.{name}]}}'), got a {type(body).__name__} {_short(body, 40)}",
            )
        bad = [k for k in body if not isinstance(k, str)]
        if bad:
            raise _err(file, name, None, f"field names must be strings, got {bad[0]!r}")
        merged, from_default = _merge_default(default, body)
        try:
            entry = OpEntry.model_validate(merged)
        except ValidationError as e:
            raise _validation_error(file, name, e, from_default, ENTRY_FIELDS) from None
        op = _build_op(file, name, entry, from_default)
        torch_names, ms_names = list(entry.torch), list(entry.mindspore)
        if entry.distributed_op_class and not torch_names and not ms_names:
            torch_names, ms_names = _seed_names(name)
        out.append(LoadedEntry(name, file, entry, op, torch_names, ms_names))
    return out


def load_dir(d: str | Path) -> list[LoadedEntry]:
    """Every ``*.yaml``/``*.yml`` file of a directory, sorted by file name.

    Raises:
        OpSpecError: ``d`` is not a directory, or any of its files is malformed
            (see :func:`load_file`).
    """
    d = Path(d)
    if not d.is_dir():
        raise OpSpecError(f"{d}: not a directory of op-spec YAML files")
    files = sorted([*d.glob("*.yaml"), *d.glob("*.yml")])
    return [e for f in files for e in load_file(f)]


def load_all(extra_dirs: Iterable[str | Path] = ()) -> list[LoadedEntry]:
    """Entries from every source, in order, with duplicates resolved.

    Sources: the built-ins, entry points, ``HYPER_PARALLEL_OPS_YAML_DIR``, then
    ``extra_dirs``. ``HYPER_PARALLEL_OPS_PYTHON_PATH`` is appended to ``sys.path`` first.

    Raises:
        OpSpecError: a malformed file (see :func:`load_file`); a missing directory in
            ``extra_dirs``, ``HYPER_PARALLEL_OPS_YAML_DIR`` or
            ``HYPER_PARALLEL_OPS_PYTHON_PATH``; an entry name, or a platform op name, defined
            twice without ``override: true`` (the message names both files).
    """
    _add_python_path()
    extra = []
    for d in extra_dirs:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise OpSpecError(f"extra op-spec directory {str(d)!r} is not a directory")
        extra.append(p)
    dirs = [*builtin_dirs(), *entry_point_dirs(), *env_dirs(), *extra]
    by_name: dict[str, LoadedEntry] = {}
    seen_dirs = set()
    for d in dirs:
        rd = d.resolve()
        if rd in seen_dirs:
            continue
        seen_dirs.add(rd)
        for le in hyper_parallel.merge(load_dir(d), by_name):  # yields to earlier entries
            prev = by_name.get(le.name)
            if prev is not None and not le.entry.override:
                raise OpSpecError(
                    f"{le.file}: entry {le.name!r} is already defined in {prev.file}; rename "
                    f"it, or add 'override: true' to it to replace the earlier one"
                )
            if prev is not None:
                del by_name[le.name]  # the replacement takes the later position
            by_name[le.name] = le
    _resolve_bindings(by_name)
    return list(by_name.values())


def _resolve_bindings(by_name: dict[str, LoadedEntry]) -> None:
    """A platform op bound by two entries is an error, unless one says ``override: true``
    (the later override wins; the other entry keeps its remaining names)."""
    owners: dict[tuple[str, str], LoadedEntry] = {}
    for le in by_name.values():
        for plat in ("torch", "mindspore"):
            names = le.torch if plat == "torch" else le.mindspore
            for n in list(names):
                prev = owners.get((plat, n))
                if prev is None or prev is le:
                    owners[(plat, n)] = le
                    continue
                if le.entry.override:
                    (prev.torch if plat == "torch" else prev.mindspore).remove(n)
                    owners[(plat, n)] = le
                elif prev.entry.override:
                    names.remove(n)
                else:
                    raise OpSpecError(
                        f"{le.file}: entry {le.name!r}, field {plat!r}: {n!r} is already bound "
                        f"by entry {prev.name!r} in {prev.file}; bind it in one entry only, or "
                        f"add 'override: true' to the entry that should win"
                    )
