"""The example plugin (plugins/scaled_add) loaded through HYPER_PARALLEL_OPS_YAML_DIR /
HYPER_PARALLEL_OPS_PYTHON_PATH on 2 real gloo ranks, against plain torch, forward and
backward, for every placement combination of the inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hyper_shard import Partial, Replicate, Shard, init_device_mesh
from tests._helpers import all_combos, check_op, dt_from_global
from tests.conftest import get_pool

pytestmark = pytest.mark.multiproc

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "scaled_add"


@pytest.fixture(scope="module")
def plugin_pool():
    """2 ranks whose environment names the plugin before the registry is first built."""
    return get_pool(
        2,
        HYPER_PARALLEL_OPS_YAML_DIR=str(PLUGIN),
        HYPER_PARALLEL_OPS_PYTHON_PATH=str(PLUGIN),
    )


def _plugin():
    """The registry (built from the worker's environment) and the plugin module."""
    from hyper_shard.registry import get_registry

    reg = get_registry()  # appends HYPER_PARALLEL_OPS_PYTHON_PATH to sys.path
    import scaled_add_ops

    # appended after the standard library and site-packages, never before them
    assert sys.path.index(str(PLUGIN)) > sys.path.index(str(Path(torch.__file__).parents[1]))
    return reg, scaled_add_ops


def check_registered(rank, world):
    reg, ops = _plugin()
    sa, ax = reg["scaled_add"], reg["scaled_add_ops.axpby"]
    assert Path(sa.file).parent == PLUGIN and sa.torch == ["scaled_add_ops.scaled_add"]
    assert type(sa.op) is ops.ScaledAddDistributedOp
    assert type(ax.op) is ops.AxpbyDistributedOp and ax.torch == ["scaled_add_ops.axpby"]
    # the plain-tensor path is plain torch
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(3, 4, generator=g), torch.randn(4, generator=g)
    torch.testing.assert_close(ops.scaled_add(x, y, alpha=0.5, bias=2.0), x + 0.5 * y + 2.0)
    torch.testing.assert_close(ops.axpby(x, y, alpha=3.0, beta=-2.0), 3.0 * x - 2.0 * y)
    return len(reg)


def check_scaled_add_all_placements(rank, world):
    torch.set_num_threads(1)
    _, ops = _plugin()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    b = torch.randn(4, generator=g)
    n = 0
    # every pair of placements, Partial(sum)/Partial(avg) included (uneven 5-row shards too)
    combos = all_combos([x, y], mesh.ndim, ("sum", "avg"))
    n += check_op(lambda a, c: ops.scaled_add(a, c, alpha=0.5, bias=2.0), [x, y], mesh, combos)
    n += check_op(lambda a, c: ops.scaled_add(a, c), [x, y], mesh, combos)
    # broadcasting against a 1-D operand, both orders; positional alpha
    n += check_op(lambda a, c: ops.scaled_add(a, c, -1.5), [x, b], mesh, all_combos([x, b], 1))
    n += check_op(lambda c, a: ops.scaled_add(c, a, 2.0, 1.0), [b, x], mesh, all_combos([b, x], 1))
    # a python-scalar `other`: a constant term, added once even on Partial(sum) inputs
    n += check_op(
        lambda a: ops.scaled_add(a, 3.0, alpha=2.0, bias=1.0),
        [x],
        mesh,
        all_combos([x], 1, ("sum", "avg", "max")),
    )
    # the seed-format entry
    n += check_op(lambda a, c: ops.axpby(a, c, alpha=2.0, beta=-0.5), [x, y], mesh, combos)
    return n


def check_scaled_add_decisions(rank, world):
    """The rule's strategies are what runs: Shard and Partial inputs stay as they are."""
    torch.set_num_threads(1)
    _, ops = _plugin()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    ref = x + 0.25 * y + 1.0
    cases = [
        ((Shard(0),), (Shard(0),), (Shard(0),)),
        ((Shard(1),), (Shard(1),), (Shard(1),)),
        ((Partial("sum"),), (Partial("sum"),), (Partial("sum"),)),
        ((Partial("avg"),), (Partial("avg"),), (Partial("avg"),)),
        ((Replicate(),), (Replicate(),), (Replicate(),)),
    ]
    for i, (px, py, want) in enumerate(cases):
        dx = dt_from_global(x, mesh, px, seed=10 + i)
        dy = dt_from_global(y, mesh, py, seed=20 + i)
        out = ops.scaled_add(dx, dy, alpha=0.25, bias=1.0)
        assert out._spec.placements == want, (px, py, out._spec.placements)
        torch.testing.assert_close(out.full_tensor(), ref)
    # Shard(0) against Shard(1): one input moves, the result is still right
    out = ops.scaled_add(
        dt_from_global(x, mesh, (Shard(0),)), dt_from_global(y, mesh, (Shard(1),)), 0.25, 1.0
    )
    torch.testing.assert_close(out.full_tensor(), ref)
    return len(cases)


def test_plugin_registered(plugin_pool):
    counts = plugin_pool.run(check_registered)
    assert counts[0] > 30 and len(set(counts)) == 1


def test_plugin_matches_torch(plugin_pool):
    counts = plugin_pool.run(check_scaled_add_all_placements)
    assert counts[0] > 100 and len(set(counts)) == 1


def test_plugin_decisions(plugin_pool):
    assert plugin_pool.run(check_scaled_add_decisions) == [5, 5]


YAML_ONLY = """\
# a YAML-only op: a declarative rule, no Python (as in docs/custom_ops.md)
__default__: {rule: pointwise}
doc_example_sinc:
  override: true          # stays valid should the built-ins bind torch.sinc one day
  torch: [torch.sinc, Tensor.sinc]
doc_example_hypot:
  override: true
  torch: [torch.hypot, Tensor.hypot]
"""


def check_yaml_only_via_reload(rank, world, spec_dir):
    """``reload(extra_dirs=...)`` on every rank adds a YAML-only op; the plugin (from the
    environment) stays; a bad spec leaves the registry as it was."""
    torch.set_num_threads(1)
    from hyper_shard.errors import OpSpecError
    from hyper_shard.registry import get_registry, reload

    _, ops = _plugin()
    mesh = init_device_mesh("cpu", (world,))
    reg = reload(extra_dirs=[spec_dir])
    try:
        assert reg.names("torch")["torch.sinc"].name == "doc_example_sinc"
        assert "scaled_add" in reg  # HYPER_PARALLEL_OPS_YAML_DIR is read again
        g = torch.Generator().manual_seed(4)
        x, y = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
        n = check_op(torch.sinc, [x], mesh, all_combos([x], 1))
        n += check_op(torch.hypot, [x, y], mesh, all_combos([x, y], 1))
        # the plugin op composes with the YAML-only one
        n += check_op(
            lambda a, b: ops.scaled_add(torch.sinc(a), b, 2.0), [x, y], mesh, all_combos([x, y], 1)
        )
        bad = Path(spec_dir) / f"bad_{rank}"
        bad.mkdir(exist_ok=True)
        (bad / "ops.yaml").write_text("oops: {rule: pointwise, torch: [torch.sincc]}\n")
        try:
            reload(extra_dirs=[spec_dir, bad])
        except OpSpecError as e:
            assert "field 'torch'" in str(e) and "torch.sincc" in str(e)
        else:
            raise AssertionError("a spec naming an unknown torch function was accepted")
        assert get_registry() is reg
    finally:
        reload()  # back to the environment's sources for the pool's next tests
    assert "doc_example_sinc" not in get_registry()
    return n


def test_yaml_only_op_via_reload(plugin_pool, tmp_path):
    (tmp_path / "extra.yaml").write_text(YAML_ONLY)
    counts = plugin_pool.run(check_yaml_only_via_reload, str(tmp_path))
    assert counts[0] > 20 and len(set(counts)) == 1


def test_python_path_importable_at_import(tmp_path):
    """HYPER_PARALLEL_OPS_PYTHON_PATH is on sys.path from `import hyper_shard` on (a user's
    op module imports before the first DTensor op, as docs/custom_ops.md 3.6 does), after
    the existing entries (never shadowing)."""
    import subprocess
    import sys

    code = (
        "import sys, hyper_shard, scaled_add_ops; "
        "i = sys.path.index(" + repr(str(PLUGIN)) + "); "
        "print(i == len(sys.path) - 1)"
    )
    env = {**__import__("os").environ, "HYPER_PARALLEL_OPS_PYTHON_PATH": str(PLUGIN)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
