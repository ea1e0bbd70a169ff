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

``--dp N`` adds fully sharded data parallelism (``hyper_shard.fsdp.fully_shard``, the
PyTorch FSDP2 API) on a ``("dp", "tp")`` mesh: each decoder layer and then the root is one
FSDP unit on ``mesh["dp"]``, the tensor-parallel plan runs on ``mesh["tp"]``, every dp rank
trains on its slice of each batch, and parameters, gradients and AdamW state are sharded
over dp too (2-D DTensors on the whole mesh).

The same model is also trained in one process from the same seed on the same batches;
the losses are printed side by side and plotted.

``--save DIR`` writes the model, the AdamW state and the step count with
``hyper_shard.checkpoint`` after the last step; ``--resume DIR`` loads them into this run's
layout (any number of ranks) and trains the remaining steps up to ``--steps``: its losses
are compared with the single-process run's at the same steps.

    python examples/train_llama_tp.py                 # spawns 2 CPU ranks (gloo, 127.0.0.1)
    python examples/train_llama_tp.py --check         # fail if a loss differs by > 1e-4 (rel)
    python examples/train_llama_tp.py --sp --steps 50 # sequence parallel too
    python examples/train_llama_tp.py --dp 2 --tp 2 --check   # FSDP x TP on 4 CPU ranks
    python examples/train_llama_tp.py --dp 2 --tp 1   # FSDP alone on 2 ranks
    python examples/train_llama_tp.py --steps 100 --save ckpt              # checkpoint at the end
    python examples/train_llama_tp.py --steps 200 --resume ckpt --nproc 4  # go on, on 4 ranks
    torchrun --nproc-per-node 2 examples/train_llama_tp.py   # NCCL on GPUs, HCCL on Ascend
