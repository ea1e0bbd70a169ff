"""Tensor parallelism holds no more activation memory than PyTorch's, on 2 gloo ranks.

The same residual MLP stack (ColwiseParallel / RowwiseParallel blocks, then a
column-parallel head whose ``Shard(-1)`` logits go to ``loss_parallel`` cross-entropy) is
parallelized by ``hyper_shard.parallel`` and by ``torch.distributed.tensor.parallel`` in
the same process, and the CPU allocator's allocation events (``torch.profiler``,
``profile_memory=True``) give the bytes allocated by a region and still alive at its end:

* at the forward/backward boundary (forward + loss): the activations kept for backward
  plus anything else still holding a tensor (a backward closure, a cache);
* after the whole step (forward, loss, backward, gradients dropped): what outlives it.

Regressions guarded (bench_fsdp_step's TP peak was 1.11x-1.19x of PyTorch's): a backward
closure of ``to_local``/``full_tensor`` holding every ``Partial(sum)`` row-parallel output
(one activation per block), ``loss_parallel`` saving the shifted logits through ``gather``
(one logits-sized tensor), and the ``from_local`` reuse cache holding the head's input
after the step (that cache is also checked directly: empty once the step is over).

Allocation sizes are deterministic; the tolerance at the boundary (half an activation)
absorbs small index tensors only. After the step it is six activations: on this loaded
machine one to three all-reduce outputs of the forward (hyper_shard's all-reduce copies,
PyTorch's too, less often) sometimes outlive the step on one rank, in every measured step
of that run (three in a full-suite run, where the pool ran other tests first), not explained
by the time this test was written (the suspect: a gloo worker thread releasing finished
work late); the leak this guards, the ``from_local`` reuse cache, held eight. Each region ends after a short sleep and each figure is the
least of three steps.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.multiproc

B, S, D, H, V, BLOCKS = 4, 16, 64, 128, 96, 3
ACT = B * S * D * 4  # one fp32 activation of the residual stream, bytes
ROUNDS, SETTLE = 3, 0.02  # measured steps per library; seconds before a region closes


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _plan(styles: Any, shard: Any) -> dict:
    col, row = styles.ColwiseParallel, styles.RowwiseParallel
    plan = {f"blocks.{i}.up": col() for i in range(BLOCKS)}
    plan.update({f"blocks.{i}.down": row() for i in range(BLOCKS)})
    plan["head"] = col(output_layouts=shard, use_local_output=False)
    return plan


def _replay(prof: torch.profiler.profile, live: dict[int, int]) -> dict[int, int]:
    """``live`` (address -> bytes) updated with the region's allocation events in time
    order; a free of memory allocated before (not in ``live``) is ignored."""
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation:
            events.append((e.start_time_ns, e.typed[1].ptr, e.typed[1].alloc_size))
    for _, ptr, size in sorted(events):
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    return live


def _measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_ctx: Any) -> tuple:
    """(bytes allocated by forward + loss and alive at their end, bytes allocated by the
    step and alive after it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as fwd:
        logits = model(x)
        with loss_ctx():
            loss = F.cross_entropy(logits.flatten(0, 1), y)
        time.sleep(SETTLE)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as rest:
        with loss_ctx():
            loss.backward()
        del loss, logits
        for p in model.parameters():
            p.grad = None
        time.sleep(SETTLE)
    live = _replay(fwd, {})
    boundary = sum(live.values())
    return boundary, sum(_replay(rest, live).values())


def check_tp_memory(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import parallel as tp

    from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    torch.manual_seed(0)
    ref = Net()
    ours, theirs = Net(), Net()
    ours.load_state_dict(ref.state_dict())
    theirs.load_state_dict(ref.state_dict())
    mesh = init_device_mesh("cpu", (world,))
    hp.parallelize_module(ours, mesh, _plan(hp, Shard(-1)))
    tp.parallelize_module(theirs, torch_mesh("cpu", (world,)), _plan(tp, TShard(-1)))
    x = torch.randn(B, S, D)
    y = torch.randint(0, V, (B * S,))
    hy = DTensor.from_local(y, mesh, [Replicate()])
    from hyper_shard.parallel import _convert

    rounds: dict[str, list[tuple[int, int]]] = {"hyper_shard": [], "torch": []}
    for _ in range(1 + ROUNDS):  # the first round fills the caches (not counted)
        rounds["hyper_shard"].append(_measure(ours, x, hy, hp.loss_parallel))
        rounds["torch"].append(_measure(theirs, x, y, tp.loss_parallel))
        # the from_local reuse cache lets go of the head's input once its backward ran
        assert _convert._LAST.get(mesh._rank) is None, _convert._LAST.get(mesh._rank)
    # the least of each figure over the counted rounds (see the module docstring)
    return {k: tuple(min(r[i] for r in v[1:]) for i in range(2)) for k, v in rounds.items()}


def test_tp_activation_memory_not_above_pytorch(dist2):
    """At the forward/backward boundary hyper_shard TP holds at most PyTorch TP's bytes
    (+ half an activation); after the step, + six (see the module docstring)."""
    for rank, res in enumerate(dist2.run(check_tp_memory)):
        (hs_fwd, hs_end), (th_fwd, th_end) = res["hyper_shard"], res["torch"]
        assert hs_fwd <= th_fwd + ACT // 2, (
            f"rank {rank}: {hs_fwd} bytes alive after forward + loss vs PyTorch TP's "
            f"{th_fwd} (one activation is {ACT})"
        )
        assert hs_end <= th_end + 6 * ACT, (
            f"rank {rank}: {hs_end} bytes outlive the step vs PyTorch TP's {th_end}"
        )
