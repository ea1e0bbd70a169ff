"""Tiny models and a single-process reference for the FSDP tests.

``TinyNet`` has uneven shapes on purpose: vocab 11 (embedding and head rows split 6/5 over
2 ranks, 3/3/3/2 over 4), hidden 6, MLP width 5. ``train`` runs a few AdamW steps and
records, at every step, the loss (the mean over the data-parallel ranks), every
gradient's full tensor and every parameter's full tensor after the step, so the same
record from one process on the whole batch is the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, D, H = 11, 6, 5


class Block(nn.Module):
    def __init__(self, d: int = D, h: int = H, checkpoint: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)
        self.checkpoint = checkpoint

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if self.checkpoint:
            from torch.utils.checkpoint import checkpoint

            return x + checkpoint(self.mlp, h, use_reentrant=False)
        return x + self.mlp(h)


class TinyNet(nn.Module):
    def __init__(self, layers: int = 2, tie: bool = False, checkpoint: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block(checkpoint=checkpoint) for _ in range(layers))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_net(seed: int = 0, **kw: Any) -> TinyNet:
    torch.manual_seed(seed)
    net = TinyNet(**kw)
    with torch.no_grad():  # LayerNorm weights 1 / bias 0 would hide layout mistakes
        for m in net.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return net


def batches(steps: int, dp: int, per_rank: int = 2, seq: int = 5, seed: int = 1) -> list:
    """``steps`` global batches of ``dp * per_rank`` sequences: (ids, targets)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (dp * per_rank, seq), generator=g)
        out.append((ids, torch.roll(ids, 1, dims=1)))
    return out


def loss_of(logits: Any, y: torch.Tensor) -> Any:
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def full(t: Any) -> torch.Tensor:
    from hyper_shard import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().clone()


def train(
    model: nn.Module,
    data: list,
    dp_rank: int,
    dp: int,
    *,
    lr: float = 0.05,
    sgd: bool = False,
    micro: int = 1,
    before_micro: Callable[[int], None] | None = None,
    mean_loss: Callable[[torch.Tensor], float] | None = None,
) -> dict:
    """AdamW (or SGD) on ``model`` over ``data``; this rank takes its ``1/dp`` slice of every
    batch (``micro`` micro-batches per step, gradients accumulated, each scaled 1/micro).

    Returns:
        ``{"loss": [...], "grads": [[...]...], "params": [[...]...]}`` per step: full
        tensors of the parameters ``named_parameters`` gave before training (the sharded
        ones under FSDP: the optimizer's), in that order.
    """
    params = [p for _, p in model.named_parameters()]  # the sharded ones under FSDP
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(params, lr=lr)
        if sgd
        else torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    )
    rec: dict = {"loss": [], "grads": [], "params": []}
    for ids, y in data:
        ids, y = ids.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        total = 0.0
        for k, (mi, my) in enumerate(zip(ids.chunk(micro), y.chunk(micro))):
            if before_micro is not None:
                before_micro(k)
            loss = loss_of(model(mi), my) / micro
            loss.backward()
            total += float(mean_loss(loss.detach()) if mean_loss else loss.item())
        rec["loss"].append(total)
        rec["grads"].append([None if p.grad is None else full(p.grad) for p in params])
        opt.step()
        opt.zero_grad()
        rec["params"].append([full(p) for p in params])
    return rec


def assert_same_training(got: dict, ref: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Losses, gradients and parameters of two :func:`train` records agree."""
    assert len(got["loss"]) == len(ref["loss"])
    for s, (a, b) in enumerate(zip(got["loss"], ref["loss"])):
        assert abs(a - b) <= atol + rtol * abs(b), f"step {s}: loss {a} vs {b}"
    for kind in ("grads", "params"):
        for s, (gs, rs) in enumerate(zip(got[kind], ref[kind])):
            assert len(gs) == len(rs), f"{kind}: {len(gs)} vs {len(rs)} tensors"
            for i, (g, r) in enumerate(zip(gs, rs)):
                if r is None or g is None:
                    assert g is None and r is None, f"step {s} {kind}[{i}]: {g} vs {r}"
                    continue
                torch.testing.assert_close(
                    g,
                    r,
                    rtol=rtol,
                    atol=atol,
                    msg=lambda m, s=s, kind=kind, i=i: f"step {s} {kind}[{i}]: {m}",
                )


def train_mixed_reference(master: nn.Module, data: list, lr: float) -> dict:
    """FSDP's mixed precision on one device: a bf16 copy of the fp32 ``master`` computes
    forward and backward on the whole batch; its gradients, cast to fp32, step the
    master with SGD. Same record as :func:`train`."""
    import copy

    compute = copy.deepcopy(master).to(torch.bfloat16)
    params = [p for _, p in master.named_parameters()]
    cparams = [p for _, p in compute.named_parameters()]
    opt = torch.optim.SGD(params, lr=lr)
    rec: dict = {"loss": [], "grads": [], "params": []}
    for ids, y in data:
        with torch.no_grad():
            for c, m in zip(cparams, params):
                c.copy_(m)
        loss = loss_of(compute(ids), y)
        loss.backward()
        for c, m in zip(cparams, params):
            m.grad = c.grad.float()
            c.grad = None
        rec["loss"].append(loss.item())
        rec["grads"].append([full(p.grad) for p in params])
        opt.step()
        opt.zero_grad()
        rec["params"].append([full(p) for p in params])
    return rec
