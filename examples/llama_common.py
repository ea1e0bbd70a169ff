"""What the two Llama tensor-parallel jobs share: the corpus, the tensor-parallel plan, the
command-line flags, the config check and the report (loss table, summary, loss plot).

``examples/train_llama_tp.py`` (PyTorch, Hugging Face ``LlamaForCausalLM``) and
``examples/mindspore_llama_tp.py`` (MindSpore, a Llama decoder built from ``mint.nn``
Cells with the same module names) import it; nothing here imports a framework.
"""

from __future__ import annotations

import argparse
import ast
import sysconfig
from pathlib import Path
from typing import Any

from moe_common import add_moe_args, moe_text, validate_moe

__all__ = [
    "stdlib_text",
    "corpus_bytes",
    "llama_tp_plan",
    "llama_config_kwargs",
    "add_common_args",
    "resolve_layout",
    "mode_name",
    "layout_text",
    "validate",
    "report",
    "write_plot",
]


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


# ---------------------------------------------------------------------------- plan
def corpus_bytes() -> bytes:
    """:func:`stdlib_text`, checked to be long enough to train on.

    Raises:
        SystemExit: the Python install ships no standard-library sources to read.
    """
    text = stdlib_text()
    if len(text) < 4096:
        raise SystemExit(
            f"found only {len(text)} bytes of docstrings under {sysconfig.get_paths()['stdlib']}; "
            f"this Python install ships no standard-library .py sources"
        )
    return text


def llama_config_kwargs(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """The Llama config both jobs build from the shared flags (Hugging Face
    ``LlamaConfig`` argument names; the MindSpore model's config takes the same)."""
    return {
        "vocab_size": vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.ffn,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": args.seq,
        "rms_norm_eps": 1e-5,
    }


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


# ---------------------------------------------------------------------------- flags
def add_common_args(ap: argparse.ArgumentParser, out_dir: Path) -> None:
    """The flags both jobs take (model size, batch, optimizer, --sp, --check, report)."""
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
    ap.add_argument("--nproc", type=int, default=2, help="CPU ranks to spawn (default 2)")
    ap.add_argument(
        "--cp", type=int, default=None, help="context-parallel ranks (sequence sharded; default 1)"
    )
    ap.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="torch.compile the model (both runs; default backend inductor, e.g. aot_eager)",
    )
    ap.add_argument("--check", action="store_true", help="fail if a loss differs by > --rtol")
    ap.add_argument("--rtol", type=float, default=1e-4, help="--check tolerance (default 1e-4)")
    ap.add_argument("--table-every", type=int, default=0, help="table row interval (0: ~12 rows)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    ap.add_argument(
        "--out-dir", type=Path, default=out_dir, help=f"where the plot goes (default {out_dir})"
    )
    add_moe_args(ap)  # --moe E, --topk K, --ep N (examples/moe_common.py)


def resolve_layout(args: argparse.Namespace, world: int) -> None:
    """Set ``args.dp`` and ``args.tp`` for ``world`` ranks: both given (their product must
    be ``world``), one given (the other fills the world), or none (tensor parallelism over
    every rank, the default; a job without ``--dp``/``--tp`` flags gets that).

    Raises:
        SystemExit: sizes that do not multiply to ``world``.
    """
    cp = getattr(args, "cp", None) or 1
    if cp < 1 or world % cp:
        raise SystemExit(f"--cp {cp} does not divide {world} ranks")
    world //= cp  # dp x tp fill the rest (context parallelism: ranks x cp)
    args.cp = cp
    dp, tp = getattr(args, "dp", None), getattr(args, "tp", None)
    given = (dp, tp)
    if dp is None and tp is None:
        dp, tp = 1, world
    elif dp is None:
        dp = world // tp if tp and world % tp == 0 else 0
    elif tp is None:
        tp = world // dp if dp and world % dp == 0 else 0
    if dp < 1 or tp < 1 or dp * tp != world:
        raise SystemExit(
            f"--dp {given[0]} x --tp {given[1]} does not fill {world} ranks; choose sizes whose "
            f"product is the number of ranks (--nproc, or torchrun's world size)"
        )
    args.dp, args.tp = dp, tp


