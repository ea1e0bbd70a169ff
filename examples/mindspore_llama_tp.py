"""Train a Llama-style decoder on MindSpore with tensor parallelism on hyper_shard DTensors.

The MindSpore counterpart of ``examples/train_llama_tp.py``: the same byte-level corpus
(the standard library's docstrings), the same sizes and flags, the same tensor-parallel
plan (``examples/llama_common.py``: q/k/v and gate/up column-parallel, o/down
row-parallel, the token embedding vocab-parallel, the LM head column-parallel with its
class-sharded logits fed to ``ops.cross_entropy`` under ``loss_parallel()``; ``--sp`` adds
sequence parallelism on the RMSNorms), the same table, progress bar and loss plot.

The model is a Llama decoder built from ``mint.nn`` Cells
(``examples/mindspore_llama_model.py``: RoPE, grouped-query attention, RMSNorm, SwiGLU;
``--tie`` shares the embedding with the LM head): neither mindformers (it needs
MindSpore 2.11 and hyper-parallel) nor mindnlp (MindSpore <= 2.7) installs with MindSpore
2.10. The optimizer is ``mindspore.nn.Adam`` (bias-corrected, as torch's AdamW; its
``weight_decay`` is the L2 form): ``nn.AdamWeightDecay`` has no bias correction, so its
early steps are 2-6x larger than the learning rate and the run sits at the edge of
stability, where fp32 rounding differences between TP and one process grow step by step
(over 1e-4 within 50 steps of the default run; below 3e-7 over 200 steps with
``nn.Adam``).

The TP job runs on ``--nproc`` spawned CPU ranks (mccl through a TCPStore, PyNative,
``launch_blocking``); the reference is the same model, seed, batches and optimizer in one
plain MindSpore process. ``--check`` fails unless every step's losses agree to 1e-4
relative.

``--dp N`` trains with fully sharded data parallelism instead
(``hyper_shard.fsdp.fully_shard``, the PyTorch FSDP2 API, on MindSpore Cells): each decoder
layer and then the root is one FSDP unit on a 1-D ``("dp",)`` mesh, every rank trains on
its slice of the batch, the parameters between steps are ``Shard(0)`` DTensors and the
loss shown is the mean over the dp ranks (the batch mean). ``--dp N --tp M`` is FSDP over
tensor parallelism on a ``("dp", "tp")`` mesh of ``N * M`` ranks: the tensor-parallel plan
on ``mesh["tp"]``, then the FSDP units on ``mesh["dp"]`` (as the torch job).

    python examples/mindspore_llama_tp.py --check              # TP on 2 CPU ranks
    python examples/mindspore_llama_tp.py --sp --steps 50      # sequence parallel too
    python examples/mindspore_llama_tp.py --dp 2 --check       # FSDP on 2 CPU ranks
    python examples/mindspore_llama_tp.py --dp 2 --tp 2 --check  # FSDP x TP on 4 CPU ranks
    python examples/mindspore_llama_tp.py --moe 4 --ep 2 --check  # MoE, EP on 2 CPU ranks
    python examples/mindspore_llama_tp.py --cp 2 --tp 2 --check  # CP x TP on 4 CPU ranks

``--moe E`` makes every MLP a mixture of ``E`` experts (``--topk K`` per token; the
model's ``MoEBlock``, laid out as Hugging Face's Mixtral), and ``--ep N`` shards the
experts over ``N`` of the data-parallel ranks with the same ``ExpertParallel`` style as
the torch job (FSDP on the other parameters; examples/moe_common.py has the layout).

``--cp N`` adds context parallelism (``hyper_shard.experimental.context_parallel``) on a
``("dp", "cp", "tp")`` mesh, as the torch job: the model's attention becomes one call of
hyper_shard's ``scaled_dot_product_attention`` (``attn_implementation="sdpa"``, in the
single-process reference too), the token ids, labels and position ids of each step are
sharded along the sequence over ``mesh["cp"]`` (head-tail load-balanced where ``2 N``
divides ``--seq``), and FSDP units span ``dp x cp``.

On a cluster launch ``train`` on every rank with ``msrun`` (docs/mindspore.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_common import (  # noqa: E402  (the examples directory first on the path)
    add_common_args,
    corpus_bytes,
    llama_config_kwargs,
    llama_tp_plan,
    report,
    resolve_layout,
    validate,
)
from moe_common import moe_defaults, parallelize_moe  # noqa: E402

__all__ = ["train", "load_data", "batches", "parse_args", "main"]

OUT_DIR = Path(__file__).resolve().parent / "out"
VOCAB = 256  # byte-level


def load_data() -> np.ndarray:
    """The corpus as a 1-D array of byte values (int32).

    Raises:
        SystemExit: the Python install ships no standard-library sources to read
            (:func:`llama_common.corpus_bytes`).
    """
    text = corpus_bytes()
    return np.frombuffer(text, dtype=np.uint8).astype(np.int32)


def batches(
    data: np.ndarray, steps: int, batch: int, seq: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` batches of ``batch`` random windows of ``seq + 1`` bytes: (inputs, targets
    shifted by one). The same seed gives the same batches in every process."""
    rs = np.random.RandomState(seed)
    starts = rs.randint(0, data.size - seq - 1, (steps, batch))
    offs = np.arange(seq + 1)
    out = []
    for s in starts:
        w = data[s[:, None] + offs]
        out.append((np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])))
    return out


