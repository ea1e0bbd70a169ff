"""Loading op specs: built-ins, entry points, and the directories named by the environment.

Sources, in order:

1. the built-in ``op_specs/`` (inside the wheel as ``hyper_shard/op_specs``);
2. the ``op_specs`` directories registered platforms ship
   (:class:`~hyper_shard.registry.platforms.PlatformBindings`);
3. installed packages' entry points in group ``hyper_shard.op_specs`` — each loads to a
   module/package (its directory's YAML files), a directory path, or a callable returning
   one or more directory paths;
4. every directory in ``HYPER_PARALLEL_OPS_YAML_DIR`` (``os.pathsep``-separated);
5. the ``extra_dirs`` given to :func:`load_all` / :func:`hyper_shard.registry.reload`.

An entry with ``extend: true`` defines nothing: its platform names (and ``signatures``)
join the entry of its name, whichever source defines it last.

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
from .models import KIND_FIELDS, OpEntry, RuleParams, entry_fields
from .platforms import platform_keys, registered_platforms
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
    "platform_dirs",
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
        op: the :class:`~hyper_shard.dispatch.op.DistributedOp` instance (None for an
            ``extend: true`` entry, which only adds names to another).
        bindings: platform key -> the op names the entry binds there. A registered
            key also reads as an attribute (``entry.torch``), a list one may edit.
        added_by: ``(key, name)`` -> the file of the ``extend: true`` entry that added
            the name (see :meth:`file_of`).
    """

    name: str
    file: str
    entry: OpEntry
    op: Any
    bindings: dict[str, list[str]] = field(default_factory=dict)
    added_by: dict[tuple[str, str], str] = field(default_factory=dict)

    def file_of(self, key: str, name: str) -> str:
        """The file that binds ``name`` on platform ``key`` to this entry (for messages)."""
        return self.added_by.get((key, name), self.file)

    def __getattr__(self, key: str) -> list[str]:
        if key.startswith("_") or key == "bindings" or key not in platform_keys():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {key!r}")
        return self.bindings.setdefault(key, [])

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
class _SpecLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader that refuses duplicate keys (plain YAML silently keeps the last);
    libyaml's parser where PyYAML has it (the op specs load ~4x faster in every process)."""


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
    """``body`` over ``default``; a body naming its own kind (or extending another
    entry) drops the default's kind."""
    base = dict(default)
    body_kinds = [k for k in KIND_FIELDS if k in body]
    if body_kinds or body.get("extend") is True:
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
            raise validation_error(file, name, e, from_default, entry_fields()) from None
        bindings = {k: list(v) for k, v in entry.bindings.items()}
        if entry.extend:
            _extension_params(file, name, entry, from_default)
            out.append(LoadedEntry(name, file, entry, None, bindings))
            continue
        op = hyper_parallel.build(file, name, entry) or build_op(file, name, entry, from_default)
        if entry.distributed_op_class and not any(bindings.values()):
            bindings = seed_names(name)
        out.append(LoadedEntry(name, file, entry, op, bindings))
    return out


def _extension_params(file: str, name: str, entry: OpEntry, from_default: set[str]) -> Any:
    """The ``signatures`` of an ``extend: true`` entry (its only parameter).

    Raises:
        OpSpecError: any other parameter (names the field).
    """
    try:
        params = RuleParams.model_validate(entry.rule_params())
    except ValidationError as e:
        raise validation_error(
            file, name, e, from_default, ["signatures"], "extend: true"
        ) from None
    for fld in ("signature", "static_args"):
        if getattr(params, fld) is not None:
            raise spec_error(
                file,
                name,
                fld,
                f"an entry with 'extend: true' adds platform names to another entry and cannot "
                f"change its {fld!r} (every platform's); give the platform its own order with "
                f"'signatures: {{KEY: [...]}}'",
            )
    return params


