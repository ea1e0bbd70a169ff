"""The MindSpore main job's training step: tensor parallel on 2 mccl ranks vs one process.

The model, plan, data and optimizer are ``examples/mindspore_llama_tp.py``'s (a Llama
decoder from ``mint.nn`` Cells; q/k/v and gate/up column-parallel, o/down row-parallel,
vocab-parallel embedding and LM head, ``ops.cross_entropy`` under ``loss_parallel()``,
``nn.AdamWeightDecay``). Each run times its steps (``value_and_grad`` + the optimizer +
reading the loss) after warm-up steps; a TP step's time is the slower rank's. It also
counts the collectives one TP step runs on a rank, by kind: every call of the platform's
``all_reduce``/``all_gather``/``broadcast``/... (redistributions and the loss kernel's own
all-reduces alike).

**ratio = TP step / single-process step**: on 2 CPU cores the TP step is not expected to
be faster (the model is tiny and each mccl collective costs a fraction of a millisecond);
the point is the dispatch and communication overhead, and that the losses agree.

    python benchmarks/bench_tp_step_mindspore.py            # --steps 12 --warmup 3
    python benchmarks/bench_tp_step_mindspore.py --sp       # sequence parallel too

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


def _run(rank: int, world: int, argv: list[str], tp: bool, warmup: int) -> dict[str, Any]:
    import mindspore_llama_tp as ex
    from mindspore import Tensor, nn, ops
    from mindspore_llama_model import build_model

    args = ex.parse_args(argv)
    data = ex.load_data()
    net = build_model(ex._config(args), args.seed)
    counts: dict[str, int] = {}
    if tp:
        from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
        from hyper_shard import parallel as hp
        from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

        mesh = init_device_mesh("CPU", (world,))
        hp.parallelize_module(net, mesh, ex.llama_tp_plan(args.sp, hp, Replicate, Shard))
        plat = mesh.platform
        for name in COLLECTIVES:  # count every collective this rank runs
            fn = getattr(plat, name)

            def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                counts[_name] = counts.get(_name, 0) + 1
                return _fn(*a, **k)

            setattr(plat, name, counted)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=args.lr, weight_decay=0.01)
    if tp:

        def loss_fn(x: Any, y: Any) -> Any:
            target = DTensor.from_local(y.reshape(-1), mesh, [Replicate()])
            with hp.loss_parallel():
                return ops.cross_entropy(net(x).reshape(-1, ex.VOCAB), target)

        step_fn = value_and_grad(loss_fn, None, opt.parameters)
    else:
        import mindspore as ms

        def loss_fn(x: Any, y: Any) -> Any:
            return ops.cross_entropy(net(x).reshape(-1, ex.VOCAB), y.reshape(-1))

        step_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    times, losses, per_step = [], [], {}
    for i, (x, y) in enumerate(ex.batches(data, args.steps, args.batch, args.seq, args.seed + 1)):
        if tp:
            import mindspore.mint.distributed as dist
            from mindspore.communication import GlobalComm

            dist.barrier(group=GlobalComm.WORLD_COMM_GROUP)
        before = dict(counts)
        t0 = time.perf_counter()
        loss, grads = step_fn(Tensor(x), Tensor(y))
        opt(optimizer_grads(grads, opt.parameters) if tp else grads)
        value = float((loss.to_local() if tp else loss).asnumpy())
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        losses.append(value)
        per_step = {k: counts.get(k, 0) - before.get(k, 0) for k in counts}
    return {"times": times, "losses": losses, "collectives": per_step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps (default 3)")
    ap.add_argument("--sp", action="store_true", help="sequence parallel on the norms too")
    opts, rest = ap.parse_known_args()
    from hyper_shard.platform.mindspore.launch import spawn

    argv = ["--steps", str(opts.steps), *(["--sp"] if opts.sp else []), *rest]
    load = os.getloadavg()[0]
    tp = spawn(_run, 2, argv, True, opts.warmup, timeout=1800)
    single = spawn(_run, 1, argv, False, opts.warmup, timeout=1800)[0]
    tp_step = statistics.median(max(a, b) for a, b in zip(tp[0]["times"], tp[1]["times"]))
    one_step = statistics.median(single["times"])
    rel = max(abs(a - b) / abs(b) for a, b in zip(tp[0]["losses"], single["losses"]))
    coll = tp[0]["collectives"]
    sp = " + sequence parallel" if opts.sp else ""
    print(
        f"load average {load:.2f} on {os.cpu_count()} cores; MindSpore Llama (the main job's "
        f"defaults), TP over 2 mccl ranks{sp} vs one process; {opts.steps - opts.warmup} "
        f"timed steps after {opts.warmup} warm-up steps"
    )
    print(f"{'':28s} {'TP x2 ms':>9s} {'single ms':>10s} {'ratio':>6s}")
    print(f"{'step (fwd+bwd+opt+loss)':28s} {tp_step * 1e3:9.1f} {one_step * 1e3:10.1f} "
          f"{tp_step / one_step:6.2f}x")  # fmt: skip
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(coll.items()) if v) or "none"
    print(f"collectives per TP step on a rank: {sum(coll.values())} ({kinds})")
    print(f"largest relative loss difference TP vs one process: {rel:.1e}")


if __name__ == "__main__":
    main()
