"""The redistribution executor: runs a :class:`Plan` on a local tensor, and its backward.

Each step runs through its :class:`~hyper_shard.redistribute.steps.StepKind` in the one
step table (:data:`~hyper_shard.redistribute.steps.STEPS`), which holds every kind's
forward and its transpose (see that module for the gradient contract). Framework-neutral:
every tensor operation goes through the mesh's platform.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..flight.context import BackwardFrame, forward_context, stack
from ..spec import DTensorSpec, split_orders
from .planner import Plan
from .steps import COUNTERS, STEPS, OrderedState, run_step

__all__ = ["execute_plan", "backward_plan", "redistribute_with_plan", "run_step", "COUNTERS"]


def execute_plan(
    plat: Any, local: Any, spec: DTensorSpec, plan: Plan, saved: list[Any] | None = None
) -> Any:
    """Run ``plan`` on ``local`` (the shard of ``spec`` on this rank), forward only.

    If ``saved`` is a list, the (input, output) of every step whose backward needs them (a
    max/min all-reduce) is appended to it for :func:`backward_plan`.
    """
    if plan.ordered:
        return _execute_ordered(plat, local, spec, plan, saved)
    state = list(spec.placements)
    for step in plan.steps:
        out = run_step(plat, local, spec, state, step.mesh_dim, step.kind, step.src, step.dst)
        if saved is not None and STEPS[step.kind].saves(step.src):
            saved.append((local, out))
        local = out
        state[step.mesh_dim] = step.dst
    return local


def _ordered_start(spec: DTensorSpec) -> OrderedState:
    return OrderedState(spec.placements, split_orders(spec.placements, spec.ndim, spec.shard_order))


def _execute_ordered(
    plat: Any, local: Any, spec: DTensorSpec, plan: Plan, saved: list[Any] | None
) -> Any:
    state = _ordered_start(spec)
    for step in plan.steps:
        out = run_step(plat, local, spec, state, step.mesh_dim, step.kind, step.src, step.dst)
        if saved is not None and STEPS[step.kind].saves(step.src):
            saved.append((local, out))
        local = out
        state = state.moved(step.mesh_dim, step.src, step.dst)
    return local


def backward_plan(
    plat: Any, grad: Any, spec: DTensorSpec, plan: Plan, saved: Sequence[Any] = ()
) -> Any:
    """The backward of :func:`execute_plan`: ``grad`` is the local derivative w.r.t. the
    output; returns the local derivative w.r.t. the input."""
    states: list[Any]
    if plan.ordered:
        states = [_ordered_start(spec)]
        for st in plan.steps:
            states.append(states[-1].moved(st.mesh_dim, st.src, st.dst))
    else:
        states = [list(spec.placements)]
        for st in plan.steps:
            s = list(states[-1])
            s[st.mesh_dim] = st.dst
            states.append(s)
    saved_left = list(saved)
    for i in range(len(plan.steps) - 1, -1, -1):
        st = plan.steps[i]
        grad = STEPS[st.kind].backward(
            plat, grad, spec, states[i], states[i + 1], st.mesh_dim, st.src, st.dst, saved_left
        )
    return grad


def redistribute_with_plan(
    plat: Any, local: Any, spec: DTensorSpec, plan: Plan, backward_dtype: Any = None
) -> Any:
    """Run a precomputed plan on a local tensor, differentiably: the platform's custom
    autograd function runs :func:`execute_plan` forward and :func:`backward_plan` on the
    gradient. ``backward_dtype``: run the backward collectives on the gradient cast to this
    dtype (cast back afterwards), as PyTorch DTensor's ``redistribute(backward_dtype=)``."""
    if not plat.requires_grad(local):
        return execute_plan(plat, local, spec, plan)
    saved: list[Any] = []
    where = BackwardFrame(forward_context())  # what the backward's collectives ran for

    def back(g: Any) -> Any:
        frames = stack()
        frames.append(where)
        try:
            return backward_plan(plat, g, spec, plan, saved)
        finally:
            frames.pop()

    if backward_dtype is None:
        bwd = back
    else:

        def bwd(g: Any) -> Any:
            return plat.cast(back(plat.cast(g, backward_dtype)), g.dtype)

    return plat.custom_autograd(lambda x: execute_plan(plat, x, spec, plan, saved), bwd, local)
