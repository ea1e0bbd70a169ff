"""Training under ``torch.compile`` over hyper_shard DTensors: FSDP, HSDP, FSDP x TP, the
vocab-parallel loss inside a compiled region, checkpointed blocks, a compiled optimizer
step and ``fullgraph=True`` on a TP decoder layer ([Note: compiled DTensor] in
platform/torch/compiled.py).

Every configuration trains the tiny Hugging Face Llama of ``test_compile.py`` for a few
AdamW steps three times in the same ranks — compiled, eager hyper_shard, and plain torch in
one process on the whole batch — and compares the losses at every step, every gradient's
``full_tensor()`` at the first step, and every parameter's ``full_tensor()`` after the last
step (the optimizer on a TP MLP). Compiled tests are few (each graph costs seconds): one pool call per world size runs
several configurations; ``aot_eager`` for most, ``inductor`` for the decoder layer.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from .test_compile import EXAMPLES, _llama

pytestmark = pytest.mark.multiproc

STEPS = 3
SEQ = 16


def _batches(dp: int) -> list:
    """``STEPS`` global batches of ``2 * dp`` sequences (each data-parallel rank takes 2)."""
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 64, (2 * dp, SEQ), generator=g),
            torch.randint(0, 64, (2 * dp, SEQ), generator=g),
        )
        for _ in range(STEPS)
    ]


def _full(t: Any) -> Any:
    from hyper_shard import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _breaks() -> dict[str, int]:
    """Graph breaks since the last reset, by their first line, without the optimizer's own
    ``torch._dynamo.graph_break()`` (torch.optim puts one in ``step``, for any tensor)."""
    out: dict[str, int] = {}
    for reason, n in torch._dynamo.utils.counters["graph_break"].items():
        first = reason.splitlines()[0]
        if "torch._dynamo.graph_break()" not in first:
            out[first] = out.get(first, 0) + n
    return out


def _checkpointed(layer: torch.nn.Module) -> None:
    """``torch.utils.checkpoint`` around a decoder layer's forward (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    inner = layer.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    layer.forward = forward  # type: ignore[method-assign]


def _model(cfg: dict, tp_mesh: Any, dp_mesh: Any) -> torch.nn.Module:
    from hyper_shard import Replicate, Shard
    from hyper_shard import parallel as hp

    sys.path.insert(0, EXAMPLES)
    from llama_common import llama_tp_plan

    model = _llama()
    if tp_mesh is not None:
        hp.parallelize_module(
            model, tp_mesh, llama_tp_plan(cfg.get("sp", False), hp, Replicate, Shard)
        )
    if cfg.get("ckpt"):
        for layer in model.model.layers:
            _checkpointed(layer)
    if dp_mesh is not None:
        from hyper_shard.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


