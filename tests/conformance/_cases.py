"""Which OpInfo entries the conformance suite runs, and on what.

An entry of ``torch.testing._internal.common_methods_invocations.op_db`` is run when one
of its callables (``op.op``, ``op.method_variant``, ``op.inplace_variant``) is bound in
hyper_shard's torch registry. Its samples come from ``op.sample_inputs('cpu', dtype,
requires_grad=...)`` under a seed derived from the entry's name (identical on every rank
and in the test process), shrunk so CI stays fast: samples whose tensors hold more than
``MAX_NUMEL`` elements are left out (if all are, the smallest one up to ``FALLBACK_NUMEL``
is kept) and at most ``MAX_SAMPLES`` of the rest are kept, evenly spread over the list
(scalars, broadcasting and uneven shapes appear); an entry whose samples have no dim of odd
size also runs a one-tensor sample cut to odd sizes (:func:`odd_cut`).

Nothing here needs a process group; :mod:`tests.conformance._check` runs the cases.
"""

from __future__ import annotations

import functools
import itertools
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyper_shard.placement import Partial, Placement, Replicate, Shard

#: a sample is left out when its tensors hold more elements than this, together
MAX_NUMEL = 400
#: when no sample is that small: the smallest one, if it holds at most this many
FALLBACK_NUMEL = 1600
#: samples kept per entry (evenly spread over the eligible ones)
MAX_SAMPLES = 4
#: placement combinations per sample on the 1-D mesh of 2, for the entry's first variant
#: (every combination when there are at most this many; else a fixed random subset)
MAX_COMBOS = 128
#: a smaller first-variant cap for entries whose cases are slow (three-tensor convolutions:
#: each case is a conv forward and backward on 2 ranks)
MAX_COMBOS_FOR = {
    f"nn.functional.{n}": 64
    for n in (
        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"
    )
}  # fmt: skip
#: the same for the other variants (method and in-place forms of the same rule)
MAX_COMBOS_OTHER = 10
#: placement combinations of the chosen sample on the (2, 2) mesh, per variant (for an
#: elementwise entry, :func:`is_elementwise`, its first variant only: the method and in-place
#: forms apply the same pointwise rule, already nested on (2, 2) by the first one)
MAX_COMBOS_2D = 5
#: entries whose output values torch leaves unspecified: only global shape, dtype and the
#: local shard shapes are compared
VALUES_UNSPECIFIED = frozenset(
    {"empty_like", "empty", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
)
#: index offset of a sample cut to odd sizes from the OpInfo's sample ``index - CUT_BASE``
CUT_BASE = 1000
#: the dtypes tried, in order: the first one the op supports on CPU is used
DTYPES = (torch.float32, torch.int64, torch.bool)


@dataclass(frozen=True)
class Variant:
    kind: str  # "op", "method" or "inplace"
    fn: Callable[..., Any]
    name: str  # the registry's name of the bound function (torch.add, Tensor.add_ ...)


def entry_key(op: Any) -> str:
    """The OpInfo's name as the suite reports it: ``name`` or ``name.variant_test_name``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def _op_db() -> list[Any]:
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo import core

    # OpInfo's sample iterators look for the calling unittest method by walking the stack
    # with source context (inspect.stack(): ~0.1 s per sample_inputs call). There is none
    # here (the lookup returns None), so answer None at once: the samples are the same.
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None  # type: ignore[assignment]
    return list(op_db)


@functools.cache
def bound_table() -> dict[Any, Any]:
    from hyper_shard.platform.torch.dispatch import build_torch_table
    from hyper_shard.registry.registry import get_registry

    return build_torch_table(get_registry())


def _code_names(code: Any) -> set[str]:
    """Every global and attribute name a code object (and the lambdas inside it) uses."""
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            out |= _code_names(c)
    return out


def _named_callable(op: Any) -> Any:
    """The torch callable an entry whose ``op.op`` is a lambda wraps (``einsum``:
    ``lambda tensors, equation: torch.einsum(equation, tensors)``; ``T``: ``lambda x: x.T``;
    ``nn.functional.embedding`` with its arguments swapped...), or None.

    The entry's ``name`` and ``aten_name`` are resolved as ``torch.NAME``, ``Tensor.NAME``
    and the property ``Tensor.NAME.__get__``; a candidate counts only if the lambda's code
    uses its last name (so a lambda that calls something else is never credited to it)."""
    from hyper_shard.platform.torch.names import resolve_torch_op

    fn = op.op
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__name__", "") != "<lambda>":
        return None
    used = _code_names(code)
    for name in dict.fromkeys(n for n in (op.name, op.aten_name) if n):
        if name.split(".")[-1] not in used:
            continue
        for cand in (f"torch.{name}", f"Tensor.{name}", f"Tensor.{name}.__get__"):
            try:
                f = resolve_torch_op(cand)
            except LookupError:
                continue
            try:
                if f in bound_table():
                    return f
            except TypeError:  # unhashable callable
                continue
    return None


def bound_variants(op: Any) -> list[Variant]:
    """The entry's callables bound in the registry (op, method, in-place; duplicates once).

    An ``op.op`` that is a lambda around a bound torch callable (:func:`_named_callable`)
    counts as that callable: the variant *calls* the lambda (the OpInfo's samples are made
    for it: einsum's operand list, embedding's swapped arguments) and reports the bound
    callable's registry name. It comes last when the entry has other bound variants (they
    keep the first variant's combination budget, :data:`MAX_COMBOS`), and is left out when
    it wraps one of them (``sum_to_size``'s lambda calls its method variant)."""
    table = bound_table()
    out: list[Variant] = []
    seen: set[int] = set()
    for kind, fn in (("op", op.op), ("method", op.method_variant), ("inplace", op.inplace_variant)):
        if fn is None or id(fn) in seen:
            continue
        try:
            bound = table.get(fn)
        except TypeError:  # unhashable callable
            bound = None
        if bound is not None:
            seen.add(id(fn))
            out.append(Variant(kind, fn, bound.name))
    if op.op is not None and id(op.op) not in seen:
        wrapped = _named_callable(op)
        if wrapped is not None and not any(wrapped == v.fn for v in out):
            out.append(Variant("op", op.op, table[wrapped].name))
    return out


def is_elementwise(op: Any) -> bool:
    """The entry is an elementwise OpInfo (UnaryUfuncInfo or BinaryUfuncInfo)."""
    names = {cls.__name__ for cls in type(op).__mro__}
    return bool(names & {"UnaryUfuncInfo", "BinaryUfuncInfo"})


def family(op: Any) -> str:
    """The registry family (YAML file name without ``.yaml``) of the entry's first bound
    function."""
    from hyper_shard.platform.torch.names import resolve_torch_op
    from hyper_shard.registry.registry import get_registry

    bound = bound_table()[resolve_torch_op(bound_variants(op)[0].name)]
    entry = get_registry().entries.get(bound.op.name)
    return Path(str(entry.file)).stem if entry is not None else ""


@functools.cache
def entries() -> dict[str, Any]:
    """Every op_db entry with at least one bound variant, by :func:`entry_key`."""
    out: dict[str, Any] = {}
    for op in _op_db():
        if bound_variants(op):
            key = entry_key(op)
            assert key not in out, f"duplicate OpInfo name {key}"
            out[key] = op
    return out


# ---------------------------------------------------------------------- samples
def sample_dtype(op: Any) -> torch.dtype | None:
    supported = op.supported_dtypes("cpu")
    return next((d for d in DTYPES if d in supported), None)


def _seed(key: str) -> int:
    return zlib.crc32(key.encode()) & 0x7FFFFFFF


def tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensor_leaves(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensor_leaves(x)


def replace_leaves(obj: Any, it: Iterator[Any]) -> Any:
    """``obj`` with every tensor replaced by the next item of ``it`` (same traversal order
    as :func:`tensor_leaves`)."""
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(replace_leaves(x, it) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(replace_leaves(x, it) for x in obj)
    if isinstance(obj, dict):
        return {k: replace_leaves(v, it) for k, v in obj.items()}
    return obj


@dataclass
class Sample:
    index: int  # position in the OpInfo's own sample list (CUT_BASE + i: cut from sample i)
    input: Any
    args: tuple
    kwargs: dict
    broadcasts_input: bool

    @property
    def leaves(self) -> list[torch.Tensor]:
        return list(tensor_leaves((self.input, self.args, self.kwargs)))

    def describe(self) -> str:
        def d(x: Any) -> str:
            if isinstance(x, torch.Tensor):
                return f"T{list(x.shape)}" + ("" if x.dtype == torch.float32 else f":{x.dtype}")
            if isinstance(x, (list, tuple)):
                inner = ", ".join(d(y) for y in x)
                return f"[{inner}]" if isinstance(x, list) else f"({inner})"
            return repr(x)

        parts = [d(self.input), *(d(a) for a in self.args)]
        parts += [f"{k}={d(v)}" for k, v in self.kwargs.items()]
        cut = (
            f" (sample {self.index - CUT_BASE} cut to odd sizes)" if self.index >= CUT_BASE else ""
        )
        return ", ".join(parts) + cut


def _has_odd_dim(s: Sample) -> bool:
    return any(n > 1 and n % 2 for t in s.leaves for n in t.shape)


def odd_cut(chosen: Sequence[Sample]) -> Sample | None:
    """When no chosen sample has a dim a mesh of 2 shards unevenly: a one-tensor sample cut
    to odd sizes (every even dim > 2 loses its last index), else None. Elementwise OpInfos
    (sin, floor, ...) give a single (20, 20) sample; this adds (19, 19)."""
    if any(_has_odd_dim(s) for s in chosen):
        return None
    for s in chosen:
        if len(s.leaves) != 1 or not isinstance(s.input, torch.Tensor):
            continue
        shape = s.input.shape
        if not any(n > 2 and n % 2 == 0 for n in shape):
            continue
        idx = tuple(slice(0, n - 1) if n > 2 and n % 2 == 0 else slice(None) for n in shape)
        x = s.input.detach()[idx].clone().requires_grad_(s.input.requires_grad)
        return Sample(CUT_BASE + s.index, x, s.args, s.kwargs, s.broadcasts_input)
    return None


def _eligible(s: Any, max_numel: int = MAX_NUMEL) -> bool:
    leaves = list(tensor_leaves((s.input, s.args, s.kwargs)))
    if not leaves or not isinstance(next(tensor_leaves(s.input), None), torch.Tensor):
        return False
    if any(t.layout != torch.strided or t.is_complex() for t in leaves):
        return False
    return sum(t.numel() for t in leaves) <= max_numel


def spread(n: int, k: int) -> list[int]:
    """``k`` indices evenly spread over ``range(n)`` (all when ``n <= k``)."""
    if n <= k:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def samples(key: str, op: Any) -> tuple[list[Sample], int]:
    """The shrunk samples of entry ``key`` and how many the OpInfo gives in total.

    Deterministic: the RNGs are seeded from ``key`` first, so every rank builds the same
    global tensors.
    """
    dtype = sample_dtype(op)
    if dtype is None:
        return [], 0
    seed = _seed(key)
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is installed with torch here
        pass
    rg = bool(op.supports_autograd) and dtype.is_floating_point
    every = list(op.sample_inputs("cpu", dtype, requires_grad=rg))
    ok = [
        Sample(i, s.input, tuple(s.args), dict(s.kwargs), bool(s.broadcasts_input))
        for i, s in enumerate(every)
        if _eligible(s)
    ]
    if not ok:  # every sample is big: the smallest one, if it is not much bigger
        small = [
            (sum(t.numel() for t in tensor_leaves((s.input, s.args, s.kwargs))), i)
            for i, s in enumerate(every)
            if _eligible(s, FALLBACK_NUMEL)
        ]
        if small:
            i = min(small)[1]
            s = every[i]
            ok = [Sample(i, s.input, tuple(s.args), dict(s.kwargs), bool(s.broadcasts_input))]
    chosen = [ok[i] for i in spread(len(ok), MAX_SAMPLES)]
    cut = odd_cut(chosen)
    return chosen + ([cut] if cut is not None else []), len(every)


def sample_2d(chosen: Sequence[Sample]) -> Sample | None:
    """The sample run on the (2, 2) mesh: one with a dim of odd size (uneven shards), then
    the most tensor dims (so sharding can nest on it), then the most elements."""
    if not chosen:
        return None
    return max(
        chosen,
        key=lambda s: (
            _has_odd_dim(s),
            sum(t.ndim for t in s.leaves),
            sum(t.numel() for t in s.leaves),
            -s.index,
        ),
    )


# ---------------------------------------------------------------------- placements
def placement_options(t: torch.Tensor) -> list[Placement]:
    """Replicate, Shard(d) for every dim, and Partial(sum) for floating tensors."""
    opts: list[Placement] = [Replicate(), *(Shard(d) for d in range(t.ndim))]
    if t.is_floating_point():
        opts.append(Partial("sum"))
    return opts


def combos(
    leaves: Sequence[torch.Tensor], mesh_ndim: int, cap: int, seed: int
) -> tuple[list[tuple[tuple[Placement, ...], ...]], int]:
    """Placement combinations of ``leaves`` (one tuple per tensor, one placement per mesh
    dim): all of them when there are at most ``cap``, else a fixed random subset of
    ``cap``. Returns (chosen, total)."""
    per = [list(itertools.product(placement_options(t), repeat=mesh_ndim)) for t in leaves]
    total = 1
    for p in per:
        total *= len(p)
    if total <= cap:
        return list(itertools.product(*per)), total
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    out = []
    while len(out) < cap:
        idx = tuple(rng.randrange(len(p)) for p in per)
        if idx not in seen:
            seen.add(idx)
            out.append(tuple(p[i] for p, i in zip(per, idx)))
    return out, total


def is_uneven(
    leaves: Sequence[torch.Tensor], combo: Sequence[Sequence[Placement]], mesh_shape: Sequence[int]
) -> bool:
    """Some tensor dim is sharded over a mesh dim that does not divide it."""
    for t, pl in zip(leaves, combo):
        size = list(t.shape)
        for m, p in enumerate(pl):
            if isinstance(p, Shard):
                n = mesh_shape[m]
                if size[p.dim] % n:
                    return True
                size[p.dim] //= n
    return False


def fmt_combo(combo: Sequence[Sequence[Placement]]) -> str:
    return "; ".join(",".join(str(p) for p in pl) for pl in combo)
