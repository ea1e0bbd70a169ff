"""The sim platform's declaration: everything hyper_shard's neutral core knows of it.

Registered by :func:`installed` (a test platform registers for the block that uses it;
an installed package would name :data:`BINDINGS` in an entry point of group
``hyper_shard.platforms`` instead)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hyper_shard.registry import reload
from hyper_shard.registry.platforms import (
    PlatformBindings,
    register_platform,
    unregister_platform,
)

from .dispatch import build_sim_table, resolve_sim_op
from .platform import KEY, the_platform

__all__ = ["BINDINGS", "installed"]

BINDINGS = PlatformBindings(
    key=KEY,
    resolve=resolve_sim_op,
    build_table=build_sim_table,
    platform=the_platform,
    names_hint="a list of sim op names, e.g. [sim.add, SimTensor.__add__]",
    modules=(__package__,),
    device_types=(KEY,),
    # the sim's names for the built-in entries (extend: true), one signature of its own
    op_specs=(str(Path(__file__).parent / "op_specs"),),
)


@contextmanager
def installed() -> Iterator[PlatformBindings]:
    """Register the sim platform and reload the registry (its op specs join it); undone
    on exit."""
    register_platform(BINDINGS, replace=True)
    try:
        reload()
        yield BINDINGS
    finally:
        unregister_platform(KEY)
        reload()
