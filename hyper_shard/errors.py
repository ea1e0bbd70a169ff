"""hyper_shard's exceptions: each names the op, the placements, and the fix."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "HyperShardError",
    "OpNotRegisteredError",
    "ShardingError",
    "OpSpecError",
    "CollectiveError",
    "DivergenceError",
]


class HyperShardError(RuntimeError):
    """Base class of hyper_shard errors."""


class OpNotRegisteredError(HyperShardError, NotImplementedError):
    """An op was called on a DTensor but no sharding rule is registered for it."""


class ShardingError(HyperShardError, ValueError):
    """The inputs' placements cannot be handled by the op's rule (and no redistribution
    helps)."""


class OpSpecError(HyperShardError, ValueError):
    """A YAML op spec is malformed; the message names the file, the entry and the field."""


class CollectiveError(HyperShardError):
    """A collective failed on this rank: it timed out (a peer stalled, or ran another
    collective), lost a peer (a rank died), or the backend refused it.

    Raised on every surviving rank of the collective's group, with the backend's error as
    ``__cause__``. The message (see docs/troubleshooting.md) names the collective, the
    redistribution step and the dispatched op it ran for (with their input layouts), the
    group's ranks and timeout, and the last collectives this rank ran
    (:func:`hyper_shard.debug.recent_ops`).

    Attributes:
        collective: the platform collective (``"all_gather"``, ``"all_reduce"``...).
        reason: ``"timeout"``, ``"peer lost"``, ``"divergence"`` or ``"failed"``.
        ranks: the global ranks of the collective's group, in mesh-coordinate order.
        context: what the rank was doing, innermost last (op, redistribution, step).
    """

    def __init__(
        self,
        message: str,
        *,
        collective: str = "",
        reason: str = "failed",
        ranks: Sequence[int] = (),
        context: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.collective = collective
        self.reason = reason
        self.ranks = tuple(ranks)
        self.context = tuple(context)


class DivergenceError(CollectiveError):
    """Ranks of a group were about to run different collectives (consistency mode,
    :func:`hyper_shard.debug.check_consistency`): raised on every rank of the group, before
    the mismatched collective runs, so the group stays usable.

    Attributes:
        doing: per group rank (mesh-coordinate order), what that rank was about to run.
    """

    def __init__(self, message: str, *, doing: Sequence[str] = (), **kw: object) -> None:
        super().__init__(message, reason="divergence", **kw)  # type: ignore[arg-type]
        self.doing = tuple(doing)