def platform_dirs() -> list[Path]:
    """The op-spec directories of the registered platforms (``PlatformBindings.op_specs``).

    Raises:
        OpSpecError: a directory that does not exist (names the platform).
    """
    out = []
    for b in registered_platforms():
        for d in b.op_specs:
            p = Path(d)
            if not p.is_dir():
                raise OpSpecError(
                    f"platform {b.key!r}: its op_specs directory {d!r} is not a directory; fix "
                    f"or reinstall the package that declares it"
                )
            out.append(p)
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

    Sources: the built-ins, the platforms' directories, entry points,
    ``HYPER_PARALLEL_OPS_YAML_DIR``, then
    ``extra_dirs``, then ``runtime`` (entries made in the program, by
    ``hyper_shard.experimental.register_sharding``: each replaces an entry of its name and
    takes its platform names from whichever entry bound them).
    ``HYPER_PARALLEL_OPS_PYTHON_PATH`` is appended to ``sys.path`` first.

    Raises:
        OpSpecError: a malformed file (see :func:`load_file`); a missing directory in
            ``extra_dirs``, ``HYPER_PARALLEL_OPS_YAML_DIR`` or
            ``HYPER_PARALLEL_OPS_PYTHON_PATH``; an entry name, or a platform op name, defined
            twice without ``override: true`` (the message names both files); an
            ``extend: true`` entry whose name no entry has.
    """
    add_python_path()
    extra = []
    for d in extra_dirs:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise OpSpecError(f"extra op-spec directory {str(d)!r} is not a directory")
        extra.append(p)
    dirs = [*builtin_dirs(), *platform_dirs(), *entry_point_dirs(), *env_dirs(), *extra]
    by_name: dict[str, LoadedEntry] = {}
    extensions: list[LoadedEntry] = []
    seen_dirs = set()
    for d in dirs:
        rd = d.resolve()
        if rd in seen_dirs:
            continue
        seen_dirs.add(rd)
        for le in hyper_parallel.merge(load_dir(d), by_name):  # yields to earlier entries
            if le.entry.extend:
                extensions.append(le)
                continue
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
    for ext in extensions:
        _extend(ext, by_name)
    _resolve_bindings(by_name)
    return list(by_name.values())


def _extend(ext: LoadedEntry, by_name: dict[str, LoadedEntry]) -> None:
    """Add an ``extend: true`` entry's names (and signatures) to the entry of its name."""
    target = by_name.get(ext.name)
    if target is None:
        raise spec_error(
            ext.file,
            ext.name,
            "extend",
            f"no entry named {ext.name!r} is defined by the built-ins or another source"
            f"{suggest(ext.name, by_name)}; 'extend: true' adds names to an existing entry "
            f"(drop it and give a rule to define a new one)",
        )
    for key, names in ext.bindings.items():
        have = target.bindings.setdefault(key, [])
        for n in names:
            if n not in have:
                have.append(n)
                target.added_by[(key, n)] = ext.file
    sigs = RuleParams.model_validate(ext.entry.rule_params()).signatures
    if sigs:
        target.op.add_signatures(sigs)


def _resolve_bindings(by_name: dict[str, LoadedEntry]) -> None:
    """A platform op bound by two entries is an error, unless one says ``override: true``
    (the later override wins; the other entry keeps its remaining names)."""
    owners: dict[tuple[str, str], LoadedEntry] = {}
    for le in by_name.values():
        for plat, names in le.bindings.items():
            for n in list(names):
                prev = owners.get((plat, n))
                if prev is None or prev is le:
                    owners[(plat, n)] = le
                    continue
                if le.entry.override:
                    prev.bindings[plat].remove(n)
                    owners[(plat, n)] = le
                elif prev.entry.override:
                    names.remove(n)
                else:
                    raise OpSpecError(
                        f"{le.file_of(plat, n)}: entry {le.name!r}, field {plat!r}: {n!r} is "
                        f"already bound by entry {prev.name!r} in {prev.file_of(plat, n)}; bind "
                        f"it in one entry only, or add 'override: true' to the entry that "
                        f"should win"
                    )
