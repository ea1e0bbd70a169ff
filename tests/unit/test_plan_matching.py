"""Plan keys of ``parallelize_module``: fnmatch wildcards token by token (as PyTorch's
``parallelize_module``), and bad keys rejected with the key and the closest module names.
One process; the meshes are abstract (no style gets applied when a key is wrong)."""

from __future__ import annotations

import fnmatch

import pytest
import torch
from torch import nn

from hyper_shard import DeviceMesh, Replicate, Shard
from hyper_shard.parallel import (
    ColwiseParallel,
    PlanKeyError,
    PlanKeyWarning,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from hyper_shard.parallel.plan import generalize_name, match_key, match_plan


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 4)
        self.v_proj, self.o_proj = nn.Linear(8, 4), nn.Linear(8, 8)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            nn.Linear(8, 16),
            nn.Linear(8, 16),
            nn.Linear(16, 8),
        )


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attn(), Mlp()
        self.input_layernorm = nn.LayerNorm(8)


class Body(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(32, 8)
        self.layers = nn.ModuleList(Layer() for _ in range(n))
        self.norm = nn.LayerNorm(8)


class LM(nn.Module):
    """The module tree of a Hugging Face LlamaForCausalLM, in miniature."""

    def __init__(self, n: int = 12) -> None:
        super().__init__()
        self.model = Body(n)
        self.lm_head = nn.Linear(8, 32, bias=False)


def names(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_modules()]


def torch_style_match(key: str, module: nn.Module, prefix: str = "") -> list[str]:
    """The reference: PyTorch's recursive token-by-token fnmatch over named_children."""
    if key == "":
        return [prefix]
    tok, _, rest = key.partition(".")
    out = []
    for child_name, child in module.named_children():
        if fnmatch.fnmatch(child_name, tok):
            path = f"{prefix}.{child_name}" if prefix else child_name
            out += torch_style_match(rest, child, path) if rest else [path]
    return out


KEYS = [
    "lm_head",
    "model.layers.*.self_attn.q_proj",
    "model.layers.*.self_attn.[qkv]_proj",
    "model.layers.*.mlp.*_proj",
    "model.layers.1?.mlp",
    "model.layers.[0-3].input_layernorm",
    "model.*",
    "*.norm",
    "model.layers.*",
]


@pytest.mark.parametrize("key", KEYS)
def test_wildcards_match_like_torch(key: str) -> None:
    m = LM()
    got = match_key(key, names(m))
    assert sorted(got) == sorted(torch_style_match(key, m))
    assert got  # every key above selects something


def test_star_does_not_cross_dots() -> None:
    m = LM(2)
    assert match_key("model.*.q_proj", names(m)) == []
    assert match_key("*", names(m)) == ["model", "lm_head"]
    assert match_key("", names(m)) == [""]  # the root


def test_match_plan_order_and_expansion() -> None:
    m = LM(3)
    c, r = ColwiseParallel(), RowwiseParallel()
    got = match_plan({"model.layers.*.mlp.up_proj": c, "lm_head": r}, names(m))
    assert [(k, n) for k, n, _ in got] == [
        ("model.layers.*.mlp.up_proj", "model.layers.0.mlp.up_proj"),
        ("model.layers.*.mlp.up_proj", "model.layers.1.mlp.up_proj"),
        ("model.layers.*.mlp.up_proj", "model.layers.2.mlp.up_proj"),
        ("lm_head", "lm_head"),
    ]
    assert got[0][2] is c and got[-1][2] is r


def test_generalize_name() -> None:
    assert generalize_name("model.layers.11.mlp.up_proj") == "model.layers.*.mlp.up_proj"
    assert generalize_name("blocks.0.1.attn") == "blocks.*.*.attn"
    assert generalize_name("lm_head") == "lm_head"


@pytest.mark.parametrize(
    "key, closest, failing",
    [
        ("model.layers.*.self_attn.q_prj", "model.layers.*.self_attn.q_proj", "q_prj"),
        ("model.layer.*.mlp.up_proj", "model.layers.*.mlp.up_proj", "layer"),
        ("model.layers.3.mlp.down", "model.layers.3.mlp.down_proj", "down"),
        ("lm_heads", "lm_head", "lm_heads"),
        ("model.layers.*.attn.q_proj", "model.layers.*.self_attn.q_proj", "attn"),
    ],
)
def test_bad_key_names_key_and_closest(key: str, closest: str, failing: str) -> None:
    m = LM(4)
    with pytest.raises(PlanKeyError) as ei:
        match_plan({key: ColwiseParallel()}, names(m), "LM")
    msg = str(ei.value)
    assert repr(key) in msg
    assert repr(closest) in msg
    assert f"'{failing}'" in msg  # the token that failed to match
    assert "LM" in msg


def test_bad_key_lists_children_of_last_match() -> None:
    m = LM(2)
    with pytest.raises(PlanKeyError) as ei:
        match_plan({"model.layers.*.feed_forward.w1": ColwiseParallel()}, names(m))
    msg = str(ei.value)
    assert "'model.layers.*' matches 2 module(s)" in msg
    assert "'mlp'" in msg and "'self_attn'" in msg  # the children that do exist


def test_parallelize_module_warns_and_skips_a_bad_key() -> None:
    """As torch: a key matching nothing is skipped with a warning ("could not be resolved",
    the token that matched nothing), plus hyper_shard's closest module names."""
    m = LM(2)
    before = {n: p.data_ptr() for n, p in m.named_parameters()}
    mesh = DeviceMesh.abstract((2,))
    with pytest.warns(PlanKeyWarning) as rec:
        out = parallelize_module(m, mesh, {"model.layers.*.mlp.gate": ColwiseParallel()})
    assert out is m
    msg = str(rec[0].message)
    assert "Parallelize plan key 'model.layers.*.mlp.gate' could not be resolved" in msg
    assert "no submodule matching token 'gate'" in msg and "skipping this plan entry" in msg
    assert "'model.layers.*.mlp.gate_proj'" in msg  # the closest name
    assert {n: p.data_ptr() for n, p in m.named_parameters()} == before


def test_match_plan_not_strict_skips() -> None:
    m = LM(1)
    c = ColwiseParallel()
    with pytest.warns(PlanKeyWarning, match="'lm_headd' could not be resolved"):
        got = match_plan({"lm_headd": c, "lm_head": c}, names(m), "LM", strict=False)
    assert [g[1] for g in got] == ["lm_head"]


def test_plan_type_errors() -> None:
    m = LM(1)
    mesh = DeviceMesh.abstract((2,))
    with pytest.raises(TypeError, match="ParallelStyle"):
        parallelize_module(m, mesh, {"lm_head": "colwise"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ParallelStyle or a dict"):
        parallelize_module(m, mesh, [ColwiseParallel()])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="module paths"):
        parallelize_module(m, mesh, {0: ColwiseParallel()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="device_mesh"):
        parallelize_module(m, None, {"lm_head": ColwiseParallel()})
    with pytest.warns(UserWarning, match="No parallelize_plan"):
        assert parallelize_module(m, mesh, None) is m


def test_style_checks_before_touching_the_module() -> None:
    mesh2d = DeviceMesh.abstract((2, 2))
    with pytest.raises(ValueError, match="1-D DeviceMesh"):
        parallelize_module(nn.Linear(4, 4), mesh2d, ColwiseParallel())
    mesh = DeviceMesh.abstract((2,))
    for style in (ColwiseParallel(), RowwiseParallel()):
        with pytest.raises(NotImplementedError, match="nn.Linear and nn.Embedding; got LayerNorm"):
            parallelize_module(nn.LayerNorm(4), mesh, style)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        parallelize_module(object(), mesh, ColwiseParallel())


def test_style_arguments_as_torch() -> None:
    c = ColwiseParallel()
    assert c.input_layouts == (Replicate(),) and c.output_layouts == (Shard(-1),)
    assert c.use_local_output
    r = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    assert r.input_layouts == (Shard(-1),) and r.output_layouts == (Shard(1),)
    assert not r.use_local_output
    s = SequenceParallel(sequence_dim=0)
    assert s.sequence_sharding == (Shard(0),) and not s.use_local_output
    p = PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate())
    assert p.input_layouts == (Shard(0),) and p.desired_input_layouts == (Replicate(),)
    with pytest.raises(ValueError, match="same length"):
        PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(),))
    with pytest.raises(ValueError, match="should not be None"):
        PrepareModuleInput(input_layouts=(Shard(0),))
    with pytest.raises(ValueError, match="same length"):
        PrepareModuleOutput(output_layouts=(Shard(0), None), desired_output_layouts=Replicate())
    assert "ColwiseParallel(input_layouts=(Replicate(),)" in repr(c)
    assert torch.is_tensor(torch.zeros(1))  # torch imported before the adapter is chosen
