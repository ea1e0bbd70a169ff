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

The jobs are split by idea: :mod:`.sources` (where specs come from), :mod:`.classes`
(the class and op behind an entry), :mod:`.messages` (error wording); this module reads
the YAML, merges ``__default__`` and resolves the bindings.

Every problem raises one :class:`~hyper_shard.errors.OpSpecError` naming the file, the
entry and the field, and saying how to fix it; the YAML/pydantic exception it came from is
not chained (the message carries everything), except an exception raised by the user's own
module or class (an import error inside it, a constructor that raises), which stays the
cause so its traceback shows where. Nothing is half-registered: a source is
either loaded completely or the whole load fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import OpSpecError
from . import hyper_parallel
from .classes import build_op, seed_names
from .messages import short, spec_error, suggest, validation_error
from .models import ENTRY_FIELDS, KIND_FIELDS, OpEntry
from .sources import (
    EP_GROUP,
    PY_ENV,
    YAML_ENV,
    add_python_path,
    add_python_path_at_import,
    builtin_dirs,
    entry_point_dirs,
    env_dirs,
)

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
    "add_python_path_at_import",
]


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
                f"found an unhashable key {short(key)}",
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
        raise spec_error(
            file,
            "__default__",
            None,
            f"must be a mapping of fields shared by every entry of the file (e.g. "
            f"'__default__: {{rule: pointwise}}'), got a {type(default).__name__}",
        )
    if "override" in default:
        raise spec_error(
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
            raise spec_error(
                file,
                name,
                None,
                f"unknown special key (the only one is '__default__'){suggest(name, _SPECIAL)}",
            )
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise spec_error(
                file,
                name,
                None,
                f"must be a mapping of fields (e.g. '{name}: {{rule: pointwise, torch: "
                f"[torch.{name}]}}'), got a {type(body).__name__} {short(body, 40)}",
            )
        bad = [k for k in body if not isinstance(k, str)]
        if bad:
            raise spec_error(file, name, None, f"field names must be strings, got {bad[0]!r}")
        merged, from_default = _merge_default(default, body)
        try:
            entry = OpEntry.model_validate(merged)
        except ValidationError as e:
            raise validation_error(file, name, e, from_default, ENTRY_FIELDS) from None
        op = hyper_parallel.build(file, name, entry) or build_op(file, name, entry, from_default)
        torch_names, ms_names = list(entry.torch), list(entry.mindspore)
        if entry.distributed_op_class and not torch_names and not ms_names:
            torch_names, ms_names = seed_names(name)
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


def load_all(
    extra_dirs: Iterable[str | Path] = (), runtime: Iterable[LoadedEntry] = ()
) -> list[LoadedEntry]:
    """Entries from every source, in order, with duplicates resolved.

    Sources: the built-ins, entry points, ``HYPER_PARALLEL_OPS_YAML_DIR``, then
    ``extra_dirs``, then ``runtime`` (entries made in the program, by
    ``hyper_shard.experimental.register_sharding``: each replaces an entry of its name and
    takes its platform names from whichever entry bound them).
    ``HYPER_PARALLEL_OPS_PYTHON_PATH`` is appended to ``sys.path`` first.

    Raises:
        OpSpecError: a malformed file (see :func:`load_file`); a missing directory in
            ``extra_dirs``, ``HYPER_PARALLEL_OPS_YAML_DIR`` or
            ``HYPER_PARALLEL_OPS_PYTHON_PATH``; an entry name, or a platform op name, defined
            twice without ``override: true`` (the message names both files).
    """
    add_python_path()
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
    for le in runtime:
        by_name.pop(le.name, None)
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
