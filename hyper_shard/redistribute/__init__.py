"""Redistribution: a pure planner (shortest path over placement states, alpha-beta cost)
and an executor that runs a plan through the platform's collectives, autograd-correct."""

from .cost import DEFAULT_COST_MODEL, CostModel
from .planner import Plan, Step, clear_plan_cache, plan_cache_info, plan_redistribute

__all__ = [
    "CostModel",
    "DEFAULT_COST_MODEL",
    "Plan",
    "Step",
    "plan_redistribute",
    "clear_plan_cache",
    "plan_cache_info",
]
