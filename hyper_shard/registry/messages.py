"""Error messages of the op-spec loader: one :class:`~hyper_shard.errors.OpSpecError`
naming the file, the entry and the field, saying how to fix it (pydantic's and PyYAML's
errors are rewritten into that form)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from ..errors import OpSpecError
from .models import RuleParams, entry_fields
from .platforms import registered_platforms

__all__ = ["spec_error", "validation_error", "suggest", "short"]


def spec_error(file: str, entry: str | None, fld: str | None, msg: str) -> OpSpecError:
    where = f"{file}"
    if entry is not None:
        where += f": entry {entry!r}"
    if fld is not None:
        where += f", field {fld!r}"
    return OpSpecError(f"{where}: {msg}")


def short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_FIELD_HINTS = {
    "signature": "a list of argument names, e.g. [input, other]",
    "static_args": "a list of argument names, e.g. [dim, keepdim]",
    "bindings": "a mapping of platform keys to lists of op names, e.g. {torch: [torch.add]}",
    "signatures": "a mapping of platform keys to lists of argument names",
}


def _hint(field: str) -> str | None:
    """What a field holds, for an error message (platform keys: their declared hint)."""
    for b in registered_platforms():
        if b.key == field:
            return b.names_hint
    return _FIELD_HINTS.get(field)


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
        every = [f for f in entry_fields() if not f.startswith(("dist", "infer", "template"))]
        keys = [b.key for b in registered_platforms()]
        msg = (
            f"unknown parameter (this rule's own parameters: {', '.join(own) or 'none'}; every "
            f"entry accepts {', '.join([*every, *RuleParams.model_fields])})"
            f"{suggest(loc, [*known, *every])}"
        )
        names = err.get("input")
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            msg += (
                f". If these are op names: the registered platforms are {', '.join(keys)}; "
                f"a platform whose package may not be installed binds under "
                f"'bindings: {{{loc}: [...]}}'"
            )
    elif kind == "missing":
        msg = "a required parameter is missing; add it to the entry (or the file's __default__)"
    elif kind == "bool_type":
        msg = f"must be true or false, got {short(err.get('input'))}"
    elif kind not in ("value_error", "assertion_error") and "input" in err:
        msg = f"{msg}, got {short(err['input'])}"
        hint = _hint(top)
        if hint is not None:
            msg += f" (expected {hint})"
    if top in from_default:
        msg += " (the value comes from this file's __default__)"
    return loc, msg


def validation_error(
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
        return spec_error(file, name, loc or None, msg + tail)
    listed = "; ".join(f"field {loc!r}: {msg}" if loc else msg for loc, msg in parts)
    return spec_error(file, name, None, f"{len(parts)} problems: {listed}{tail}")
