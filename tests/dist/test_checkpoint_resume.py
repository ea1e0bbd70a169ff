"""Resume training on another layout: train k steps, save model + AdamW state with
``hyper_shard.checkpoint``, load on another layout, continue; every step's loss equals an
uninterrupted single-process run of the same steps (plain torch, same seed and batches).

The chain, each link on another layout: 1-D TP on 2 ranks -> FSDP x TP on a (2, 2) mesh
(4 ranks; ``(Shard(0), Shard(1))`` and ``(Shard(1), Shard(0))`` weights, uneven shards) ->
one process (plain ``nn.Module``, no process group) -> FSDP-style ``Shard(0)`` on 4 ranks
(uneven: 6 rows and 3 rows over 4). AdamW moments follow their parameter's layout; the
step counters are plain (replicated) tensors. The main job itself resumes on another
``--tp`` (``test_llama_resume_other_tp``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiproc

STEPS = 2  # per link
LR = 0.05


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _parallelize(model: torch.nn.Module, kind: str, world: int) -> tuple[torch.nn.Module, object]:
    """``model`` laid out as ``kind``: 'tp' (colwise/rowwise on a 1-D mesh), 'fsdp' (every
    parameter Shard(0)), '2d' (a (2, 2) mesh, both mesh dims sharding the weights)."""
    from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
    from hyper_shard import parallel as hp

    if kind == "tp":
        mesh = init_device_mesh("cpu", (world,))
        hp.parallelize_module(model, mesh, {"0": hp.ColwiseParallel(), "2": hp.RowwiseParallel()})
        return model, mesh
    mesh = init_device_mesh("cpu", (2, 2) if kind == "2d" else (world,))
    if kind == "2d":
        layouts = {
            "0.weight": [Shard(0), Shard(1)],  # (6, 5): rows 3/3, then columns 3/2 (uneven)
            "0.bias": [Shard(0), Replicate()],
            "2.weight": [Shard(1), Shard(0)],  # (3, 6): columns 3/3, then rows 2/1 (uneven)
            "2.bias": [Replicate(), Shard(0)],  # 3 over 2: 2/1
        }
    else:
        layouts = {n: [Shard(0)] for n, _ in model.named_parameters()}

    def partition(name: str, mod: torch.nn.Module, mesh: object) -> None:
        for pn, p in list(mod.named_parameters(recurse=False)):
            dt = distribute_tensor(p.detach(), mesh, layouts[f"{name}.{pn}"])
            mod.register_parameter(pn, torch.nn.Parameter(dt))

    def to_dtensor(mod: torch.nn.Module, inputs: tuple, mesh: object) -> tuple:
        return tuple(DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim) for t in inputs)

    hp.distribute_module(model, mesh, partition, input_fn=to_dtensor)
    return model, mesh


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, mesh, start: int, n: int) -> list:
    from hyper_shard import DTensor, Replicate

    losses = []
    for step in range(start, start + n):
        x, y = _batch(step)
        out = model(x)
        if mesh is not None:
            if not isinstance(out, DTensor):  # the TP plan returns plain local outputs
                out = DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim)
            y = DTensor.from_local(y, mesh, [Replicate()] * mesh.ndim)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
    return losses


def _state(model, opt, step):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "step": step}


def _link(kind: str | None, world: int, src: str | None, dst: str) -> tuple[list, int]:
    """Load ``src`` (if any) into a ``kind`` layout, train STEPS steps, save to ``dst``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    import hyper_shard.checkpoint as hc

    model, mesh = (_model(), None) if kind is None else _parallelize(_model(), kind, world)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    start = 0
    if src is not None:
        state = _state(model, opt, 0)
        hc.load(state, src)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = state["step"]
    losses = _train(model, opt, mesh, start, STEPS)
    hc.save(_state(model, opt, start + STEPS), dst)
    return losses, start


def run_link(rank: int, world: int, kind: str, src: str | None, dst: str) -> tuple[list, int]:
    return _link(kind, world, src, dst)


def test_resume_across_layouts(dist2, dist4, tmp_path: Path) -> None:
    ref_model = _model()
    ref = _train(
        ref_model,
        torch.optim.AdamW(ref_model.parameters(), lr=LR, weight_decay=0.1),
        None,
        0,
        4 * STEPS,
    )
    a, b, c, d = (str(tmp_path / n) for n in "abcd")
    got = []
    res = dist2.run(run_link, "tp", None, a)  # 1-D TP over 2 ranks
    assert res[0] == res[1]
    got += res[0][0]
    res = dist4.run(run_link, "2d", a, b)  # 2 -> 4 ranks, TP -> FSDP x TP (2, 2)
    assert all(r == res[0] for r in res) and res[0][1] == STEPS
    got += res[0][0]
    losses, start = _link(None, 1, b, c)  # sharded -> one process (no process group)
    assert start == 2 * STEPS
    got += losses
    res = dist4.run(run_link, "fsdp", c, d)  # one process -> Shard(0) over 4 ranks, uneven
    assert res[0][1] == 3 * STEPS
    got += res[0][0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-6)
