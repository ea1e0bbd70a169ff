"""``parallelize_module`` (as ``torch.distributed.tensor.parallel.parallelize_module``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ..mesh import DeviceMesh, as_mesh
from ._adapter import adapter_for
from .plan import describe_root, match_plan
from .style import ParallelStyle

__all__ = ["parallelize_module"]


def parallelize_module(
    module: Any,
    device_mesh: DeviceMesh | None = None,
    parallelize_plan: ParallelStyle | Mapping[str, ParallelStyle] | None = None,
    *,
    src_data_rank: int | None = 0,
) -> Any:
    """Apply tensor parallelism to ``module`` in place, by a plan (as PyTorch's
    ``parallelize_module``).

    Args:
        module: the root module (``torch.nn.Module``).
        device_mesh: a 1-D DeviceMesh (slice an N-D one first: ``mesh["tp"]``); a
            ``torch.distributed.device_mesh.DeviceMesh`` is taken too; default: the mesh of
            the innermost ``with mesh:``.
        parallelize_plan: one :class:`ParallelStyle` applied to ``module`` itself, or a
            dict ``{module path: style}``. Paths are dotted submodule names whose tokens may
            be fnmatch wildcards (``"model.layers.*.self_attn.q_proj"``; ``*`` never crosses
            a ``.``; ``""`` is ``module`` itself). Entries apply in the dict's order.
        src_data_rank: the rank whose parameter values every rank takes (the styles
            broadcast or scatter from it, so all ranks start from one model); None keeps
            each rank's own values.

    Returns:
        ``module``, whose selected parameters are now DTensor parameters (an optimizer built
        afterwards steps them directly) and whose selected submodules convert their inputs
        and outputs in forward hooks.

    Warns:
        PlanKeyWarning: a plan key that matches no submodule is skipped, as torch does (the
            message says it "could not be resolved", names the token that matched nothing
            and the closest module names).

    Raises:
        TypeError: a plan that is neither a style nor a dict of styles, or a plan value that
            is not a :class:`ParallelStyle`.
        ValueError: no mesh, or a mesh that is not 1-D.
        NotImplementedError: a style applied to a module kind it does not support
            (e.g. ``ColwiseParallel`` on a ``Conv2d``).
    """
    device_mesh = as_mesh(device_mesh, "parallelize_module")
    if parallelize_plan is None:
        warnings.warn(
            "No parallelize_plan is provided and auto-parallel is not supported at the moment, "
            "so this parallelize_module call will do nothing.",
            stacklevel=2,
        )
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, Mapping):
        raise TypeError(
            f"parallelize_module: expected a ParallelStyle or a dict of module path -> "
            f"ParallelStyle for parallelize_plan, got {type(parallelize_plan).__name__}"
        )
    for key, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(
                f"parallelize_module: plan entry {key!r} is a {type(style).__name__}, not a "
                f"hyper_shard.parallel ParallelStyle (ColwiseParallel(), RowwiseParallel(), ...)"
            )
    ad = adapter_for(module)
    named = ad.named_modules(module)
    by_name = dict(named)
    matches = match_plan(
        parallelize_plan, [n for n, _ in named], describe_root(module), strict=False
    )
    ties = _tied_params(ad, named)
    for _key, name, style in matches:
        style.src_data_rank = src_data_rank
        style._apply(by_name[name], device_mesh)
    _retie(ad, ties)
    return module


def _tied_params(ad: Any, named: list[tuple[str, Any]]) -> list[list[tuple[str, Any, str]]]:
    """Groups of (module name, module, attribute) sharing one parameter object."""
    sites: dict[int, list[tuple[str, Any, str]]] = {}
    for mname, m in named:
        for pname, p in ad.direct_params(m):
            if p is not None:
                sites.setdefault(id(p), []).append((mname, m, pname))
    return [v for v in sites.values() if len(v) > 1]


def _retie(ad: Any, ties: list[list[tuple[str, Any, str]]]) -> None:
    """Keep tied weights tied (e.g. an embedding shared with the LM head), where PyTorch's
    ``parallelize_module`` silently unties them: each style replaces its own module's
    parameter, so afterwards every site of a tie group is made the same DTensor parameter
    again. The sites must have been given the same placements (embedding
    ``RowwiseParallel`` and LM head ``ColwiseParallel`` both shard the vocab dim: Shard(0));
    otherwise the tie cannot hold and a ValueError names the sites and their layouts."""
    from ..dtensor import DTensor

    for sites in ties:
        params = [getattr(m, pn) for _, m, pn in sites]
        first = params[0]
        if all(p is first for p in params):
            continue
        if all(isinstance(p, DTensor) for p in params) and all(
            p._spec.placements == first._spec.placements and p._spec.shape == first._spec.shape
            for p in params
        ):
            for _, m, pn in sites[1:]:
                ad.tie_param(m, pn, first)
            continue

        def layout(p: Any) -> str:
            if isinstance(p, DTensor):
                return "[" + ", ".join(repr(x) for x in p._spec.placements) + "]"
            return "a plain parameter (not in the plan)"

        where = "; ".join(
            f"{(mn + '.') if mn else ''}{pn}: {layout(p)}" for (mn, _, pn), p in zip(sites, params)
        )
        raise ValueError(
            f"parallelize_module: tied parameter used by {len(sites)} modules would be untied "
            f"({where}); give every module sharing it a style with the same placements (an "
            f"embedding with RowwiseParallel and an LM head with ColwiseParallel both shard the "
            f"vocab dim), or untie the weights before parallelizing"
        )
