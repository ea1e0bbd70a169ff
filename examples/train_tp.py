"""A Megatron-style tensor-parallel MLP trained on 2 CPU ranks with hyper_shard DTensors.

The first linear layer is column-parallel (weight ``Shard(0)``), the second row-parallel
(weight ``Shard(1)``); the partial outputs are summed by redistributing ``Partial()`` to
``Replicate()``. Gradients flow through hyper_shard's redistribution. The losses are
compared with the same model trained in one process from the same seed.

    python examples/train_tp.py            # spawns 2 gloo ranks on 127.0.0.1
    python examples/train_tp.py --check    # also fails if any loss differs (rel 1e-4)
    torchrun --nproc-per-node 2 examples/train_tp.py
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

IN, HIDDEN, OUT, BATCH = 32, 64, 8, 16


def make_data(steps: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    true_w = torch.randn(OUT, IN, generator=g)
    xs = torch.randn(steps, BATCH, IN, generator=g)
    ys = torch.tanh(xs @ true_w.T)
    torch.manual_seed(1)
    w1 = torch.randn(HIDDEN, IN) / IN**0.5
    w2 = torch.randn(OUT, HIDDEN) / HIDDEN**0.5
    return xs, ys, [w1, w2]


def train_single(steps: int, lr: float) -> list[float]:
    xs, ys, (w1, w2) = make_data(steps)
    w1.requires_grad_()
    w2.requires_grad_()
    losses = []
    for i in range(steps):
        h = torch.relu(xs[i] @ w1.T)
        loss = torch.nn.functional.mse_loss(h @ w2.T, ys[i])
        loss.backward()
        with torch.no_grad():
            for w in (w1, w2):
                w -= lr * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses


def train_tp(steps: int, lr: float) -> list[float]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    xs, ys, (w1, w2) = make_data(steps)
    w1 = distribute_tensor(w1, mesh, [Shard(0)]).requires_grad_()  # column-parallel
    w2 = distribute_tensor(w2, mesh, [Shard(1)]).requires_grad_()  # row-parallel
    losses = []
    for i in range(steps):
        h = torch.relu(xs[i] @ w1.to_local().T)  # local columns of the hidden layer
        partial = DTensor.from_local(
            h @ w2.to_local().T, mesh, [Partial()], shape=(BATCH, OUT), stride=(OUT, 1)
        )
        y = partial.redistribute(mesh, [Replicate()]).to_local()  # all-reduce
        loss = torch.nn.functional.mse_loss(y, ys[i])
        loss.backward()
        with torch.no_grad():
            for w in (w1, w2):
                w.to_local().sub_(lr * w.grad.to_local())
                w.grad = None
        losses.append(loss.item())
    return losses


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    run(args)
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    t0 = time.perf_counter()
    tp = train_tp(args.steps, args.lr)
    dt = time.perf_counter() - t0
    if rank != 0:
        return
    single = train_single(args.steps, args.lr)
    print(f"{'step':>5} {'TP loss':>12} {'single loss':>12}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(tp, single)):
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"{i:>5} {a:>12.6f} {b:>12.6f}")
    print(f"TP time {dt:.2f}s for {args.steps} steps; max relative loss difference {worst:.2e}")
    if args.check and worst > 1e-4:
        raise SystemExit(f"--check failed: TP and single-device losses differ by {worst:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if "RANK" in os.environ:  # under torchrun
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        run(args)
        dist.destroy_process_group()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.nproc, port, args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