"""

from __future__ import annotations

import argparse
import ast
import os
import socket
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

OUT_DIR = Path(__file__).resolve().parent / "out"
VOCAB = 256  # byte-level


# ---------------------------------------------------------------------------- data
def stdlib_text(max_bytes: int = 1 << 18) -> bytes:
    """English prose from the standard library: the module, class and function docstrings
    of ``<stdlib>/*.py`` in sorted file order (deterministic for a Python install), read
    with ``ast`` (nothing is imported or downloaded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 64:
                    parts.append(doc)
                    total += len(doc) + 2
        if total >= max_bytes:
            break
    return "\n\n".join(parts).encode("utf-8")[:max_bytes]


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
    """``LlamaForCausalLM`` with a tiny config, randomly initialised from ``args.seed``."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(cfg)


def llama_tp_plan(sp: bool, styles: Any, Replicate: Any, Shard: Any) -> dict[str, Any]:
    """The tensor-parallel plan of ``LlamaForCausalLM``.

    ``styles`` is a module (or namespace) with ``ColwiseParallel``, ``RowwiseParallel``,
    ``SequenceParallel`` and ``PrepareModuleInput``: ``hyper_shard.parallel`` here,
    ``torch.distributed.tensor.parallel`` in ``benchmarks/bench_tp_step.py`` (same plan).
    Attention runs on each rank's heads as plain local tensors (rotary embedding, GQA and
    ``sdpa`` need no sharding rule); the logits stay a ``Shard(-1)`` DTensor for
    ``loss_parallel``.
    """
    col, row = styles.ColwiseParallel, styles.RowwiseParallel
    layer = "model.layers.*."
    plan: dict[str, Any] = {
        layer + "self_attn.q_proj": col(),
        layer + "self_attn.k_proj": col(),
        layer + "self_attn.v_proj": col(),
        layer + "mlp.gate_proj": col(),
        layer + "mlp.up_proj": col(),
    }
    if not sp:
        plan.update(
            {
                "model.embed_tokens": row(input_layouts=Replicate()),
                layer + "self_attn.o_proj": row(),
                layer + "mlp.down_proj": row(),
                "lm_head": col(output_layouts=Shard(-1), use_local_output=False),
            }
        )
        return plan
    seq, prep = styles.SequenceParallel, styles.PrepareModuleInput
    plan.update(
        {
            # the residual stream is each rank's sequence shard (plain local tensors)
            "model.embed_tokens": row(input_layouts=Replicate(), output_layouts=Shard(1)),
            layer + "input_layernorm": seq(),
            # attention and MLP get the gathered sequence as a Replicate DTensor: the
            # backward of the all-gather is then one reduce-scatter of q/k/v's (gate/up's)
            # summed input gradient
            layer + "self_attn": prep(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            layer + "self_attn.o_proj": row(output_layouts=Shard(1)),
            layer + "post_attention_layernorm": seq(),
            layer + "mlp": prep(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            layer + "mlp.down_proj": row(output_layouts=Shard(1)),
            "model.norm": seq(use_local_output=True),
            "lm_head": col(
                input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
            ),
        }
    )
    return plan


# ---------------------------------------------------------------------------- training
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def parallelize(args: argparse.Namespace, model: torch.nn.Module, device: torch.device) -> Any:
    """Tensor parallelism on ``mesh["tp"]`` (when ``--tp`` > 1), then FSDP units on
    ``mesh["dp"]`` (each decoder layer, then the root; when ``--dp`` > 1). Returns the
    mesh: ``("tp",)`` alone, else ``("dp", "tp")``."""
    from hyper_shard import Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    if args.dp == 1:
        mesh = init_device_mesh(device.type, (args.tp,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh(device.type, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    if args.tp > 1:
        hp.parallelize_module(model, mesh["tp"], llama_tp_plan(args.sp, hp, Replicate, Shard))
    if args.dp > 1:
        from hyper_shard.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return mesh


def mode_name(args: argparse.Namespace) -> str:
    """``TP``, ``FSDP`` or ``FSDPxTP`` (for the progress bar, the table and the plot)."""
    if args.dp == 1:
        return "TP"
    return "FSDP" if args.tp == 1 else "FSDPxTP"


def train_tp(args: argparse.Namespace, data: torch.Tensor, device: torch.device) -> dict:
    """Train with tensor parallelism (and FSDP with ``--dp``) over all ranks; every rank
    returns the losses (the mean over the data-parallel ranks)."""
    from tqdm import tqdm

    from hyper_shard import DTensor, Replicate
    from hyper_shard import parallel as hp

    rank, world = dist.get_rank(), dist.get_world_size()
    resolve_layout(args, world)
    model = build_model(args).to(device)
    mesh = parallelize(args, model, device)
    dp_rank = mesh.get_local_rank("dp") if args.dp > 1 else 0
    dp_group = mesh.get_group("dp") if args.dp > 1 else None
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
        logits = model(input_ids=x, position_ids=pos).logits  # DTensor [b, s, V], Shard(-1)
        if args.tp > 1:
            target = DTensor.from_local(y.flatten(), mesh["tp"], [Replicate()])
            with hp.loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), target)
                loss.backward()
            local = loss.detach().full_tensor()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            local = loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dp_group is not None:  # the mean over the dp ranks (equal slices: the batch mean)
            local = local.clone()
            dist.all_reduce(local, group=dp_group)
            local /= args.dp
        value = local.item()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(value)
        bar.set_postfix(loss=f"{value:.4f}")
        bar.update()
    bar.close()
    save(args, model, opt)
    return {"losses": losses, "times": times, "start": start}


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
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    pos = torch.arange(args.seq, device=device)[None]
    losses, times = [], []
    bar = tqdm(total=args.steps, desc="single device", unit="step")
    for x, y in batches(data, args.steps, args.batch, args.seq, args.seed + 1):
        x, y = x.to(device), y.to(device)
        sync(device)
        t0 = time.perf_counter()
        logits = model(input_ids=x, position_ids=pos).logits
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


# ---------------------------------------------------------------------------- report
def report(args: argparse.Namespace, world: int, tp: dict, single: dict, wall: float) -> int:
    """Print the table and summary, write the plot; return the exit code."""
    tok = args.batch * args.seq
    start = tp.get("start", 0)  # --resume: the TP run covers steps start.. only
    single = {k: v[start:] for k, v in single.items()}
    n = len(tp["losses"])
    every = max(1, args.table_every or n // 12)
    rows = sorted(set(range(0, n, every)) | {n - 1})
    name = mode_name(args)
    wl, wt = max(10, len(name) + 5), max(9, len(name) + 6)  # column widths
    print(
        f"\n{'step':>5} {name + ' loss':>{wl}} {'single loss':>12} {'rel diff':>9} "
        f"{name + ' tok/s':>{wt}} {'single tok/s':>13}"
    )
    worst, worst_step = 0.0, 0
    for i, (a, b) in enumerate(zip(tp["losses"], single["losses"])):
        rel = abs(a - b) / max(abs(b), 1e-12)
        if rel > worst:
            worst, worst_step = rel, i
    for i in rows:
        a, b = tp["losses"][i], single["losses"][i]
        rel = abs(a - b) / max(abs(b), 1e-12)
        print(
            f"{start + i:>5} {a:>{wl}.5f} {b:>12.5f} {rel:>9.1e} {tok / tp['times'][i]:>{wt}.0f} "
            f"{tok / single['times'][i]:>13.0f}"
        )
    steady = slice(1, None) if n > 1 else slice(None)
    tp_rate = tok * len(tp["times"][steady]) / sum(tp["times"][steady])
    one_rate = tok * len(single["times"][steady]) / sum(single["times"][steady])
    sp = " + sequence parallel" if args.sp else ""
    resumed = f" (resumed at step {start} from {args.resume})" if start else ""
    print(
        f"\nLlama {args.layers}x{args.hidden} (ffn {args.ffn}, {args.heads} heads / "
        f"{args.kv_heads} kv), batch {args.batch}x{args.seq} bytes, {n} steps{resumed}, "
        f"{layout_text(args)}{sp}"
    )
    tail = tp["losses"][-10:]
    print(
        f"loss {tp['losses'][0]:.4f} -> {tp['losses'][-1]:.4f} (mean of the last {len(tail)} "
        f"steps {sum(tail) / len(tail):.4f}); max relative loss difference {name} vs single "
        f"device {worst:.2e} (step {start + worst_step})"
    )
    print(
        f"throughput (steps 1..): {name} {tp_rate:.0f} tok/s, single device {one_rate:.0f} tok/s; "
        f"wall time {wall:.1f}s"
    )
    plot = write_plot(args, world, tp, single)
    if plot is not None:
        print(f"loss curves: {plot}")
    if args.check:
        if worst > args.rtol:
            print(
                f"--check FAILED: step {start + worst_step} {name} loss "
                f"{tp['losses'][worst_step]:.6f} vs "
                f"single-device {single['losses'][worst_step]:.6f} (relative {worst:.2e} > "
                f"{args.rtol:.0e})"
            )
            return 1
        print(f"--check passed: every step within {args.rtol:.0e} relative")
    return 0


def write_plot(args: argparse.Namespace, world: int, tp: dict, single: dict) -> Path | None:
    if args.no_plot:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out_dir.mkdir(parents=True, exist_ok=True)
    dp = f"_dp{args.dp}" if args.dp > 1 else ""
    path = args.out_dir / f"train_llama_tp{dp}{'_sp' if args.sp else ''}_loss.png"
    start = tp.get("start", 0)
    steps = range(start, start + len(tp["losses"]))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, single["losses"], label="single device", linewidth=3, alpha=0.45)
    ax.plot(steps, tp["losses"], label=layout_text(args), linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    sp = " + SP" if args.sp else ""
    ax.set_title(
        f"LlamaForCausalLM {args.layers}x{args.hidden}, byte-level stdlib docstrings "
        f"({mode_name(args)}{sp})"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- launch
def resolve_layout(args: argparse.Namespace, world: int) -> None:
    """Set ``args.dp`` and ``args.tp`` for ``world`` ranks: both given (their product must
    be ``world``), one given (the other fills the world), or none (tensor parallelism over
    every rank, the default).

    Raises:
        SystemExit: sizes that do not multiply to ``world``.
    """
    dp, tp = args.dp, args.tp
    if dp is None and tp is None:
        dp, tp = 1, world
    elif dp is None:
        dp = world // tp if tp and world % tp == 0 else 0
    elif tp is None:
        tp = world // dp if dp and world % dp == 0 else 0
    if dp < 1 or tp < 1 or dp * tp != world:
        raise SystemExit(
            f"--dp {args.dp} x --tp {args.tp} does not fill {world} ranks; choose sizes whose "
            f"product is the number of ranks (--nproc, or torchrun's world size)"
        )
    args.dp, args.tp = dp, tp


def layout_text(args: argparse.Namespace) -> str:
    """``TP over 2 ranks`` / ``FSDP over 2 ranks`` / ``FSDP (dp 2) x TP (tp 2) over 4 ranks``."""
    if args.dp == 1:
        return f"TP over {args.tp} ranks"
    if args.tp == 1:
        return f"FSDP over {args.dp} ranks"
    return f"FSDP (dp {args.dp}) x TP (tp {args.tp}) over {args.dp * args.tp} ranks"


def validate(args: argparse.Namespace, world: int) -> None:
    """Exit with a message if the config cannot be split over ``world`` ranks."""
    resolve_layout(args, world)
    tp = args.tp
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise SystemExit(
            f"--hidden {args.hidden} must be a multiple of --heads {args.heads}, and --heads a "
            f"multiple of --kv-heads {args.kv_heads}"
        )
    for name, n in (("--heads", args.heads), ("--kv-heads", args.kv_heads), ("--ffn", args.ffn)):
        if n % tp:
            raise SystemExit(f"{name} {n} must be divisible by the tensor-parallel size {tp}")
    if args.sp and args.seq % tp:
        raise SystemExit(f"--seq {args.seq} must be divisible by {tp} ranks with --sp")
    if args.batch % args.dp:
        raise SystemExit(f"--batch {args.batch} must be divisible by --dp {args.dp}")


def load_data() -> torch.Tensor:
    """The corpus as a 1-D tensor of byte values (int64).

    Raises:
        SystemExit: the Python install ships no standard-library sources to read.
    """
    text = stdlib_text()
    if len(text) < 4096:
        raise SystemExit(
            f"found only {len(text)} bytes of docstrings under {sysconfig.get_paths()['stdlib']}; "
            f"this Python install ships no standard-library .py sources"
        )
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
    ap.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    ap.add_argument("--seq", type=int, default=64, help="bytes per sequence (default 64)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    ap.add_argument("--ffn", type=int, default=384, help="MLP intermediate size (default 384)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2, GQA)")
    ap.add_argument("--lr", type=float, default=7e-4, help="AdamW learning rate (default 7e-4)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    ap.add_argument("--seed", type=int, default=0, help="init seed; batches use seed + 1")
    ap.add_argument("--sp", action="store_true", help="sequence parallel on the norms too")
    # checkpoints (hyper_shard.checkpoint): resume on any number of ranks
    ap.add_argument(
        "--save", type=Path, default=None, help="save model+AdamW+step to DIR at the end"
    )
    ap.add_argument(
        "--resume", type=Path, default=None, help="go on from a --save DIR (any layout)"
    )
    ap.add_argument("--nproc", type=int, default=2, help="CPU ranks to spawn (default 2)")
    ap.add_argument(
        "--dp", type=int, default=None, help="FSDP ranks (default 1; --dp x --tp ranks)"
    )
    ap.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel ranks (default: the rest)"
    )
    ap.add_argument("--check", action="store_true", help="fail if a loss differs by > --rtol")
    ap.add_argument("--rtol", type=float, default=1e-4, help="--check tolerance (default 1e-4)")
    ap.add_argument("--table-every", type=int, default=0, help="table row interval (0: ~12 rows)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    ap.add_argument(
        "--out-dir", type=Path, default=OUT_DIR, help=f"where the plot goes (default {OUT_DIR})"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        device, backend = _launcher_device()
        if device.type == "cpu":
            torch.set_num_threads(1)
        dist.init_process_group(backend)
        sys.exit(run(args, device))
    if args.dp is not None and args.tp is not None:
        args.nproc = args.dp * args.tp
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
