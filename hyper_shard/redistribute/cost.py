"""The alpha-beta cost model shared by the redistribution planner and the strategy search.

A collective over ``n`` ranks of one mesh dim costs ``hops * alpha + bytes * beta``
(ring algorithms):

=================  ==============================  ================================
step               hops                            bytes on the wire (per rank)
=================  ==============================  ================================
all-gather         n - 1                           (n - 1) / n * output bytes
reduce-scatter     n - 1                           (n - 1) / n * input bytes
all-reduce         2 (n - 1)                       2 (n - 1) / n * bytes
all-to-all         n - 1                           (n - 1) / n * input bytes
local chunk/pad    0                               gamma * output bytes (a copy)
=================  ==============================  ================================

A collective the platform does not have natively is priced as the composition that
replaces it: reduce-scatter = all-reduce + chunk; all-to-all = all-gather of the whole
local shard + a local pick. Every step also costs ``step_penalty`` so that, among equal
plans, the one with fewer steps wins.

Units: seconds and bytes. This module imports no framework.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CostModel", "COLLECTIVES", "LOCAL_STEPS", "DEFAULT_COST_MODEL"]

COLLECTIVES = frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all"})
LOCAL_STEPS = frozenset({"chunk", "partition", "pad"})


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta costs per mesh dim.

    Attributes:
        alpha: latency per hop in seconds; one value, or one per mesh dim.
        beta: seconds per byte on the wire; one value, or one per mesh dim.
        gamma: seconds per byte of a local copy.
        step_penalty: seconds added to every step (prefers shorter plans).
        native: the collectives the platform runs natively; others are composed.
    """

    alpha: float | tuple[float, ...] = 1e-5
    beta: float | tuple[float, ...] = 1e-9
    gamma: float = 1e-11
    step_penalty: float = 1e-9
    native: frozenset[str] = field(default=COLLECTIVES)

    def _a(self, m: int) -> float:
        a = self.alpha
        return a if isinstance(a, float | int) else a[m]

    def _b(self, m: int) -> float:
        b = self.beta
        return b if isinstance(b, float | int) else b[m]

    def step_cost(self, kind: str, mesh_dim: int, n: int, bytes_in: int, bytes_out: int) -> float:
        """Cost in seconds of one step on ``mesh_dim`` (``n`` ranks).

        ``bytes_in``/``bytes_out``: the largest local shard before/after the step.
        """
        a, b = self._a(mesh_dim), self._b(mesh_dim)
        pen = self.step_penalty
        if kind == "chunk" or kind == "pad":
            return pen + self.gamma * bytes_out
        if kind == "partition":
            return pen + self.gamma * bytes_in
        if n <= 1:
            return pen
        f = (n - 1) / n
        if kind == "all_gather":
            return pen + (n - 1) * a + f * bytes_out * b
        if kind == "all_reduce":
            return pen + 2 * (n - 1) * a + 2 * f * bytes_in * b
        if kind == "reduce_scatter":
            if "reduce_scatter" in self.native:
                return pen + (n - 1) * a + f * bytes_in * b
            return pen + 2 * (n - 1) * a + 2 * f * bytes_in * b + self.gamma * bytes_out
        if kind == "all_to_all":
            if "all_to_all" in self.native:
                return pen + (n - 1) * a + f * bytes_in * b
            return pen + (n - 1) * a + (n - 1) * bytes_in * b + self.gamma * bytes_out
        raise ValueError(f"unknown redistribution step kind {kind!r}")

    def with_native(self, native: Iterable[str]) -> CostModel:
        """The same model with another set of native collectives."""
        return CostModel(self.alpha, self.beta, self.gamma, self.step_penalty, frozenset(native))


DEFAULT_COST_MODEL = CostModel()
