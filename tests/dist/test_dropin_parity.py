"""Differences a user migrating from PyTorch DTensor hit, found by running the same small
programs on ``torch.distributed.tensor`` and on ``hyper_shard`` (imports switched), now
fixed. Each check runs on both libraries in the same process through ``_both`` of
``test_dropin_pytorch_tests`` (results, placements, shapes, strides and error types compared),
never against numbers of our own.

* ``from_local(run_check=True)`` did not compare the local shapes: ``Replicate`` (or
  ``Partial``) shards of different shapes made a DTensor whose global shape differed per
  rank, where PyTorch raises ``ValueError`` (uneven ``Shard`` shards stay accepted).
* the factories (``zeros``/``ones``/``empty``/``full``/``rand``/``randn``) refused
  ``layout=torch.strided``; ``zeros`` refused ``Partial`` placements (zero in every form).
* ``repr(dt)`` showed ``placements=(Shard(dim=0))``, not the tuple ``(Shard(dim=0),)``.
* ``y.backward(gradient)`` of a ``Partial(max)`` output (``x.max()`` of a sharded ``x``)
  raised ``NotImplementedError``; a plain one-element gradient raised ``TypeError``.
* ``init_device_mesh`` with a shape over more ranks than the world raised a bare
  ``ValueError`` (PyTorch: ``RuntimeError``); ``"cuda:0"`` (a device index, which PyTorch
  refuses) made a mesh. Both raise ``MeshError``, a ``ValueError`` and a ``RuntimeError``.
* ``CommDebugMode`` had no ``comm_counts`` attribute (PyTorch's own tests index
  ``comm_mode.comm_counts[funcol.all_gather_into_tensor]``).
"""

from __future__ import annotations

import re

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


def check_factories(rank, world):
    """``layout=torch.strided`` is taken by every factory; ``zeros`` takes ``Partial``."""
    for f in ("zeros", "ones", "empty"):
        _both(
            lambda L, f=f: (
                getattr(L, f)(
                    5, 3, device_mesh=_m(L, world), placements=[L.Shard(0)], layout=torch.strided
                ).shape
            ),
            f"{f}(layout=torch.strided)",
        )
    _both(
        lambda L: L.full(
            (5, 3), 2.0, device_mesh=_m(L, world), placements=[L.Shard(1)], layout=torch.strided
        ),
        "full(layout=torch.strided)",
    )
    _both(
        lambda L: L.zeros(5, 3, device_mesh=_m(L, world), placements=[L.Partial()]),
        "zeros(placements=[Partial()])",
    )
    return True


def check_repr(rank, world):
    """The placements in ``repr`` are a tuple, as PyTorch prints them."""

    def placements_of(L):
        d = L.distribute_tensor(_r(4, 2), _m(L, world), [L.Shard(0)])
        p = L.DTensor.from_local(torch.ones(2), _m(L, world), [L.Partial()])
        return [re.search(r"placements=(\(.*?,\))", repr(x)).group(1) for x in (d, p)]

    _both(placements_of, "repr(dt) placements")
    return True


def check_backward_gradient(rank, world):
    """An explicit gradient (a DTensor, or a plain one-element tensor) of a reduction whose
    output is ``Partial(max)``/``Partial(min)`` here reaches the ranks holding the extremum."""

    def run(L, red, grad):
        x = L.distribute_tensor(_r(5, 4).requires_grad_(), _m(L, world), [L.Shard(0)])
        y = getattr(x, red)() * 3
        g = torch.tensor(2.0)
        y.backward(L.distribute_tensor(g, _m(L, world), [L.Replicate()]) if grad == "dt" else g)
        return y.full_tensor(), x.grad.full_tensor()

    # (torch's x.grad of sum().backward(plain) is a plain tensor: left out)
    for red, grad in [
        ("max", "dt"),
        ("max", "plain"),
        ("min", "dt"),
        ("min", "plain"),
        ("sum", "dt"),
    ]:
        _both(lambda L, red=red, grad=grad: run(L, red, grad), f"{red}().backward({grad})")
    return True


def check_comm_counts(rank, world):
    """``comm_mode.comm_counts[...]`` as PyTorch's test_dtensor reads it (to_local with a
    Partial gradient hint: one all-gather forward, one reduce-scatter backward)."""
    import torch.distributed._functional_collectives as funcol

    def run(L):
        if L.name == "torch":
            from torch.distributed.tensor.debug import CommDebugMode
        else:
            from hyper_shard.debug import CommDebugMode
        x = L.distribute_tensor(torch.ones(8, 3, requires_grad=True), _m(L, world), [L.Shard(0)])
        with CommDebugMode() as cm:
            lo = x.redistribute(placements=[L.Replicate()]).to_local(grad_placements=[L.Partial()])
            lo.backward(torch.ones_like(lo))
        c = cm.comm_counts
        return (
            c[funcol.all_gather_into_tensor],
            c[funcol.reduce_scatter_tensor],
            x.grad.full_tensor(),
        )

    _both(run, "CommDebugMode.comm_counts")
    return True


def check_init_device_mesh_errors(rank, world):
    """The errors of ``init_device_mesh`` are PyTorch's type (``RuntimeError``)."""
    _both(lambda L: L.init_device_mesh("cpu", (world + 1,)), "init_device_mesh over too many ranks")
    _both(lambda L: L.init_device_mesh("cpu:0", (world,)), "init_device_mesh('cpu:0')")
    return True


def check_all(rank, world):
    return [
        f(rank, world)
        for f in (
            check_run_check_shapes,
            check_factories,
            check_repr,
            check_backward_gradient,
            check_comm_counts,
            check_init_device_mesh_errors,
        )
    ]


def test_dropin_parity(dist2):
    assert dist2.run(check_all) == [[True] * 6] * 2