def _train(cfg: dict, tp_mesh: Any, dp_mesh: Any, dp: tuple, compiled: bool) -> dict:
    """``STEPS`` AdamW steps; ``cfg["compile"]``: "blocks" (each decoder layer's
    ``module.compile()``, as torchtitan) or "step" (one region: forward and loss, the loss
    under ``loss_parallel`` when TP)."""
    from hyper_shard import DTensor, Replicate
    from hyper_shard import parallel as hp

    backend = cfg.get("backend", "aot_eager")
    model = _model(cfg, tp_mesh, dp_mesh)
    pos = torch.arange(SEQ)[None]

    def fwd_loss(x: torch.Tensor, y: torch.Tensor) -> Any:
        logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
        if tp_mesh is None:
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())
        target = DTensor.from_local(y.flatten(), tp_mesh, [Replicate()])
        with hp.loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), target)

    step_fn = fwd_loss
    if compiled and cfg["compile"] == "blocks":
        for layer in model.model.layers:
            layer.compile(backend=backend)
    elif compiled:
        step_fn = torch.compile(fwd_loss, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], None
    n, dp_rank, group = dp
    for x, y in _batches(n):
        x, y = x.chunk(n)[dp_rank], y.chunk(n)[dp_rank]
        loss = step_fn(x, y)
        with hp.loss_parallel():
            loss.backward()
        value = _full(loss.detach())
        if n > 1:  # the mean over the data-parallel ranks
            value = value.clone()
            torch.distributed.all_reduce(value, group=group)
            value = value / n
        losses.append(value.item())
        if grads is None:
            grads = {n: _full(p.grad).clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    params = {n: _full(p.detach()).clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _train_plain(n: int) -> dict:
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pos = torch.arange(SEQ)[None]
    losses, grads = [], None
    for x, y in _batches(n):
        logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        losses.append(loss.item())
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "grads": grads}


def _compare(got: dict, eager: dict, plain: dict, what: str) -> None:
    for a, e, p in zip(got["losses"], eager["losses"], plain["losses"]):
        assert abs(a - e) <= 1e-5 * abs(e), (what, got["losses"], eager["losses"])
        assert abs(a - p) <= 1e-4 * abs(p), (what, got["losses"], plain["losses"])
    for n, g in got["grads"].items():
        for ref, tol, vs in (
            (eager["grads"][n], 1e-5, "eager"),
            (plain["grads"][n], 1e-4, "plain"),
        ):
            err = float((g - ref).abs().max())
            assert torch.allclose(g, ref, rtol=tol, atol=tol / 10), (what, "grad", n, vs, err)
    # the parameters after the steps against eager: AdamW's first updates are ~lr * sign(g),
    # so a parameter whose gradient is near 0 moves by amounts that reflect float rounding
    # (eager TP vs one process differ up to ~1e-4 there; the losses above hold the training
    # to plain torch); a compiled AdamW also rounds differently from the eager one
    for n, p in got["params"].items():
        err = float((p - eager["params"][n]).abs().max())
        assert torch.allclose(p, eager["params"][n], rtol=1e-4, atol=1e-5), (what, n, err)


def _run(cfg: dict, tp_mesh: Any, dp_mesh: Any, dp: tuple = (1, 0, None)) -> dict[str, int]:
    """One configuration compiled, eager and plain; returns the compiled run's graph breaks.
    ``dp``: (data-parallel ranks, this rank's index among them, their process group)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    got = _train(cfg, tp_mesh, dp_mesh, dp, compiled=True)
    breaks = _breaks()
    eager = _train(cfg, tp_mesh, dp_mesh, dp, compiled=False)
    _compare(got, eager, _train_plain(dp[0]), cfg["name"])
    return breaks


# ---------------------------------------------------------------------- configurations
def check_config(rank: int, world: int, name: str) -> dict[str, int]:
    """One configuration (``name``) on this pool's ranks: compiled, eager and plain."""
    from hyper_shard import init_device_mesh

    if name == "fsdp":  # each decoder layer compiled, FSDP's hooks eager around it
        dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        return _run({"name": name, "compile": "blocks"}, None, dp_mesh, (world, rank, None))
    if name == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        return _run({"name": name, "compile": "blocks"}, None, mesh, (world, rank, None))
    if name == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        dp = (2, mesh.get_local_rank("dp"), mesh.get_group("dp"))
        return _run({"name": name, "compile": "blocks"}, mesh["tp"], mesh["dp"], dp)
    tp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    if name == "tp_loss":  # forward + vocab-parallel loss in one region
        return _run({"name": name, "compile": "step"}, tp_mesh, None)
    assert name == "tp_ckpt"  # checkpointed decoder layers in the compiled region
    return _run({"name": name, "compile": "step", "ckpt": True}, tp_mesh, None)


def check_optimizer_step(rank: int, world: int) -> int:
    """``torch.compile(opt.step)`` (AdamW) over the DTensor parameters of a TP MLP (column-
    then row-parallel): the parameters after 3 steps equal the eager optimizer's, and the
    losses the single-process model's; returns the graph breaks besides torch.optim's."""
    from hyper_shard import init_device_mesh
    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    data = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(5))

    def train(parallel: bool, compiled: bool) -> tuple[list[float], dict]:
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
        if parallel:
            parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        opt = torch.optim.AdamW(mlp.parameters(), lr=1e-2)
        step = torch.compile(opt.step, backend="aot_eager") if compiled else opt.step
        losses = []
        for x in data:
            loss = (mlp(x) ** 2).mean()
            loss.backward()
            losses.append(loss.item())
            step()
            opt.zero_grad()
        return losses, {n: _full(p.detach()) for n, p in mlp.named_parameters()}

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    got, got_p = train(True, True)
    breaks = sum(_breaks().values())
    eager, eager_p = train(True, False)
    plain, _ = train(False, False)
    for a, e, p in zip(got, eager, plain):
        assert abs(a - e) <= 1e-5 * abs(e) and abs(a - p) <= 1e-4 * abs(p), (got, eager, plain)
    for n, p in got_p.items():
        torch.testing.assert_close(p, eager_p[n], rtol=1e-4, atol=1e-5)
    return breaks


def test_optimizer_step_compiled(dist2):
    assert dist2.run(check_optimizer_step, timeout=600) == [0, 0]


def _report(name: str, breaks: dict[str, int]) -> None:
    print(f"{name}: {sum(breaks.values())} graph breaks {sorted(breaks)}")


def test_fsdp_compiled_per_block(dist2):
    _report("fsdp", dist2.run(check_config, "fsdp", timeout=600)[0])


def test_tp_loss_parallel_compiled(dist2):
    breaks = dist2.run(check_config, "tp_loss", timeout=600)[0]
    _report("tp_loss", breaks)
    assert breaks == {}  # forward and the vocab-parallel loss trace as one region


def test_tp_checkpointed_layers_compiled(dist2):
    breaks = dist2.run(check_config, "tp_ckpt", timeout=600)[0]
    _report("tp_ckpt", breaks)
    assert breaks == {}  # the checkpoint's body traces inside the region


def test_hsdp_compiled_per_block(dist4):
    _report("hsdp", dist4.run(check_config, "hsdp", timeout=600)[0])


def test_fsdp_tp_compiled_per_block(dist4):
    _report("fsdp_tp", dist4.run(check_config, "fsdp_tp", timeout=600)[0])
