"""The error every checkpoint failure raises (on every rank)."""

from __future__ import annotations

from ..errors import HyperShardError

__all__ = ["CheckpointError"]


class CheckpointError(HyperShardError):
    """A checkpoint could not be saved or loaded: a missing or unexpected key, a global
    shape or dtype that differs from the saved one, a truncated or corrupted file, a
    checkpoint from another model, a save that never committed.

    The message names the key(s) and the file. Collective ``save``/``load`` calls raise it
    on every rank (the ranks agree before anything changes), and a failed ``load`` leaves
    the state dict's tensors as they were.
    """
