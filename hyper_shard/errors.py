"""hyper_shard's exceptions: each names the op, the placements, and the fix."""

from __future__ import annotations

__all__ = ["HyperShardError", "OpNotRegisteredError", "ShardingError", "OpSpecError"]


class HyperShardError(RuntimeError):
    """Base class of hyper_shard errors."""


class OpNotRegisteredError(HyperShardError, NotImplementedError):
    """An op was called on a DTensor but no sharding rule is registered for it."""


class ShardingError(HyperShardError, ValueError):
    """The inputs' placements cannot be handled by the op's rule (and no redistribution
    helps)."""


class OpSpecError(HyperShardError, ValueError):
    """A YAML op spec is malformed; the message names the file, the entry and the field."""
