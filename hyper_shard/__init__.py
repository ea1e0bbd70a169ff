"""hyper_shard: one sharded tensor (DTensor) for PyTorch and MindSpore.

The public API follows PyTorch DTensor: ``DeviceMesh``/``init_device_mesh``,
``Shard``/``Replicate``/``Partial``, ``DTensor.from_local``/``to_local``/``full_tensor``/
``redistribute``, ``distribute_tensor`` and the factories.
"""

from . import platform as _platform  # registers the built-in platforms' bindings
from .dispatch.dispatcher import config
from .dtensor import DTensor, distribute_tensor, empty, full, ones, rand, randn, zeros
from .errors import (
    CollectiveError,
    DivergenceError,
    HyperShardError,
    OpNotRegisteredError,
    OpSpecError,
    ShardingError,
)
from .mesh import DeviceMesh, init_device_mesh
from .parallel.distribute import distribute_module
from .placement import Partial, Placement, Replicate, Shard
from .platform import select as _select  # noqa: F401  (installs the platform lookups)
from .registry.loader import add_python_path_at_import as _add_python_path
from .spec import DTensorSpec, TensorMeta

_add_python_path()
# what a platform needs loaded when its framework came first (torch.load of DTensors needs
# their rebuild functions allowlisted): PlatformBindings.preload
_platform.preload_imported()

from . import debug, experimental  # noqa: E402,F401  (hs.experimental, as torch.distributed.tensor's)

__version__ = "0.1.0"

__all__ = [
    "config",
    "DTensor",
    "DTensorSpec",
    "TensorMeta",
    "DeviceMesh",
    "init_device_mesh",
    "Placement",
    "Shard",
    "Replicate",
    "Partial",
    "distribute_tensor",
    "distribute_module",
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "HyperShardError",
    "OpNotRegisteredError",
    "OpSpecError",
    "ShardingError",
    "CollectiveError",
    "DivergenceError",
]
