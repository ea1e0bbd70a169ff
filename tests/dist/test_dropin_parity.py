"""Differences a user migrating from PyTorch DTensor hit, found by running the same small
programs on ``torch.distributed.tensor`` and on ``hyper_shard`` (imports switched), now
fixed. Each check runs on both libraries in the same process through ``_both`` of
``test_dropin_pytorch_tests`` (results, placements, shapes, strides and error types compared),
never against numbers of our own.

* ``from_local(run_check=True)`` did not compare the local shapes: ``Replicate`` (or
  ``Partial``) shards of different shapes made a DTensor whose global shape differed per
  rank, where PyTorch raises ``ValueError`` (uneven ``Shard`` shards stay accepted).
"""

from __future__ import annotations

import pytest
import torch

from .test_dropin_pytorch_tests import _both

pytestmark = pytest.mark.multiproc


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _m(L, world):
    return L.mesh((world,))


def check_run_check_shapes(rank, world):
    """Local shapes that disagree off the sharded dim raise ``ValueError`` on every rank."""
    for pl in ("Replicate", "Partial"):
        _both(
            lambda L, pl=pl: L.DTensor.from_local(
                _r(2 + rank, 2), _m(L, world), [getattr(L, pl)()], run_check=True
            ),
            f"from_local({pl}, run_check=True) of shards of different shapes",
        )
    _both(
        lambda L: L.DTensor.from_local(_r(2, 2 + rank), _m(L, world), [L.Shard(0)], run_check=True),
        "from_local(Shard(0), run_check=True) differing off the sharded dim",
    )
    _both(
        lambda L: L.DTensor.from_local(
            _r(2, 3, seed=rank), _m(L, world), [L.Shard(1)], run_check=True
        ),
        "from_local(Shard(1), run_check=True) of even shards",
    )
    return True


def check_all(rank, world):
    return [f(rank, world) for f in (check_run_check_shapes,)]


def test_dropin_parity(dist2):
    assert dist2.run(check_all) == [[True] * 1] * 2
