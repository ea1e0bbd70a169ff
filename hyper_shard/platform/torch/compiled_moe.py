"""Expert parallelism in a compiled region: an :class:`~hyper_shard.parallel.
ExpertParallel` layer called while dynamo traces is one nonstrict call (``"ep_moe"`` in
``compiled.py``), whose body runs here while AOTAutograd traces the region.

The eager layer sizes its token exchange from counts exchanged first (python ints read
from a tensor: data a trace does not have). Traced, the layer is the static-shape form of
:mod:`hyper_shard.kernels.moe_padded` (each rank's pieces padded to all its pairs, one
even all-to-all each way, a functional ``all_to_all_single``), so the region holds the
whole layer: no graph break. A router id out of range cannot raise in Python from a
graph: the count of bad ids is all-reduced over the expert-parallel group and asserted in
the graph (``aten._assert_async``), so every rank raises together, at run time.
"""

from __future__ import annotations

from typing import Any

import torch

from ...kernels.moe_padded import bad_index_count
from ...parallel.expert import traced_forward, traced_layer


def ep_moe(key: str, x: Any, index: Any, weights: Any, params: tuple) -> Any:
    """Expert-parallel layer ``key`` on this rank's tokens ``x [T, H]`` and the router's
    ``index``/``weights [T, K]`` (local fake tensors while traced); ``params`` its weights
    (traced DTensors)."""
    _, mesh, layout, ep, _ = traced_layer(key)
    plat = mesh.platform
    bad = bad_index_count(plat, index, layout.num_experts)
    if mesh.shape[ep] > 1:
        bad = plat.all_reduce(bad, "sum", mesh._group(ep))
    torch._assert_async(
        bad == 0,
        f"expert parallelism: the router produced expert indices outside [0, "
        f"{layout.num_experts}) on some rank of the expert-parallel group; every index of "
        f"top_k_index must name one of the layer's {layout.num_experts} experts",
    )
    return traced_forward(key, x, index, weights, params)
