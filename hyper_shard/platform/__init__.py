"""Framework platforms: the only place torch or MindSpore is imported."""

from .base import Platform
from .select import get_platform, platform_of_tensor

__all__ = ["Platform", "get_platform", "platform_of_tensor"]
