"""Tensor-parallel training of a MindSpore MLP on CPU ranks, checked against one process.

The model reads token ids through an input embedding (``mindspore.nn.Embedding``), then a
stack of residual MLP blocks (``x + down(silu(up(x)))``, ``mint.nn.Linear`` layers) and a
linear head. ``hyper_shard.parallel.parallelize_module`` shards it with the same plan
classes as on torch: the embedding vocab-parallel — ``RowwiseParallel(input_layouts=
Replicate())`` (table ``Shard(0)``, each rank looks up its rows, one all-reduce) — every
block Megatron-style — ``up``: ``ColwiseParallel`` (weight ``Shard(0)``), ``down``:
``RowwiseParallel`` (weight ``Shard(1)``, one all-reduce per block) — and the head stays
replicated. The TP job runs on ``--world`` spawned CPU
ranks (mccl through a TCPStore; MindSpore PyNative, ``launch_blocking``); the reference is
the same model, the same data and the same ``nn.SGD`` in a single plain MindSpore process.

Run::

    python examples/mindspore_tp_mlp.py            # prints the loss table
    python examples/mindspore_tp_mlp.py --check    # exit 1 if any loss differs by >1e-4 (rel)

On a cluster, launch the ``train`` function of each rank with ``msrun`` instead (see
docs/mindspore.md); ``init_device_mesh("Ascend", (n,))`` then joins msrun's world.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np


def build_model(vocab: int, dim: int, hidden: int, blocks: int, seed: int) -> Any:
    """The model with deterministic weights (numpy RNG: identical in every process)."""
    from mindspore import Parameter, Tensor, mint, nn

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.up = mint.nn.Linear(dim, hidden)
            self.down = mint.nn.Linear(hidden, dim)

        def construct(self, x: Any) -> Any:
            return x + self.down(mint.nn.functional.silu(self.up(x)))

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)  # Gather(embedding_table, ids, 0)
            self.blocks = nn.CellList([Block() for _ in range(blocks)])
            self.head = mint.nn.Linear(dim, dim)

        def construct(self, ids: Any) -> Any:
            x = self.embed(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    net = MLP()
    rs = np.random.RandomState(seed)
    table = rs.randn(vocab, dim).astype(np.float32)
    net.embed.embedding_table = Parameter(Tensor(table), name=net.embed.embedding_table.name)
    for _, cell in net.cells_and_names():
        if isinstance(cell, mint.nn.Linear):
            out_f, in_f = cell.weight.shape
            w = rs.randn(out_f, in_f).astype(np.float32) / np.sqrt(in_f)
            cell.weight = Parameter(Tensor(w), name=cell.weight.name)
            cell.bias = Parameter(
                Tensor(rs.randn(out_f).astype(np.float32) * 0.02), name=cell.bias.name
            )
    return net


def batches(
    steps: int, batch: int, vocab: int, dim: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """A fixed regression task: token ids, and targets from a random per-token vector
    through a random linear map plus a nonlinearity."""
    rs = np.random.RandomState(seed + 1)
    true = rs.randn(vocab, dim).astype(np.float32)
    proj = rs.randn(dim, dim).astype(np.float32) / np.sqrt(dim)
    out = []
    for _ in range(steps):
        ids = rs.randint(0, vocab, (batch,)).astype(np.int32)
        out.append((ids, np.tanh(true[ids] @ proj)))
    return out


def train(rank: int, world: int, cfg: dict) -> list[float]:
    """One rank's run: TP through hyper_shard when ``cfg['tp']``, else plain MindSpore."""
    import mindspore as ms
    from mindspore import Tensor, nn

    net = build_model(cfg["vocab"], cfg["dim"], cfg["hidden"], cfg["blocks"], cfg["seed"])
    data = batches(cfg["steps"], cfg["batch"], cfg["vocab"], cfg["dim"], cfg["seed"])
    if cfg["tp"]:
        import hyper_shard as hs
        from hyper_shard import Replicate
        from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

        mesh = hs.init_device_mesh("CPU", (world,))
        # vocab-parallel: the token ids are the same on every rank (Replicate)
        plan: dict[str, Any] = {"embed": RowwiseParallel(input_layouts=Replicate())}
        for i in range(cfg["blocks"]):
            plan[f"blocks.{i}.up"] = ColwiseParallel()
            plan[f"blocks.{i}.down"] = RowwiseParallel()
        parallelize_module(net, mesh, plan)
    opt = nn.SGD(net.trainable_params(), learning_rate=cfg["lr"])

    def loss_fn(x: Any, y: Any) -> Any:
        return ((net(x) - y) ** 2).mean()

    losses = []
    if cfg["tp"]:
        step = value_and_grad(loss_fn, None, opt.parameters)
        for x, y in data:
            loss, grads = step(Tensor(x), Tensor(y))
            opt(optimizer_grads(grads, opt.parameters))  # Partial bias grads all-reduced
            losses.append(float(loss.asnumpy()))
    else:
        step = ms.value_and_grad(loss_fn, None, opt.parameters)
        for x, y in data:
            loss, grads = step(Tensor(x), Tensor(y))
            opt(grads)
            losses.append(float(loss.asnumpy()))
    return losses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="tensor-parallel ranks (CPU processes)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50, help="input embedding rows")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64, help="divisible by --world")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--check", action="store_true", help="fail on a relative loss difference > 1e-4"
    )
    args = ap.parse_args(argv)
    from hyper_shard.platform.mindspore.launch import spawn

    keys = ("steps", "vocab", "dim", "hidden", "blocks", "batch", "lr", "seed")
    cfg = {k: getattr(args, k) for k in keys}
    t0 = time.time()
    ref = spawn(train, 1, {**cfg, "tp": False}, timeout=300)[0]
    t1 = time.time()
    tp = spawn(train, args.world, {**cfg, "tp": True}, timeout=300)
    t2 = time.time()
    print(
        f"MindSpore MLP, embedding {args.vocab}x{args.dim}, {args.blocks} blocks "
        f"{args.dim}->{args.hidden}->{args.dim}, TP on {args.world} CPU ranks"
    )
    print(
        f"{'step':>4}  {'single process':>14}  {'TP rank 0':>12}  {'TP rank 1':>12}  {'rel diff':>9}"
    )
    worst = 0.0
    for i, r in enumerate(ref):
        vals = [tp[k][i] for k in range(args.world)]
        rel = max(abs(v - r) / max(abs(r), 1e-12) for v in vals)
        worst = max(worst, rel)
        cols = "  ".join(f"{v:12.6f}" for v in vals[:2])
        print(f"{i:>4}  {r:14.6f}  {cols}  {rel:9.2e}")
    print(
        f"max relative difference {worst:.2e}; single process {t1 - t0:.1f} s, TP {t2 - t1:.1f} s "
        f"(wall, including process start)"
    )
    if args.check and worst > 1e-4:
        print("CHECK FAILED: TP losses differ from the single-process run", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
