"""The guard every platform collective runs in: consistency check, record, and the
backend's timeout / lost-peer errors turned into :class:`~hyper_shard.errors.CollectiveError`.

A platform calls ``collective(plat, name, group, shape, dtype, fn, *args, **kwargs)`` around
the one framework call that communicates (``dist.all_reduce(...)``,
``mint.distributed.all_gather(...)``); the platform's ``comm_errors`` (the exception types
its backend raises for a failed collective) become a ``CollectiveError`` raised from them,
whose message names the collective, the group and its timeout, the step / redistribution /
op it ran for, what probably happened and what to do, and the last collectives of this
rank. :func:`guarded` is the same without the record and the check (the consistency
exchange itself). Framework-neutral.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..errors import CollectiveError
from .consistency import MODE, check
from .context import Frame, stack
from .recorder import RECENT, Record, format_records, recent

if TYPE_CHECKING:
    from ..platform.base import Platform

__all__ = ["collective", "guarded", "collective_error", "LAST_SHOWN"]

#: records shown in a CollectiveError's message (all of them: hyper_shard.debug.recent_ops)
LAST_SHOWN = 8

_TIMEOUT_WORDS = ("timed out", "timeout", "time out", "deadline")
_PEER_WORDS = (
    "connection closed",
    "connection reset",
    "broken pipe",
    "closed by peer",
    "connection refused",
    "end of file",
    "socket closed",
    "peer",
    "disconnect",
    "heartbeat",
)


def collective(
    plat: Platform,
    name: str,
    group: Any,
    shape: Any,
    dtype: Any,
    fn: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` — the framework call of collective ``name`` on
    ``group`` (a :class:`~hyper_shard.platform.base.GroupRanks`) with a local buffer of
    ``shape``/``dtype`` (None for object collectives) — checked (consistency mode),
    recorded, and guarded.

    Raises:
        DivergenceError: consistency mode, and a rank of the group is about to run
            something else.
        CollectiveError: the backend raised one of ``plat.comm_errors`` (cause chained).
    """
    frames = tuple(stack())
    if MODE.on:
        check(plat, name, group, shape, dtype, frames)
    rec = Record(name, group.ranks, shape, dtype, frames)
    RECENT.append(rec)
    t0 = perf_counter()
    try:
        out = fn(*args, **kwargs)
    except CollectiveError:  # a nested guarded call already described it
        rec.status = "failed"
        raise
    except plat.comm_errors as e:
        rec.status = "failed"
        raise collective_error(plat, name, group, e, frames, rec, perf_counter() - t0) from e
    rec.seconds = perf_counter() - t0
    rec.status = "ok"
    return out


def guarded(
    plat: Platform, name: str, group: Any, fn: Callable[..., Any], /, *args: Any, **kw: Any
) -> Any:
    """``fn(*args, **kw)`` with the backend's errors turned into CollectiveError (no record,
    no consistency check: for the consistency exchange itself)."""
    t0 = perf_counter()
    try:
        return fn(*args, **kw)
    except CollectiveError:
        raise
    except plat.comm_errors as e:
        elapsed = perf_counter() - t0
        raise collective_error(plat, name, group, e, tuple(stack()), None, elapsed) from e


def _reason(msg: str, elapsed: float | None, timeout: Any) -> str:
    low = msg.lower()
    if any(w in low for w in _TIMEOUT_WORDS):
        return "timeout"
    if any(w in low for w in _PEER_WORDS):
        return "peer lost"
    if elapsed is not None and timeout is not None:
        # a backend that says only "AllReduce failed." (mccl) after waiting the timeout out
        if elapsed >= 0.8 * timeout.total_seconds():
            return "timeout"
    return "failed"


def _first_line(msg: str, limit: int = 300) -> str:
    line = msg.strip().splitlines()[0] if msg.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


_ADVICE = {
    "timeout": (
        "another rank of the group did not join this collective within the timeout: it is "
        "stalled (a long computation, a deadlock, I/O), dead, or running a different "
        "collective. Look at the other ranks' errors; run every rank with "
        "HYPER_SHARD_CHECK_CONSISTENCY=1 (or inside hyper_shard.debug.check_consistency()) "
        "to catch ranks that diverge; if the work is legitimately slow, raise the timeout "
        "(init_device_mesh(..., timeout=timedelta(...)) or HYPER_SHARD_TIMEOUT seconds)."
    ),
    "peer lost": (
        "a rank of the group went away (crashed, was killed, or exited early): its own log "
        "has the cause. The group is unusable now; restart the job (from a checkpoint)."
    ),
    "failed": (
        "the backend refused or aborted the collective (see the cause below); a mismatch "
        "between ranks (different shapes, dtypes or collectives) is the usual reason: run "
        "every rank with HYPER_SHARD_CHECK_CONSISTENCY=1 to find where they diverge."
    ),
}


def collective_error(
    plat: Platform,
    name: str,
    group: Any,
    err: BaseException,
    frames: tuple[Frame, ...],
    rec: Record | None,
    elapsed: float | None = None,
) -> CollectiveError:
    """The CollectiveError for backend error ``err`` of collective ``name``, raised after
    ``elapsed`` seconds (see the module docstring for what the message holds)."""
    msg = str(err)
    timeout = getattr(group, "timeout", None)
    reason = _reason(msg, elapsed, timeout)
    try:
        me: int | str = plat.get_rank()
    except Exception:  # the backend may be unusable by now
        me = "?"
    ranks = list(group.ranks)
    head = {"timeout": "timed out", "peer lost": "lost a peer", "failed": "failed"}[reason]
    what = rec.buffer() if rec is not None else f"{name} over ranks {ranks}"
    lines = [
        f"{name} {head} on rank {me} ({plat.name}: {_first_line(msg)})",
        f"  collective: {what}"
        + (f", after {elapsed:.1f} s" if elapsed is not None else "")
        + (f" (group timeout {timeout})" if timeout is not None else ""),
    ]
    ctx = [f"  {f.label}: {f.describe()}" for f in reversed(frames)]
    lines += ctx or [
        "  in: no hyper_shard op or redistribution (a kernel's own collective, FSDP, or a "
        "direct call: see the traceback)"
    ]
    lines.append(f"  what happened: {_ADVICE[reason]}")
    shown = recent(LAST_SHOWN)
    lines.append(
        "  last collectives on this rank (oldest first; all of them: "
        "hyper_shard.debug.recent_ops()):"
    )
    lines.append(format_records(shown) if shown else "    (none)")
    return CollectiveError(
        "\n".join(lines),
        collective=name,
        reason=reason,
        ranks=ranks,
        context=[f"{f.label} {f.describe()}" for f in reversed(frames)],
    )
