"""The op-spec registry: YAML -> pydantic models -> DistributedOp instances per op name."""

from .loader import LoadedEntry, load_dir, load_file
from .models import OpEntry, RuleParams
from .registry import Registry, get_registry, reload

__all__ = [
    "OpEntry",
    "RuleParams",
    "LoadedEntry",
    "load_file",
    "load_dir",
    "Registry",
    "get_registry",
    "reload",
]
