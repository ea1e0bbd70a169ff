"""Helpers that run inside MindSpore worker processes (they import MindSpore): the 1-D
mesh, DTensors from global numpy values with any placements (Partial values split at
random), and a relative error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hyper_shard import DTensor, Partial, Replicate, distribute_tensor, init_device_mesh
from hyper_shard.placement import Placement


def mesh_1d(world: int) -> Any:
    return init_device_mesh("CPU", (world,), platform="mindspore")


def dt_from_numpy(
    x: np.ndarray,
    mesh: Any,
    placements: Sequence[Placement],
    seed: int = 0,
    cache: dict | None = None,
) -> Any:
    """A MindSpore DTensor whose global value is ``x`` laid out by ``placements``.

    Partial(sum) mesh dims hold a random zero-sum decomposition (not zeros off coordinate
    0), so a rule that mishandles Partial values shows. ``cache``: a dict the caller keeps
    across calls on the same unchanged ``x`` (the placement combinations of one sample):
    each (placements, seed) local is cut once, every DTensor gets its own copy.
    """
    from mindspore import Tensor

    if cache is not None:
        key = (id(x), tuple(placements), seed)
        hit = cache.get(key)
        if hit is None or hit[0] is not x:
            local = dt_from_numpy(x, mesh, placements, seed).to_local().asnumpy()
            hit = cache[key] = (x, local)
        return DTensor.from_local(Tensor(hit[1].copy()), mesh, list(placements), shape=x.shape)

    plain = [Replicate() if isinstance(p, Partial) else p for p in placements]
    dt = distribute_tensor(Tensor(x), mesh, plain, src_data_rank=None)
    local = dt.to_local().asnumpy().copy()
    coord = mesh.get_coordinate()
    for m, p in enumerate(placements):
        if not isinstance(p, Partial):
            continue
        if p.reduce_op != "sum":
            raise ValueError(f"no test decomposition for {p}")
        n = mesh.shape[m]
        rs = np.random.RandomState(seed * 131 + m)
        noise = rs.randn(n, *local.shape).astype(local.dtype)
        noise = noise - noise.mean(0, keepdims=True)
        local = (local if coord[m] == 0 else np.zeros_like(local)) + noise[coord[m]]
    return DTensor.from_local(Tensor(local), mesh, list(placements), shape=x.shape)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-6))


def fresh_record() -> int:
    """Empty the flight recorder and return the index to read its new records from (it is
    a bounded ring: once full its length stops growing, so counting from ``len(...)``
    would read nothing and the checks on it would pass vacuously)."""
    from hyper_shard.debug import clear_recent_ops

    clear_recent_ops()
    return 0


def max_param_err(net: Any, ref: Any) -> float:
    """The largest absolute difference between ``net``'s parameters (DTensors: their
    ``full_tensor()``) and the same-order parameters of the one-process ``ref`` Cell."""
    return max(
        float(np.abs(p.full_tensor().asnumpy() - r.asnumpy()).max())
        for p, r in zip(net.trainable_params(), ref.trainable_params())
    )


def chunked_two_layer(seed: int, bias: bool = True) -> Any:
    """A ``mint.nn.Linear`` 8 -> 6, relu, and a head 6 -> 5 applied to two chunks of the
    rows (a chunked loss), with weights drawn from ``seed``."""
    from mindspore import Parameter, Tensor, mint, nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.up = mint.nn.Linear(8, 6, bias=bias)
            self.head = mint.nn.Linear(6, 5, bias=bias)

        def construct(self, x):
            h = mint.nn.functional.relu(self.up(x))
            a, b = mint.chunk(h, 2, 0)
            return mint.cat([self.head(a), self.head(b)], 0)

    net = Net()
    rs = np.random.RandomState(seed)
    for cell in (net.up, net.head):
        o, i = cell.weight.shape
        cell.weight = Parameter(
            Tensor(rs.randn(o, i).astype(np.float32) / np.sqrt(i)), name=cell.weight.name
        )
        if bias:
            cell.bias = Parameter(Tensor(rs.randn(o).astype(np.float32) * 0.3), name=cell.bias.name)
    return net


def chunked_two_layer_one_process(
    x: np.ndarray, t: np.ndarray, steps: int
) -> tuple[Any, list[float], list[np.ndarray]]:
    """:func:`chunked_two_layer` (seed 0) trained ``steps`` SGD steps (lr 0.1) on the
    squared error to ``t`` in this one process: the Cell, the losses, the last gradients."""
    import mindspore as ms
    from mindspore import Tensor, nn

    ref = chunked_two_layer(0)
    opt = nn.SGD(ref.trainable_params(), learning_rate=0.1)
    vg = ms.value_and_grad(lambda a, b: ((ref(a) - b) ** 2).mean(), None, opt.parameters)
    losses, grads = [], None
    for _ in range(steps):
        loss, grads = vg(Tensor(x), Tensor(t))
        losses.append(float(loss.asnumpy()))
        opt(grads)
    return ref, losses, [g.asnumpy() for g in grads]
