"""The alpha-beta cost model shared by the redistribution planner and the strategy search.

A :class:`CostModel` holds the constants (latency per hop, seconds per byte on the wire,
seconds per byte copied, a per-step penalty) and which collectives the platform runs
natively; each step kind prices itself from them, a collective the platform lacks as the
composition that replaces it (the table of prices and routes is
:mod:`hyper_shard.redistribute.steps`).

Units: seconds and bytes. This module imports no framework.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .steps import COLLECTIVES, LOCAL_STEPS, STEPS

__all__ = ["CostModel", "COLLECTIVES", "LOCAL_STEPS", "DEFAULT_COST_MODEL"]


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

    def alpha_at(self, m: int) -> float:
        """Latency per hop (seconds) on mesh dim ``m``."""
        a = self.alpha
        return a if isinstance(a, float | int) else a[m]

    def beta_at(self, m: int) -> float:
        """Seconds per byte on the wire on mesh dim ``m``."""
        b = self.beta
        return b if isinstance(b, float | int) else b[m]

    def step_cost(self, kind: str, mesh_dim: int, n: int, bytes_in: int, bytes_out: int) -> float:
        """Cost in seconds of one step of ``kind`` on ``mesh_dim`` (``n`` ranks).

        ``bytes_in``/``bytes_out``: the largest local shard before/after the step.

        Raises:
            ValueError: an unknown step kind.
        """
        k = STEPS.get(kind)
        if k is None:
            raise ValueError(f"unknown redistribution step kind {kind!r}; known: {sorted(STEPS)}")
        return k.cost(self, mesh_dim, n, bytes_in, bytes_out)

    def with_native(self, native: Iterable[str]) -> CostModel:
        """The same model with another set of native collectives."""
        return CostModel(self.alpha, self.beta, self.gamma, self.step_penalty, frozenset(native))


DEFAULT_COST_MODEL = CostModel()
