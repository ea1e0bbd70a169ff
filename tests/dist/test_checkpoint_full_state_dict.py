"""Consolidated ("full") state dicts through ``torch.distributed.checkpoint.state_dict`` on
2 gloo ranks, as the FSDP2 and TP tutorials write them:
``get_model_state_dict`` / ``get_optimizer_state_dict`` with
``StateDictOptions(full_state_dict=True[, cpu_offload=True])`` give plain full tensors
(on rank 0 only with ``cpu_offload``) equal to the DTensors' full values, and
``set_model_state_dict`` / ``set_optimizer_state_dict`` load them back (each rank, or
broadcast from rank 0) into FSDP and tensor-parallel models; a full checkpoint loads into
a plain single-process model with the same outputs. Before this, torch's gather left
hyper_shard DTensors untouched: a "full" state dict held rank 0's shards. PyTorch's own
placements (``torch.distributed.tensor.Replicate()``) are taken by hyper_shard DTensors
too."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.multiproc


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def check_full_state_dicts(rank, world, path):
    import torch.distributed.tensor as tdt
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    import hyper_shard as hs
    from hyper_shard import parallel as hp
    from hyper_shard.fsdp import fully_shard

    mesh = hs.init_device_mesh("cpu", (world,))
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))

    def fsdp(seed):  # noqa: ANN001, ANN202
        m = _net(seed)
        fully_shard(m[0], mesh=mesh)
        return fully_shard(m, mesh=mesh)

    def tp(seed):  # noqa: ANN001, ANN202
        m = _net(seed)
        plan = {"0": hp.ColwiseParallel(), "2": hp.RowwiseParallel()}
        return hp.parallelize_module(m, mesh, plan)

    def out_of(m):  # noqa: ANN001, ANN202
        y = m(x)
        return y.full_tensor() if isinstance(y, hs.DTensor) else y

    for make in (fsdp, tp):
        model = make(0)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        out_of(model).sum().backward()
        opt.step()
        opt.zero_grad()
        want = {k: v.full_tensor() for k, v in model.state_dict().items()}
        # ---- full state dicts: plain tensors with the full values
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        assert set(full) == set(want)
        for k, v in full.items():
            assert type(v) is torch.Tensor and torch.equal(v, want[k]), (make.__name__, k)
        off = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if rank == 0:
            assert all(type(v) is torch.Tensor and torch.equal(v, want[k]) for k, v in off.items())
        else:
            assert off == {}
        osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
        for st in osd["state"].values():
            assert all(type(v) is torch.Tensor for v in st.values())
        moments = [opt.state[p]["exp_avg"].full_tensor() for p in model.parameters()]
        got = [osd["state"][k]["exp_avg"] for k in sorted(osd["state"], key=list(full).index)]
        assert all(torch.equal(a, b) for a, b in zip(got, moments))
        # ---- and back: on every rank, or broadcast from rank 0
        for bcast in (False, True):
            other = make(1)
            oopt = torch.optim.Adam(other.parameters(), lr=0.1)
            out_of(other).sum().backward()  # optimizer state to load into
            oopt.step()
            sd = {k: v.clone() for k, v in full.items()} if rank == 0 or not bcast else {}
            opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=bcast)
            set_model_state_dict(other, sd, options=opts)
            set_optimizer_state_dict(
                other, oopt, osd, options=StateDictOptions(full_state_dict=True)
            )
            for k, v in other.state_dict().items():
                assert isinstance(v, hs.DTensor) and torch.equal(v.full_tensor(), want[k]), k
            for p, m in zip(other.parameters(), moments):
                assert torch.equal(oopt.state[p]["exp_avg"].full_tensor(), m)
            torch.testing.assert_close(out_of(other), out_of(model))
        # ---- a consolidated checkpoint loads into one plain process
        if rank == 0:
            torch.save(off, f"{path}.{make.__name__}")
        torch.distributed.barrier()
        plain = _net(2)
        plain.load_state_dict(torch.load(f"{path}.{make.__name__}"))
        torch.testing.assert_close(plain(x), out_of(model))
        # a plain full state dict through load_state_dict itself
        again = make(3)
        again.load_state_dict({k: v.clone() for k, v in want.items()})
        torch.testing.assert_close(out_of(again), out_of(model))

    # ---- PyTorch's own placement objects
    dt = hs.distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [hs.Shard(0)])
    r = dt.redistribute(mesh, [tdt.Replicate()])
    assert r.placements == (hs.Replicate(),) and torch.equal(r.to_local(), dt.full_tensor())
    s = hs.distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [tdt.Shard(1)])
    assert s.placements == (hs.Shard(1),) and s.to_local().shape == (4, 1)
    return True


def test_full_state_dicts_fsdp_and_tp(dist2, tmp_path):
    assert dist2.run(check_full_state_dicts, str(tmp_path / "full.pt")) == [True, True]
