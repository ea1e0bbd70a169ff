"""The op-spec registry: YAML -> pydantic models -> DistributedOp instances per op name.

See ``docs/custom_ops.md`` for the YAML format and how to add ops.
"""

from .loader import LoadedEntry, load_all, load_dir, load_file
from .models import OpEntry, RuleParams
from .registry import Registry, get_registry, reload

__all__ = [
    "OpEntry",
    "RuleParams",
    "LoadedEntry",
    "load_file",
    "load_dir",
    "load_all",
    "Registry",
    "get_registry",
    "reload",
]
