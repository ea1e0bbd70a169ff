"""The communication context shared by the units of one root (framework-neutral).

[Note: FSDP communication]
Every unit collective is issued through one :class:`CommContext`:

* **asynchronous where the platform can** (``Platform.async_collectives``: the backend
  returns a work handle, e.g. torch.distributed with ``async_op=True``; gloo runs it on
  its own thread, NCCL/HCCL on their communication stream): the all-gather of the next
  unit is issued before the current unit computes (forward: the order of the previous
  iteration; backward: the reverse of this iteration's forward) and waited for at that
  unit's pre-forward / pre-backward hook; a unit's reduce-scatter is issued at its
  post-backward and completed when the next unit reduces (or at the end of backward),
  so it overlaps the next unit's backward. On a host device (``"cpu"``) the backward
  prefetch is issued synchronously: the host backend (gloo) runs a collective on a helper
  thread with a scratch buffer of the output's size for as long as it is in flight, so an
  all-gather still waiting for a slower rank would hold one unit's bytes more through the
  unit's backward, its activation peak (FSDP2 runs every collective synchronously on
  CPU); forward prefetches and reduce-scatters stay asynchronous there. A platform
  without async collectives runs each collective to completion where it is issued (same
  values, no overlap).
* **in a profiler range** named as FSDP2 names them (``FSDP::all_gather``,
  ``FSDP::all_gather_copy_out``, ``FSDP::reduce_scatter``, ``FSDP::all_reduce``,
  ``FSDP::pre_forward``, ``FSDP::post_backward``...), through the adapter's
  :meth:`~._adapter.FSDPAdapter.record` (``torch.profiler.record_function`` on torch), so
  a profile names every collective and hook.
* **counted** (:attr:`CommContext.counts`, per kind; each unit keeps its own counts too).

The context also holds what the root coordinates: the order units ran in (prefetch), the
reductions in flight (at most :attr:`CommContext.max_pending_reduces`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._group import FSDPParamGroup

__all__ = ["CommContext"]


class CommContext:
    """State shared by the units of one root (see the module note).

    Args:
        adapter: the framework adapter (profiler ranges).
        plat: the Platform (``async_collectives``).
    """

    def __init__(self, adapter: Any = None, plat: Any = None, device_type: str = "") -> None:
        self.adapter = adapter
        #: collectives return work handles (``Platform.async_collectives``)
        self.async_op = bool(getattr(plat, "async_collectives", False))
        #: backward prefetches overlap the unit's backward: not on a host device, whose
        #: backend runs a collective on a helper thread with an output-sized scratch buffer
        #: for as long as it is in flight (gloo), which would stack on the backward's
        #: activation peak (see the module note)
        self.async_backward_prefetch = self.async_op and device_type.lower() != "cpu"
        self.post_forward_order: list[FSDPParamGroup] = []
        self.pre_forward_order: list[FSDPParamGroup] = []
        self.last_forward_order: list[FSDPParamGroup] = []
        self.pending_reduces: list[FSDPParamGroup] = []
        #: reductions allowed in flight before the oldest is completed
        self.max_pending_reduces = 1
        self.counts: dict[str, int] = {}

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def record(self, name: str) -> AbstractContextManager[Any]:
        """A profiler range (see the module note)."""
        from contextlib import nullcontext

        return nullcontext() if self.adapter is None else self.adapter.record(name)

    def adopt(self, other: CommContext) -> None:
        """Take over ``other``'s settings when a root gathers the units under it."""
        self.max_pending_reduces = max(self.max_pending_reduces, other.max_pending_reduces)
