"""The flight recorder: the last collectives this rank ran, in a bounded ring buffer.

Every platform collective (torch.distributed / mindspore ``mint.distributed``: the
redistribution steps, ``from_local``'s shape exchange, FSDP's and the loss kernels'
collectives...) appends one :class:`Record` — the collective, its group, the local buffer's
shape and dtype, the context frames (the op and step it ran for), the wall time — and marks
it done, failed or still running. Ops that move nothing record nothing. Read it with
:func:`hyper_shard.debug.recent_ops`; a :class:`~hyper_shard.errors.CollectiveError`
shows the last few.

The buffer keeps the last ``HYPER_SHARD_RECENT_OPS`` records (default 256; read at
import), one buffer per rank: where ranks are threads of one process (PyTorch's threaded
process group) each reads and writes its own, as with one process per rank.
Framework-neutral.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from ..mesh import this_rank
from .context import Frame, OpFrame, RedistributeFrame, StepFrame, dtype_name

__all__ = ["Record", "RankRings", "RECENT", "recent", "format_records", "DEFAULT_SIZE"]

DEFAULT_SIZE = 256


def _size() -> int:
    raw = os.environ.get("HYPER_SHARD_RECENT_OPS", "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_SIZE
    except ValueError:
        return DEFAULT_SIZE


class Record:
    """One collective this rank ran (or is running).

    Attributes:
        time: wall-clock start (``time.time()``, seconds).
        collective: the platform collective (``"all_gather"``, ``"all_reduce"``...).
        ranks: the group's global ranks (mesh-coordinate order).
        shape: the local buffer's shape (None for object collectives).
        dtype: the buffer's dtype (the framework's object; None for objects).
        frames: the context frames, outermost first.
        seconds: duration once finished (None while running or after a failure).
        status: ``"running"``, ``"ok"`` or ``"failed"``.
    """

    __slots__ = ("time", "collective", "ranks", "shape", "dtype", "frames", "seconds", "status")

    def __init__(
        self,
        collective: str,
        ranks: Sequence[int],
        shape: Sequence[int] | None,
        dtype: Any,
        frames: tuple[Frame, ...],
    ) -> None:
        self.time = time.time()
        self.collective = collective
        self.ranks = tuple(ranks)
        self.shape = None if shape is None else tuple(shape)
        self.dtype = dtype
        self.frames = frames
        self.seconds: float | None = None
        self.status = "running"

    def _frame(self, cls: type) -> Frame | None:
        for f in reversed(self.frames):
            if isinstance(f, cls):
                return f
        return None

    @property
    def op(self) -> str | None:
        """The dispatched op it ran for (name and input layouts), if any."""
        f = self._frame(OpFrame)
        return None if f is None else f.describe()

    @property
    def step(self) -> str | None:
        """The redistribution step it ran for (``all_gather on mesh dim 'tp' ...``), if any."""
        f = self._frame(StepFrame)
        return None if f is None else f.describe()

    @property
    def redistribution(self) -> str | None:
        """The redistribution it ran for (``redistribute DTensor[8, 4][S(0)] -> [R]``)."""
        f = self._frame(RedistributeFrame)
        return None if f is None else f.describe()

    def buffer(self) -> str:
        """``all_gather of [4, 4] float32 over ranks [0, 1]``."""
        what = "an object" if self.shape is None else f"{list(self.shape)} {dtype_name(self.dtype)}"
        return f"{self.collective} of {what} over ranks {list(self.ranks)}"

    def context(self) -> list[str]:
        """What it ran for, one ``label: text`` line per frame, innermost first."""
        return [f"{f.label} {f.describe()}" for f in reversed(self.frames)]

    def as_dict(self) -> dict[str, Any]:
        """The record as plain python values (for logs and JSON)."""
        return {
            "time": self.time,
            "collective": self.collective,
            "ranks": list(self.ranks),
            "shape": None if self.shape is None else list(self.shape),
            "dtype": None if self.dtype is None else dtype_name(self.dtype),
            "step": self.step,
            "redistribution": self.redistribution,
            "op": self.op,
            "context": self.context(),
            "seconds": self.seconds,
            "status": self.status,
        }

    def __str__(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.time))
        ms = f"{(self.time % 1) * 1000:03.0f}"
        if self.status == "ok" and self.seconds is not None:
            took = f"{self.seconds * 1e3:.2f} ms"
        else:
            took = self.status.upper()
        ctx = " | ".join(self.context())
        return f"{clock}.{ms}  {self.buffer()}  {took}" + (f"  | {ctx}" if ctx else "")

    __repr__ = __str__


class RankRings:
    """One ring buffer of ``maxlen`` records per rank of this process (one buffer with one
    rank per process); :meth:`append`, :meth:`clear`, iteration and ``len`` act on the
    calling rank's (:func:`hyper_shard.mesh.this_rank`)."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._rings: dict[int | None, deque[Record]] = {}

    def _ring(self) -> deque[Record]:
        rank = this_rank()
        ring = self._rings.get(rank)
        if ring is None:
            ring = self._rings.setdefault(rank, deque(maxlen=self.maxlen))
        return ring

    def append(self, rec: Record) -> None:
        self._ring().append(rec)

    def clear(self) -> None:
        self._ring().clear()

    def __iter__(self) -> Iterator[Record]:
        return iter(list(self._ring()))

    def __len__(self) -> int:
        return len(self._ring())


#: the ring buffers (oldest first); appended by :func:`hyper_shard.flight.guard.collective`
RECENT = RankRings(_size())


def recent(last: int | None = None) -> list[Record]:
    """The calling rank's recorded collectives, oldest first (the last ``last`` if given)."""
    out = list(RECENT)
    return out if last is None else out[-last:] if last > 0 else []


def format_records(records: Sequence[Record], indent: str = "    ") -> str:
    """One line per record."""
    return "\n".join(indent + str(r) for r in records)
