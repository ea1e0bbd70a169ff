"""The MindSpore main job's training step: ``fully_shard`` on 2 mccl ranks vs one process.

The model, data and optimizer are ``examples/mindspore_llama_tp.py``'s (a Llama decoder
from ``mint.nn`` Cells, ``ops.cross_entropy``, ``nn.AdamWeightDecay``); FSDP as its
``--dp 2``: each decoder layer, then the root, one ``hyper_shard.fsdp.fully_shard`` unit on
a 1-D mesh, each rank on half the batch. The single process runs the same model on the
whole batch. Printed, all measured in this run:

* **step time ratio** = FSDP step (the slower rank's; ``value_and_grad`` + optimizer +
  reading the loss, here the dp mean) / single-process step, median over the timed steps;
* **collectives per step** on a rank, by kind (every call of the platform's collectives:
  the units' all-gathers, their gradient reductions, the loss mean);
* **bytes held after a step** on a rank (parameters + AdamWeightDecay's two moments, the
  local data) / (the single process's / 2): 1.00x means exactly 1/N of the unsharded
  model's state (uneven dim-0 chunks make it slightly more on the rank with the larger
  chunks);
* the largest relative loss difference (FSDP's dp-mean loss vs the single process's).

On 2 CPU cores the FSDP step is not expected to be faster (the model is tiny; each rank
computes half the batch but gathers and reduces every parameter): the point is the
overhead, the communication count and the memory. mccl has no reduce-scatter on CPU, so
the gradient reduction is an all-reduce and a slice (the bytes moved are those of an
all-reduce).

    python benchmarks/bench_fsdp_step_mindspore.py            # --steps 12 --warmup 3

Times on a shared machine are noisy: the first line prints the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _run(rank: int, world: int, argv: list[str], fsdp: bool, warmup: int) -> dict[str, Any]:
    import mindspore as ms
    import mindspore_llama_tp as ex
    from mindspore import Tensor, nn, ops
    from mindspore_llama_model import build_model

    args = ex.parse_args(argv)
    data = ex.load_data()
    net = build_model(ex._config(args), args.seed)
    counts: dict[str, int] = {}
    b = args.batch // world
    if fsdp:
        from hyper_shard import init_device_mesh
        from hyper_shard.fsdp import fully_shard
        from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

        mesh = init_device_mesh("CPU", (world,), mesh_dim_names=("dp",))
        for layer in net.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        plat, group = mesh.platform, mesh._group(0)
        for name in COLLECTIVES:  # count every collective this rank runs
            fn = getattr(plat, name)

            def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                counts[_name] = counts.get(_name, 0) + 1
                return _fn(*a, **k)

            setattr(plat, name, counted)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=args.lr, weight_decay=0.01)

    def loss_fn(x: Any, y: Any) -> Any:
        return ops.cross_entropy(net(x).reshape(-1, ex.VOCAB), y.reshape(-1))

    step_fn = (value_and_grad if fsdp else ms.value_and_grad)(loss_fn, None, opt.parameters)
    times, losses, per_step, parts = [], [], {}, []
    for i, (x, y) in enumerate(ex.batches(data, args.steps, args.batch, args.seq, args.seed + 1)):
        if fsdp:
            import mindspore.mint.distributed as dist
            from mindspore.communication import GlobalComm

            dist.barrier(group=GlobalComm.WORLD_COMM_GROUP)
            x, y = x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]
        before = dict(counts)
        t0 = time.perf_counter()
        loss, grads = step_fn(Tensor(x), Tensor(y))
        t1 = time.perf_counter()
        opt(optimizer_grads(grads, opt.parameters) if fsdp else grads)
        t2 = time.perf_counter()
        if fsdp:
            loss = plat.all_reduce(loss, "avg", group)
        value = float(loss.asnumpy())
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
            parts.append((t1 - t0, t2 - t1))
        losses.append(value)
        per_step = {k: counts.get(k, 0) - before.get(k, 0) for k in counts}
    state = list(net.trainable_params()) + list(opt.moments1) + list(opt.moments2)
    return {
        "times": times,
        "parts": parts,
        "losses": losses,
        "collectives": per_step,
        "held": sum(int(_local(t).nbytes) for t in state),
    }


def _local(t: Any) -> Any:
    from hyper_shard import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3)")
    opts, rest = ap.parse_known_args()
    from hyper_shard.platform.mindspore.launch import spawn

    argv = ["--steps", str(opts.steps), *rest]
    load = os.getloadavg()[0]
    fs = spawn(_run, 2, argv, True, opts.warmup, timeout=1800)
    single = spawn(_run, 1, argv, False, opts.warmup, timeout=1800)[0]
    fs_step = statistics.median(max(a, b) for a, b in zip(fs[0]["times"], fs[1]["times"]))
    one_step = statistics.median(single["times"])
    rel = max(abs(a - b) / abs(b) for a, b in zip(fs[0]["losses"], single["losses"]))
    coll = fs[0]["collectives"]
    print(
        f"load average {load:.2f} on {os.cpu_count()} cores; MindSpore Llama (the main job's "
        f"defaults), fully_shard over 2 mccl ranks (half the batch each) vs one process; "
        f"{opts.steps - opts.warmup} timed steps after {opts.warmup} warm-up steps"
    )
    print(f"{'':28s} {'FSDP x2 ms':>10s} {'single ms':>10s} {'ratio':>6s}")
    print(f"{'step (fwd+bwd+opt+loss)':28s} {fs_step * 1e3:10.1f} {one_step * 1e3:10.1f} "
          f"{fs_step / one_step:6.2f}x")  # fmt: skip
    for j, label in enumerate(("  forward + backward", "  optimizer (+ grads)")):
        a = statistics.median(max(p[j], q[j]) for p, q in zip(fs[0]["parts"], fs[1]["parts"]))
        b = statistics.median(p[j] for p in single["parts"])
        print(f"{label:28s} {a * 1e3:10.1f} {b * 1e3:10.1f} {a / b:6.2f}x")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(coll.items()) if v) or "none"
    print(f"collectives per FSDP step on a rank: {sum(coll.values())} ({kinds})")
    ideal = single["held"] / 2
    held = ", ".join(f"rank {r} {o['held'] / ideal:.3f}x" for r, o in enumerate(fs))
    print(
        f"bytes held after a step (parameters + AdamWeightDecay moments) vs the unsharded "
        f"model's / 2 ({ideal / 1e6:.2f} MB): {held}"
    )
    print(f"largest relative loss difference FSDP vs one process: {rel:.1e}")


if __name__ == "__main__":
    main()
