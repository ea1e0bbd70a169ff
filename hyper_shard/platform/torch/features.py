"""What the neutral core reaches on torch through the platform's declaration
(:data:`hyper_shard.platform.bindings.TORCH`): the default generator's state for
:mod:`hyper_shard.random`, dtypes by name for ``hyper-shard explain``."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

__all__ = ["GENERATOR", "dtype_named"]


class _Generator:
    """torch's default CPU generator (``torch.manual_seed`` / ``get_rng_state``)."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def state_digest(self) -> int:
        """A 64-bit digest of the generator state (equal states, equal digests)."""
        raw = torch.get_rng_state().numpy().tobytes()
        return int.from_bytes(hashlib.sha1(raw).digest()[:8], "big")


GENERATOR = _Generator()


def dtype_named(name: str) -> Any:
    """``torch.<name>`` if it is a dtype.

    Raises:
        AttributeError: no torch dtype has that name.
    """
    dt = getattr(torch, name)
    if not isinstance(dt, torch.dtype):
        raise AttributeError(f"torch.{name} is not a dtype")
    return dt