def mode_name(args: argparse.Namespace) -> str:
    """``TP``, ``FSDP`` or ``FSDPxTP``, ``EP...`` with ``--ep`` (for the progress bar, the
    table and the plot); ``CP``, ``CPxTP``, ``FSDPxCP``... with context parallelism."""
    if getattr(args, "ep", 1) > 1:
        return "EP" + ("xFSDP" if args.dp > args.ep else "") + ("xTP" if args.tp > 1 else "")
    if (getattr(args, "cp", None) or 1) > 1:
        parts = [n for n, k in (("FSDP", args.dp), ("CP", args.cp), ("TP", args.tp)) if k > 1]
        return "x".join(parts)
    if getattr(args, "dp", 1) == 1:
        return "TP"
    return "FSDP" if args.tp == 1 else "FSDPxTP"


def layout_text(args: argparse.Namespace) -> str:
    """``TP over 2 ranks`` / ``FSDP over 2 ranks`` / ``FSDP (dp 2) x TP (tp 2) over 4 ranks``
    / ``EP 2 over the 4 data-parallel ranks (FSDP) x TP 2``
    / ``FSDP (dp 1) x CP (cp 2) x TP (tp 2) over 4 ranks``."""
    if getattr(args, "ep", 1) > 1:
        tp = f" x TP {args.tp}" if args.tp > 1 else ""
        return f"EP {args.ep} over the {args.dp} data-parallel ranks (FSDP){tp}"
    if (getattr(args, "cp", None) or 1) > 1:
        n = args.dp * args.cp * args.tp
        return f"FSDP (dp {args.dp}) x CP (cp {args.cp}) x TP (tp {args.tp}) over {n} ranks"
    if args.dp == 1:
        return f"TP over {args.tp} ranks"
    if args.tp == 1:
        return f"FSDP over {args.dp} ranks"
    return f"FSDP (dp {args.dp}) x TP (tp {args.tp}) over {args.dp * args.tp} ranks"


def validate(args: argparse.Namespace, world: int) -> None:
    """Resolve ``--dp``/``--tp`` (:func:`resolve_layout`), then exit with a message if the
    config cannot be split over them."""
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
    if args.cp > 1 and (args.sp or args.seq % args.cp):
        raise SystemExit(
            f"--cp {args.cp}: --seq {args.seq} must be divisible by it, and --sp does not "
            f"combine with it (the sequence is already sharded)"
        )
    if args.batch % args.dp:
        raise SystemExit(f"--batch {args.batch} must be divisible by --dp {args.dp}")
    validate_moe(args)


# ---------------------------------------------------------------------------- report
def report(
    args: argparse.Namespace,
    world: int,
    tp: dict,
    single: dict,
    wall: float,
    *,
    title: str = "LlamaForCausalLM",
    stem: str = "train_llama_tp",
) -> int:
    """Print the table and summary, write the plot (``<out_dir>/<stem>[_sp]_loss.png``,
    titled ``title``); return the exit code (1 when ``--check`` fails)."""
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
    resumed = f" (resumed at step {start} from {getattr(args, 'resume', None)})" if start else ""
    print(
        f"\nLlama {args.layers}x{args.hidden} (ffn {args.ffn}, {args.heads} heads / "
        f"{args.kv_heads} kv){moe_text(args)}, batch {args.batch}x{args.seq} bytes, {n} steps{resumed}, "
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
    plot = write_plot(args, world, tp, single, title=title, stem=stem)
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


def write_plot(
    args: argparse.Namespace,
    world: int,
    tp: dict,
    single: dict,
    *,
    title: str = "LlamaForCausalLM",
    stem: str = "train_llama_tp",
) -> Path | None:
    if args.no_plot:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out_dir.mkdir(parents=True, exist_ok=True)
    dp = f"_dp{args.dp}" if args.dp > 1 else ""
    dp += f"_cp{args.cp}" if (getattr(args, "cp", None) or 1) > 1 else ""
    path = args.out_dir / f"{stem}{dp}{'_sp' if args.sp else ''}_loss.png"
    start = tp.get("start", 0)
    steps = range(start, start + len(tp["losses"]))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, single["losses"], label="single device", linewidth=3, alpha=0.45)
    ax.plot(steps, tp["losses"], label=layout_text(args), linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    sp = " + SP" if args.sp else ""
    ax.set_title(
        f"{title} {args.layers}x{args.hidden}, byte-level stdlib docstrings ({mode_name(args)}{sp})"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
