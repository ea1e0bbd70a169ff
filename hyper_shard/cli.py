"""The ``hyper-shard`` command line: list the registered ops, validate a directory of op
specs, and explain one op's sharding decision on an abstract mesh.

.. code-block:: console

    $ hyper-shard ops list --platform torch
    $ hyper-shard validate plugins/scaled_add --python-path plugins/scaled_add
    $ hyper-shard explain mm --shapes 8x6 6x4 --placements "S(0),R" "R,S(1)" --mesh 2,2

Every command reads the same sources as the runtime registry (the built-in specs, entry
points, ``HYPER_PARALLEL_OPS_YAML_DIR`` and ``HYPER_PARALLEL_OPS_PYTHON_PATH``) plus the
directories given with ``--yaml-dir``. Nothing here needs a process group: ``explain``
runs the rule on :meth:`hyper_shard.mesh.DeviceMesh.abstract`.

Exit codes: 0 success, 1 a spec or sharding error (printed to stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .errors import HyperShardError, OpSpecError
from .placement import Partial, Placement, Replicate, Shard

__all__ = ["main", "parse_placement", "parse_placements", "parse_shape"]

_ITEMSIZE = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2,
    "bfloat16": 2, "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip


class UsageError(ValueError):
    """A command-line value that cannot be parsed (exit code 2)."""


# ---------------------------------------------------------------------- parsing
_PLACEMENT_RE = re.compile(
    r"""^\s*(?:
        (?P<shard>S|Shard)\s*\(\s*(?:dim\s*=\s*)?(?P<dim>-?\d+)\s*\)
      | (?P<rep>R|Replicate)(?:\s*\(\s*\))?
      | (?P<part>P|Partial)(?:\s*\(\s*(?:reduce_op\s*=\s*)?['"]?(?P<op>\w*)['"]?\s*\))?
    )\s*$""",
    re.VERBOSE,
)


def parse_placement(text: str) -> Placement:
    """``S(0)``/``Shard(0)``, ``R``/``Replicate()``, ``P``/``P(max)``/``Partial('avg')``.

    Raises:
        UsageError: anything else (or an unknown reduce op).
    """
    m = _PLACEMENT_RE.match(text)
    if m is None:
        raise UsageError(
            f"cannot read placement {text!r}; write S(dim), R or P(op) (e.g. S(0), R, P(sum))"
        )
    if m.group("shard"):
        return Shard(int(m.group("dim")))
    if m.group("rep"):
        return Replicate()
    try:
        return Partial(m.group("op") or "sum")
    except ValueError as e:
        raise UsageError(f"placement {text!r}: {e}") from None


def parse_placements(text: str) -> tuple[Placement, ...]:
    """One tensor's placements, one per mesh dim, comma-separated: ``"S(0),R"``.

    Raises:
        UsageError: a placement that cannot be read.
    """
    parts = [p for p in re.split(r",(?![^(]*\))", text) if p.strip()]
    if not parts:
        raise UsageError(f"no placements in {text!r}")
    return tuple(parse_placement(p) for p in parts)


def parse_shape(text: str) -> tuple[int, ...]:
    """``8x4``, ``8,4`` or ``8 4``; ``()``/``scalar`` for a 0-d tensor.

    Raises:
        UsageError: anything but non-negative integers.
    """
    t = text.strip()
    if t in ("()", "", "scalar"):
        return ()
    parts = [p for p in re.split(r"[x×,\s]+", t.strip("()[]")) if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(
            f"cannot read shape {text!r}; write e.g. 8x4 (or () for a 0-d tensor)"
        ) from None
    if any(s < 0 for s in shape):
        raise UsageError(f"shape {text!r} has a negative size")
    return shape


def _parse_kv(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        if "=" not in it:
            raise UsageError(f"--arg {it!r}: write name=value (the value is read as YAML)")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else None
        except yaml.YAMLError:
            out[k.strip()] = v
    return out


def _show_path(p: str) -> str:
    """``p`` relative to the working directory when it lies below it, else absolute."""
    path, cwd = Path(p).resolve(), Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def _n(k: int, one: str, many: str | None = None) -> str:
    return f"{k} {one if k == 1 else (many or one + 's')}"


def _fmt_pl(pl: Sequence[Placement] | None) -> str:
    return "-" if pl is None else "[" + ", ".join(str(p) for p in pl) + "]"


# ---------------------------------------------------------------------- commands
def _load(yaml_dirs: Sequence[str], python_path: Sequence[str]) -> Any:
    from .registry.loader import PY_ENV, load_all
    from .registry.registry import Registry

    if python_path:
        cur = [p for p in os.environ.get(PY_ENV, "").split(os.pathsep) if p]
        os.environ[PY_ENV] = os.pathsep.join([*cur, *python_path])
    return Registry(load_all([Path(d) for d in yaml_dirs]))


def _platforms() -> list[Any]:
    """The registered platforms' declarations (the built-ins first)."""
    from .registry.platforms import registered_platforms

    return registered_platforms()


def _dtype(name: str) -> Any:
    """The dtype named ``name`` of the first installed platform that declares dtypes (the
    name itself when none does)."""
    for b in _platforms():
        if b.dtype is not None and b.available():
            try:
                return b.load("dtype")(name)
            except (ImportError, AttributeError):
                continue
    return name


def _all_names(e: Any) -> list[str]:
    return [n for names in e.bindings.values() for n in names]


def cmd_ops_list(args: argparse.Namespace) -> int:
    reg = _load(args.yaml_dir, args.python_path)
    platforms = [args.platform] if args.platform else [b.key for b in _platforms()]
    rows = []
    n_names = 0
    for e in reg.entries.values():
        if (
            args.filter
            and args.filter not in e.name
            and not any(args.filter in n for n in _all_names(e))
        ):
            continue
        bound = []
        for plat in platforms:
            names = e.bindings.get(plat, [])
            n_names += len(names)
            if names:
                bound.append(", ".join(names) if args.platform else f"{plat}: {', '.join(names)}")
        if args.platform and not bound:
            continue  # nothing bound on the asked platform
        rows.append((e.name, e.kind, _show_path(e.file), "; ".join(bound) or "-"))
    if not rows:
        print("no matching entries")
        return 0
    head = (
        "ENTRY",
        "RULE / CLASS",
        "FILE",
        f"{args.platform.upper()} NAMES" if args.platform else "BOUND NAMES",
    )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    print(f"\n{len(rows)} entries, {n_names} bound {' and '.join(platforms)} names")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise OpSpecError(
                f"{d}: not a directory; 'hyper-shard validate' takes directories of YAML specs"
            )
    reg = _load(args.dirs, args.python_path)
    mine = [
        e
        for e in reg.entries.values()
        if any(Path(e.file).resolve().parent == d.resolve() for d in dirs)
    ]
    files = sorted({_show_path(e.file) for e in mine})
    bind_note = "" if args.no_bind else _bind_names(reg, mine, args.platform)
    print(
        f"OK: {_n(len(mine), 'entry', 'entries')} in {_n(len(files), 'file')} under "
        f"{', '.join(map(str, args.dirs))}"
        f"{bind_note}; {len(reg)} entries with the built-ins"
    )
    for e in mine:
        names = ", ".join(_all_names(e)) or "no platform names"
        print(f"  {e.name}: {e.kind} -> {names}")
    for key, entries in reg.unregistered_keys().items():
        import difflib

        close = difflib.get_close_matches(key, [b.key for b in _platforms()], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(
            f"  note: no installed platform has key {key!r}{hint}: the names "
            f"{', '.join(e.name for e in entries)} bind there are neither checked nor used"
        )
    return 0


def _bind_names(reg: Any, mine: list[Any], keys: Sequence[str] | None) -> str:
    """Resolve the names of platforms ``keys`` (default: the first installed one) with
    their resolvers; a summary for the OK line.

    Raises:
        OpSpecError: a name a platform does not have (names file, entry, field).
    """
    from .registry.platforms import resolve_all

    installed = [b for b in _platforms() if b.available()]
    chosen = [b for b in _platforms() if b.key in keys] if keys else installed[:1]
    notes = []
    for b in chosen:
        if not b.available():
            notes.append(f" ({b.key} is not installed: its names not checked)")
            continue
        n_all = sum(1 for _ in resolve_all(reg, b.key))
        n = sum(len(e.bindings.get(b.key, ())) for e in mine)
        notes.append(f", {n} {b.key} names bound ({n_all} in all)")
    if not chosen:
        notes.append(" (no platform is installed: names not checked)")
    return "".join(notes)


def _find_entry(reg: Any, op: str) -> Any:
    if op in reg.entries:
        return reg.entries[op]
    names: dict[str, Any] = {}
    for b in reversed(_platforms()):  # the first platform's name wins
        names.update(reg.names(b.key))
    if op in names:
        return names[op]
    import difflib

    close = difflib.get_close_matches(op, [*reg.entries, *names], n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see 'hyper-shard ops list'"
    raise UsageError(f"no entry or bound op name {op!r}{hint}")


def cmd_explain(args: argparse.Namespace) -> int:
    from .dispatch.op import Layout, OpCall
    from .mesh import DeviceMesh
    from .redistribute.planner import plan_redistribute
    from .spec import DTensorSpec, TensorMeta, contiguous_stride

    reg = _load(args.yaml_dir, args.python_path)
    entry = _find_entry(reg, args.op)
    op = entry.op
    mesh_shape = parse_shape(args.mesh)
    if not mesh_shape or any(s < 1 for s in mesh_shape):
        raise UsageError(f"--mesh {args.mesh!r}: give the mesh shape, e.g. 2,2")
    if not 0 <= args.rank < math.prod(mesh_shape):
        raise UsageError(f"--rank {args.rank} is not a rank of a mesh of shape {mesh_shape}")
    mesh = DeviceMesh.abstract(mesh_shape, rank=args.rank)
    shapes = [parse_shape(s) for s in args.shapes]
    placements: list[tuple[Placement, ...]]
    if args.placements is None:
        placements = [(Replicate(),) * mesh.ndim for _ in shapes]
    else:
        placements = [parse_placements(p) for p in args.placements]
    if len(placements) != len(shapes):
        raise UsageError(
            f"{len(shapes)} shapes but {len(placements)} placements; give one placement list per tensor"
        )
    dtype_name = args.dtype.rsplit(".", 1)[-1]  # "float32", or a framework's "<fw>.float32"
    if dtype_name not in _ITEMSIZE:
        raise UsageError(f"--dtype {args.dtype!r}: one of {', '.join(_ITEMSIZE)}")
    dtype: Any = _dtype(dtype_name)
    specs = []
    for i, (shape, pl) in enumerate(zip(shapes, placements)):
        if len(pl) != mesh.ndim:
            raise UsageError(
                f"tensor {i}: {len(pl)} placements {_fmt_pl(pl)} for a {mesh.ndim}-D mesh; give one per mesh dim"
            )
        meta = TensorMeta(shape, contiguous_stride(shape), dtype, _ITEMSIZE[dtype_name])
        try:
            specs.append(DTensorSpec(mesh, pl, meta))
        except (ValueError, IndexError, TypeError) as e:
            raise UsageError(f"tensor {i} (shape {shape}): {e}") from None
    if args.roles:
        roles = [r.strip() for r in args.roles.split(",")]
        if len(roles) != len(specs):
            raise UsageError(f"--roles names {len(roles)} tensors, --shapes {len(specs)}")
    else:
        b = op.binder
        roles = []
        for i in range(len(specs)):
            if b.varargs is not None and i >= b.varargs[1]:
                roles.append(f"{b.varargs[0]}[{i - b.varargs[1]}]")
            else:
                roles.append(b.names[i] if i < len(b.names) else f"arg{i}")
    values = _parse_kv(args.arg)
    kwargs: dict[str, Any] = {**values}
    scalars = {k: v for k, v in values.items() if isinstance(v, (int, float, bool, complex))}
    static = {n: values.get(n) for n in op.static_names}
    pname = args.name or next(
        (entry.bindings[b.key][0] for b in _platforms() if entry.bindings.get(b.key)), entry.name
    )
    call = OpCall(
        name=op.name,
        platform_name=pname,
        specs=specs,
        arg_roles=roles,
        static=static,
        scalars=scalars,
        inplace=args.inplace,
        reflected=False,
        args=(),
        kwargs=kwargs,
    )
    try:
        layout: Layout = op.infer_layout(call)
    except HyperShardError:
        raise
    except (ValueError, IndexError, TypeError, NotImplementedError) as e:
        print(
            f"hyper-shard: {call.describe()}: the rule failed: {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 1
    print(f"op:      {entry.name} ({entry.kind}) from {_show_path(entry.file)}")
    print(f"call:    {call.describe()}" + (f"  with {values}" if values else ""))
    print(f"mesh:    {mesh_shape}, rank {args.rank} at coordinate {mesh.get_coordinate()}")
    print("inputs (current -> target):")
    w = max(len(r) for r in roles)
    for r, s, tgt in zip(roles, specs, layout.inputs):
        cur = s.placements
        if tgt is None or tuple(tgt) == cur:
            how = "keep"
        else:
            plan = plan_redistribute(s, tuple(tgt))
            how = " then ".join(repr(st) for st in plan.steps) or "keep"
        print(f"  {r.ljust(w)}  {list(s.shape)}  {_fmt_pl(cur)} -> {_fmt_pl(tgt)}  ({how})")
    print("outputs:")
    for i, (o, sh) in enumerate(zip(layout.outputs, layout.shapes)):
        print(f"  {i}  {list(sh) if sh is not None else '?'}  {_fmt_pl(o)}")
    moved = any(t is not None and tuple(t) != s.placements for s, t in zip(specs, layout.inputs))
    print(f"cost:    {layout.cost:.3e} s" + ("" if moved else " (no redistribution)"))
    if layout.impl is not None:
        print(f"local implementation: {getattr(layout.impl, '__qualname__', layout.impl)!s}")
    if layout.overrides:
        print(f"rank-local argument overrides: {layout.overrides}")
    return 0


# ---------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hyper-shard",
        description="Inspect and check hyper_shard's YAML op specs.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    def sources(sp: argparse.ArgumentParser, dirs: bool = True) -> None:
        if dirs:
            sp.add_argument(
                "--yaml-dir",
                action="append",
                default=[],
                metavar="DIR",
                help="another directory of YAML specs (repeatable; adds to "
                "HYPER_PARALLEL_OPS_YAML_DIR)",
            )
        sp.add_argument(
            "--python-path",
            action="append",
            default=[],
            metavar="DIR",
            help="a directory for the specs' Python modules (repeatable; adds to "
            "HYPER_PARALLEL_OPS_PYTHON_PATH)",
        )

    ops = sub.add_parser("ops", help="the registered ops")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True)
    ls = ops_sub.add_parser("list", help="every entry: rule/class, bound names, source file")
    keys = [b.key for b in _platforms()]
    ls.add_argument("--platform", choices=keys, help="only this platform's names")
    ls.add_argument("--filter", help="only entries whose name or bound names contain this")
    sources(ls)
    ls.set_defaults(func=cmd_ops_list)

    va = sub.add_parser(
        "validate",
        help="load directories of specs (with the built-ins), resolve op names; OK or the error",
    )
    va.add_argument("dirs", nargs="+", metavar="DIR", help="directory of YAML op specs")
    va.add_argument("--no-bind", action="store_true", help="do not resolve op names")
    va.add_argument(
        "--platform",
        action="append",
        choices=keys,
        help="resolve this platform's names (repeatable; default: the first installed of "
        f"{', '.join(keys)})",
    )
    sources(va, dirs=False)
    va.set_defaults(func=cmd_validate)

    ex = sub.add_parser(
        "explain",
        help="one op's decision on an abstract mesh: input targets, outputs, cost",
        description="Run an op's sharding rule on abstract DTensor specs and print the "
        "decision. OP is an entry name (mm) or a bound op name (torch.mm, Tensor.mm).",
    )
    ex.add_argument("op", metavar="OP")
    ex.add_argument(
        "--shapes",
        nargs="+",
        required=True,
        metavar="SHAPE",
        help="one global shape per DTensor input, e.g. 8x6 6x4",
    )
    ex.add_argument(
        "--placements",
        nargs="+",
        metavar="PLACEMENTS",
        help="one per DTensor input, comma-separated per mesh dim, e.g. 'S(0),R' 'R,S(1)' "
        "(default: all Replicate)",
    )
    ex.add_argument("--mesh", default="2", help="mesh shape, e.g. 2,2 (default 2)")
    ex.add_argument("--rank", type=int, default=0, help="the rank whose view to show (default 0)")
    ex.add_argument("--dtype", default="float32", help="element type (default float32)")
    ex.add_argument(
        "--roles",
        help="argument names of the tensors, comma-separated (default: the op's signature)",
    )
    ex.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a non-tensor argument (YAML value), e.g. --arg dim=1 --arg keepdim=true",
    )
    ex.add_argument("--name", help="the platform op name the call uses (default: the first bound)")
    ex.add_argument("--inplace", action="store_true", help="decide as an in-place call")
    sources(ex)
    ex.set_defaults(func=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hyper-shard`` command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 success, 1 an :class:`~hyper_shard.errors.OpSpecError` or sharding
        error (printed to stderr), 2 bad usage.

    Raises:
        SystemExit: from argparse, for ``--help`` and unparsable command lines (code 2).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as e:
        print(f"hyper-shard: error: {e}", file=sys.stderr)
        return 2
    except OpSpecError as e:
        print(f"hyper-shard: invalid op spec: {e}", file=sys.stderr)
        return 1
    except HyperShardError as e:
        print(f"hyper-shard: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
