"""Train a Hugging Face Llama with tensor parallelism on hyper_shard DTensors.

The model is ``transformers.LlamaForCausalLM`` with a tiny config built here (random init,
nothing downloaded, ``sdpa`` attention), trained byte-level (vocabulary: the 256 byte
values) on real English text that ships with every Python install: the docstrings of the
standard library's modules, read from their source files in sorted order.

Tensor parallelism (``hyper_shard.parallel``, the ``torch.distributed.tensor.parallel``
API): q/k/v and gate/up projections column-parallel, o/down projections row-parallel, the
token embedding vocab-parallel (row-wise) and the LM head column-parallel with its
class-sharded logits fed to ``loss_parallel()`` (cross-entropy without gathering the
vocabulary). ``--sp`` adds sequence parallelism: the RMSNorms run on sequence shards and
the row-parallel outputs are reduce-scattered over the sequence.

The same model is also trained in one process from the same seed on the same batches;
the losses are printed side by side and plotted.

``--dp N`` adds fully sharded data parallelism (``hyper_shard.fsdp.fully_shard``, the
PyTorch FSDP2 API) on a ``("dp", "tp")`` mesh: each decoder layer and then the root is one
FSDP unit on ``mesh["dp"]``, the tensor-parallel plan runs on ``mesh["tp"]``, every dp rank
trains on its slice of each batch, and parameters, gradients and AdamW state are sharded
over dp too (2-D DTensors on the whole mesh).

``--cp N`` adds context parallelism (``hyper_shard.experimental.context_parallel``, the
PyTorch API) on a ``("dp", "cp", "tp")`` mesh: each step's token ids, labels and position
ids are sharded along the sequence over ``mesh["cp"]`` (head-tail load-balanced where
``2 N`` divides ``--seq``), and the model's ``scaled_dot_product_attention`` runs as
context-parallel attention over the whole sequence (ring, all-to-all or all-gather, as
hyper_shard's cost model picks); FSDP units then span ``dp x cp`` (the mean over both).
Hugging Face reads position ids with a jump (the head-tail pieces) as packed sequences
and would build a mask; an all-ones ``attention_mask`` tells it there is no packing.

``--save DIR`` writes the model, the AdamW state and the step count with
``hyper_shard.checkpoint`` after the last step; ``--resume DIR`` loads them into this run's
layout (any number of ranks) and trains the remaining steps up to ``--steps``: its losses
are compared with the single-process run's at the same steps.

    python examples/train_llama_tp.py                 # spawns 2 CPU ranks (gloo, 127.0.0.1)
    python examples/train_llama_tp.py --dp 2 --tp 2 --check   # FSDP x TP on 4 CPU ranks
    python examples/train_llama_tp.py --dp 2 --tp 1   # FSDP alone on 2 ranks
    python examples/train_llama_tp.py --check         # fail if a loss differs by > 1e-4 (rel)
    python examples/train_llama_tp.py --sp --steps 50 # sequence parallel too
    python examples/train_llama_tp.py --cp 2 --tp 2 --check  # CP x TP on 4 CPU ranks
    python examples/train_llama_tp.py --steps 100 --save ckpt              # checkpoint at the end
    python examples/train_llama_tp.py --steps 200 --resume ckpt --nproc 4  # go on, on 4 ranks
    torchrun --nproc-per-node 2 examples/train_llama_tp.py   # NCCL on GPUs, HCCL on Ascend

``--moe E`` trains ``MixtralForCausalLM`` instead (the same sizes, every MLP a mixture of
``E`` experts of ``--ffn`` each, ``--topk K`` per token, default 2); ``--ep N`` shards the
experts over ``N`` of the data-parallel ranks (``hyper_shard.parallel.ExpertParallel``; the
other parameters FSDP over every data-parallel rank; with ``--tp`` the experts are split
by ``ExpertTensorParallel`` too; examples/moe_common.py has the layout):

    python examples/train_llama_tp.py --moe 4 --ep 2 --check            # EP on 2 ranks
    python examples/train_llama_tp.py --moe 4 --ep 2 --dp 4 --check     # EP x FSDP on 4
    python examples/train_llama_tp.py --moe 4 --ep 2 --tp 2 --check     # EP x TP on 4
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_common import (  # noqa: E402  (the examples directory first on the path)
    add_common_args,
    corpus_bytes,
    llama_config_kwargs,
    llama_tp_plan,
    mode_name,
    report,
    resolve_layout,
    validate,
)
from moe_common import moe_defaults, parallelize_moe  # noqa: E402

__all__ = ["build_model", "llama_tp_plan", "load_data", "train_tp", "train_single", "report"]

OUT_DIR = Path(__file__).resolve().parent / "out"
VOCAB = 256  # byte-level


# ---------------------------------------------------------------------------- data
def batches(
    data: torch.Tensor, steps: int, batch: int, seq: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``batch`` random windows of ``seq + 1`` bytes: (inputs, targets
    shifted by one). The same seed gives the same batches in every process."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - seq - 1, (steps, batch), generator=g)
    offs = torch.arange(seq + 1)
    for s in starts:
        w = data[s[:, None] + offs]
        yield w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------- model and plan
def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """``LlamaForCausalLM`` with a tiny config, randomly initialised from ``args.seed``
    (``MixtralForCausalLM``, Llama with a mixture of ``--moe`` experts, with ``--moe``)."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    if getattr(args, "moe", 0):
        from transformers import MixtralConfig, MixtralForCausalLM

        moe = MixtralConfig(
            **llama_config_kwargs(args, VOCAB), num_local_experts=args.moe,
            num_experts_per_tok=args.topk, router_jitter_noise=0.0,
            tie_word_embeddings=False, attn_implementation="sdpa",
        )  # fmt: skip
        torch.manual_seed(args.seed)
        return MixtralForCausalLM(moe)
    cfg = LlamaConfig(
        **llama_config_kwargs(args, VOCAB), tie_word_embeddings=False, attn_implementation="sdpa"
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(cfg)


# ---------------------------------------------------------------------------- training
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def parallelize(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> Any:
    """Tensor parallelism on ``mesh["tp"]`` (when ``--tp`` > 1), then FSDP units on
    ``mesh["dp"]`` (each decoder layer, then the root; when ``--dp`` > 1). Returns the
    mesh: ``("tp",)`` alone, else ``("dp", "tp")``; ``("dp", "cp", "tp")`` with ``--cp``
    (FSDP units then on ``dp x cp``)."""
    from hyper_shard import Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    if getattr(args, "moe", 0):  # experts, FSDP and TP: examples/moe_common.py
        return parallelize_moe(args, model, device.type)
    args.cp = getattr(args, "cp", None) or 1  # a caller's own Namespace may not have it
    if args.cp > 1:  # ("dp", "cp", "tp"); FSDP over dp x cp (each rank a share of the tokens)
        dims = (args.dp, args.cp, args.tp)
        mesh = init_device_mesh(device.type, dims, mesh_dim_names=("dp", "cp", "tp"))
        fsdp = mesh["dp", "cp"]._flatten("dp_cp") if args.dp > 1 else mesh["cp"]
    elif args.dp == 1:
        mesh = init_device_mesh(device.type, (args.tp,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh(device.type, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    if args.cp == 1 and args.dp > 1:
        fsdp = mesh["dp"]
    if args.tp > 1:
        hp.parallelize_module(model, mesh["tp"], llama_tp_plan(args.sp, hp, Replicate, Shard))
    if args.dp * args.cp > 1:
        from hyper_shard.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=fsdp)
        fully_shard(model, mesh=fsdp)
    return mesh


def compiled(args: argparse.Namespace, model: torch.nn.Module) -> Any:
    """``--compile``: the whole model under ``torch.compile`` (TP: one graph, collectives
    inside it), or each decoder layer when FSDP units hold them (FSDP's hooks run eagerly
    around each compiled layer, as torchtitan applies compile per block) or with ``--cp``
    (traced, transformers builds an explicit causal mask, which context parallelism does
    not take; eager, it passes none and attention runs ``is_causal=True``)."""
    if not args.compile:
        return model
    if getattr(args, "dp", 1) > 1 or getattr(args, "cp", 1) > 1:
        for layer in model.model.layers:
            layer.compile(backend=args.compile)
        return model
    return torch.compile(model, backend=args.compile)


def train_tp(args: argparse.Namespace, data: torch.Tensor, device: torch.device) -> dict:
    """Train with tensor parallelism (and FSDP with ``--dp``) over all ranks; every rank
    returns the losses (the mean over the data-parallel ranks)."""
    from tqdm import tqdm

    rank, world = dist.get_rank(), dist.get_world_size()
    resolve_layout(args, world)
    model = build_model(args).to(device)
    mesh = parallelize(args, model, device)
    args.cp = getattr(args, "cp", None) or 1
    fwd = compiled(args, model)
    dp_rank = mesh["dp"].get_local_rank() if args.dp > 1 else 0
    dp_group = mesh["dp"].get_group() if args.dp > 1 else None
    if args.cp > 1:  # the loss mean over every rank holding other tokens
        dp_group = (mesh["dp_cp"] if args.dp > 1 else mesh["cp"]).get_group()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    start = resume(args, model, opt)
    pos = torch.arange(args.seq, device=device)[None]  # global positions (needed under --sp)
    losses, times = [], []
    desc = f"{mode_name(args)} x{world}"
    bar = tqdm(total=args.steps - start, desc=desc, unit="step", disable=rank != 0)
    for i, (x, y) in enumerate(batches(data, args.steps, args.batch, args.seq, args.seed + 1)):
        if i < start:
            continue  # the batches of the steps the checkpoint has done
        x, y = x.chunk(args.dp)[dp_rank].to(device), y.chunk(args.dp)[dp_rank].to(device)
        sync(device)
        t0 = time.perf_counter()
        if args.cp > 1:
            local = cp_step(args, mesh, fwd, x, y, pos)
        else:
            local = tp_step(args, mesh, fwd, x, y, pos)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dp_group is not None:  # the mean over the dp (x cp) ranks: equal token counts
            local = local.clone()
            dist.all_reduce(local, group=dp_group)
            local /= args.dp * args.cp
        value = local.item()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    save(args, model, opt)
    return {"losses": losses, "times": times, "start": start}


def tp_step(
    args: argparse.Namespace,
    mesh: Any,
    fwd: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    pos: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward and backward of one batch (with ``--tp``: ``loss_parallel`` on the
    class-sharded logits); returns this rank's loss."""
    from hyper_shard import DTensor, Replicate
    from hyper_shard import parallel as hp

    logits = fwd(input_ids=x, position_ids=pos, attention_mask=mask).logits  # [b, s, V]
    if args.tp > 1:  # logits: a DTensor, Shard(-1)
        target = DTensor.from_local(y.flatten(), mesh["tp"], [Replicate()])
        with hp.loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), target)
            loss.backward()
        return loss.detach().full_tensor()
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    return loss.detach()


def cp_step(
    args: argparse.Namespace, mesh: Any, fwd: Any, x: torch.Tensor, y: torch.Tensor, pos: Any
) -> torch.Tensor:
    """Forward and backward of one batch with context parallelism: ids, labels and
    position ids sharded along the sequence on ``mesh["cp"]`` (the model's attention runs
    context-parallel inside the block); returns this rank's loss (the mean over its
    tokens)."""
    from hyper_shard.experimental import context_parallel

    x, y, p = x.clone(), y.clone(), pos.clone()  # the buffers are resized in place
    with context_parallel(mesh["cp"], buffers=[x, y, p], buffer_seq_dims=[1, 1, 1]):
        # an all-ones mask: position ids with a jump are not packed sequences
        return tp_step(args, mesh, fwd, x, y, p, torch.ones_like(x))


def resume(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Load ``--resume DIR`` (model, AdamW state, step) into this run's layout, whatever
    layout saved it; return the step to go on from (0 without ``--resume``)."""
    if args.resume is None:
        return 0
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import hyper_shard.checkpoint as hc

    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 0}
    hc.load(state, args.resume)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if not 0 <= state["step"] < args.steps:
        raise SystemExit(
            f"--resume {args.resume}: the checkpoint is at step {state['step']}; pass --steps "
            f"greater than that"
        )
    return int(state["step"])


def save(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """``--save DIR``: the model, the AdamW state and the step count, each rank writing its
    own shards once (hyper_shard.checkpoint; loads on any layout)."""
    if args.save is None:
        return
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import hyper_shard.checkpoint as hc

    msd, osd = get_state_dict(model, opt)
    hc.save({"model": msd, "optim": osd, "step": args.steps}, args.save)


def train_single(args: argparse.Namespace, data: torch.Tensor, device: torch.device) -> dict:
    """The same model, seed, batches and optimizer in one process (the reference)."""
    from tqdm import tqdm

    model = build_model(args).to(device)
    fwd = torch.compile(model, backend=args.compile) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    pos = torch.arange(args.seq, device=device)[None]
    losses, times = [], []
    bar = tqdm(total=args.steps, desc="single device", unit="step")
    for x, y in batches(data, args.steps, args.batch, args.seq, args.seed + 1):
        x, y = x.to(device), y.to(device)
        sync(device)
        t0 = time.perf_counter()
        logits = fwd(input_ids=x, position_ids=pos).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    return {"losses": losses, "times": times}


# ---------------------------------------------------------------------------- launch
def load_data() -> torch.Tensor:
    """The corpus as a 1-D tensor of byte values (int64).

    Raises:
        SystemExit: the Python install ships no standard-library sources to read
            (:func:`llama_common.corpus_bytes`).
    """
    text = corpus_bytes()
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def run(args: argparse.Namespace, device: torch.device, data: torch.Tensor | None = None) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    validate(args, world)
    if data is None:
        data = load_data()
    t0 = time.perf_counter()
    tp = train_tp(args, data, device)
    wall = time.perf_counter() - t0
    dist.destroy_process_group()
    if rank != 0:
        return 0
    single = train_single(args, data, device)
    if getattr(args, "moe", 0):
        return report(args, world, tp, single, wall, title="MixtralForCausalLM", stem="train_moe")
    return report(args, world, tp, single, wall)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, data: torch.Tensor) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    code = run(args, torch.device("cpu"), data)
    if code:
        sys.exit(code)


def _launcher_device() -> tuple[torch.device, str]:
    """The device and backend under torchrun: CUDA/NCCL, Ascend/HCCL (torch_npu), else
    CPU/gloo."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 losses comparable to 1e-4
        torch.backends.cudnn.allow_tf32 = False
        return torch.device("cuda", local), "nccl"
    try:
        import torch_npu  # noqa: F401

        if torch.npu.is_available():  # type: ignore[attr-defined]
            torch.npu.set_device(local)  # type: ignore[attr-defined]
            return torch.device("npu", local), "hccl"
    except ImportError:
        pass
    return torch.device("cpu"), "gloo"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(ap, OUT_DIR)
    # checkpoints (hyper_shard.checkpoint): resume on any number of ranks
    ap.add_argument(
        "--save", type=Path, default=None, help="save model+AdamW+step to DIR at the end"
    )
    ap.add_argument(
        "--resume", type=Path, default=None, help="go on from a --save DIR (any layout)"
    )
    # FSDP (hyper_shard.fsdp.fully_shard) x TP on a ("dp", "tp") mesh
    ap.add_argument(
        "--dp", type=int, default=None, help="FSDP ranks (default 1; --dp x --tp ranks)"
    )
    ap.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel ranks (default: the rest)"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    moe_defaults(args)  # --ep N alone: N data-parallel ranks
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        device, backend = _launcher_device()
        if device.type == "cpu":
            torch.set_num_threads(1)
        dist.init_process_group(backend)
        sys.exit(run(args, device))
    if args.dp is not None and args.tp is not None:
        args.nproc = args.dp * args.tp * (args.cp or 1)
    elif args.cp and args.cp > 1:  # --cp N [--dp M | --tp M]: the ranks they take
        args.nproc = args.cp * (args.dp or 1) * (args.tp or 1)
    elif args.dp is not None and args.ep > 1:
        args.nproc = args.dp
    validate(args, args.nproc)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        data = load_data()  # read once here, shared with the ranks
        mp.spawn(_worker, args=(args.nproc, port, args, data), nprocs=args.nproc)
    except mp.ProcessExitedException as e:  # rank 0 exits 1 when --check fails
        sys.exit(e.exit_code or 1)


if __name__ == "__main__":
    main()
