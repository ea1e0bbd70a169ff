"""``embedding(..., max_norm=...)`` on a weight whose columns are sharded.

Semantics (``torch.nn.functional.embedding``, ``torch.embedding_renorm_``; MindSpore's
``ops.embedding`` documents the same): before the lookup, every weight row that the indices
look up and whose ``norm_type``-norm exceeds ``max_norm`` is multiplied, in place and
outside autograd, by ``max_norm / (norm + 1e-7)``; the lookup then reads the renormalised
rows, and its gradient is the plain lookup's (the rescale is not differentiated).

A column-sharded weight (``Shard(1)`` on some mesh dims) holds a slice of each row, so a
row's norm needs every column shard: each rank computes, for the looked-up rows it holds,
the partial ``sum |w|^p`` over its columns (``max |w|`` for ``p = inf``, ``min`` for
``-inf``, the count of non-zeros for ``p = 0``), one all-reduce over the mesh dims that
shard the columns completes it, and each rank rescales its own slice of those rows. The
indices are Replicate (the rule gathers them), and the ranks of one column group hold the
same rows (rows may be sharded only on other mesh dims), so each all-reduce has the same
size on every member. A row-sharded weight (``Shard(0)`` as well) renormalises only the
rows in its range.

The lookup is the op itself without ``max_norm`` (or the vocab-parallel lookup of a
row-sharded weight); if it raises (e.g. no kernel for it on this device), the rows are
restored first, so a failed call leaves the table as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import all_reduce

__all__ = ["ShardedEmbeddingRenorm", "renorm_rows_"]

_EPS = 1e-7  # torch.embedding_renorm_'s


def _partial_norms(plat: Any, rows: Any, p: float) -> tuple[Any, str]:
    """Each row's partial p-norm statistic over the local columns, and its reduction."""
    n, cols = plat.shape(rows)
    a = abs(rows)
    if p in (float("inf"), float("-inf")):
        mode = "max" if p > 0 else "min"
        if cols == 0:  # an empty column shard: the reduction's identity
            return plat.full((n,), 0.0 if p > 0 else float("inf"), rows), mode
        return (plat.amax(a, 1) if p > 0 else plat.amin(a, 1)), mode
    if p == 0:
        return plat.sum(1 - plat.eq_mask(a, plat.zeros_like(a)), 1), "sum"
    return plat.sum(a**p, 1), "sum"


def renorm_rows_(
    plat: Any, weight: Any, rows: Any, max_norm: float, p: float, groups: Sequence[Any]
) -> Any:
    """Renormalise ``weight``'s rows ``rows`` (local row indices, a 1-D integer tensor;
    duplicates allowed) in place, as ``torch.embedding_renorm_``, their norms taken over
    every column shard (an all-reduce over ``groups``). Returns the rows' previous values
    (to restore them with ``plat.put_rows_``). No autograd."""
    with plat.no_grad():
        old = plat.take_rows(plat.detach(weight), rows)
        part, mode = _partial_norms(plat, old, p)
        stat = all_reduce(plat, part, mode, groups)
        norm = stat if p in (0, 1, float("inf"), float("-inf")) else stat ** (1.0 / p)
        over = norm > max_norm
        factor = plat.where(over, max_norm / (norm + _EPS), plat.ones_like(norm))
        plat.put_rows_(weight, rows, old * plat.unsqueeze(factor, 1))
    return old


class ShardedEmbeddingRenorm:
    """The local kernel of ``embedding(input, weight, ..., max_norm, norm_type, ...)`` on a
    column-sharded weight: called like the op, with the local (Replicate) indices and the
    local weight; arguments read through the call's binder.

    ``lookup``: the lookup to run after renormalising (the op itself, or a
    ``VocabParallelLookup`` for a row-sharded weight), called without ``max_norm``;
    ``lo``/``rows``: this rank's global row range, of ``vocab`` rows in all; ``groups``:
    the process groups of the mesh dims that shard the columns."""

    __slots__ = ("lookup", "binder", "plat", "lo", "rows", "vocab", "groups")

    def __init__(
        self,
        lookup: Any,
        binder: Any,
        plat: Any,
        rows: tuple[int, int, int],
        groups: Sequence[Any],
    ) -> None:
        self.lookup, self.binder, self.plat = lookup, binder, plat
        self.lo, self.rows, self.vocab = rows
        self.groups = tuple(groups)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b, plat = self.binder, self.plat
        ids = b.get(args, kwargs, "input")
        weight = b.get(args, kwargs, "weight")
        max_norm = float(b.get(args, kwargs, "max_norm"))
        p = b.get(args, kwargs, "norm_type")
        p = 2.0 if p is None else float(p)
        flat = plat.reshape(ids, (-1,))
        if self.rows != self.vocab:  # a row shard: its own rows only
            local = flat - self.lo
            flat = local[(local >= 0) & (local < self.rows)]
        args, kwargs = b.replace(args, kwargs, "max_norm", None)
        if plat.shape(flat)[0] == 0:  # no looked-up row here (nor on its column group)
            return self.lookup(*args, **kwargs)
        old = renorm_rows_(plat, weight, flat, max_norm, p, self.groups)
        try:
            return self.lookup(*args, **kwargs)
        except BaseException:
            with plat.no_grad():
                plat.put_rows_(weight, flat, old)
            raise
