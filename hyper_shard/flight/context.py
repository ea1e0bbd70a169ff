"""What this rank is communicating for: a per-thread stack of context frames.

The slow paths that run collectives push a frame while they run — the dispatcher for a
decision that redistributes its inputs (:class:`OpFrame`), ``DTensor.redistribute`` and
``full_tensor`` (:class:`RedistributeFrame`), every collective redistribution step
(:class:`StepFrame`), and the backward of a redistribution (:class:`BackwardFrame`) — so a
collective that fails, or a fingerprint in the consistency mode, can say which op and which
step it ran for. A frame keeps references to immutable values (specs, placements) and
formats them only when asked (an error, :func:`hyper_shard.debug.recent_ops`).

Nothing here runs on the dispatcher's cache-hit path of a decision that moves nothing.
The stack is per thread (autograd may run a backward on another thread). Framework-neutral.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..placement import Placement
from ..spec import DTensorSpec

__all__ = [
    "Frame",
    "OpFrame",
    "RedistributeFrame",
    "StepFrame",
    "BackwardFrame",
    "UnitFrame",
    "stack",
    "fmt_spec",
    "forward_context",
    "dtype_name",
]

_TLS = threading.local()


def stack() -> list[Frame]:
    """This thread's frames, outermost first (the list itself: callers append and pop)."""
    try:
        return _TLS.frames  # type: ignore[no-any-return]
    except AttributeError:
        s: list[Frame] = []
        _TLS.frames = s
        return s


def fmt_spec(spec: DTensorSpec, placements: Sequence[Placement] | None = None) -> str:
    """``DTensor[8, 4][S(0)]``: the global shape and the placements (``placements`` when
    given: a state in the middle of a redistribution)."""
    pl = spec.placements if placements is None else placements
    return f"DTensor{list(spec.shape)}[{', '.join(str(p) for p in pl)}]"


def dtype_name(d: Any) -> str:
    """``float32`` for ``torch.float32`` (MindSpore's dtypes print as ``Float32``)."""
    s = str(d)
    return s[6:] if s.startswith("torch.") else s


def _dim_name(spec: DTensorSpec, m: int) -> str:
    names = spec.mesh.mesh_dim_names
    return repr(names[m]) if names else str(m)


class Frame:
    """One level of what the rank is doing; :meth:`describe` is the same text on every
    rank of a group that runs the same program (it is the consistency fingerprint)."""

    __slots__ = ()
    #: the label of the frame's line in a :class:`~hyper_shard.errors.CollectiveError`
    label = "in"
    #: what a DivergenceError adds when this kind of frame is open (the usual fix)
    hint = ""

    def describe(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class OpFrame(Frame):
    """A dispatched op whose decision redistributes its inputs (``name_of(func)`` is
    resolved only when described)."""

    __slots__ = ("name_of", "func", "specs")
    label = "op"

    def __init__(
        self, name_of: Callable[[Any], str], func: Any, specs: Sequence[DTensorSpec]
    ) -> None:
        self.name_of = name_of
        self.func = func
        self.specs = tuple(specs)

    @property
    def name(self) -> str:
        """The op's platform name (``torch.mm``, ``Tensor.softmax``, ``MatMulExt``...)."""
        return self.name_of(self.func)

    def describe(self) -> str:
        return f"{self.name}({', '.join(fmt_spec(s) for s in self.specs)})"


class RedistributeFrame(Frame):
    """``DTensor.redistribute`` / ``full_tensor`` / a decision's input move: ``spec`` to
    ``dst`` placements."""

    __slots__ = ("what", "spec", "dst")
    label = "for"

    def __init__(self, what: str, spec: DTensorSpec, dst: Sequence[Placement]) -> None:
        self.what = what
        self.spec = spec
        self.dst = tuple(dst)

    def describe(self) -> str:
        return f"{self.what} {fmt_spec(self.spec)} -> [{', '.join(str(p) for p in self.dst)}]"


class StepFrame(Frame):
    """One collective redistribution step: ``kind`` on mesh dim ``m`` from ``state``."""

    __slots__ = ("kind", "m", "spec", "state", "dst")
    label = "step"

    def __init__(
        self, kind: str, m: int, spec: DTensorSpec, state: Sequence[Placement], dst: Placement
    ) -> None:
        self.kind = kind
        self.m = m
        self.spec = spec
        self.state = tuple(state)
        self.dst = dst

    def describe(self) -> str:
        after = list(self.state)
        after[self.m] = self.dst
        return (
            f"{self.kind} on mesh dim {_dim_name(self.spec, self.m)} (size "
            f"{self.spec.mesh.shape[self.m]}) of {fmt_spec(self.spec, self.state)} -> "
            f"[{', '.join(str(p) for p in after)}]"
        )


class BackwardFrame(Frame):
    """The backward of a redistribution: the frames that were open when its forward ran."""

    __slots__ = ("frames",)
    label = "backward of"

    def __init__(self, frames: Sequence[Frame]) -> None:
        self.frames = tuple(frames)

    def describe(self) -> str:
        inner = " / ".join(f.describe() for f in self.frames if not isinstance(f, StepFrame))
        return inner or "a redistribution"


class UnitFrame(Frame):
    """An FSDP unit's collective: ``what`` (all-gather / reduce-scatter / all-reduce) of
    the parameters ``fqns`` of the unit at ``unit`` (its module path; ``""``: the root)."""

    __slots__ = ("unit", "what", "fqns")
    label = "fsdp"
    hint = (
        "For fully_shard units: every rank must run forward through the same units and get "
        "gradients for the same parameters of each; with rank-dependent control flow "
        "(mixture of experts, modality branches) call "
        "model.set_reduce_scatter_unused_params(True) on the root, and run every unit on "
        "every rank."
    )

    def __init__(self, unit: str, what: str, fqns: Sequence[str]) -> None:
        self.unit = unit
        self.what = what
        self.fqns = tuple(fqns)

    def describe(self) -> str:
        names = ", ".join(self.fqns[:8]) + (", ..." if len(self.fqns) > 8 else "")
        return (
            f"{self.what} of fully_shard unit {self.unit or 'root'!r} "
            f"({len(self.fqns)} parameters: {names})"
        )


def forward_context() -> tuple[Frame, ...]:
    """The frames to name in a backward: this thread's current ones, steps left out."""
    return tuple(f for f in stack() if not isinstance(f, StepFrame))
