"""What the neutral core reaches on MindSpore through the platform's declaration
(:data:`hyper_shard.platform.bindings.MINDSPORE`): seeding for :mod:`hyper_shard.random`
(MindSpore exposes no generator state to copy: ``rng_state`` is False), dtypes by name."""

from __future__ import annotations

from typing import Any

import mindspore

__all__ = ["GENERATOR", "dtype_named"]


class _Generator:
    """MindSpore's global seed (``mindspore.set_seed``)."""

    def manual_seed(self, seed: int) -> None:
        mindspore.set_seed(seed)


GENERATOR = _Generator()


def dtype_named(name: str) -> Any:
    """``mindspore.<name>`` if it is a dtype.

    Raises:
        AttributeError: no MindSpore dtype has that name.
    """
    dt = getattr(mindspore, name)
    if not isinstance(dt, mindspore.dtype.Type):
        raise AttributeError(f"mindspore.{name} is not a dtype")
    return dt
