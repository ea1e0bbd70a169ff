"""Matching a parallelize plan's keys to module names (framework-neutral).

A plan maps module paths to styles. A key is a dotted path whose tokens may use
:mod:`fnmatch` wildcards, matched token by token against the module tree as
``torch.distributed.tensor.parallel.parallelize_module`` does: ``"model.layers.*.mlp.up_proj"``
matches ``model.layers.0.mlp.up_proj`` and ``model.layers.1.mlp.up_proj`` but not
``model.layers.0.block.mlp.up_proj`` (``*`` never crosses a dot). The empty key ``""`` is the
root module.

A key that matches no module is skipped with a warning, as torch does (its message says
the key "could not be resolved" and which token matched nothing), naming in addition the
closest module names; :func:`match_plan` with ``strict=True`` raises :class:`PlanKeyError`
with the same message instead.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, TypeVar

from ..errors import HyperShardError

__all__ = ["PlanKeyError", "PlanKeyWarning", "match_plan", "match_key", "generalize_name"]

S = TypeVar("S")


class PlanKeyError(HyperShardError, ValueError):
    """A parallelize plan key matches no submodule (the message gives the closest names);
    raised by :func:`match_plan` with ``strict=True``."""


class PlanKeyWarning(UserWarning):
    """A parallelize plan key matched no submodule and was skipped (as torch warns); the
    message names the key, the token that matched nothing and the closest module names."""


def _tokens(path: str) -> tuple[str, ...]:
    return tuple(path.split(".")) if path else ()


def match_key(key: str, names: Iterable[str]) -> list[str]:
    """The module names (in the given order) that plan key ``key`` selects.

    Args:
        key: a dotted module path; each token is an :func:`fnmatch.fnmatchcase` pattern
            (``*``, ``?``, ``[0-3]``); ``""`` selects the root (``""``).
        names: qualified module names, as ``named_modules()`` yields them (root ``""``).

    Returns:
        Every name with as many tokens as ``key`` whose tokens match ``key``'s one by one.
    """
    kt = _tokens(key)
    out = []
    for name in names:
        nt = _tokens(name)
        if len(nt) == len(kt) and all(fnmatchcase(n, k) for n, k in zip(nt, kt)):
            out.append(name)
    return out


_INDEX = re.compile(r"^\d+$")


def generalize_name(name: str) -> str:
    """A module name with its numeric tokens (list indices) replaced by ``*``:
    ``model.layers.3.mlp`` -> ``model.layers.*.mlp``."""
    return ".".join("*" if _INDEX.match(t) else t for t in _tokens(name))


def _closest(key: str, names: Sequence[str], n: int = 3) -> list[str]:
    """The names closest to ``key``: wildcard keys are compared with the generalised names
    (``model.layers.*.self_attn.q_proj``), plain keys with the concrete ones."""
    pool: list[str] = list(names)
    if any(c in key for c in "*?["):
        pool = [generalize_name(x) for x in names]
    pool = [p for p in dict.fromkeys(pool) if p]
    close = difflib.get_close_matches(key, pool, n=n, cutoff=0.5)
    if not close:  # compare the last token only (a typo in the leaf name)
        leaf = _tokens(key)[-1] if key else ""
        by_leaf = {p: _tokens(p)[-1] for p in pool}
        hits = difflib.get_close_matches(leaf, list(dict.fromkeys(by_leaf.values())), n=1)
        close = [p for p, t in by_leaf.items() if hits and t == hits[0]][:n]
    return close


def _failing_prefix(key: str, names: Sequence[str]) -> str:
    """Which token of ``key`` stops matching, as a readable sentence."""
    kt = _tokens(key)
    for i in range(len(kt), 0, -1):
        prefix = ".".join(kt[:i])
        hits = match_key(prefix, names)
        if hits:
            if i == len(kt):
                return ""
            hit_tokens = {_tokens(h) for h in hits}
            children = sorted(
                {
                    _tokens(x)[i]
                    for x in names
                    if len(_tokens(x)) > i and _tokens(x)[:i] in hit_tokens
                }
            )
            shown = ", ".join(repr(c) for c in children[:12]) or "none"
            more = ", ..." if len(children) > 12 else ""
            return (
                f"'{prefix}' matches {len(hits)} module(s) but none has a child matching "
                f"'{kt[i]}' (their children: {shown}{more})"
            )
    return f"no top-level child matches '{kt[0]}'" if kt else ""


def match_plan(
    plan: Mapping[str, S], names: Sequence[str], root: str = "module", *, strict: bool = True
) -> list[tuple[str, str, S]]:
    """Resolve every plan entry to the module names it selects.

    Args:
        plan: key -> style, applied in the plan's order.
        names: every qualified module name of the root (``""`` first), in
            ``named_modules()`` order.
        root: a description of the root module for error messages (e.g. its class name).
        strict: raise on a key that matches nothing; False warns (:class:`PlanKeyWarning`,
            as ``torch.distributed.tensor.parallel.parallelize_module``) and skips it.

    Returns:
        ``(key, module name, style)`` for every match, plan order first, then module order.

    Raises:
        PlanKeyError: with ``strict``, a key that matches no module; the message names the
            key, the token that failed and the closest module names.
        TypeError: a key that is not a string.
    """
    out: list[tuple[str, str, S]] = []
    for key, style in plan.items():
        if not isinstance(key, str):
            raise TypeError(
                f"parallelize_module: plan keys are module paths (str), got {key!r} of type "
                f"{type(key).__name__}"
            )
        hits = match_key(key, names)
        if not hits:
            msg = _unmatched_message(key, names, root)
            if strict:
                raise PlanKeyError(msg)
            warnings.warn(PlanKeyWarning(msg), stacklevel=3)
            continue
        out.extend((key, h, style) for h in hits)
    return out


def _failing_token(key: str, names: Sequence[str]) -> tuple[str, str]:
    """(the first token of ``key`` that matches nothing, the matched path before it)."""
    kt = _tokens(key)
    for i in range(len(kt), 0, -1):
        if match_key(".".join(kt[: i - 1]), names) and not match_key(".".join(kt[:i]), names):
            return kt[i - 1], ".".join(kt[: i - 1])
    return (kt[0] if kt else ""), ""


def _unmatched_message(key: str, names: Sequence[str], root: str) -> str:
    close = _closest(key, [n for n in names if n])
    why = _failing_prefix(key, names)
    token, where = _failing_token(key, names)
    hint = (
        f"; closest module names: {', '.join(repr(c) for c in close)}"
        if close
        else "; print(dict(module.named_modules()).keys()) lists them"
    )
    return (
        f"Parallelize plan key {key!r} could not be resolved: no submodule matching token "
        f"{token!r} in module {root}{'.' + where if where else ''}, skipping this plan entry"
        f"{' (' + why + ')' if why else ''}{hint}. Keys are dotted module paths whose tokens "
        f"may use fnmatch wildcards ('*' never crosses a '.')"
    )


def describe_root(module: Any) -> str:
    """``LlamaForCausalLM`` — a short name for a root module in messages."""
    return type(module).__name__
