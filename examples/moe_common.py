"""What the two Llama jobs share for a mixture-of-experts model (``--moe E``): the
flags' defaults and checks, and the layout of expert parallelism (``--ep N``) with FSDP
and tensor parallelism. Nothing here imports a framework (hyper_shard's API only).

Layout. Expert parallelism *borrows the data-parallel ranks*, as torchtitan does: the
``--dp`` data-parallel ranks (each with its own slice of the batch) are the mesh
``("dp_shard", "ep")`` of ``dp / ep`` x ``ep`` ranks; with ``--tp`` every data-parallel
rank is an expert-parallel one (``--ep`` = ``--dp``) and the mesh is ``("dp", "tp")``:

* the experts of every layer (``model.layers.*.mlp.experts``) are sharded over ``"ep"``
  (``ExpertParallel``; ``ExpertTensorParallel`` on ``("dp", "tp")`` when ``--tp`` > 1),
  and, when ``dp / ep`` > 1, ``fully_shard`` over ``"dp_shard"`` (the ranks holding the
  same experts);
* everything else (attention, router, norms, embedding, head) is ``fully_shard`` over all
  the data-parallel ranks (``("dp_shard", "ep")`` flattened, named ``"dp"``), over the
  tensor-parallel plan on ``"tp"`` when ``--tp`` > 1 (the MLP entries dropped: the MoE
  block replaces the MLP);
* when ``dp == ep`` the experts are not an FSDP unit (each expert lives on one rank; its
  gradient is complete after the token exchange's backward): the decoder layers' and the
  root's units leave them out (``ignored_params``).

Why borrow the data-parallel ranks rather than add a separate ``"ep"`` dimension: the
tokens an expert-parallel group exchanges are the data-parallel ranks' own tokens, so
no rank holds a copy of another's batch and no compute is replicated; the non-expert
parameters see the same world as without EP (FSDP over every data-parallel rank).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_moe_args", "moe_defaults", "validate_moe", "parallelize_moe", "moe_text"]


def add_moe_args(ap: argparse.ArgumentParser) -> None:
    """``--moe E``, ``--topk K`` and ``--ep N``."""
    ap.add_argument(
        "--moe", type=int, default=0, metavar="E",
        help="a mixture of E experts in every layer's MLP (default 0: dense)",
    )  # fmt: skip
    ap.add_argument("--topk", type=int, default=2, help="experts per token with --moe (default 2)")
    ap.add_argument(
        "--ep", type=int, default=1,
        help="expert-parallel ranks, borrowed from the data-parallel ones (--moe; default 1)",
    )  # fmt: skip


def moe_defaults(args: argparse.Namespace) -> None:
    """``--ep N`` without ``--dp``: the data-parallel ranks are the expert-parallel ones."""
    if getattr(args, "ep", 1) > 1 and getattr(args, "dp", None) is None:
        args.dp = args.ep


def validate_moe(args: argparse.Namespace) -> None:
    """Exit with a message for a MoE config the layout cannot run.

    Raises:
        SystemExit: ``--ep``/``--topk`` without ``--moe``, ``E`` not divisible by ``--ep``,
            ``--dp`` not a multiple of ``--ep``, ``K`` outside ``1..E``, ``--sp`` or
            ``--cp`` with ``--moe``.
    """
    moe, ep, k = getattr(args, "moe", 0), getattr(args, "ep", 1), getattr(args, "topk", 2)
    if not moe:
        if ep > 1:
            raise SystemExit("--ep needs a mixture-of-experts model: pass --moe E too")
        return
    if ep < 1 or moe % ep:
        raise SystemExit(f"--moe {moe} experts cannot be shared evenly by --ep {ep} ranks")
    if args.dp % ep:
        raise SystemExit(
            f"--ep {ep} borrows the data-parallel ranks: --dp {args.dp} must be a multiple of it"
        )
    if not 1 <= k <= moe:
        raise SystemExit(f"--topk {k} must be between 1 and --moe {moe}")
    if args.sp:
        raise SystemExit(
            "--sp is not available with --moe (the MoE block is not sequence parallel)"
        )
    if (getattr(args, "cp", None) or 1) > 1:
        raise SystemExit(
            "--cp is not available with --moe (the MoE layout spans the data-parallel ranks "
            "only; run context parallelism on a dense model)"
        )


def moe_text(args: argparse.Namespace) -> str:
    """`` (MoE 8 experts top-2, EP 2)`` for the summary and the plot."""
    if not getattr(args, "moe", 0):
        return ""
    ep = f", EP {args.ep}" if args.ep > 1 else ""
    return f" (MoE {args.moe} experts top-{args.topk}{ep})"


def parallelize_moe(args: argparse.Namespace, model: Any, device_type: str) -> Any:
    """Apply the layout of the module docstring to a Llama MoE model (Hugging Face's
    ``MixtralForCausalLM`` or the MindSpore job's model: ``model.layers.*.mlp.experts``).
    Returns the root mesh (``("dp_shard", "ep")``, or ``("dp", "tp")`` with ``--tp``),
    whose ``mesh["dp"]`` is the data-parallel mesh (flattened from ``("dp_shard", "ep")``)
    and ``mesh["tp"]`` the tensor-parallel one (without ``--tp``: none, the caller does not
    ask)."""
    from llama_common import llama_tp_plan

    from hyper_shard import Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp
    from hyper_shard.fsdp import fully_shard

    dp, ep, tp = args.dp, args.ep, args.tp
    if tp > 1:  # dp == ep (validate_moe): a ("dp", "tp") mesh, the experts on all of it
        mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_mesh, expert_mesh = mesh["dp"], mesh
    else:
        mesh = init_device_mesh(device_type, (dp // ep, ep), mesh_dim_names=("dp_shard", "ep"))
        dp_mesh, expert_mesh = mesh[("dp_shard", "ep")]._flatten("dp"), mesh["ep"]
    layers = list(model.model.layers)
    experts = [layer.mlp.experts for layer in layers]
    if tp > 1:
        plan = llama_tp_plan(False, hp, Replicate, Shard)
        hp.parallelize_module(
            model, mesh["tp"], {k: v for k, v in plan.items() if ".mlp." not in k}
        )
        for e in experts:
            hp.parallelize_module(e, expert_mesh, hp.ExpertTensorParallel())
    elif ep > 1:
        for e in experts:
            hp.parallelize_module(e, expert_mesh, hp.ExpertParallel())
    if dp == 1:
        return mesh
    ignored: set[Any] = set()
    for layer, e in zip(layers, experts):
        if ep > 1 and dp // ep > 1:
            fully_shard(e, mesh=mesh["dp_shard"])
        elif ep > 1:
            ignored |= {p for _, p in _params(e)}
        fully_shard(layer, mesh=dp_mesh, ignored_params=ignored or None)
    fully_shard(model, mesh=dp_mesh, ignored_params=ignored or None)
    return mesh


def _params(module: Any) -> list[tuple[str, Any]]:
    """A torch Module's or a MindSpore Cell's own parameters."""
    if hasattr(module, "named_parameters"):
        return list(module.named_parameters())
    return [(p.name, p) for p in module.get_parameters()]
