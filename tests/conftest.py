"""Session fixtures: the gloo pools (``tests/_dist.py``), one per world size and
environment, started once per session.

Start-up is the expensive part of a pool (each rank imports torch and builds the op
registry; a conformance rank also imports PyTorch's OpInfo database). So the session runs
the single-process tests first and, meanwhile, the pools its multi-process tests will use
start in the background (:func:`pytest_collection_finish`): the second core does the
start-up while the first runs the unit tests.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests._dist import DistPool

_POOLS: dict[tuple, DistPool] = {}
#: the fixtures that hand out a pool, and the MindSpore ones (tests/mindspore/conftest.py)
_GLOO = {"dist2": 2, "dist4": 4}
_MS = {"ms1": 1, "ms2": 2, "ms4": 4}


def get_pool(world: int, **env: str) -> DistPool:
    key = (world, tuple(sorted(env.items())))
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = DistPool(world, env)
    return pool


@pytest.fixture(scope="session")
def dist2() -> DistPool:
    return get_pool(2)


@pytest.fixture(scope="session")
def dist4() -> DistPool:
    return get_pool(4)


def _pools_of(item: pytest.Item) -> set[str]:
    return set(getattr(item, "fixturenames", ())) & (set(_GLOO) | set(_MS))


def _spawns(item: pytest.Item) -> bool:
    """A test that starts ranks: a pool's, a fresh world's (tests/_fresh.py) or a
    subprocess's (marked ``multiproc``)."""
    return bool(_pools_of(item)) or item.get_closest_marker("multiproc") is not None


def pytest_collection_modifyitems(session, config, items):  # noqa: ARG001
    """Single-process tests first (in their collected order), then the ones that start
    ranks (in theirs): the pools start while the first run, and a test that starts a
    fresh world with short timeouts (tests/dist/test_hang.py) does not compete with
    that start-up."""
    items.sort(key=_spawns)


def pytest_collection_finish(session):
    """Start, in the background, every pool the selected tests use (see the module)."""
    used: set[str] = set()
    conformance = False
    for item in session.items:
        names = _pools_of(item)
        used |= names
        conformance |= bool(names) and "conformance" in item.nodeid.split("::")[0]
    warm = ("tests.conformance._cases:entries",) if conformance else ()
    for name, world in _GLOO.items():
        if name in used:
            get_pool(world).warm_up(warm)
    ms = [w for name, w in _MS.items() if name in used]
    if ms and importlib.util.find_spec("mindspore") is not None:
        from tests.mindspore.conftest import _pool

        for world in ms:
            _pool(world).warm_up()


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