def _config(args: argparse.Namespace) -> Any:
    from mindspore_llama_model import LlamaConfig

    attn = "sdpa" if (getattr(args, "cp", None) or 1) > 1 else "eager"
    return LlamaConfig(
        **llama_config_kwargs(args, VOCAB), tie_word_embeddings=args.tie, attn_implementation=attn,
        num_experts=getattr(args, "moe", 0), num_experts_per_tok=getattr(args, "topk", 2),
    )  # fmt: skip


def train(rank: int, world: int, args: argparse.Namespace, data: np.ndarray, tp: bool) -> dict:
    """One rank's run over ``world`` ranks through hyper_shard when ``tp`` (tensor parallel,
    or FSDP when ``args.dp`` > 1), else plain MindSpore in one process. Returns
    ``{"losses", "times"}`` (per step)."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore_llama_model import build_model
    from tqdm import tqdm

    net = build_model(_config(args), args.seed)
    mesh = None
    dp = (getattr(args, "dp", None) or 1) if tp else 1
    if tp and (getattr(args, "cp", None) or 1) > 1:
        return _train_cp(rank, world, args, data, net)
    if dp > 1 or (tp and getattr(args, "moe", 0)):
        return _train_fsdp(rank, world, args, data, net)
    if tp:
        from hyper_shard import Replicate, Shard, init_device_mesh
        from hyper_shard import parallel as hp

        mesh = init_device_mesh("CPU", (world,), mesh_dim_names=("tp",))
        hp.parallelize_module(net, mesh, llama_tp_plan(args.sp, hp, Replicate, Shard))
    opt = nn.Adam(net.trainable_params(), learning_rate=args.lr, weight_decay=args.weight_decay)

    if tp:
        from hyper_shard import DTensor
        from hyper_shard.parallel import loss_parallel
        from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

        def loss_fn(x: Any, y: Any) -> Any:
            logits = net(x)  # DTensor [b, s, V], Shard(-1): never gathered
            target = DTensor.from_local(y.reshape(-1), mesh, [Replicate()])
            with loss_parallel():
                return ops.cross_entropy(logits.reshape(-1, VOCAB), target)

        grad_fn = value_and_grad(loss_fn, None, opt.parameters)
    else:

        def loss_fn(x: Any, y: Any) -> Any:
            return ops.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))

        grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    losses, times = [], []
    desc = f"TP x{world}" if tp else "single process"
    bar = tqdm(total=args.steps, desc=desc, unit="step", disable=rank != 0)
    for x, y in batches(data, args.steps, args.batch, args.seq, args.seed + 1):
        t0 = time.perf_counter()
        loss, grads = grad_fn(Tensor(x), Tensor(y))
        opt(optimizer_grads(grads, opt.parameters) if tp else grads)
        value = float((loss.to_local() if tp else loss).asnumpy())
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    return {"losses": losses, "times": times}


def _train_fsdp(
    rank: int, world: int, args: argparse.Namespace, data: np.ndarray, net: Any
) -> dict:
    """FSDP over ``--dp`` ranks (each decoder layer, then the root, one unit), over the
    tensor-parallel plan on ``--tp`` ranks when ``--tp`` > 1 (a ``("dp", "tp")`` mesh)."""
    from mindspore import Tensor, nn, ops
    from tqdm import tqdm

    from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    dp = args.dp
    tp = world // dp
    if getattr(args, "moe", 0):  # experts, FSDP and TP: examples/moe_common.py
        mesh = parallelize_moe(args, net, "CPU")
        dp_mesh = mesh["dp"]
        tp_mesh = mesh["tp"] if tp > 1 else None
    elif tp > 1:
        mesh = init_device_mesh("CPU", (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
        hp.parallelize_module(net, tp_mesh, llama_tp_plan(args.sp, hp, Replicate, Shard))
    else:
        dp_mesh = init_device_mesh("CPU", (world,), mesh_dim_names=("dp",))
    if not getattr(args, "moe", 0):
        for layer in net.model.layers:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(net, mesh=dp_mesh)
    opt = nn.Adam(net.trainable_params(), learning_rate=args.lr, weight_decay=args.weight_decay)

    def loss_fn(x: Any, y: Any) -> Any:  # this dp rank's slice of the batch
        if tp == 1:  # plain tensors throughout
            return ops.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))
        logits = net(x)  # DTensor [b, s, V] on the tp mesh, Shard(-1)
        target = DTensor.from_local(y.reshape(-1), tp_mesh, [Replicate()])
        with hp.loss_parallel():
            return ops.cross_entropy(logits.reshape(-1, VOCAB), target)

    grad_fn = value_and_grad(loss_fn, None, opt.parameters)
    group, plat = dp_mesh._group(0), dp_mesh.platform
    coord = dp_mesh.get_coordinate()[0]
    b = args.batch // dp
    losses, times = [], []
    desc = (
        f"FSDP x{dp}"
        + (f" TP x{tp}" if tp > 1 else "")
        + (f" EP x{args.ep}" if args.ep > 1 else "")
    )
    bar = tqdm(total=args.steps, desc=desc, unit="step", disable=rank != 0)
    for x, y in batches(data, args.steps, args.batch, args.seq, args.seed + 1):
        t0 = time.perf_counter()
        sl = slice(coord * b, (coord + 1) * b)
        loss, grads = grad_fn(Tensor(x[sl]), Tensor(y[sl]))
        opt(optimizer_grads(grads, opt.parameters))
        local = loss.to_local() if isinstance(loss, DTensor) else loss
        # the mean over the dp ranks (equal slices: the batch mean)
        value = float(plat.all_reduce(local, "avg", group).asnumpy())
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    return {"losses": losses, "times": times}


def _train_cp(rank: int, world: int, args: argparse.Namespace, data: np.ndarray, net: Any) -> dict:
    """Context parallelism over ``--cp`` ranks on a ``("dp", "cp", "tp")`` mesh: the
    tensor-parallel plan on ``mesh["tp"]``, FSDP units over ``dp x cp``, each step's ids,
    labels and position ids sharded along the sequence on ``mesh["cp"]``."""
    from mindspore import Tensor, nn, ops
    from tqdm import tqdm

    from hyper_shard import DTensor, Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp
    from hyper_shard.experimental import context_parallel
    from hyper_shard.fsdp import fully_shard
    from hyper_shard.platform.mindspore.autograd import optimizer_grads, value_and_grad

    resolve_layout(args, world)
    dp, cp, tp = args.dp, args.cp, args.tp
    mesh = init_device_mesh("CPU", (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
    if tp > 1:
        hp.parallelize_module(net, mesh["tp"], llama_tp_plan(False, hp, Replicate, Shard))
    fsdp = mesh["dp", "cp"]._flatten("dp_cp") if dp > 1 else mesh["cp"]
    for layer in net.model.layers:
        fully_shard(layer, mesh=fsdp)
    fully_shard(net, mesh=fsdp)
    opt = nn.Adam(net.trainable_params(), learning_rate=args.lr, weight_decay=args.weight_decay)

    def loss_fn(x: Any, y: Any, p: Any) -> Any:  # this rank's tokens
        logits = net(x, p)
        if tp == 1:
            return ops.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        target = DTensor.from_local(y.reshape(-1), mesh["tp"], [Replicate()])
        with hp.loss_parallel():
            return ops.cross_entropy(logits.reshape(-1, VOCAB), target)

    grad_fn = value_and_grad(loss_fn, None, opt.parameters)
    group, plat = fsdp._group(0), fsdp.platform
    b = args.batch // dp
    coord = mesh.get_local_rank("dp")
    pos = np.arange(args.seq, dtype=np.int32)[None]
    losses, times = [], []
    bar = tqdm(total=args.steps, desc=f"CP x{cp} ({world} ranks)", unit="step", disable=rank != 0)
    for x, y in batches(data, args.steps, args.batch, args.seq, args.seed + 1):
        t0 = time.perf_counter()
        sl = slice(coord * b, (coord + 1) * b)
        xs, ys, ps = Tensor(x[sl]), Tensor(y[sl]), Tensor(pos)
        with context_parallel(mesh["cp"], buffers=[xs, ys, ps], buffer_seq_dims=[1, 1, 1]):
            loss, grads = grad_fn(xs, ys, ps)
        opt(optimizer_grads(grads, opt.parameters))
        local = loss.to_local() if isinstance(loss, DTensor) else loss
        # the mean over the dp x cp ranks (equal token counts: the batch mean)
        value = float(plat.all_reduce(local, "avg", group).asnumpy())
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    return {"losses": losses, "times": times}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(ap, OUT_DIR)
    ap.add_argument("--tie", action="store_true", help="share the embedding with the LM head")
    ap.add_argument("--dp", type=int, default=None, help="FSDP ranks (default 1: tensor parallel)")
    ap.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel ranks (default: the rest)"
    )
    args = ap.parse_args(argv)
    if args.compile:
        ap.error(
            "--compile is torch.compile (examples/train_llama_tp.py); the MindSpore job runs "
            "in PyNative mode: mindspore.jit over DTensors is refused (docs/mindspore.md)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    moe_defaults(args)  # --ep N alone: N data-parallel ranks
    if args.dp is not None and args.tp is not None:
        args.nproc = args.dp * args.tp * (args.cp or 1)
    elif args.cp and args.cp > 1:  # --cp N [--dp M | --tp M]: the ranks they take
        args.nproc = args.cp * (args.dp or 1) * (args.tp or 1)
    elif args.dp is not None:
        args.nproc = args.dp * (args.cp or 1)
    validate(args, args.nproc)
    from hyper_shard.platform.mindspore.launch import spawn

    data = load_data()  # read once here, shared with the ranks
    t0 = time.perf_counter()
    tp = spawn(train, args.nproc, args, data, True, timeout=3600)[0]
    wall = time.perf_counter() - t0
    single = spawn(train, 1, args, data, False, timeout=3600)[0]
    title = "MindSpore Llama" + (" (tied head)" if args.tie else "")
    return report(args, args.nproc, tp, single, wall, title=title, stem="mindspore_llama_tp")


if __name__ == "__main__":
    sys.exit(main())
