"""A third platform for the tests: "sim", a thread-simulated SPMD framework.

Every rank is a thread of this process; collectives meet through an in-process exchange
(:mod:`.exchange`); local tensors are torch tensors. It is a platform in its own right,
added as this one package with no line changed elsewhere: its own key (``sim``), its own
op names (``sim.add``, ``SimTensor.__add__``...; :mod:`.tensor`) and resolver, its own
binding table and dispatcher (:mod:`.dispatch`), its own DTensor type and its declaration
(:mod:`.bindings`), registered through hyper_shard's neutral registration call. It imports
nothing from hyper_shard's torch or MindSpore platform packages.

Use it to run layout and plan checks on N ranks in one process::

    from tests.fake_platform import installed, run_ranks, sim, sim_mesh

    with installed():                       # register "sim", load its op specs
        def rank(r):
            mesh = sim_mesh((2, 2))
            x = DTensor.from_local(local, mesh, [Shard(0), Replicate()])
            return sim.relu(x).full_tensor()
        results = run_ranks(4, rank)        # by rank

:func:`run_ranks` alone (without :func:`installed`) is enough for code that calls the
redistribution executor with :class:`SimPlatform` directly.
"""

from __future__ import annotations

from types import SimpleNamespace

from .bindings import BINDINGS, installed
from .exchange import Exchange, SimGroup
from .platform import KEY, PLATFORM, SimPlatform
from .runner import run_ranks, sim_mesh
from .tensor import FUNCTIONS, METHODS, SimDTensor, SimOp

#: the framework's function namespace: ``sim.add(x, y)``, ``sim.linear(x, w, b)``...
sim = SimpleNamespace(**FUNCTIONS)

__all__ = [
    "BINDINGS",
    "KEY",
    "PLATFORM",
    "Exchange",
    "SimGroup",
    "SimPlatform",
    "SimDTensor",
    "SimOp",
    "METHODS",
    "installed",
    "run_ranks",
    "sim",
    "sim_mesh",
]
