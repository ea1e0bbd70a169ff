"""FSDP unit lifetime under partial backward calls (issue 28), on 2 gloo ranks against the
same model trained in one process on the whole batch: the loss of every step, every
gradient's ``full_tensor()`` and every parameter after each AdamW step.

* the chunked loss: ``fully_shard([norm, head])``; the model's forward runs the norm
  once, the head is called per chunk and each chunk's loss is backpropagated at once,
  then the norm's (and the body's) backward runs from the saved gradient — with and
  without ``reshard_after_forward``;
* a module of a unit used outside the unit's forward: the head of ``[norm, head]``
  called after the model's forward, one backward;
* two backward passes through one unit per step: two forwards then two backwards, and
  one forward whose two losses are backpropagated one after the other;
* a module shared by two ``fully_shard`` calls: the error names the shared module and
  how to group it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.dist._fsdp_models import VOCAB, Block, D, assert_same_training, batches, full

pytestmark = pytest.mark.multiproc


class ChunkNet(nn.Module):
    """A small language model whose forward stops at the final norm: the head is applied
    by the loss (per chunk, as chunked cross-entropy does)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.norm(x)


def _make(seed: int = 0) -> ChunkNet:
    torch.manual_seed(seed)
    net = ChunkNet()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.5, 0.5)
    return net


def _shard(net: ChunkNet, mesh, **kw) -> ChunkNet:  # noqa: ANN001
    from hyper_shard.fsdp import fully_shard

    for b in net.blocks:
        fully_shard(b, mesh=mesh, **kw)
    fully_shard([net.norm, net.head], mesh=mesh, **kw)
    fully_shard(net, mesh=mesh)
    return net


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")


def _step_chunked(net: ChunkNet, ids: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """Chunked loss (the mean over every token): per chunk of the sequence, the head and
    that chunk's loss backpropagated at once; then the body's backward from the hidden
    states' accumulated gradient."""
    h = net(ids)
    hd = h.detach().requires_grad_()
    total = 0.0
    for hc, yc in zip(hd.chunk(3, dim=1), y.chunk(3, dim=1)):
        loss = _ce(net.head(hc), yc) / n
        loss.backward()
        total += float(loss)
    h.backward(hd.grad)
    return total


def _step_outside(net: ChunkNet, ids: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """The head called after the model's forward (outside it), one backward."""
    loss = _ce(net.head(net(ids)), y) / n
    loss.backward()
    return float(loss)


def _step_two_forwards(net: ChunkNet, ids: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """Two forwards (the two halves of the batch), then two backward passes."""
    (a, b), (ya, yb) = ids.chunk(2), y.chunk(2)
    la = _ce(net.head(net(a)), ya) / n
    lb = _ce(net.head(net(b)), yb) / n
    la.backward()
    lb.backward()
    return float(la) + float(lb)


def _step_two_losses(net: ChunkNet, ids: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """One forward, two losses (the first and the last positions) backpropagated one
    after the other through the same graph."""
    logits = net.head(net(ids))
    k = ids.shape[1] // 2
    la = _ce(logits[:, :k], y[:, :k]) / n
    lb = _ce(logits[:, k:], y[:, k:]) / n
    la.backward(retain_graph=True)
    lb.backward()
    return float(la) + float(lb)


STEPS = {
    "chunked": _step_chunked,
    "outside": _step_outside,
    "two_forwards": _step_two_forwards,
    "two_losses": _step_two_losses,
}


def _train(net: ChunkNet, step, data: list, rank: int, world: int, mean) -> dict:  # noqa: ANN001
    params = [p for _, p in net.named_parameters()]
    opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.01)
    rec: dict = {"loss": [], "grads": [], "params": []}
    for ids, y in data:
        ids, y = ids.chunk(world)[rank], y.chunk(world)[rank]
        loss = step(net, ids, y, ids.numel())  # the mean over this rank's tokens
        rec["loss"].append(mean(loss))
        rec["grads"].append([None if p.grad is None else full(p.grad) for p in params])
        opt.step()
        opt.zero_grad()
        rec["params"].append([full(p) for p in params])
    return rec


def _mean_over_ranks(x: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def check_partial_backward(rank, world, pattern):
    """One pattern (see the module docstring), with and without reshard_after_forward:
    three AdamW steps against one process; the unit of [norm, head] reduce-scatters its
    gradients, and every unit ends the step resharded."""
    from hyper_shard import DTensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    data = batches(3, world, per_rank=2, seq=6)
    step = STEPS[pattern]
    ref = _train(_make(), step, data, 0, 1, float)
    out = []
    for raf in (True, False):
        net = _shard(_make(), mesh, reshard_after_forward=raf)
        got = _train(net, step, data, rank, world, _mean_over_ranks)
        assert_same_training(got, ref)
        for name, p in net.named_parameters():  # resharded: the sharded DTensors again
            assert isinstance(p, DTensor), (pattern, raf, name)
        counts = net.norm._fsdp_state().group.counts
        out.append((raf, counts.get("reduce_scatter", 0) >= len(data)))
    return out


@pytest.mark.parametrize("pattern", sorted(STEPS))
def test_partial_backward_matches_one_process(dist2, pattern):
    out = dist2.run(check_partial_backward, pattern)
    assert out[0] == out[1] == [(True, True), (False, True)]


class _Shared(nn.Module):
    """``x`` and ``y`` both hold the same ``shared`` module."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.x = nn.Sequential(nn.Linear(4, 4), shared)
        self.y = nn.Sequential(shared, nn.Linear(4, 4))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.y(self.x(t))


def check_shared_module(rank, world):
    """A module shared by two fully_shard calls: the error names the shared submodule and
    says how to group it; grouping both users in one unit trains as one process."""
    from hyper_shard import init_device_mesh
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    net = _Shared()
    fully_shard(net.x, mesh=mesh)
    with pytest.raises(ValueError) as info:
        fully_shard(net.y, mesh=mesh)
    msg = str(info.value)
    for words in ("submodule '0' (Linear)", "'0.weight'", "shared", "one unit", "fully_shard(["):
        assert words in msg, (words, msg)
    assert "bottom-up" not in msg
    # an enclosing module applied first keeps the bottom-up hint
    top = _Shared()
    fully_shard(top, mesh=mesh)
    with pytest.raises(ValueError, match="bottom-up"):
        fully_shard(top.x, mesh=mesh)
    # the fix the message gives: one unit of both users
    torch.manual_seed(0)
    ref = _Shared()
    torch.manual_seed(0)
    net = _Shared()
    fully_shard([net.x, net.y], mesh=mesh)
    fully_shard(net, mesh=mesh)
    g = torch.Generator().manual_seed(2)
    t = torch.randn(2 * world, 4, generator=g)
    ref(t).pow(2).mean().backward()
    net(t.chunk(world)[rank]).pow(2).mean().backward()  # FSDP: the mean over the ranks
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)
    return msg


def test_shared_module_error_names_it(dist2):
    out = dist2.run(check_shared_module)
    assert out[0] == out[1]
