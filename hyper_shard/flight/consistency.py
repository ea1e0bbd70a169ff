"""The consistency mode: before each collective, the ranks of its group compare what they
are about to run, and every rank raises at the first disagreement.

A rank's *fingerprint* of a collective is the text of what it is about to run — the
collective, its buffer's shape and dtype, the group, and the context frames (the step, the
redistribution, the dispatched op and its inputs' global layouts) — all of which are the
same on every rank of a group that runs the same program. The ranks exchange it with one
all-gather of a fixed-size buffer (:data:`PAYLOAD` bytes: an 8-byte hash of the whole
text, then the text, cut to fit) through the same group, so under the same timeout. If
the hashes differ, every rank of the group raises
:class:`~hyper_shard.errors.DivergenceError` naming what each rank was doing, *before* the
mismatched collective runs (which would hang, or return garbage, or make gloo abort).

Off by default; on inside :func:`hyper_shard.debug.check_consistency` (per rank) or with
``HYPER_SHARD_CHECK_CONSISTENCY=1`` (read at import). When off it costs one property
read per collective; when on, one small extra all-gather per collective (see
benchmarks/bench_dispatch.py). Every rank must turn it on and off at the same points.
Framework-neutral: the exchange is the platform's ``all_gather_bytes``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import DivergenceError
from ..mesh import this_rank
from .context import Frame, dtype_name

if TYPE_CHECKING:
    from ..platform.base import Comm

__all__ = ["MODE", "PAYLOAD", "fingerprint", "check"]

#: bytes each rank sends per check (hash + length + text)
PAYLOAD = 1024
_HASH = 8


class _Mode:
    """The switch, read once per collective: ``on`` is the calling rank's setting — the
    innermost :func:`hyper_shard.debug.check_consistency` block it is in, else the
    process-wide default (``HYPER_SHARD_CHECK_CONSISTENCY``; assigning ``on`` sets it).
    Blocks are per rank: ranks that are threads of one process enter and leave them at
    their own points of the program, as processes do."""

    __slots__ = ("default", "ranks")

    def __init__(self) -> None:
        self.default = os.environ.get("HYPER_SHARD_CHECK_CONSISTENCY", "").strip().lower() in (
            "1",
            "true",
            "yes",
            "on",
        )
        #: rank -> the setting of its innermost open block
        self.ranks: dict[int | None, bool] = {}

    @property
    def on(self) -> bool:
        if self.ranks:
            here = self.ranks.get(this_rank())
            if here is not None:
                return here
        return self.default

    @on.setter
    def on(self, value: bool) -> None:
        self.default = bool(value)

    @contextmanager
    def block(self, enabled: bool) -> Iterator[None]:
        """The calling rank's setting is ``enabled`` inside (nestable)."""
        rank = this_rank()
        before = self.ranks.get(rank)
        self.ranks[rank] = bool(enabled)
        try:
            yield
        finally:
            if before is None:
                self.ranks.pop(rank, None)
            else:
                self.ranks[rank] = before


MODE = _Mode()


def fingerprint(
    collective: str, ranks: tuple[int, ...], shape: Any, dtype: Any, frames: tuple[Frame, ...]
) -> str:
    """What this rank is about to run, as text that is the same on every rank of the group
    when they run the same program (innermost context first)."""
    what = "an object" if shape is None else f"{list(shape)} {dtype_name(dtype)}"
    parts = [f"{collective} of {what} over ranks {list(ranks)}"]
    parts += [f"{f.label} {f.describe()}" for f in reversed(frames)]
    return " | ".join(parts)


def _encode(text: str) -> bytes:
    raw = text.encode("utf-8")
    digest = hashlib.blake2b(raw, digest_size=_HASH).digest()
    body = raw[: PAYLOAD - _HASH - 2]
    return (
        digest + len(body).to_bytes(2, "little") + body + b"\0" * (PAYLOAD - _HASH - 2 - len(body))
    )


def _decode(buf: bytes) -> tuple[bytes, str]:
    n = int.from_bytes(buf[_HASH : _HASH + 2], "little")
    text = buf[_HASH + 2 : _HASH + 2 + n].decode("utf-8", errors="replace")
    return buf[:_HASH], text + " ..." if n == PAYLOAD - _HASH - 2 else text


def check(
    plat: Comm,
    collective: str,
    group: Any,
    shape: Any,
    dtype: Any,
    frames: tuple[Frame, ...],
) -> None:
    """Exchange fingerprints over ``group``; raise on every rank if they differ.

    Raises:
        DivergenceError: some rank of the group is about to run something else.
        CollectiveError: the exchange itself failed (a peer stalled past the timeout, or
            died).
    """
    ranks = tuple(group.ranks)
    n = len(ranks)
    if n <= 1:
        return
    text = fingerprint(collective, ranks, shape, dtype, frames)
    got = plat.all_gather_bytes(_encode(text), group, n)
    decoded = [_decode(b) for b in got]
    if all(h == decoded[0][0] for h, _ in decoded):
        return
    me = plat.get_rank()
    rows = []
    for r, (_, t) in zip(ranks, decoded):
        tag = " (this rank)" if r == me else ""
        rows.append(f"  rank {r}{tag}: {t}")
    from .recorder import format_records, recent

    hints = "".join(sorted({f"\n{f.hint}" for f in frames if f.hint}))
    raise DivergenceError(
        f"ranks {list(ranks)} were about to run different collectives (hyper_shard consistency "
        f"mode); every rank of the group raised this before the collective ran, so the group "
        f"is still usable:\n"
        + "\n".join(rows)
        + "\nMake every rank run the same DTensor ops on DTensors of the same global shapes "
        "and placements: look for a branch on the rank, or DTensor.from_local with local "
        "shards that do not form one tensor (pass run_check=True or the right shape=)."
        + hints
        + "\nlast collectives on this rank (oldest first, hyper_shard.debug.recent_ops()):\n"
        + (format_records(recent(8)) or "    (none)"),
        collective=collective,
        ranks=ranks,
        context=[f"{f.label} {f.describe()}" for f in reversed(frames)],
        doing=[t for _, t in decoded],
    )
