"""Mixture-of-experts step (forward + backward of one MoE layer): hyper_shard's
``ExpertParallel`` vs a torchtitan-style expert parallelism written with
``torch.distributed`` directly, vs the same layer in one process.

The layer is Hugging Face's ``MixtralSparseMoeBlock`` (``transformers`` as installed: the
router, then ``MixtralExperts`` with stacked ``gate_up_proj``/``down_proj``; its default
experts implementation is ``grouped_mm``, ``torch._grouped_mm`` on CPU). On ``--nproc``
gloo ranks (127.0.0.1, ``torch.set_num_threads(1)``), in the same run, steps alternating:

* **hyper_shard EP** — ``parallelize_module(block, mesh, {"experts": ExpertParallel()})``:
  the count all-gather, the token all-to-all of variable pieces (gloo's native
  ``all_to_all_single`` with splits), ``torch._grouped_mm`` on the local experts, the
  all-to-all back and the weighted combine (hyper_shard/kernels/moe.py);
* **torchtitan-style EP** — the same block, the experts' forward replaced by the pattern
  of torchtitan's ``ExpertParallel`` (``torchtitan/distributed/expert_parallel.py``:
  counts by ``all_to_all_single``, the tokens by ``all_to_all_single`` with splits and its
  autograd, a permutation to local-expert order, ``torch._grouped_mm``, back), written
  here with ``torch.distributed`` (torchtitan is not a dependency of this project; its
  code is not copied): the baseline a PyTorch user would write;
* **one process** — the unchanged block on every rank's tokens at once (``nproc`` times
  the tokens), in rank 0 alone, as the single-device reference.

Each rank holds ``--tokens`` tokens; ``E`` experts of ``--ffn`` (``E / nproc`` per rank),
top-``--topk``. A step is timed with a ``dist.barrier()`` before it; the figure is the
median over ``--steps`` timed steps of the slower rank. Printed: milliseconds per step
and tokens per second of the whole world, **ratio = hyper_shard / torchtitan-style (< 1:
hyper_shard faster)**, and each EP's throughput against one process. The outputs of the
three are compared on the first step (they must agree to 1e-5).

    python benchmarks/bench_moe_step.py                       # 2 ranks, about 30 s
    python benchmarks/bench_moe_step.py --nproc 4 --experts 8

Times on a shared machine are noisy: the first line prints the load average.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _block(args: argparse.Namespace) -> Any:
    import transformers
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    transformers.logging.set_verbosity_error()
    cfg = MixtralConfig(
        hidden_size=args.hidden, intermediate_size=args.ffn, num_local_experts=args.experts,
        num_experts_per_tok=args.topk, router_jitter_noise=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(cfg)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return block


# ---------------------------------------------------------------------- the baseline
class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with splits; backward: the same with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv), x.shape[1]))
        dist.all_to_all_single(out, x.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        out = g.new_empty((sum(ctx.send), g.shape[1]))
        dist.all_to_all_single(out, g.contiguous(), ctx.send, ctx.recv)
        return out, None, None


def _titan_forward(experts: Any, n: int, me: int) -> Any:
    """A torchtitan-style expert-parallel forward for a Mixtral experts module whose
    ``gate_up_proj``/``down_proj`` hold this rank's experts (plain local tensors)."""
    e_total = experts.num_experts
    local = e_total // n

    def forward(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        k = idx.shape[1]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=e_total)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts)  # tokens per (source rank, local expert)
        send = counts.view(n, local).sum(1).tolist()
        recv_m = got.view(n, local)
        recv = recv_m.sum(1).tolist()
        rows = _AllToAll.apply(x[order // k], send, recv)
        # rank-major -> local-expert-major (torchtitan's _permute)
        starts = (torch.cumsum(got, 0) - got).view(n, local)
        perm = torch.cat([
            torch.arange(int(starts[s, e]), int(starts[s, e] + recv_m[s, e]))
            for e in range(local) for s in range(n)
        ]) if rows.shape[0] else torch.zeros(0, dtype=torch.long)  # fmt: skip
        sizes = recv_m.sum(0)
        offs = torch.cumsum(sizes, 0, dtype=torch.int32)
        h = torch._grouped_mm(rows[perm], experts.gate_up_proj.transpose(1, 2), offs=offs)
        gate, up = h.chunk(2, -1)
        y = torch._grouped_mm(
            experts.act_fn(gate) * up, experts.down_proj.transpose(1, 2), offs=offs
        )
        back = torch.empty_like(y).index_copy(0, perm, y) if rows.shape[0] else y
        out = _AllToAll.apply(back, recv, send)
        pairs = out[torch.argsort(order)] * w.reshape(-1, 1)
        return pairs.view(-1, k, x.shape[1]).sum(1)

    return forward


def _titan_setup(block: Any, n: int, me: int) -> Any:
    ex = block.experts
    local = ex.num_experts // n
    with torch.no_grad():
        gu = ex.gate_up_proj[me * local : (me + 1) * local].clone()
        dn = ex.down_proj[me * local : (me + 1) * local].clone()
    ex.gate_up_proj = torch.nn.Parameter(gu)
    ex.down_proj = torch.nn.Parameter(dn)
    ex.forward = _titan_forward(ex, n, me)
    return block


# ---------------------------------------------------------------------- the run
def _step(block: Any, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    out = block(x)
    out.square().mean().backward()
    t = time.perf_counter() - t0
    block.zero_grad(set_to_none=True)
    return t, out.detach()


def _worker(rank: int, n: int, port: int, args: argparse.Namespace, q: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    from hyper_shard import init_device_mesh
    from hyper_shard.parallel import ExpertParallel, parallelize_module

    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("ep",))
    hs = parallelize_module(_block(args), mesh, {"experts": ExpertParallel()})
    titan = _titan_setup(_block(args), n, rank)
    one = _block(args) if rank == 0 else None
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(n, 1, args.tokens, args.hidden, generator=g)
    x = xs[rank]
    t_hs, out_hs = _step(hs, x)
    t_ti, out_ti = _step(titan, x)
    if one is not None:
        _, out_one = _step(one, xs.reshape(n, args.tokens, args.hidden))
        torch.testing.assert_close(out_hs, out_one[0:1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_hs, out_ti, atol=1e-5, rtol=1e-5)
    times: dict[str, list[float]] = {
        "hyper_shard EP": [],
        "torchtitan-style EP": [],
        "one process": [],
    }
    for _ in range(args.warmup + args.steps):
        for name, blk, inp in (("hyper_shard EP", hs, x), ("torchtitan-style EP", titan, x)):
            dist.barrier()
            t, _ = _step(blk, inp)
            slowest = torch.tensor([t])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[name].append(float(slowest))
        dist.barrier()
        if one is not None:
            times["one process"].append(_step(one, xs.reshape(n, args.tokens, args.hidden))[0])
    if rank == 0:
        q.put({k: v[args.warmup :] for k, v in times.items()})
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank (default 1024)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512, help="intermediate size of each expert")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(args.nproc, port, args, q), nprocs=args.nproc)
    times = q.get()
    n, tok = args.nproc, args.tokens
    print(
        f"MixtralSparseMoeBlock: hidden {args.hidden}, {args.experts} experts of ffn {args.ffn}, "
        f"top-{args.topk}; {tok} tokens per rank, {n} ranks (gloo); forward + backward; "
        f"median of {args.steps} steps"
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, t in med.items():
        world_tok = tok * n
        print(f"  {name:<20} {t * 1e3:8.1f} ms/step  {world_tok / t:9.0f} tok/s")
    hs, ti, one = med["hyper_shard EP"], med["torchtitan-style EP"], med["one process"]
    print(f"ratio hyper_shard / torchtitan-style: {hs / ti:.2f}  (< 1: hyper_shard faster)")
    print(
        f"throughput vs one process: hyper_shard EP {one / hs:.2f}x, "
        f"torchtitan-style EP {one / ti:.2f}x"
    )


if __name__ == "__main__":
    main()
