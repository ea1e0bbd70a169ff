"""The MindSpore platform (see issue: MindSpore backend)."""

from __future__ import annotations

from ..base import Platform

__all__ = ["MindSporePlatform"]


class MindSporePlatform(Platform):
    """hyper_shard on MindSpore (PyNative): not implemented yet."""

    name = "mindspore"

    def __init__(self) -> None:
        raise NotImplementedError(
            "the MindSpore platform is not available yet; use platform='torch'"
        )
